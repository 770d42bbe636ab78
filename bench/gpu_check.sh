#!/usr/bin/env bash
# The GPU check of agent training and inference, as one script for a GPU machine without network.
#
#   bash bench/gpu_check.sh <tokenizer-folder> <agent-data-folder> <out-folder>
#   QUICK=1 bash bench/gpu_check.sh ...     # a CPU dry run: tiny shapes, 2 steps (catches typos first)
#
# Hub weights cannot be fetched there, so the models are random weights of the real shapes
# (bench/random_model.py): the timings and memory are the real ones, the losses and actions are not.
#   1. raw LoRA step throughput of the Qwen2.5-0.5B shape (bench/train_throughput.py);
#   2. `rir train agent-sft` with the CPU config moved to the GPU, on the packaged model's shape;
#   3. `rir train agent-sft` with configs/train/agent_sft_qwen2.5-0.5b.yaml through `accelerate launch`;
#   4. the adapter of step 2 as a policy (`--policy llm:<folder>`) in `rir eval` on the builtin env.
# Writes to <out-folder>: versions.txt, throughput.json, mem.csv (GPU memory every 0.5 s),
# trainer_state_135m.json, trainer_state_0.5b.json, summary.json, and log.txt.
set -euo pipefail
tok=$1 data=$2 out=$3
source "$(dirname "$0")/gpu_lib.sh"
log_to_out
if [[ "${QUICK:-0}" == 1 ]]; then
  shape135=tiny shape05=tiny steps135=2 gpu=(--use_cpu true --bf16 false) launcher=(--launcher python)
  q05_extra=(--max-steps 2 --use_cpu true --bf16 false --per_device_train_batch_size 2 --per_device_eval_batch_size 2
             --max_eval_samples 4)
  bench=(--shape tiny --steps 2 --seq-len 64 --batch-size 2 --device cpu)
else
  shape135=same shape05=0.5b steps135=120 gpu=(--use_cpu false --bf16 true) q05_extra=()
  launcher=(--launcher accelerate --accelerate-config configs/accelerate/single_gpu.yaml)
  bench=(--shape 0.5b --steps 10 --seq-len 1024 --batch-size 16 --gradient-checkpointing)
  sample_gpu_memory
fi
write_versions

stamp "1. raw throughput"
python3 bench/train_throughput.py "${bench[@]}" | tee "$out/throughput.json"

stamp "2. agent-sft, CPU config on the GPU, packaged shape"
python3 bench/random_model.py --tokenizer "$tok" --shape "$shape135" --out /tmp/m135
SECONDS=0
rir train agent-sft --config configs/train/agent_sft_cpu.yaml --agent-data configs/build/agent_data_dagger.yaml \
  --model /tmp/m135 --data "$data" --output_dir /tmp/runs/agent-135m "${gpu[@]}" --max-steps "$steps135"
stamp "2. done in ${SECONDS}s"
last_state /tmp/runs/agent-135m "$out/trainer_state_135m.json"

stamp "3. agent-sft, Qwen2.5-0.5B config, accelerate launch"
python3 bench/random_model.py --tokenizer "$tok" --shape "$shape05" --out /tmp/q05
SECONDS=0
rir train agent-sft "${launcher[@]}" --config configs/train/agent_sft_qwen2.5-0.5b.yaml \
  --agent-data configs/build/agent_data_dagger.yaml --model /tmp/q05 --data "$data" --output_dir /tmp/runs/agent-q05 \
  "${q05_extra[@]}"
stamp "3. done in ${SECONDS}s"
last_state /tmp/runs/agent-q05 "$out/trainer_state_0.5b.json"

stamp "4. the 135M-shape adapter as a policy in rir eval"
SECONDS=0
rir eval --env builtin --tasks workshop-4 --variations 0-3 --policy llm:/tmp/runs/agent-135m --methods react,rir \
  --budget-agent 12 --out /tmp/eval-gpu
stamp "4. done in ${SECONDS}s"
cp /tmp/eval-gpu/summary.json "$out/summary.json"
