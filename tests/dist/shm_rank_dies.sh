#!/bin/sh
# A rank SIGKILLed while the ranks run 16 MiB all-reduces through shared
# memory (so the other rank waits inside one): the job ends within a few
# seconds, the launcher names the killed rank and exits non-zero, no
# process of the job survives, and nothing of the segment or of the heaps
# the all-reduces run in is left in /dev/shm (each was unlinked as soon as
# both ranks had mapped it, so none is there even while the job runs).
# usage: shm_rank_dies.sh XLA_LAUNCH DIST_SHM
set -eu
LAUNCH=$1 PROG=$2
W=$(mktemp -d /tmp/cx_shm_dies.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; cat "$W/out" >&2 || true; exit 1; }

DIST_SHM_DIR=$W "$LAUNCH" --nproc 2 "$PROG" die > "$W/out" 2>&1 &
lpid=$!
i=0
while [ ! -s "$W/rank-0.pid" ] || [ ! -s "$W/rank-1.pid" ]; do
    i=$((i + 1))
    [ $i -le 300 ] || fail "the ranks did not start within 30 s"
    kill -0 "$lpid" 2>/dev/null || fail "the job ended before it was killed"
    sleep 0.1
done
p0=$(cat "$W/rank-0.pid") p1=$(cat "$W/rank-1.pid")
sleep 1   # well inside the loop of all-reduces
named() { ls /dev/shm/cxla-shm-"$p0"-* > /dev/null 2>&1 || ls /dev/shm/cxla-heap-"$p0"-* > /dev/null 2>&1; }
if named; then fail "the segment or a heap is still named in /dev/shm while the job runs"; fi
start=$(date +%s)
kill -9 "$p1"
if wait "$lpid"; then fail "the launcher exited 0 after a rank was killed"; fi
took=$(( $(date +%s) - start ))
[ "$took" -le 10 ] || fail "the job took $took s to end after rank 1 was killed"
grep -q "rank 1 killed by signal 9" "$W/out" || fail "the launcher does not name rank 1 as killed"
sleep 0.5
if kill -0 "$p0" 2>/dev/null; then fail "rank 0 (pid $p0) survived"; fi
if named; then fail "a segment or heap of the job is left in /dev/shm"; fi
echo "shm_rank_dies: ok (ended in $took s)"
