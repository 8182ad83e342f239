#!/bin/sh
# Builds the libFuzzer harnesses (clang, ASan + UBSan, every object
# instrumented) in BUILD (default build-fuzz) and runs each for SECONDS
# from its committed seed corpus. Prints one line per harness with its
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
status=0
for h in idx text cli ckpt cache hostfile slurm; do
    work=$(mktemp -d /tmp/cx_fuzz_$h.XXXXXX)
    cp "$ROOT/tests/fuzz/corpus/$h"/* "$work/"
    log="$B/fuzz_$h.log"
    if ASAN_OPTIONS=detect_leaks=1 "$B/tests/fuzz/fuzz_$h" -max_total_time="$SECS" -max_len=262144 -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$B/crash-$h-" "$work" > "$log" 2>&1; then
        execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
        echo "fuzz_$h: ok, $execs executions in $SECS s"
    else
        echo "fuzz_$h: FAILED (see $log)"
        grep -E "ERROR|SUMMARY|Test unit written" "$log" | head -5
        status=1
    fi
    rm -rf "$work"
done
exit $status
