#!/bin/sh
# The collective watchdog: with CX_COLLECTIVE_TIMEOUT=3, a rank that sleeps
# before a collective, and a rank that leaves out the last step, each end
# the job within the timeout plus 5 s (plus start-up); the report line names
# rank 1 as the one behind and rank 0 as waiting; the flight recorder is
# written; the launcher exits non-zero and no process of the job survives.
# A job without a stall is untouched by the watchdog.
# usage: watchdog.sh XLA_LAUNCH DIST_STALL
set -eu
LAUNCH=$1 PROG=$2
W=$(mktemp -d /tmp/cx_watchdog.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

for mode in sleep skip; do
    start=$(date +%s)
    if CX_COLLECTIVE_TIMEOUT=3 "$LAUNCH" --nproc 2 --log-dir "$W/logs-$mode" "$PROG" "$mode" > "$W/$mode.out" 2>&1; then
        cat "$W/$mode.out"; fail "$mode: the job succeeded"
    fi
    took=$(( $(date +%s) - start ))
    # 3 s timeout + 5 s, plus the launch and the steps before the stall
    # (about 1 s here, a few under the sanitizers)
    [ "$took" -le 15 ] || { cat "$W/$mode.out"; fail "$mode: took $took s"; }
    grep -q "collective stall (CX_COLLECTIVE_TIMEOUT=3 s): rank 1 is at #[0-9]* all_reduce f32\[1024\]" "$W/$mode.out" ||
        { cat "$W/$mode.out"; fail "$mode: the report does not name rank 1 as behind"; }
    grep -q "rank 0 waits in #[0-9]* desync check of all_reduce f32\[1024\] (entered [0-9]* s ago)" "$W/$mode.out" ||
        { cat "$W/$mode.out"; fail "$mode: the report does not say where rank 0 waits"; }
    grep -q "job stopped by the collective watchdog" "$W/$mode.out" || { cat "$W/$mode.out"; fail "$mode: no stop line"; }
    [ -f "$W/logs-$mode/flight/rank-0.txt" ] && [ -f "$W/logs-$mode/flight/rank-1.txt" ] || fail "$mode: no flight recorder"
    grep -q "|all_reduce f32\[1024\]|group -1|done|" "$W/logs-$mode/flight/rank-1.txt" || fail "$mode: empty flight recorder"
    sleep 1
    if pgrep -f "$PROG $mode" > /dev/null; then fail "$mode: a process of the job survived"; fi
done

# Only this launcher's own status directory is looked at: other tests'
# launchers run alongside and come and go.
CX_COLLECTIVE_TIMEOUT=3 "$LAUNCH" --nproc 2 "$PROG" none > "$W/none.out" 2>&1 &
lpid=$!
wait "$lpid" || { cat "$W/none.out"; fail "a job without a stall failed"; }
for d in /dev/shm/xla-launch."$lpid".* /tmp/xla-launch."$lpid".*; do
    if [ -e "$d" ]; then fail "status directory $d left behind"; fi
done
echo "watchdog: ok"
