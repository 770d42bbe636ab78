"""What every training method shares: script arguments, datasets, the base model and LoRA, the launch
checks, the train-and-save loop, the adapter's files and card, calibration, and GRPO's rewards. The
methods themselves (`train/sft.py`, `dpo.py`, `grpo.py`, `value.py`, `value_grpo.py`, `agent_sft.py`)
say only what differs."""
