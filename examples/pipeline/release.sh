#!/usr/bin/env bash
# The steps of a specbuild release pipeline: check -> compile -> verify -> serve -> gate -> stop -> deploy.
# Each CI step runs one of them (github-workflow.yml, gitlab-ci.yml); `bash release.sh all` runs them in turn.
#
# Settings come from the environment; TARGET and DRAFT (the checkpoints to release) are required.
# Every step writes its JSON report into $REPORTS_DIR; a failing step exits non-zero with the reason in that JSON
# (`specbuild bench --gate`: exit 3 when the release misses a threshold).
set -euo pipefail

: "${TARGET:?the target checkpoint folder}"
: "${DRAFT:?the draft checkpoint folder}"
: "${SPECBUILD_SPEC:=specbuild.yaml}"       # the release's build spec (runtime, K, limits, ...)
: "${RELEASE_DIR:=dist/release}"            # what is uploaded: the repository, its engines folder beside it
: "${BUILD_DIR:=dist/build}"                # converted checkpoints (not uploaded)
: "${REPORTS_DIR:=dist/reports}"            # every step's JSON
: "${MANIFESTS_DIR:=dist/manifests}"        # Kubernetes manifests
: "${BENCH_K:=2}"                           # the K values gated (K=0 is always measured: the baseline)
: "${BENCH_PROMPTS:=16}"
: "${BENCH_REQUESTS:=16}"
: "${BENCH_MAX_TOKENS:=128}"
: "${GATE_MIN_SPEEDUP:=1.05}"               # over the target alone, on the runner: set it for your hardware
: "${GATE_MIN_ACCEPTANCE:=0.5}"
: "${GATE_MAX_P95_MS:=30000}"
: "${GATE_MAX_ERROR_RATE:=0}"               # failed requests tolerated (0: any failure fails the gate)
: "${DEPLOY_PVC:=specbuild-release}"        # the claim the cluster holds the uploaded release in
: "${DEPLOY_NAMESPACE:=default}"
: "${SERVE_TIMEOUT:=900}"                   # seconds for the server to load the models

REPOSITORY="$RELEASE_DIR/triton_repo"
SERVER="$REPORTS_DIR/serve.jsonl"           # serve --json: one line when ready (URLs, PIDs), one when stopped
mkdir -p "$REPORTS_DIR"

check() {
  specbuild check "$TARGET" "$DRAFT" --spec "$SPECBUILD_SPEC" --json > "$REPORTS_DIR/check.json"
}

compile() {
  specbuild compile --spec "$SPECBUILD_SPEC" --target "$TARGET" --draft "$DRAFT" \
    --set "outputs.build_dir=$BUILD_DIR" --set "outputs.engines_dir=$RELEASE_DIR/engines" \
    --set "outputs.repository_dir=$REPOSITORY" --json > "$REPORTS_DIR/compile.json"
}

verify() {
  specbuild verify "$REPOSITORY" --json > "$REPORTS_DIR/verify.json"
}

serve() {
  # free ports only, and no OpenAI API (the gate speaks gRPC): two pipelines on one runner never meet on a port
  specbuild serve "$REPOSITORY" --http-port 0 --grpc-port 0 --metrics-port 0 --no-openai \
    --timeout "$SERVE_TIMEOUT" --json > "$SERVER" 2> "$REPORTS_DIR/serve.log" &
  local pid=$!
  echo "$pid" > "$REPORTS_DIR/serve.pid"
  until grep -qs '"event": "ready"' "$SERVER"; do
    if ! kill -0 "$pid" 2> /dev/null; then  # it exited: its error is the last JSON line
      cat "$SERVER" "$REPORTS_DIR/serve.log" >&2
      return 1
    fi
    sleep 1
  done
}

ready() {  # a field of the server's ready line
  python3 -c 'import json, sys; print(json.loads(sys.stdin.readline())[sys.argv[1]])' "$1" \
    < <(grep '"event": "ready"' "$SERVER")
}

gate() {
  specbuild bench --url "$(ready grpc_url)" --metrics-url "$(ready metrics_url)" \
    --tokenizer "$REPOSITORY/preprocessing/1/tokenizer" --k "$BENCH_K" --num-prompts "$BENCH_PROMPTS" \
    --requests "$BENCH_REQUESTS" --max-tokens "$BENCH_MAX_TOKENS" --out "$REPORTS_DIR/bench" --no-plots \
    --gate "min_speedup=$GATE_MIN_SPEEDUP" --gate "min_acceptance=$GATE_MIN_ACCEPTANCE" --gate greedy_identical \
    --gate "max_p95_ms=$GATE_MAX_P95_MS" --gate "max_error_rate=$GATE_MAX_ERROR_RATE" \
    --json > "$REPORTS_DIR/gate.json"
}

stop() {  # SIGTERM: the server stops its model processes and frees their shared memory
  local pid
  pid="$(cat "$REPORTS_DIR/serve.pid" 2> /dev/null)" || return 0
  kill -TERM "$pid" 2> /dev/null || return 0
  while kill -0 "$pid" 2> /dev/null; do sleep 1; done
}

deploy() {
  specbuild deploy "$REPOSITORY" -o "$MANIFESTS_DIR" --pvc "$DEPLOY_PVC" --namespace "$DEPLOY_NAMESPACE" \
    ${DEPLOY_IMAGE:+--image "$DEPLOY_IMAGE"} --json > "$REPORTS_DIR/deploy.json"
}

all() {
  check
  compile
  verify
  serve
  trap stop EXIT
  gate
  stop
  deploy
}

case "${1:-}" in
  check | compile | verify | serve | gate | stop | deploy | all) "$1" ;;
  *) echo "usage: release.sh check|compile|verify|serve|gate|stop|deploy|all" >&2; exit 2 ;;
esac
