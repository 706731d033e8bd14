#!/usr/bin/env bash
# A prepared serving check for a CUDA machine (docs/serving.md): the default demo trained there
# from an empty cache, then the load benchmark (continuous batching against one request at a time
# and static batching, 1-64 clients) and the ceiling benchmark on its checkpoint, on the GPU.
#
#   bash benchmarks/gpu_serving.sh                 # on the GPU (about 10 minutes with the toy LMs)
#   SERVE_QUICK=1 bash benchmarks/gpu_serving.sh   # the plumbing, on a CPU (the quick demo)
#
# Env: SERVE_DIR (work folder, default a new temporary one; its results: serve_load.json and
# serve_ceiling.json), ELFREG_CACHE (default SERVE_DIR/cache).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${SERVE_DIR:-$(mktemp -d /tmp/elfreg-gpu-serving-XXXX)}
export ELFREG_CACHE=${ELFREG_CACHE:-$dir/cache}
if [ "${SERVE_QUICK:-0}" = "1" ]; then
  device=cpu; demo=(--quick); load=(--clients 1,2 --requests 1 --nfe 4); ceiling=(--requests 2 --rows 2 --nfe 4 --repeats 2)
else
  device=cuda; demo=(); load=(--clients 1,4,16,64 --requests 8 --nfe 16); ceiling=(--requests 64 --rows 16 --nfe 16)
fi
start=$(date +%s)
elfreg demo "${demo[@]}" --out "$dir/demo" --no-progress train.device=$device >"$dir/demo.log" 2>&1
echo "demo trained in $(( $(date +%s) - start )) s (log: $dir/demo.log)"
python benchmarks/serve_load.py --checkpoint "$dir/demo/elf-reg" --device $device "${load[@]}" \
  --out "$dir/serve_load.json"
python benchmarks/serve_ceiling.py --checkpoint "$dir/demo/elf-reg" --device $device "${ceiling[@]}" \
  --out "$dir/serve_ceiling.json"
echo "results: $dir/serve_load.json $dir/serve_ceiling.json"
