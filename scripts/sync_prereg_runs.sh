#!/usr/bin/env bash
# Copies the finished runs of the pre-registered grid (issue 47 item 5) from
# the folder it trains in into benchmarks/loss_gradient_prereg/, every file
# but the snapshots (the committed record of each run: config.yaml,
# run.json, log.csv, log, skips.csv, loss_scales.csv, scaling.txt), then
# prints the tables of the runs there (nothing trained).
#   scripts/sync_prereg_runs.sh SRC     (SRC: the --out folder of the grid)
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${1:?usage: scripts/sync_prereg_runs.sh SRC}
DST=benchmarks/loss_gradient_prereg
PY=${PYTHON:-python}
for run in "$SRC"/loss_gradient_prereg/*/*/; do
  [ -f "$run/run.json" ] || continue
  grep -q '"status": "finished"\|"status": "diverged"' "$run/run.json" || continue
  rel=${run#"$SRC"/}
  mkdir -p "$DST/$rel"
  for f in "$run"*; do
    case "$(basename "$f")" in snapshot_*) continue ;; esac
    cp -p "$f" "$DST/$rel"
  done
done
"$PY" experiments/depth_study.py --config configs/loss_gradient_prereg.yaml \
  --out "$DST" --table-only
