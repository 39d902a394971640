#!/usr/bin/env bash
# Issue 47: the third edition's tables and the mixed16 confirmation
# re-printed by today's table code from their committed results.json (their
# run folders were not committed, so each run's config is unverified, as the
# tables say): the paired differences both ways (pairs with a diverged side
# dropped; diverged runs scored at chance, the verdict's), Holm's verdict
# beside the raw one, the held-out scale's own collapse rate, and which
# images chose the held-out scale (the test images: those runs recorded no
# selection split).
#   scripts/depth_audit_tables.sh [OUT]     (default benchmarks/fp8_diagnosis/depth_grid3)
set -euo pipefail
cd "$(dirname "$0")/.."
B=benchmarks/fp8_diagnosis/depth_grid3
OUT=${1:-$B}
PY=${PYTHON:-python}
"$PY" experiments/depth_study.py --config "$B/third/config.yaml" --out "$OUT" \
  --table-only --set table=third_audit --set study.fig4.run=false \
  --set "study.runs_from=$B/third/results.json" > /dev/null
"$PY" experiments/depth_study.py --out "$OUT" --table-only \
  --set table=mixed16_confirm_audit --set 'grid.models=[resnet56,resnet110]' \
  --set 'grid.fixed_scales=[4,16]' --set 'grid.seeds=[8,9,10,11,12,13,14,15]' \
  --set 'grid.precisions=[mixed16]' --set 'grid.modes=[adaptive]' \
  --set study.fp32=false --set study.fig4.run=false --set "study.reuse=''" \
  --set "study.runs_from=$B/mixed16_confirm/replicate_results.json" \
  --set "study.choose_fixed_on=$B/third/results.json" > /dev/null
echo "wrote $OUT/third_audit/ and $OUT/mixed16_confirm_audit/"
