#!/usr/bin/env bash
# The nightly job of a release that captures its traffic (its spec's capture section, off unless turned on):
# capture -> distil -> check -> compile -> verify -> gate -> release. Each CI step runs one of them
# (github-nightly.yml); `bash nightly.sh all` runs them in turn.
#
# The release's draft is continued on the traffic the release in service captured (`specbuild draft
# --from-capture`, which holds the newest records out), the target is compiled again with it, and `specbuild bench`
# measures the new release against the one in service on those held-out prompts, replayed by their token ids, both
# served on this runner and interleaved: it is released only when faster by GATE_FASTER_THAN with the same greedy text
# on every prompt (exit 3 otherwise, the figures in gate.json). check, compile, verify and deploy are release.sh's.
#
# Privacy: the capture store is the traffic (token ids are the text), and the new draft's weights embed it, so the
# new release does too. Run this job where the capture may be read, keep the release under the capture's access
# policy, and never upload the store, the draft's state folder (NEW_DRAFT.state holds captured ids while it trains)
# or the held-out file. The reports hold figures only, no prompt or answer.
set -euo pipefail

: "${CAPTURE_STORE:?the capture store the release in service writes (synced to this runner)}"
: "${CURRENT_RELEASE:?the repository folder of the release in service (its engines beside it)}"
: "${TARGET:?the target checkpoint folder (the one the release in service serves)}"
: "${SPECBUILD_SPEC:=specbuild.yaml}"       # the release's build spec, capture section included
: "${NIGHTLY_DIR:=dist/nightly}"            # the new draft, the new release, its reports and manifests
: "${NEW_DRAFT:=$NIGHTLY_DIR/draft}"        # its held-out records go to CAPTURE_STORE/held-out/<its name>.jsonl
: "${MIN_CAPTURED:=200}"                    # records the store must hold for a night's distillation
: "${DISTIL_MINUTES:=60}"                   # the distillation's wall-clock budget
: "${BENCH_K:=2}"                           # the K values gated (K=0 is measured too, on both releases)
: "${BENCH_REQUESTS:=32}"                   # per cell and release
: "${GATE_FASTER_THAN:=1.05}"               # tokens/s over the release in service's, at each gated K
: "${GATE_MAX_ERROR_RATE:=0}"

export TARGET SPECBUILD_SPEC DRAFT="$NEW_DRAFT" RELEASE_DIR="$NIGHTLY_DIR/release" BUILD_DIR="$NIGHTLY_DIR/build" \
  REPORTS_DIR="$NIGHTLY_DIR/reports" MANIFESTS_DIR="$NIGHTLY_DIR/manifests"
RELEASE_SH="$(dirname "${BASH_SOURCE[0]}")/release.sh"
HELD_OUT="$CAPTURE_STORE/held-out/$(basename "$NEW_DRAFT").jsonl"
mkdir -p "$REPORTS_DIR"

capture() {  # what the release in service captured: enough complete records to learn from
  python3 - "$CAPTURE_STORE" "$MIN_CAPTURED" > "$REPORTS_DIR/capture.json" <<'PYTHON'
import json, sys
from pathlib import Path
from specbuild.capture.records import capture_files, read_records

store, least = Path(sys.argv[1]), int(sys.argv[2])
files = capture_files(store) if store.is_dir() else []
records = sum(1 for _ in read_records(files))
print(json.dumps({"store": str(store), "files": len(files), "records": records, "enough": records >= least}))
if records < least:
    sys.exit(f"{store} holds {records} captured records, fewer than MIN_CAPTURED={least}: no distillation tonight")
PYTHON
}

distil() {
  specbuild draft "$NEW_DRAFT" --from-capture "$CAPTURE_STORE" --release "$CURRENT_RELEASE" \
    --minutes "$DISTIL_MINUTES" --json > "$REPORTS_DIR/distil.json"
}

gate() {  # both releases served here (loopback, free ports), the held-out prompts replayed on both, interleaved
  specbuild bench --repository "$RELEASE_DIR/triton_repo" --incumbent "$CURRENT_RELEASE" --captured "$HELD_OUT" \
    --k "$BENCH_K" --requests "$BENCH_REQUESTS" --out "$REPORTS_DIR/bench" --no-plots \
    --gate "faster_than_incumbent=$GATE_FASTER_THAN" --gate greedy_identical \
    --gate "max_error_rate=$GATE_MAX_ERROR_RATE" --json > "$REPORTS_DIR/gate.json"
}

all() {
  capture
  distil
  bash "$RELEASE_SH" check
  bash "$RELEASE_SH" compile
  bash "$RELEASE_SH" verify
  gate
  bash "$RELEASE_SH" deploy
}

case "${1:-}" in
  capture | distil | gate | all) "$1" ;;
  check | compile | verify) bash "$RELEASE_SH" "$1" ;;
  release) bash "$RELEASE_SH" deploy ;;
  *) echo "usage: nightly.sh capture|distil|check|compile|verify|gate|release|all" >&2; exit 2 ;;
esac
