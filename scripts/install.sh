#!/usr/bin/env bash
# Creates .venv in the checkout and installs ada_loss with pinned dependencies.
# Safe to re-run: finishes in a second when everything is already in place.
#   ./scripts/install.sh          core + test dependencies
#   ./scripts/install.sh mpi      also mpi4py + Open MPI (for ChainerMN)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
PY=${PYTHON:-python3}
STAMP="$VENV/.ada_loss_installed"
EXTRAS=${1:-}
C="$ROOT/constraints.txt"
export PIP_DISABLE_PIP_VERSION_CHECK=1

want="$(sha256sum "$C" setup.py | sha256sum | cut -c1-16) $EXTRAS"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi

"$PY" -c 'import sys; assert sys.version_info[:2] >= (3, 8), sys.version' 
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q -c "$C")

echo "[install] build tools (setuptools<74 is also a runtime pin of Chainer 7)"
"${PIP[@]}" setuptools wheel Cython numpy

echo "[install] chainer 7.8.1 (its setup.py needs pkg_resources: no build isolation)"
"${PIP[@]}" --no-build-isolation chainer

if ! "$VENV/bin/python" -c 'import chainercv.utils.bbox._nms_gpu_post' 2>/dev/null; then
  echo "[install] chainercv 0.13.1, its Cython extension rebuilt from the .pyx of 0.8.0"
  # The generated C file shipped in 0.13.1 does not compile on Python 3.11; the
  # same extension's .pyx is only in the 0.8.0 sdist. Both are fetched by version
  # and checked against these hashes.
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  for v in 0.13.1 0.8.0; do
    "$VENV/bin/python" -m pip download -q --no-deps --no-binary :all: \
      --no-build-isolation -d "$work" "chainercv==$v"
  done
  (cd "$work" && sha256sum -c - <<'SUMS'
84214bd2fc191dacd73a95342ac45ded36232fc588825458752ec57df5e97ded  chainercv-0.13.1.tar.gz
2cc9c6a772b02fd81eee51c85a54a037d73bae2a8840c273cec449bfe0386f75  chainercv-0.8.0.tar.gz
SUMS
  )
  tar xzf "$work/chainercv-0.13.1.tar.gz" -C "$work"
  tar xzf "$work/chainercv-0.8.0.tar.gz" -C "$work"
  bbox="$work/chainercv-0.13.1/chainercv/utils/bbox"
  cp "$work/chainercv-0.8.0/chainercv/utils/bbox/_nms_gpu_post.pyx" "$bbox/"
  rm -f "$bbox/_nms_gpu_post.c"
  "${PIP[@]}" --no-build-isolation "$work/chainercv-0.13.1"
fi

echo "[install] ada_loss and its dependencies"
"${PIP[@]}" --no-build-isolation -e ".[test${EXTRAS:+,$EXTRAS}]"

"$VENV/bin/python" -c 'import chainer, chainercv, ada_loss; print("[install] ok: chainer", chainer.__version__, "chainercv", chainercv.__version__)'
echo "$want" > "$STAMP"
