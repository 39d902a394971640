#!/usr/bin/env bash
# Builds a folder of wheels for a machine without network (a GPU node):
# chainer 7.8.1 and chainercv 0.13.1 compiled for the target Python, the
# project itself, and any further packages the target lacks.
#   scripts/wheelhouse.sh OUTDIR                      # for python3.12
#   PYTHON=python3.11 scripts/wheelhouse.sh OUTDIR
#   scripts/wheelhouse.sh OUTDIR mpi4py==4.1.1 ...    # also these, as binary
#                                                     # wheels for the target
# The target needs NumPy 2, SciPy, PyYAML, matplotlib, scikit-learn, Pillow,
# ml_dtypes, filelock, protobuf, six, typing_extensions (and CuPy for a GPU);
# the GPU machine this project uses has them all. Install there with
#   pip install --no-index --no-deps --target DIR OUTDIR/*.whl
# and put DIR on PYTHONPATH (scripts/gpu_check.sh does this).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: scripts/wheelhouse.sh OUTDIR [NAME==VERSION ...]" >&2; exit 2; }
OUT=$(mkdir -p "$1" && cd "$1" && pwd); shift
PY=${PYTHON:-python3.12}
if ! "$PY" -c '' 2>/dev/null; then
  for c in "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12; do
    [ -x "$c" ] && PY=$c && break
  done
fi
tag=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
# Build with the project's own environment for that interpreter.
VENV=".venv-py$tag" PYTHON="$PY" ./scripts/install.sh
VPY=".venv-py$tag/bin/python"
echo "[wheelhouse] Python $tag -> $OUT"
"$VPY" -m pip wheel -q --no-deps --no-build-isolation -c constraints.txt -w "$OUT" chainer==7.8.1
./scripts/build_chainercv.sh "$VPY" "$OUT"
"$VPY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" .
for req in "$@"; do
  "$VPY" -m pip download -q --no-deps --only-binary=:all: -d "$OUT" "$req"
done
ls -l "$OUT"
