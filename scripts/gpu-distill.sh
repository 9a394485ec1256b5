#!/usr/bin/env bash
# On a CUDA machine that has PyTorch and transformers (nothing is installed, nothing downloaded): the demo draft's
# distillation recipe at 4 layers on the local prompt pool, within 5 minutes. Writes OUT/layers4.safetensors (decoder
# layers and final norm, bfloat16), its SHA256SUMS, figures.json and, where made, head_vocabulary.json.
#   scripts/gpu-distill.sh OUT --target DIR     (DIR: the target's checkpoint; `specbuild demo-models` makes it)
#   scripts/gpu-distill.sh OUT --device cpu --tiny   (the same code on the tiny pair, on the CPU, in seconds)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHONPATH="$PWD/pipeline${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m specbuild.drafts.gpu_distill "$@"
