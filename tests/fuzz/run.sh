#!/bin/sh
# Builds the libFuzzer harnesses (clang, ASan + UBSan, every object
# instrumented) in BUILD (default build-fuzz) and runs each for SECONDS
# from its committed seed corpus, as many at once as the machine has cores
# (CX_FUZZ_JOBS overrides). Prints one line per harness with its
# executions; exits non-zero when one crashes, leaks or times out (the
# input is kept as BUILD/crash-<harness>-*: add it to the corpus once fixed).
# usage: tests/fuzz/run.sh SECONDS [BUILD]   (CX_WERROR=ON: warnings are errors)
set -eu
SECS=${1:-60}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${2:-$ROOT/build-fuzz}
CC=${CC:-clang-14}
command -v "$CC" > /dev/null || { echo "fuzz: $CC not found (scripts/install-deps.sh installs clang-14)" >&2; exit 1; }
mkdir -p "$B"
CC=$CC cmake -S "$ROOT" -B "$B" -DCX_FUZZ=ON -DCX_WERROR="${CX_WERROR:-OFF}" -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$B/configure.log" 2>&1 ||
    { cat "$B/configure.log"; exit 1; }
cmake --build "$B" -j2 --target fuzz_idx fuzz_text fuzz_cli fuzz_ckpt fuzz_cache fuzz_hostfile fuzz_slurm > "$B/build.log" 2>&1 ||
    { tail -30 "$B/build.log"; exit 1; }
# one harness per core at a time (each is single-threaded); the lines come
# out in the harnesses' order whatever order they finish in
JOBS=${CX_FUZZ_JOBS:-$(nproc)}
run_one() {   # harness: fuzzes it, writes its line to $B/fuzz_$1.line
    h=$1
    work=$(mktemp -d /tmp/cx_fuzz_$h.XXXXXX)
    cp "$ROOT/tests/fuzz/corpus/$h"/* "$work/"
    log="$B/fuzz_$h.log"
    if ASAN_OPTIONS=detect_leaks=1 "$B/tests/fuzz/fuzz_$h" -max_total_time="$SECS" -max_len=262144 -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$B/crash-$h-" "$work" > "$log" 2>&1; then
        execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
        echo "fuzz_$h: ok, $execs executions in $SECS s" > "$B/fuzz_$h.line"
    else
        { echo "fuzz_$h: FAILED (see $log)"
          grep -E "ERROR|SUMMARY|Test unit written" "$log" | head -5; } > "$B/fuzz_$h.line"
    fi
    rm -rf "$work"
}
HARNESSES="idx text cli ckpt cache hostfile slurm"
set -- $HARNESSES
while [ $# -gt 0 ]; do
    pids=""
    n=0
    while [ $# -gt 0 ] && [ $n -lt "$JOBS" ]; do
        rm -f "$B/fuzz_$1.line"
        run_one "$1" &
        pids="$pids $!"
        n=$((n + 1))
        shift
    done
    for p in $pids; do wait "$p" || true; done   # a harness that failed to start has no line: reported below
done
status=0
for h in $HARNESSES; do
    if [ -f "$B/fuzz_$h.line" ]; then cat "$B/fuzz_$h.line"; else echo "fuzz_$h: FAILED (no result)"; fi
    grep -q "^fuzz_$h: ok," "$B/fuzz_$h.line" 2> /dev/null || status=1
done
exit $status
