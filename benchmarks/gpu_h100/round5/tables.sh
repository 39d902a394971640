#!/usr/bin/env bash
# The fifth round's depth-study table over its three device calls: the
# finished runs of call1 (FP32 and fp8_e4m3, seeds 0-3) and of call2/call3
# (the recipe cells, seeds 0-1 and 2-3) gathered into one results folder
# (hard links) and tabulated on the CPU (nothing is trained).
#   benchmarks/gpu_h100/round5/tables.sh [OUT]    (default results/gpu5_all)
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=benchmarks/gpu_h100/round5
OUT=${1:-results/gpu5_all}
PY=${PYTHON:-python}
rm -rf "$OUT"; mkdir -p "$OUT/depth_gpu"
cp -al "$R/call1/depth_gpu/float32" "$R/call1/depth_gpu/fp8_e4m3" "$OUT/depth_gpu/"
for p in "fp8_e4m3:recipe=current" "fp8_e4m3:recipe=current,grad=loss"; do
  mkdir -p "$OUT/depth_gpu/$p"
  cp -al "$R/call2/depth_gpu/$p/"* "$R/call3/depth_gpu/$p/"* "$OUT/depth_gpu/$p/"
done
"$PY" experiments/depth_study.py --config configs/depth_study_gpu.yaml \
  --out "$OUT" --table-only --set device=@numpy --set train.epochs=1 \
  --set 'train.lr_steps=[0.75]' --set 'grid.seeds=[0,1,2,3]' \
  --set 'grid.modes=[none,adaptive]'
