#!/usr/bin/env bash
# kvown's model-check CI job as a plain shell script; github-workflow.yml beside it runs
# the same steps on GitHub Actions. In a fresh virtual environment it installs kvown, then
#
#   1. kvown check --junit         the spec's default suite, a testcase per property x config
#   2. kvown check-trace --junit   every *.jsonl event log of your engine in LOGS_DIR
#   3. kvown fuzz --profile ci     the reference engine against the spec
#
# JUnit XML goes to OUT_DIR/junit/. On a failure the evidence stays in OUT_DIR/artifacts/:
# the model check's counterexample as JSON (replayable) and DOT, the verdict JSON of each
# deviating log, the fuzz report with its shrunk program.
#
# Exit: 0 every step passed; 1 a property is violated or a log deviates; 2 bad input
# (a malformed log, a bad option); anything else: a step broke (see its output).
#
# Settings, from the environment:
#   KVOWN_SPEC        what pip installs (default: the checkout this script lives in),
#                     e.g. "kvown @ git+https://github.com/OWNER/kvown"
#   TORCH_SPEC        the torch requirement (default: torch==2.13.0)
#   LOGS_DIR          your engine's event logs (default: ./kvown-logs)
#   OUT_DIR           JUnit files and artifacts (default: ./kvown-ci)
#   PYTHON            the interpreter that makes the venv (default: python3)
#   KVOWN_NO_INSTALL  set to 1 to use the kvown already on PATH
#   KVOWN_DEEP        set to 1 (nightly) to also check the deep suite (kvown check --suite deep)
set -uo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
KVOWN_SPEC="${KVOWN_SPEC:-$(cd "$HERE/../.." && pwd)}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
LOGS_DIR="${LOGS_DIR:-./kvown-logs}"
OUT_DIR="${OUT_DIR:-./kvown-ci}"
PYTHON="${PYTHON:-python3}"

mkdir -p "$OUT_DIR/junit" "$OUT_DIR/artifacts" || exit 2
if [ "${KVOWN_NO_INSTALL:-0}" != 1 ]; then
    VENV="$(mktemp -d "${TMPDIR:-/tmp}/kvown-venv.XXXXXX")"
    trap 'rm -rf "$VENV"' EXIT
    "$PYTHON" -m venv "$VENV" && . "$VENV/bin/activate" || exit 3
    echo "== install: $TORCH_SPEC $KVOWN_SPEC"
    pip install --quiet "$TORCH_SPEC" "$KVOWN_SPEC" || exit 3
fi

worst=0
note() {  # remember the worst exit code: 0 < 1 (violation) < 2 (bad input) < others
    local rc=$1
    if [ "$rc" -gt "$worst" ]; then worst=$rc; fi
}

echo "== kvown check"
kvown check --junit "$OUT_DIR/junit/check.xml" --cex-dir "$OUT_DIR/artifacts"
note $?

echo "== kvown check-trace over $LOGS_DIR"
shopt -s nullglob
logs=("$LOGS_DIR"/*.jsonl)
if [ ${#logs[@]} -eq 0 ]; then
    echo "no *.jsonl event logs in $LOGS_DIR" >&2
fi
for log in "${logs[@]}"; do
    name="$(basename "$log" .jsonl)"
    verdict="$OUT_DIR/artifacts/trace-$name.json"
    kvown check-trace "$log" --json --junit "$OUT_DIR/junit/trace-$name.xml" >"$verdict"
    rc=$?
    echo "$name: exit $rc"
    if [ "$rc" -eq 0 ]; then rm -f "$verdict"; fi  # keep only the failures' evidence
    note $rc
done

if [ "${KVOWN_DEEP:-0}" = 1 ]; then  # the nightly run: the larger worlds too
    echo "== kvown check --suite deep"
    kvown check --suite deep --junit "$OUT_DIR/junit/check-deep.xml" --cex-dir "$OUT_DIR/artifacts"
    note $?
fi

echo "== kvown fuzz --profile ci"
report="$OUT_DIR/artifacts/fuzz.json"
kvown fuzz --profile ci --json --junit "$OUT_DIR/junit/fuzz.xml" >"$report"
rc=$?
if [ "$rc" -eq 0 ]; then rm -f "$report"; fi
note $rc

echo "== done: exit $worst; JUnit in $OUT_DIR/junit, artifacts in $OUT_DIR/artifacts"
exit "$worst"
