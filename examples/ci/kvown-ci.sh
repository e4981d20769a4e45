#!/usr/bin/env bash
# usage: kvown-ci.sh [LOGS_DIR [OUT_DIR]]     (inputs below; kvown-ci.sh --help shows them)
#
# kvown's model-check CI job as a plain shell script; github-workflow.yml beside it runs
# the same steps on GitHub Actions. Copy this folder anywhere: it needs nothing around it.
# In a fresh virtual environment it installs kvown (KVOWN_SPEC), then
#
#   1. kvown check --junit         the spec's default suite, a testcase per property x config
#   2. kvown check-trace --junit   every *.jsonl event log of your engine in LOGS_DIR
#   3. kvown fuzz --profile ci     the reference engine against the spec, at most
#                                  KVOWN_FUZZ_SECONDS (the nightly run: no cap)
#
# Time on a 2-core runner: install 3-5 min (the CPU torch wheel), check 1-3 min, each log
# a few seconds, fuzz at most 10 min: it fits a 30-minute timeout. The nightly run
# (KVOWN_NIGHTLY=1) adds the deep suite and fuzzes without the cap: give it 90 minutes.
#
# JUnit XML goes to OUT_DIR/junit/. On a failure the evidence stays in OUT_DIR/artifacts/:
# the model check's counterexample as JSON (`kvown replay FILE` replays it) and DOT, the
# verdict JSON of each deviating log, the fuzz report with its shrunk program.
#
# Exit: 0 every step passed; 1 a property is violated or a log deviates; 2 bad input
# (a malformed log, a bad option); 3 the install failed; others: a step broke.
#
# Inputs (an argument wins over the environment, the environment over the default):
#   LOGS_DIR            your engine's JSONL event logs (default: ./kvown-logs)
#   OUT_DIR             JUnit files and artifacts (default: ./kvown-ci)
#   KVOWN_SPEC          what pip installs as kvown (default: kvown==0.1.0, the release this
#                       script belongs to); or "kvown @ git+https://HOST/OWNER/kvown@TAG",
#                       a wheel, or a local checkout's path (kvown is not on PyPI yet:
#                       until it is, the default does not install; set this)
#   TORCH_SPEC          the torch requirement (default: torch==2.13.0)
#   TORCH_INDEX         extra index for torch (default: the CPU wheels,
#                       https://download.pytorch.org/whl/cpu; empty: none)
#   KVOWN_STEPS         the steps to run (default: "check trace fuzz")
#   KVOWN_FUZZ_SECONDS  the fuzz step's time cap (default: 600)
#   KVOWN_NIGHTLY       1: the nightly run: also `kvown check --suite deep`, no fuzz cap
#   PYTHON              the interpreter that makes the venv (default: python3)
#   KVOWN_NO_INSTALL    1: use the kvown already on PATH
set -uo pipefail

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
case "${1:-}" in
    -h | --help) usage; exit 0 ;;
    -*) echo "error: kvown-ci.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
esac
if [ $# -gt 2 ]; then
    echo "error: kvown-ci.sh: at most two arguments, LOGS_DIR and OUT_DIR" >&2
    exit 2
fi
LOGS_DIR="${1:-${LOGS_DIR:-./kvown-logs}}"
OUT_DIR="${2:-${OUT_DIR:-./kvown-ci}}"
KVOWN_SPEC="${KVOWN_SPEC:-kvown==0.1.0}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
TORCH_INDEX="${TORCH_INDEX-https://download.pytorch.org/whl/cpu}"
KVOWN_STEPS="${KVOWN_STEPS:-check trace fuzz}"
NIGHTLY="${KVOWN_NIGHTLY:-${KVOWN_DEEP:-0}}"  # KVOWN_DEEP: this script's older name for it
FUZZ_SECONDS="${KVOWN_FUZZ_SECONDS:-600}"
PYTHON="${PYTHON:-python3}"
for step in $KVOWN_STEPS; do
    case "$step" in
        check | trace | fuzz) ;;
        *) echo "error: kvown-ci.sh: KVOWN_STEPS: unknown step $step (check, trace, fuzz)" >&2; exit 2 ;;
    esac
done
wants() { case " $KVOWN_STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

mkdir -p "$OUT_DIR/junit" "$OUT_DIR/artifacts" || exit 2
if [ "${KVOWN_NO_INSTALL:-0}" != 1 ]; then
    VENV="$(mktemp -d "${TMPDIR:-/tmp}/kvown-venv.XXXXXX")"
    trap 'rm -rf "$VENV"' EXIT
    "$PYTHON" -m venv "$VENV" && . "$VENV/bin/activate" || exit 3
    echo "== install: $TORCH_SPEC $KVOWN_SPEC"
    index=()
    if [ -n "$TORCH_INDEX" ]; then index=(--extra-index-url "$TORCH_INDEX"); fi
    pip install --quiet "${index[@]}" "$TORCH_SPEC" "$KVOWN_SPEC" || exit 3
fi
echo "== $(kvown --version)"

worst=0
note() {  # remember the worst exit code: 0 < 1 (violation) < 2 (bad input) < others
    local rc=$1
    if [ "$rc" -gt "$worst" ]; then worst=$rc; fi
}

if wants check; then
    echo "== kvown check"
    kvown check --junit "$OUT_DIR/junit/check.xml" --cex-dir "$OUT_DIR/artifacts"
    note $?
fi

if wants trace; then
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
fi

if [ "$NIGHTLY" = 1 ] && wants check; then  # the nightly run: the larger worlds too
    echo "== kvown check --suite deep"
    kvown check --suite deep --junit "$OUT_DIR/junit/check-deep.xml" --cex-dir "$OUT_DIR/artifacts"
    note $?
fi

if wants fuzz; then
    cap=(--examples 100 --seconds "$FUZZ_SECONDS")  # the ci profile's 100 per world, or the cap
    if [ "$NIGHTLY" = 1 ]; then cap=(); fi
    echo "== kvown fuzz --profile ci ${cap[*]}"
    report="$OUT_DIR/artifacts/fuzz.json"
    kvown fuzz --profile ci --json --junit "$OUT_DIR/junit/fuzz.xml" "${cap[@]}" >"$report"
    rc=$?
    if [ "$rc" -eq 0 ]; then rm -f "$report"; fi
    note $rc
fi

echo "== done: exit $worst; JUnit in $OUT_DIR/junit, artifacts in $OUT_DIR/artifacts"
exit "$worst"
