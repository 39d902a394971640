#!/usr/bin/env bash
# One device call of issue 35's fifth round (docs/gpu.md): the private
# environment, the GPU tests of the code the last CPU-side change touched
# (beside the grid, niced), then the depth study's FP8 E4M3 cells
# (configs/depth_study_gpu.yaml) at one epoch of full Fashion-MNIST.
# The runs live in results/gpu5 of the device's checkout, which a warm
# machine keeps between calls, so a second call resumes them; everything
# but the snapshots is packed into OUT at the end.
#   benchmarks/gpu_h100/round5/call.sh OUT LIMIT_S [SEEDS] [TESTS=yes|no]
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=$1; LIMIT=$2; SEEDS=${3:-[0,1,2,3,4,5]}; TESTS=${4:-yes}
GPU_TESTS=no GPU_BENCH=no GPU_ENV=/tmp/genv scripts/gpu_check.sh "$OUT" .whl \
  > "$OUT/setup.txt" 2>&1
PY=/tmp/genv/bin/python
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
if [ "$TESTS" = yes ]; then
  nice -n 10 "$PY" -m pytest -p no:cacheprovider -m gpu -rfEs -q -n 2 \
    tests/adaptive/test_ada_gpu.py tests/adaptive/test_guard_gpu.py \
    tests/experiment/test_device_runs_gpu.py > "$OUT/tests.txt" 2>&1 &
fi
start=$(date +%s)
JOBS_A=${JOBS_A:-10} JOBS_B=${JOBS_B:-2} JOBS_C=${JOBS_C:-2} PYTHON=$PY \
  scripts/gpu_depth_study.sh results/gpu5 "$LIMIT" \
  --set data.fashion_mnist_root=.data/fashion-mnist --set train.epochs=1 \
  --set 'train.lr_steps=[0.75]' --set "grid.seeds=$SEEDS" "${@:5}" \
  > "$OUT/grid.txt" 2>&1
echo "grid call: $(( $(date +%s) - start )) s" >> "$OUT/grid.txt"
wait
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$OUT/setup.txt" 2>&1
tar czf "$OUT/gpu5.tgz" --exclude='snapshot*' results/gpu5
