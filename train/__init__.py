"""train stage of the RIR pipeline: LoRA SFT, DPO and the agent recipe, through TRL and PEFT (see docs/)."""
