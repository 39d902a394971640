#!/usr/bin/env bash
# The fifth round's second device call: the recipe cells alone (grad=loss
# adaptive against the recipe's own gradient scaling, mode none) on seeds
# 0 and 1, two processes each, results written under OUT and packed.
#   benchmarks/gpu_h100/round5/call2.sh OUT LIMIT_S [SEEDS]
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=$1; LIMIT=$2; SEEDS=${3:-[0,1]}
GPU_TESTS=no GPU_BENCH=no GPU_ENV=/tmp/genv scripts/gpu_check.sh "$OUT" .whl \
  > "$OUT/setup.txt" 2>&1
PY=/tmp/genv/bin/python
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
common=(--config configs/depth_study_gpu.yaml --out "$OUT/r"
  --set data.fashion_mnist_root=.data/fashion-mnist --set train.epochs=1
  --set 'train.lr_steps=[0.75]' --set "grid.seeds=$SEEDS"
  --set study.fp32=false --set 'grid.fixed_scales=[]')
timeout --signal=INT --kill-after=10 "$LIMIT" "$PY" experiments/depth_study.py \
  "${common[@]}" --no-table --jobs 2 \
  --set 'grid.precisions=["fp8_e4m3:recipe=current,grad=loss"]' \
  --set 'grid.modes=[adaptive]' > "$OUT/grid_gradloss.log" 2>&1 &
timeout --signal=INT --kill-after=10 "$LIMIT" "$PY" experiments/depth_study.py \
  "${common[@]}" --no-table --jobs 2 \
  --set 'grid.precisions=["fp8_e4m3:recipe=current"]' \
  --set 'grid.modes=[none]' > "$OUT/grid_recipe.log" 2>&1 &
wait
"$PY" experiments/depth_study.py "${common[@]}" --table-only \
  --set 'grid.precisions=["fp8_e4m3:recipe=current,grad=loss","fp8_e4m3:recipe=current"]' \
  --set 'grid.modes=[none,adaptive]' > "$OUT/tables.txt" 2>&1
tar czf "$OUT/r.tgz" --exclude='snapshot*' -C "$OUT" r && rm -rf "$OUT/r"
