#!/usr/bin/env bash
# The CPU counterpart of the fifth round's recipe cells (same config as the
# device's, --set device=@numpy), tabulated from the runs kept here:
#   benchmarks/gpu_h100/round5/cpu_check/tables.sh
# Trained by (per seed S; each run ~18-20 min of one core):
#   python experiments/depth_study.py --config configs/depth_study_gpu.yaml --out results/cpu5 \
#     --set device=@numpy --set data.fashion_mnist_root=.data/fashion-mnist --set train.epochs=1 \
#     --set 'train.lr_steps=[0.75]' --set study.fp32=false --set 'grid.fixed_scales=[]' --jobs 1 \
#     --set 'grid.seeds=[S]' --set 'grid.precisions=["fp8_e4m3:recipe=current,grad=loss"]' \
#     --set 'grid.modes=[adaptive,"adaptive:init_scale=amax"]'     # and recipe=current with mode none
set -euo pipefail
cd "$(dirname "$0")"
R=$(cd ../../../.. && pwd)
PY=${PYTHON:-python}
"$PY" "$R/experiments/depth_study.py" --config "$R/configs/depth_study_gpu.yaml" \
  --out . --table-only --set device=@numpy --set train.epochs=1 \
  --set 'train.lr_steps=[0.75]' --set 'grid.seeds=[0,1,2,3]' --set study.fp32=false \
  --set 'grid.fixed_scales=[]' \
  --set 'grid.precisions=["fp8_e4m3:recipe=current,grad=loss","fp8_e4m3:recipe=current"]' \
  --set 'grid.modes=[none,adaptive,"adaptive:init_scale=amax"]'
