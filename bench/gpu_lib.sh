# Helpers shared by the GPU check scripts (bench/gpu_check.sh, bench/gpu_controller_check.sh); source it.
# They write into "$out", which the sourcing script sets first.
rir() { python3 -m rir_runtime.cli "$@"; }
stamp() { echo "== $(date +%T) $*"; }
log_to_out() { mkdir -p "$out"; exec > >(tee "$out/log.txt") 2>&1; }  # all output, also to $out/log.txt
last_state() { cp "$(ls -d "$1"/checkpoint-* | sort -V | tail -1)/trainer_state.json" "$2"; }  # newest checkpoint

write_versions() {  # the GPU's name and the versions that decide the timings, to $out/versions.txt
  python3 - > "$out/versions.txt" <<'PY'
import importlib.metadata as md, torch
print("gpu:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
for d in ("torch", "transformers", "trl", "peft", "datasets", "accelerate", "pyarrow"):
    print(d, md.version(d))
PY
  cat "$out/versions.txt"
}

sample_gpu_memory() {  # whole-GPU memory every 0.5 s to $out/mem.csv, until the script exits
  nvidia-smi --query-gpu=timestamp,memory.used --format=csv -lms 500 > "$out/mem.csv" &
  trap 'kill %1' EXIT  # else the sampler holds the log pipe open after the script ends
}
