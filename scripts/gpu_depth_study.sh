#!/usr/bin/env bash
# The depth study's FP8 cells on one GPU (configs/depth_study_gpu.yaml), as
# three grids side by side: the runs are host-bound, so N processes train N
# runs at a time on the one GPU.
#   scripts/gpu_depth_study.sh OUT [LIMIT_S] [--set K=V ...]
# OUT: the results folder (resumable: finished runs are skipped, --resume
# continues the rest); LIMIT_S: stop the grids after this many seconds
# (an interrupt, then a kill 15 s later: the runner's workers finish their
# current run on an interrupt, which can take minutes; snapshots are written
# atomically, so a killed run resumes from its last one; timeout signals
# the grid's whole process group, its workers included); then the tables
# of every finished run. Each grid's log is in OUT as it runs. JOBS_A (fp8_e4m3: FP32, fixed scales, adaptive), JOBS_B
# (grad=loss adaptive), JOBS_C (recipe=current) set the processes of each.
# PYTHON: the interpreter (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: scripts/gpu_depth_study.sh OUT [LIMIT_S] [--set K=V ...]" >&2; exit 2; }
OUT=$1; shift
# LIMIT_S is optional: only a number is taken as one (OUT --set K=V ... keeps
# its overrides)
LIMIT=0
if [ $# -ge 1 ] && [[ $1 =~ ^[0-9]+$ ]]; then LIMIT=$1; shift; fi
PY=${PYTHON:-python3}
run() {  # $1 jobs, $2 log name, rest: --set overrides
  local jobs=$1 log=$2; shift 2
  if [ "$LIMIT" -gt 0 ]; then
    timeout --signal=INT --kill-after=15 "$LIMIT" "$PY" experiments/depth_study.py \
      --config configs/depth_study_gpu.yaml --out "$OUT" --resume --no-table \
      --jobs "$jobs" "$@" > "$OUT/$log.log" 2>&1
  else
    "$PY" experiments/depth_study.py --config configs/depth_study_gpu.yaml \
      --out "$OUT" --resume --no-table --jobs "$jobs" "$@" > "$OUT/$log.log" 2>&1
  fi
}
mkdir -p "$OUT"
start=$(date +%s)
run "${JOBS_A:-8}" grid_fp8 --set 'grid.precisions=[fp8_e4m3]' \
  --set 'grid.modes=[adaptive]' "$@" &
run "${JOBS_B:-2}" grid_gradloss --set study.fp32=false \
  --set 'grid.precisions=["fp8_e4m3:recipe=current,grad=loss"]' \
  --set 'grid.modes=[adaptive]' --set 'grid.fixed_scales=[]' "$@" &
run "${JOBS_C:-2}" grid_recipe --set study.fp32=false \
  --set 'grid.precisions=["fp8_e4m3:recipe=current"]' \
  --set 'grid.modes=[none]' --set 'grid.fixed_scales=[]' "$@" &
wait
echo "grids: $(( $(date +%s) - start )) s"
tail -n 3 "$OUT"/grid_*.log
"$PY" experiments/depth_study.py --config configs/depth_study_gpu.yaml \
  --out "$OUT" --table-only "$@" 2>&1 | tee "$OUT/tables.txt"
