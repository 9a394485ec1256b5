#!/usr/bin/env bash
# On a CUDA machine that has PyTorch and transformers (nothing is installed, nothing downloaded): greedy identity of
# the torch runtime at K 0/2/4 on the GPU, step costs c and V(K), tokens/s. Prints a JSON report (a few minutes).
# Imports only torch, transformers, tokenizers, safetensors, numpy, pyyaml, click and rich (no pydantic); its results
# are small (--json FILE), so it has no --part-size.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHONPATH="$PWD/pipeline${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m specbuild.gpu_check "$@"
