#!/usr/bin/env bash
# Sets up the environment if needed, then runs the whole test suite.
#   ./scripts/test.sh                 all tests
#   ./scripts/test.sh tests/adaptive  a subset (any pytest arguments)
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh mpi || { echo "test.sh: installation failed" >&2; exit 1; }
.venv/bin/python -m pytest "${@:-tests}"
rc=$?
if [ "$rc" -eq 5 ]; then
  # pytest's "no tests collected": a suite that runs nothing is broken.
  echo "test.sh: no tests were collected or run; failing" >&2
  exit 1
fi
exit "$rc"
