#!/usr/bin/env bash
# On a GPU machine without network: installs the wheels of
# scripts/wheelhouse.sh into a private target, then runs the GPU tests and
# the GPU benchmark, writing everything under OUTDIR.
#   scripts/gpu_check.sh OUTDIR [WHEELDIR]      (WHEELDIR default: .whl)
# Uses the machine's python3 (NumPy 2, CuPy 14, pytest); PYTHON= to choose.
# Files: env.txt (stack, CUDA availability), tests.txt (pytest -m gpu -rs),
# bench_gpu.txt and bench_gpu.json (scripts/bench_gpu.py).
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: scripts/gpu_check.sh OUTDIR [WHEELDIR]" >&2; exit 2; }
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
WHEELS=${2:-.whl}
PY=${PYTHON:-python3}
SITE=$(mktemp -d)/site
"$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" \
  "$WHEELS"/*.whl || { echo "gpu_check.sh: installing $WHEELS failed" >&2; exit 1; }
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
rc=0
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  "$PY" - <<'PY'
import sys, numpy, cupy
import ada_loss, chainer
from chainer.backends import cuda
print('python', sys.version.split()[0], 'numpy', numpy.__version__,
      'cupy', cupy.__version__, 'chainer', chainer.__version__)
print('chainer.backends.cuda.available', cuda.available,
      'cudnn_enabled', cuda.cudnn_enabled,
      '_resolution_error', repr(getattr(cuda, '_resolution_error', None)))
print('compatibility patches', ada_loss._chainer_compat.applied)
PY
} 2>&1 | tee "$OUT/env.txt" || rc=1
"$PY" -m pytest -p no:cacheprovider -m gpu -rs -q tests 2>&1 \
  | tee "$OUT/tests.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
"$PY" scripts/bench_gpu.py --json "$OUT/bench_gpu.json" ${BENCH_ARGS:-} 2>&1 \
  | tee "$OUT/bench_gpu.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
exit $rc
