#!/usr/bin/env bash
# Sets up the environment if needed, then runs the whole test suite on it
# (.venv, the default interpreter); then, when this machine has a Python 3.12
# (the GPU machine's interpreter), sets up .venv-py3.12 with it and runs the
# exactness, formats, kill/resume, MPI and Chainer-compatibility tests there.
#   ./scripts/test.sh                 all tests, then the Python 3.12 subset
#   ./scripts/test.sh tests/adaptive  a subset (any pytest arguments), on .venv
#                                     only
#   PYTHON312=/path/to/python3.12 ./scripts/test.sh   that interpreter for the
#                                     second run; PYTHON312=no skips it
# Fails if either run fails; a run that collects no tests fails too.
set -uo pipefail
cd "$(dirname "$0")/.."

# The Python 3.12 part: these folders and files, on .venv-py3.12.
PY312_TESTS=(
  tests/test_chainer_compat.py          # the patches, where they are needed
  tests/adaptive                        # exactness
  tests/formats
  tests/experiment/test_kill_resume.py  # kill/resume
  tests/detection/test_ssd_resume.py
  tests/experiment/test_distributed.py  # MPI (mpiexec -n 2)
  tests/communication/test_mpi_simulator.py
)

run_pytest() {     # <python> <what> <pytest args...>
  local py=$1 what=$2 rc
  shift 2
  "$py" -m pytest "$@"
  rc=$?
  if [ "$rc" -eq 5 ]; then
    # pytest's "no tests collected": a suite that runs nothing is broken.
    echo "test.sh: no tests were collected or run ($what); failing" >&2
    return 1
  fi
  return "$rc"
}

runs_py312() {     # prints the interpreter if it is a working Python 3.12
  [ -n "$1" ] && "$1" -c 'import sys; assert sys.version_info[:2] == (3, 12)' \
    >/dev/null 2>&1 && echo "$1"
}

find_py312() {
  local c
  # python3.12 on PATH may be a pyenv shim that fails: try each candidate
  for c in "$(command -v python3.12 2>/dev/null)" \
           $(command -v pyenv >/dev/null 2>&1 && \
             ls -d "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12 \
               2>/dev/null) \
           /usr/local/bin/python3.12 /usr/bin/python3.12; do
    runs_py312 "$c" && return 0
  done
  return 1
}

VENV=.venv ./scripts/install.sh mpi || {
  echo "test.sh: installation failed" >&2; exit 1; }
run_pytest .venv/bin/python "$(.venv/bin/python -V)" "${@:-tests}"
rc=$?
[ "$#" -gt 0 ] && exit "$rc"    # a subset: the default interpreter only

if .venv/bin/python -c 'import sys; assert sys.version_info[:2] == (3, 12)' \
    2>/dev/null; then
  echo "test.sh: .venv is Python 3.12: the whole suite ran on it above"
  exit "$rc"
fi
case "${PYTHON312:-}" in
  no|none|0)
    echo "test.sh: PYTHON312=$PYTHON312: no Python 3.12 run"
    exit "$rc" ;;
  '') py312=$(find_py312) ;;
  *) py312=$(runs_py312 "$PYTHON312") || {
       echo "test.sh: PYTHON312=$PYTHON312 is not a working Python 3.12" >&2
       exit 1; } ;;
esac
if [ -z "${py312:-}" ]; then
  echo "test.sh: no Python 3.12 on this machine (python3.12 on PATH, pyenv's" \
       "versions, /usr/bin, /usr/local/bin): the Python 3.12 tests did not run"
  exit "$rc"
fi

echo "test.sh: Python 3.12 ($py312): ${PY312_TESTS[*]}"
VENV=.venv-py3.12 PYTHON=$py312 ./scripts/install.sh mpi || {
  echo "test.sh: installation of .venv-py3.12 failed" >&2; exit 1; }
run_pytest .venv-py3.12/bin/python "Python 3.12" "${PY312_TESTS[@]}"
rc312=$?
[ "$rc" -ne 0 ] && echo "test.sh: the suite failed on .venv (exit $rc)" >&2
[ "$rc312" -ne 0 ] && \
  echo "test.sh: the Python 3.12 tests failed (exit $rc312)" >&2
[ "$rc" -ne 0 ] && exit "$rc"
exit "$rc312"
