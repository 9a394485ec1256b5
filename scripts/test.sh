#!/usr/bin/env bash
# Set up (idempotent), then run the whole test suite, slow end-to-end tests on a real Triton server included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
