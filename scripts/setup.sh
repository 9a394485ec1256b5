#!/usr/bin/env bash
# Creates .venv (if missing) and installs specbuild with every extra a CPU machine can use: the torch runtime
# (the CPU build of torch, pinned), the bundled Triton server, benchmarks and tests. scripts/install.py does the
# installing, step by step with pip's progress; it takes torch from PyTorch's CPU index, or pip's own sources
# where that index cannot be reached, and stops rather than pull a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$PYTHON" -m venv .venv
fi
.venv/bin/python scripts/install.py
echo "==> ready: $(.venv/bin/specbuild --version)"
