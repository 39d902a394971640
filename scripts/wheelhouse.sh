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
# the GPU machine this project uses has them all. Also, as binary wheels
# for the target (manylinux x86_64), the GPU extras of issue 46 that its
# image lacks (GPU_WHEELS, default below; GPU_WHEELS= for none):
#   nvidia-cudnn-frontend 1.16.0  cuDNN's graph API (conv fprop/dgrad/wgrad)
#                                 over the image's nvidia-cudnn-cu13; 1.9 MB,
#                                 no requirements (1.17+ require
#                                 nvidia-cutlass-dsl and apache-tvm-ffi:
#                                 1.32.0 alone is 11.6 MB)
#   nvmath-python 1.0.0           cuBLASLt matmul with FP8 scales; 5.3 MB;
#                                 needs cuda-bindings, cuda-core>=0.5,
#                                 cuda-pathfinder>=1.5.1, numpy (the image
#                                 has them)
# 7.2 MB for the two, far inside the device tool's 64 MiB carry limit
# with chainer, chainercv and the project. Install there with
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
GPU_WHEELS=${GPU_WHEELS-nvidia-cudnn-frontend==1.16.0 nvmath-python==1.0.0}
# shellcheck disable=SC2086  (word splitting of GPU_WHEELS is wanted)
for req in "$@" $GPU_WHEELS; do
  "$VPY" -m pip download -q --no-deps --only-binary=:all: \
    --python-version "$tag" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$OUT" "$req"
done
ls -l "$OUT"
