#!/usr/bin/env bash
# Run the tests that use the trained tiny pair against pairs trained from other seeds (default: 0 1 2 3), one
# seed after another: each seed's pair and releases are built once into .cache/tiny-seed-N (seed 0: the usual
# .cache/tiny-pair). Extra pytest arguments go after --, e.g. `bash scripts/test-seeds.sh 1 2 -- -x`.
# Exit 1 if any seed failed; a summary line per seed at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
seeds=() pytest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; pytest_args=("$@"); break ;;
    *) seeds+=("$1"); shift ;;
  esac
done
[ ${#seeds[@]} -gt 0 ] || seeds=(0 1 2 3)
bash scripts/setup.sh || exit 1
summary=() status=0
for seed in "${seeds[@]}"; do
  echo "==> tiny pair from seed $seed: pytest -m tiny_model ${pytest_args[*]}"
  if SPECBUILD_TINY_SEED="$seed" .venv/bin/python -m pytest -m tiny_model "${pytest_args[@]}"; then
    summary+=("seed $seed: passed")
  else
    summary+=("seed $seed: FAILED") status=1
  fi
done
printf '%s\n' "${summary[@]}"
exit $status
