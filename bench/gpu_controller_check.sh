#!/usr/bin/env bash
# The GPU check of the controller recipe's training (the GPU twin, configs/pipeline/controller_gpu.yaml),
# as one script for a GPU machine without network.
#
#   bash bench/gpu_controller_check.sh <tokenizer-folder> <controller-data-folder> <out-folder>
#   QUICK=1 bash bench/gpu_controller_check.sh ...   # a CPU dry run: tiny shapes, 2 steps (catches typos first)
#
# Hub weights cannot be fetched there, so the models are random weights of the real shapes
# (bench/random_model.py): the timings and memory are the real ones, the losses and decisions are not.
#   1. `rir train sft` with configs/train/sft_qwen2.5-0.5b.yaml through `accelerate launch` (the twin's SFT stage,
#      all of it) on the controller datasets, Qwen2.5-0.5B shape;
#   2. `rir train dpo` with configs/train/dpo_qwen2.5-0.5b.yaml through `accelerate launch`, from that adapter,
#      capped at $DPO_STEPS steps (default 20), so a full epoch is extrapolated from the time per step;
#   3. `rir eval-controller` of the step-1 adapter on 40 review, 20 restore-point and 6 reflection rows: seconds per
#      decision on the GPU;
#   4. `rir train sft` with the CPU recipe's config (configs/train/sft_controller_cpu.yaml) moved to the GPU, the
#      packaged model's shape: the CPU recipe's 60 steps, to compare with ~24 s per step on two cores.
# Steps 1-3 took about 10 minutes on one H200 (docs/results.md, "GPU check of the controller recipe").
# Writes to <out-folder>: versions.txt, mem.csv (GPU memory every 0.5 s), trainer_state_{sft,dpo,sft_135m}.json,
# controller_eval.json and log.txt.
set -euo pipefail
tok=$1 data=$2 out=$3
source "$(dirname "$0")/gpu_lib.sh"
log_to_out
if [[ "${QUICK:-0}" == 1 ]]; then
  shape05=tiny shape135=tiny gpu=(--use_cpu true --bf16 false) launcher=(--launcher python) dpo_steps=2
  q05_extra=(--max_steps 2 --use_cpu true --bf16 false --per_device_train_batch_size 2 --per_device_eval_batch_size 2
             --max_eval_samples 4 --eval_on_start false --save_steps 2)
  cpu_steps=(--max_steps 2 --save_steps 2) eval_rows=(--max_rows 4 --max_reflect_rows 1)
else
  shape05=0.5b shape135=same gpu=(--use_cpu false --bf16 true) dpo_steps=${DPO_STEPS:-20} q05_extra=()
  launcher=(--launcher accelerate --accelerate-config configs/accelerate/single_gpu.yaml)
  cpu_steps=() eval_rows=(--max_rows 40 --max_reflect_rows 6)
  sample_gpu_memory
fi
write_versions

stamp "1. controller sft, Qwen2.5-0.5B config, accelerate launch"
python3 bench/random_model.py --tokenizer "$tok" --shape "$shape05" --out /tmp/q05
SECONDS=0
rir train sft "${launcher[@]}" --config configs/train/sft_qwen2.5-0.5b.yaml --model /tmp/q05 --data "$data" \
  --output_dir /tmp/runs/sft-q05 "${q05_extra[@]}"
stamp "1. done in ${SECONDS}s"
last_state /tmp/runs/sft-q05 "$out/trainer_state_sft.json"

stamp "2. controller dpo, Qwen2.5-0.5B config, accelerate launch, ${dpo_steps} steps"
SECONDS=0
rir train dpo "${launcher[@]}" --config configs/train/dpo_qwen2.5-0.5b.yaml --sft_adapter /tmp/runs/sft-q05 \
  --data "$data" --output_dir /tmp/runs/dpo-q05 "${q05_extra[@]}" --max_steps "$dpo_steps" --save_steps "$dpo_steps"
stamp "2. done in ${SECONDS}s"
last_state /tmp/runs/dpo-q05 "$out/trainer_state_dpo.json"

stamp "3. eval-controller of the step-1 adapter"
SECONDS=0
rir eval-controller --data "$data" --controller tuned:/tmp/runs/sft-q05 "${eval_rows[@]}" --out /tmp/eval-q05
stamp "3. done in ${SECONDS}s"
cp /tmp/eval-q05/controller_eval.json "$out/controller_eval.json"

stamp "4. controller sft, the CPU recipe's config on the GPU, packaged shape"
python3 bench/random_model.py --tokenizer "$tok" --shape "$shape135" --out /tmp/m135
SECONDS=0
rir train sft --config configs/train/sft_controller_cpu.yaml --model /tmp/m135 --data "$data" \
  --output_dir /tmp/runs/sft-135m "${gpu[@]}" "${cpu_steps[@]}"
stamp "4. done in ${SECONDS}s"
last_state /tmp/runs/sft-135m "$out/trainer_state_sft_135m.json"
