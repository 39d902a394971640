#!/usr/bin/env bash
# Builds a wheel of ChainerCV 0.13.1 for the interpreter PY into OUTDIR:
#   scripts/build_chainercv.sh PY OUTDIR
# PY must have numpy, Cython and setuptools (< 82) installed.
# The generated C file shipped in 0.13.1 does not compile on Python >= 3.11;
# the same extension's .pyx is only in the 0.8.0 sdist. Both are fetched by
# version and checked against these hashes. Its setup.py looks for NumPy's
# headers in numpy/core/include, which NumPy 2 moved: they are named for the
# compiler. Used by install.sh and wheelhouse.sh.
set -euo pipefail
PY=$1
OUT=$(mkdir -p "$2" && cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for v in 0.13.1 0.8.0; do
  "$PY" -m pip download -q --no-deps --no-binary :all: \
    --no-build-isolation -d "$work" "chainercv==$v"
done
(cd "$work" && sha256sum -c --quiet - <<'SUMS'
84214bd2fc191dacd73a95342ac45ded36232fc588825458752ec57df5e97ded  chainercv-0.13.1.tar.gz
2cc9c6a772b02fd81eee51c85a54a037d73bae2a8840c273cec449bfe0386f75  chainercv-0.8.0.tar.gz
SUMS
)
tar xzf "$work/chainercv-0.13.1.tar.gz" -C "$work"
tar xzf "$work/chainercv-0.8.0.tar.gz" -C "$work"
bbox="$work/chainercv-0.13.1/chainercv/utils/bbox"
cp "$work/chainercv-0.8.0/chainercv/utils/bbox/_nms_gpu_post.pyx" "$bbox/"
rm -f "$bbox/_nms_gpu_post.c"
C_INCLUDE_PATH="$("$PY" -c 'import numpy; print(numpy.get_include())')${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}" \
  "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" "$work/chainercv-0.13.1"
