#!/usr/bin/env bash
# Mini reproduction of Table 1 of "Adaptive Loss Scaling for Mixed Precision
# Training" (§4.1) on CPU, on data that needs no download: installs the
# project if needed, then trains ResNet-8 on 16x16 digits with FP32, mixed16
# without scaling, fixed scales {16, 1024, 16384}, dynamic and adaptive loss
# scaling (2 seeds), prints the table in the paper's layout and saves a plot
# of the per-layer adaptive loss scales. About 4 minutes on 2 idle cores.
#   ./scripts/demo.sh                      # results in results/mini/
#   ./scripts/demo.sh --out /tmp/r --jobs 1 --set train.epochs=4
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
exec .venv/bin/python experiments/mini_repro.py "$@"
