#!/bin/sh
# A program that returns from main without cx_dist_finalize: with status 0
# the library finalizes at exit and the job succeeds with none of mpirun's
# "exited without calling finalize" lines; a rank returning 3 still fails
# the job, and the launcher names it.
# usage: no_finalize.sh XLA_LAUNCH DIST_NO_FINALIZE
set -u
LAUNCH=$1 PROG=$2
W=$(mktemp -d /tmp/cx_no_finalize.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; cat "$W/out" >&2; exit 1; }

"$LAUNCH" --nproc 2 "$PROG" > "$W/out" 2>&1 || fail "the job without cx_dist_finalize exited $?"
[ "$(grep -c 'dist_no_finalize: rank [01] done' "$W/out")" -eq 2 ] || fail "not both ranks finished"
if grep -q 'mpirun' "$W/out"; then fail "mpirun's lines about a rank that did not finalize"; fi

if "$LAUNCH" --nproc 2 "$PROG" fail > "$W/out" 2>&1; then fail "a rank returned 3 and the job exited 0"; fi
grep -q 'rank 1 exited with status 3' "$W/out" || fail "the launcher did not name rank 1"
# rank 0 waits to finalize when rank 1 fails: its output was flushed first
grep -q 'dist_no_finalize: rank 0 done' "$W/out" || fail "rank 0's line was lost"
echo "no_finalize: ok"
