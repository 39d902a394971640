#!/usr/bin/env bash
# The depth study's third edition (issue 32; docs/depth_study.md): its cells
# were trained as separate grids, each under its own table name in one
# results folder; this gathers their runs into OUT/third (hard links: no
# copy, nothing retrained) and prints the tables over all of them.
#   scripts/depth_third_tables.sh [OUT]        (default results/depth3)
# Fixed scales under recipe=current are left out: the recipe divides a loss
# scale out exactly, each such run equals mode none (checked on 32 runs).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/depth3}
PY=${PYTHON:-python}
T=$OUT/third
rm -rf "$T"; mkdir -p "$T"
for src in depth_study depth_fp8_20 depth_mixed16_110 depth_fp8_110 \
           depth_mixed16_20_56 depth_modes_20_56 depth_recipes_20_56 depth_modes_110 \
           depth_mixed16_modes depth_amax_56 depth_none_110 depth_recipes_110 \
           depth_recipe_modes depth_none_20_56 depth_recipe_none_110 depth_recipe_fixed; do
  [ -d "$OUT/$src" ] || continue
  for prec in "$OUT/$src"/*/; do
    p=$(basename "$prec"); mkdir -p "$T/$p"
    for run in "$prec"*/; do
      [ -d "$run" ] || continue
      r=$(basename "$run")
      [ -e "$T/$p/$r" ] || cp -al "$run" "$T/$p/$r"
    done
  done
done
rm -rf "$T/fp8_e4m3:recipe=current/"*-fixed_*
"$PY" experiments/depth_study.py --out "$OUT" --table-only --set table=third \
  --set 'grid.models=[resnet20,resnet56,resnet110]' \
  --set 'grid.precisions=[fp8_e4m3,"fp8_e4m3:recipe=current,grad=loss","fp8_e4m3:recipe=current","fp8_e4m3:recipe=delayed",mxfp8,fp8,mixed16]' \
  --set 'grid.modes=[none,dynamic,adaptive,"adaptive:init_scale=amax",amax]' \
  --set 'grid.fixed_scales=[4,16,64,256]' --set 'grid.seeds=[0,1,2,3,4,5,6,7]' \
  --set study.fig4.run=false
