#!/usr/bin/env bash
# A prepared check for a CUDA machine: ELF-REG-B shapes with randomly initialised frozen models of
# the Qwen3-0.6B/1.7B configs (no download), a few steps of DDP in bf16 on every visible GPU;
# prints step time, peak memory and MFU from the run's metrics.jsonl.
#
#   bash benchmarks/gpu_smoke.sh [STEPS] [extra key=value overrides ...]
#   SMOKE_TINY=1 bash benchmarks/gpu_smoke.sh 4 train.device=cpu   # the plumbing, on a CPU
#
# Env: SMOKE_DIR (work folder, default a new temporary one), SMOKE_GPUS (default: all visible),
# SMOKE_PEAK_TFLOPS (default 989, H100/H200 dense bf16), SMOKE_BATCH (global micro-batch, default 64).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
shift || true
dir=${SMOKE_DIR:-$(mktemp -d /tmp/elfreg-gpu-smoke-XXXX)}
gpus=${SMOKE_GPUS:-$(python -c 'import torch; print(max(torch.cuda.device_count(), 1))')}
tiny=()
precision=bf16
if [ "${SMOKE_TINY:-0}" = "1" ]; then tiny=(--tiny); precision=fp32; fi
python benchmarks/gpu_smoke_assets.py "$dir/assets" "${tiny[@]}" >/dev/null
log_every=$(( steps < 5 ? 1 : 5 ))
start=$(date +%s)
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} torchrun --standalone --nproc_per_node "$gpus" --no-python elfreg train \
  --config "$dir/assets/config.yaml" train.parallel=ddp train.precision=$precision train.steps="$steps" \
  train.warmup_steps=1 train.batch_size="${SMOKE_BATCH:-64}" train.log_every=$log_every train.ckpt_every=100000 \
  train.out_dir="$dir/run" train.progress=false train.peak_tflops="${SMOKE_PEAK_TFLOPS:-989}" "$@"
echo "wall: $(( $(date +%s) - start )) s for $steps steps on $gpus rank(s) (start-up included)"
python - "$dir/run/metrics.jsonl" "$gpus" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
last = rows[-1]  # averages since the loop started (the first step includes warm-up)
canvas_tokens = None
print(f"steps logged: {len(rows)} ({rows[0]['step']} to {rows[-1]['step']})")
print(f"tokens/s {last['tokens_per_s']:.0f} (without padding {last['real_tokens_per_s']:.0f}) over {sys.argv[2]} rank(s)")
print(f"step time {last['step_seconds']:.3f} s; peak memory {last.get('peak_memory_gb', float('nan')):.2f} GB per GPU")
print(f"model TFLOP/s per GPU {last['tflops_per_device']:.1f}; MFU {last['mfu']:.1%}")
print("FLOPs per canvas token (GFLOP): " + ", ".join(
    f"{k.split('.', 1)[1]} {v / 1e9:.3f}" for k, v in last.items() if k.startswith("flops_per_token.")))
PY
