#!/usr/bin/env bash
# One device call for issue 46 item 1 (CUDA graph replay of the training
# step): installs the wheelhouse, runs the graph GPU tests, then the
# benchmark -- ResNet-110 b128 mixed16, fixed:128 and adaptive, eager vs
# replay (scripts/bench_graph.py) beside PyTorch AMP on the same GPU
# (scripts/bench_torch_peer.py) -- writing everything under OUTDIR as it
# finishes (a call cut off at its limit still returns what is done).
#   scripts/gpu_graph_check.sh OUTDIR [WHEELDIR]    (WHEELDIR default: .whl)
# Files: env.txt, graph_tests.txt, bench_graph.{txt,json},
# bench_torch_peer.{txt,json}, summary.txt. Budget (a 10-minute call):
# tests ~3 min (timeout GRAPH_TEST_TIMEOUT, 240 s), benchmarks ~4 min.
# The device tool's call (15 device minutes per session; one command):
#   run(command="OUT=$OUT scripts/gpu_graph_check.sh $OUT .whl",
#       carry=[".whl"], timeout_s=600)
# after, here: scripts/wheelhouse.sh .whl (see its header: the cuDNN
# frontend and nvmath wheels are in its default extras).
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: scripts/gpu_graph_check.sh OUTDIR [WHEELDIR]" >&2; exit 2; }
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
WHEELS=${2:-.whl}
PY=${PYTHON:-python3}
ENV=$(mktemp -d)/env
"$PY" -m venv --system-site-packages --without-pip "$ENV" || exit 1
"$PY" -m pip --python "$ENV/bin/python" install -q --no-index --no-deps \
  --no-compile "$WHEELS"/*.whl \
  || { echo "gpu_graph_check.sh: installing $WHEELS failed" >&2; exit 1; }
"$PY" -c 'import site; print("\n".join(site.getsitepackages()))' \
  > "$("$ENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/machine_packages.pth"
TORCH_PY=$PY                 # the machine's own Python holds PyTorch
PY="$ENV/bin/python"
"$PY" ada_loss/_chainer_compat.py --write-startup-hook || exit 1
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
rc=0
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  "$PY" -c 'import sys, numpy, cupy, chainer, ada_loss
print("python", sys.version.split()[0], "numpy", numpy.__version__,
      "cupy", cupy.__version__, "chainer", chainer.__version__)
for name in ("cudnn", "nvmath"):
    try:
        m = __import__(name); print(name, getattr(m, "__version__", "?"))
    except Exception as e:
        print(name, "not importable:", type(e).__name__, e)'
} 2>&1 | tee "$OUT/env.txt" || rc=1
timeout "${GRAPH_TEST_TIMEOUT:-240}" "$PY" -m pytest -p no:cacheprovider \
  -m gpu -rfEs -q -x --timeout 120 \
  tests/training/test_cuda_graph_gpu.py 2>&1 | tee "$OUT/graph_tests.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
timeout 200 "$PY" scripts/bench_graph.py --json "$OUT/bench_graph.json" \
  ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_graph.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
timeout 120 "$TORCH_PY" scripts/bench_torch_peer.py --models resnet110 \
  --json "$OUT/bench_torch_peer.json" 2>&1 | tee "$OUT/bench_torch_peer.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
"$PY" - "$OUT" <<'PY' 2>&1 | tee "$OUT/summary.txt"
import json, os, sys
out = sys.argv[1]
try:
    g = json.load(open(os.path.join(out, 'bench_graph.json')))
    t = json.load(open(os.path.join(out, 'bench_torch_peer.json')))
except Exception as e:
    sys.exit('no summary: {}'.format(e))
amp = [r for r in t['rows'] if r['model'] == 'resnet110'
       and r['precision'] == 'amp_fp16'][0]['images_per_second']
print('GPU', g['gpu'], '| PyTorch AMP ResNet-110 b128: {:.0f} images/s'
      .format(amp))
for r in g['rows']:
    print('{mode:10s} {step:6s} {images_per_second:8.0f} images/s'.format(**r),
          '= {:.3f} x PyTorch AMP'.format(r['images_per_second'] / amp))
for k, v in g['ratios'].items():
    print(k, round(v, 3))
PY
exit $rc
