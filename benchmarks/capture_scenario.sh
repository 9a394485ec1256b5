#!/usr/bin/env bash
# Issue 41's scenario on the demo pair (docs/benchmarks.md, "A draft that learns its traffic"), about 30 minutes
# on a 2-core machine: a release that captures its traffic serves everyday-advice chat (the demo draft's weakest
# kind) at concurrency 4; its draft is continued on that capture on the CPU; the release with the new draft is
# measured against the one in service, interleaved through the servers, on the held-out captured prompts (replayed
# by token ids) and on the bundled prompts.
#
#   benchmarks/capture_scenario.sh SPEC WORKDIR [MINUTES]
#
# SPEC: a torch release's spec on the demo pair (`specbuild demo --workdir DIR` writes DIR/demo.yaml); WORKDIR: new
# folder for both releases, the capture store and the reports; MINUTES: the distillation's budget (default 15);
# COUNT (environment): the chat requests captured (default 110).
set -euo pipefail
spec=${1:?usage: benchmarks/capture_scenario.sh SPEC WORKDIR [MINUTES]}
work=${2:?usage: benchmarks/capture_scenario.sh SPEC WORKDIR [MINUTES]}
minutes=${3:-15}
here=$(cd "$(dirname "$0")/.." && pwd)
specbuild=${SPECBUILD:-$here/.venv/bin/specbuild}
python=${PYTHON:-$here/.venv/bin/python}
mkdir -p "$work"
work=$(cd "$work" && pwd)
store=$work/store

echo "== 1. the release in service, capturing: $work/current"
"$specbuild" compile --spec "$spec" --set name=chat-current --set capture.enabled=true \
    --set outputs.build_dir="$work/current/build" --set outputs.engines_dir="$work/current/engines" \
    --set outputs.repository_dir="$work/current/triton_repo"

echo "== 2. chat traffic through the server at concurrency 4, captured into $store"
"$python" "$here/benchmarks/chat_traffic.py" write --count "${COUNT:-110}" --seed 1 --out "$work/chat_traffic.jsonl"
"$specbuild" serve "$work/current/triton_repo" --capture-dir "$store" --http-port 0 --grpc-port 0 --metrics-port 0 \
    --no-openai --json > "$work/serve.jsonl" &
server=$!
trap 'kill -INT $server 2>/dev/null || true' EXIT
until grep -q '"grpc_url"' "$work/serve.jsonl" 2>/dev/null; do sleep 2; kill -0 $server; done
grpc=$("$python" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["grpc_url"])' "$work/serve.jsonl")
"$python" "$here/benchmarks/chat_traffic.py" send "$grpc" --concurrency 4 --max-tokens 64 \
    --tokenizer "$work/current/triton_repo/preprocessing/1/tokenizer" --prompts "$work/chat_traffic.jsonl"
kill -INT $server; wait $server || true; trap - EXIT
"$specbuild" capture show "$store"

echo "== 3. the draft continued on the capture ($minutes CPU minutes)"
"$specbuild" draft "$work/chat-draft" --from-capture "$store" --release "$work/current/triton_repo" \
    --minutes "$minutes" --pool-share 0.4 --held-out-share 0.15 --max-new-tokens 64 --json \
    > "$work/chat-draft.json"

echo "== 4. the candidate release: the same spec, the new draft"
"$specbuild" compile --spec "$spec" --set name=chat-candidate --set draft.checkpoint="$work/chat-draft" \
    --set outputs.build_dir="$work/candidate/build" --set outputs.engines_dir="$work/candidate/engines" \
    --set outputs.repository_dir="$work/candidate/triton_repo"

echo "== 5. candidate against the release in service, interleaved: held-out captured prompts, then bundled ones"
"$specbuild" bench --repository "$work/candidate/triton_repo" --incumbent "$work/current/triton_repo" \
    --captured "$store/held-out/chat-draft.jsonl" --k 0,3 --lookup on --requests 51 --no-plots \
    --out "$work/bench-held-out"
"$specbuild" bench --repository "$work/candidate/triton_repo" --incumbent "$work/current/triton_repo" \
    --num-prompts 16 --k 0,3 --lookup on --requests 16 --no-plots --out "$work/bench-bundled"
