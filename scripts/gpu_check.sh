#!/usr/bin/env bash
# On a GPU machine without network: installs the wheels of
# scripts/wheelhouse.sh into a private target, then runs the GPU tests and
# the GPU benchmark, writing everything under OUTDIR.
#   scripts/gpu_check.sh OUTDIR [WHEELDIR]      (WHEELDIR default: .whl)
# Uses the machine's python3 (NumPy 2, CuPy 14, pytest) through a private
# environment that sees its packages; PYTHON= to choose another.
# Files: env.txt (stack, CUDA availability), tests.txt (pytest -m gpu -rs),
# bench_gpu.txt and bench_gpu.json (scripts/bench_gpu.py; its options in
# BENCH_ARGS). GPU_TESTS=no runs the benchmark alone, GPU_BENCH=no the
# tests alone; GPU_TEST_PATHS (default tests) and PYTEST_ARGS narrow them.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: scripts/gpu_check.sh OUTDIR [WHEELDIR]" >&2; exit 2; }
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
WHEELS=${2:-.whl}
PY=${PYTHON:-python3}
# A private environment over the machine's packages (NumPy, CuPy, ...):
# only the wheels go into it, and the start-up hook of _chainer_compat.
ENV=${GPU_ENV:-$(mktemp -d)/env}   # GPU_ENV= to keep it for later commands
"$PY" -m venv --system-site-packages --without-pip "$ENV" || exit 1
"$PY" -m pip --python "$ENV/bin/python" install -q --no-index --no-deps \
  --no-compile "$WHEELS"/*.whl \
  || { echo "gpu_check.sh: installing $WHEELS failed" >&2; exit 1; }
# The machine's python3 may itself be a virtual environment, whose packages
# --system-site-packages does not reach: name its package folders too.
"$PY" -c 'import site; print("\n".join(site.getsitepackages()))' \
  > "$("$ENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/machine_packages.pth"
PY="$ENV/bin/python"
"$PY" ada_loss/_chainer_compat.py --write-startup-hook || exit 1
export PYTHONUNBUFFERED=1
# the checkout itself, not a wheel of it, is what runs
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
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
if [ "${GPU_TESTS:-yes}" != no ]; then
  # PYTEST_ARGS, e.g. "-n 8 --dist loadfile" (pytest-xdist, where the
  # machine has it); a test failing there is run again on its own below
  # shell word splitting of PYTEST_ARGS is wanted
  # shellcheck disable=SC2086
  "$PY" -m pytest -p no:cacheprovider -m gpu -rfEs -q ${PYTEST_ARGS:-} ${GPU_TEST_PATHS:-tests} \
    2>&1 | tee "$OUT/tests.txt"
  if [ "${PIPESTATUS[0]}" -ne 0 ]; then
    failed=$(grep -oE '^(FAILED|ERROR) tests/[^ ]+' "$OUT/tests.txt" \
      | awk '{print $2}' | sort -u)
    if [ -n "${PYTEST_ARGS:-}" ] && [ -n "$failed" ]; then
      echo "=== the failed tests again, one process ===" \
        | tee -a "$OUT/tests.txt"
      # shellcheck disable=SC2086
      "$PY" -m pytest -p no:cacheprovider -rs -q $failed 2>&1 \
        | tee -a "$OUT/tests.txt"
    fi
    rc=1
  fi
fi
if [ "${GPU_BENCH:-yes}" != no ]; then
  "$PY" scripts/bench_gpu.py --json "$OUT/bench_gpu.json" ${BENCH_ARGS:-} 2>&1 \
    | tee "$OUT/bench_gpu.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
exit $rc
