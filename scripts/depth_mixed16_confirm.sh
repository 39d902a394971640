#!/usr/bin/env bash
# Issue 32, the mixed16 cells on new seeds (docs/depth_study.md, "Ninth
# cell"): adaptive and the fixed scales chosen on seeds 0-7 (S = 4 at depth
# 56, S = 16 at depth 110), retrained on seeds 8-15, then
#   1. the confirmation: adaptive against the scale chosen on seeds 0-7
#      (study.choose_fixed_on), scored on seeds 8-15 only;
#   2. all sixteen seeds pooled: the runs of both grids gathered (hard
#      links) into OUT/mixed16_pooled, the scale chosen on the other seeds —
#      exploratory (issue 47): the candidate scales (4, 16) were picked on
#      seeds 0-7, which the pool contains; the confirmation is step 1.
#   scripts/depth_mixed16_confirm.sh [OUT]    (default results/depth3;
#   trains what is missing of step 1's grid, then prints the tables)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/depth3}
PY=${PYTHON:-python}
NEW='[8,9,10,11,12,13,14,15]'
COMMON=(--set 'grid.precisions=[mixed16]' --set 'grid.modes=[adaptive]'
        --set study.fp32=false --set study.fig4.run=false --set "study.reuse=''")
"$PY" experiments/depth_study.py --out "$OUT" --jobs 1 --no-table \
  --set table=depth_mixed16_replicate --set 'grid.models=[resnet56]' \
  --set 'grid.fixed_scales=[4,16]' --set "grid.seeds=$NEW" "${COMMON[@]}"
"$PY" experiments/depth_study.py --out "$OUT" --jobs 1 --no-table \
  --set table=depth_mixed16_replicate --set 'grid.models=[resnet110]' \
  --set 'grid.fixed_scales=[16]' --set "grid.seeds=$NEW" "${COMMON[@]}"
echo '## 1. Confirmation on seeds 8-15 (scales chosen on seeds 0-7)'
"$PY" experiments/depth_study.py --out "$OUT" --table-only \
  --set table=depth_mixed16_replicate --set 'grid.models=[resnet56,resnet110]' \
  --set 'grid.fixed_scales=[4,16]' --set "grid.seeds=$NEW" "${COMMON[@]}" \
  --set study.choose_fixed_on=benchmarks/fp8_diagnosis/depth_grid3/third/results.json
# 2. pooled: seeds 0-7 from the second and sixth cells, 8-15 from above
P=$OUT/mixed16_pooled
rm -rf "$P"; mkdir -p "$P/mixed16"
for src in depth_mixed16_110 depth_mixed16_20_56 depth_mixed16_replicate; do
  # the scales trained on all sixteen seeds: 4 and 16 at depth 56, 16 at 110
  for run in "$OUT/$src"/mixed16/resnet56-*-{adaptive,fixed_4,fixed_16}-s*/ \
             "$OUT/$src"/mixed16/resnet110-*-{adaptive,fixed_16}-s*/; do
    [ -d "$run" ] || continue
    r=$(basename "$run")
    [ -e "$P/mixed16/$r" ] || cp -al "$run" "$P/mixed16/$r"
  done
done
echo '## 2. All sixteen seeds (the scale chosen on the other fifteen) — exploratory: the candidate scales were picked on seeds 0-7, which it contains'
"$PY" experiments/depth_study.py --out "$OUT" --table-only \
  --set table=mixed16_pooled --set 'grid.models=[resnet56,resnet110]' \
  --set 'grid.fixed_scales=[4,16]' \
  --set 'grid.seeds=[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]' "${COMMON[@]}"
echo '## 3. The fixed scales and adaptive against each other at depth 56: seeds 8-15, then all sixteen (exploratory)'
for r in "$OUT/depth_mixed16_replicate/results.json" "$P/results.json"; do
  "$PY" scripts/paired_cells.py "$r" 'mixed16|resnet56|fixed:4' \
    'mixed16|resnet56|fixed:16' 'mixed16|resnet56|adaptive'
done
echo '## 4. Seeds 0-7 (the third edition): adaptive against every fixed scale, depth 56'
"$PY" scripts/paired_cells.py benchmarks/fp8_diagnosis/depth_grid3/third/results.json \
  'mixed16|resnet56|adaptive' 'mixed16|resnet56|fixed:4' 'mixed16|resnet56|fixed:16' \
  'mixed16|resnet56|fixed:64' 'mixed16|resnet56|fixed:256' 'float32|resnet56|fp32'
