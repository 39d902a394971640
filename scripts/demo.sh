#!/usr/bin/env bash
# The demo, on CPU, on data that needs no download (scikit-learn's digits at
# 16x16, ResNet-8): installs the project if needed, then
#  1. the mini reproduction of Table 1 of "Adaptive Loss Scaling for Mixed
#     Precision Training" (§4.1) in mixed16: FP32, no scaling, fixed scales
#     {16, 1024, 16384}, dynamic and adaptive loss scaling, 2 seeds; prints
#     the table in the paper's layout and plots the per-layer adaptive scales;
#  2. the FP8 E4M3 table: every mode (none, fixed {16, 64, 256}, dynamic,
#     adaptive, adaptive with the paper's overflow bound, amax) with
#     gradients in FP8 E4M3, 2 seeds, where the methods differ for real.
# Options go to both (e.g. --out DIR, --jobs N). At the end: the wall time.
# scripts/check_docs.py reruns both and compares their tables with README.md
# and docs/results.md.
#   ./scripts/demo.sh                      # results in results/mini/, results/demo_fp8/
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
SECONDS=0
.venv/bin/python experiments/mini_repro.py "$@"
.venv/bin/python experiments/precision_table.py \
  --config configs/demo_fp8.yaml "$@"
echo "[demo] wall time of both tables: ${SECONDS} s"
