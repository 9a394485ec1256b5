#!/usr/bin/env bash
# On a CUDA machine that has PyTorch and transformers (nothing is installed, nothing downloaded): the demo draft's
# distillation recipe at 4 layers on the local prompt pool, within 5 minutes. Writes OUT/layers4.safetensors (decoder
# layers and final norm, bfloat16), its SHA256SUMS, figures.json and, where made, head_vocabulary.json.
# Imports only torch, transformers, tokenizers, safetensors, numpy, pyyaml, click and rich (no pydantic); a --gguf
# target also needs gguf (pure Python; carry its wheel: `pip download --no-deps gguf==0.19.0 -d .whl` here,
# `pip install --no-deps --target /tmp/site .whl/gguf-*.whl && export PYTHONPATH=/tmp/site` there) and accelerate.
#   scripts/gpu-distill.sh OUT --target DIR     (DIR: the target's checkpoint; `specbuild demo-models` makes it)
#   scripts/gpu-distill.sh OUT --gguf FILE --part-size 15M   (FILE may be there as FILE.part-00, ... only:
#       `split -d -b 60M FILE FILE.part-`; results over 15 MiB stay in parts, OUT/reassemble.sh joins and checks them)
#   scripts/gpu-distill.sh OUT --target DIR --minutes 6.5 --data-share 0.45 --steps 1600   (the demo draft's budget)
#   scripts/gpu-distill.sh OUT --device cpu --tiny   (the same code on the tiny pair, on the CPU, in seconds)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHONPATH="$PWD/pipeline${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m specbuild.drafts.gpu_distill "$@"
