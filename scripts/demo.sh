#!/usr/bin/env bash
# The whole demo on a fresh machine: set up, make the demo pair, compile it with the torch runtime,
# serve it on a real Triton server, stream one answer with its acceptance figures, stop the server.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/specbuild demo "$@"
