#!/usr/bin/env bash
# Creates a virtual environment in the checkout and installs ada_loss with the
# pinned dependencies (constraints.txt; NumPy 2). Safe to re-run: finishes in a
# second when everything is already in place.
#   ./scripts/install.sh                       core + test dependencies
#   ./scripts/install.sh mpi                   also mpi4py + Open MPI (ChainerMN)
#   PYTHON=python3.12 ./scripts/install.sh     another interpreter (>= 3.11):
#                                              .venv is rebuilt for it
#   VENV=.venv-py3.12 PYTHON=... ./scripts/install.sh   a second environment
# Without PYTHON, an existing environment keeps its interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${VENV:-$ROOT/.venv}
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
STAMP="$VENV/.ada_loss_installed"
EXTRAS=${1:-}
C="$ROOT/constraints.txt"
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
elif [ -x "$VENV/bin/python" ]; then
  PY="$VENV/bin/python"
else
  PY=python3
fi
"$PY" -c 'import sys; assert sys.version_info[:2] >= (3, 11), "ada_loss needs Python >= 3.11, got " + sys.version' \
  || { echo "install.sh: $PY is not a usable interpreter (Python >= 3.11 needed)" >&2; exit 1; }
pyver=$("$PY" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')

want="$(sha256sum "$C" setup.py "$0" | sha256sum | cut -c1-16) py$pyver $EXTRAS"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi

if [ -x "$VENV/bin/python" ] && \
   [ "$("$VENV/bin/python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')" != "$pyver" ]; then
  echo "[install] $VENV holds another Python; rebuilding it for Python $pyver"
  rm -rf "$VENV"
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
PIP=("$VPY" -m pip install -q -c "$C")

echo "[install] Python $pyver in $VENV: build tools and NumPy 2"
"${PIP[@]}" setuptools wheel Cython numpy

echo "[install] chainer 7.8.1 (its setup.py needs pkg_resources: no build isolation)"
"${PIP[@]}" --no-build-isolation chainer

if ! "$VPY" -c 'import chainercv.utils.bbox._nms_gpu_post' 2>/dev/null; then
  echo "[install] chainercv 0.13.1, its Cython extension rebuilt from the .pyx of 0.8.0"
  whl=$(mktemp -d)
  ./scripts/build_chainercv.sh "$VPY" "$whl"
  "${PIP[@]}" --no-deps "$whl"/chainercv-*.whl
  rm -rf "$whl"
fi

echo "[install] ada_loss and its dependencies"
"${PIP[@]}" --no-build-isolation -e ".[test${EXTRAS:+,$EXTRAS}]"
# So that a program importing chainer before ada_loss gets the same patches.
"$VPY" ada_loss/_chainer_compat.py --write-startup-hook

"$VPY" -c 'import ada_loss, chainer, chainercv, numpy, sys; print("[install] ok: Python %s, NumPy %s, chainer %s, chainercv %s" % (sys.version.split()[0], numpy.__version__, chainer.__version__, chainercv.__version__))'
echo "$want" > "$STAMP"
