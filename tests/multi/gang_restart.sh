#!/bin/sh
# Gang restart: rank 1 SIGKILLed in the middle of a 2-rank DDP run with
# --max-restarts 2 and --resume auto. The launcher names the rank and how
# fast it knew ("detected in X ms"), restarts the whole job ("restart 1 of
# 2"), says how long recovery took and of what ("recovered in Y s (restart
# 1: spawn, load, compile, first step)"), and the run ends with parameters
# bit-identical to an uninterrupted run's. A job that fails before its first
# step is not restarted, whatever --max-restarts says.
# usage: gang_restart.sh XLA_LAUNCH TRAIN CONSOLIDATE_CKPTS
set -eu
LAUNCH=$1 TRAIN=$2 CONSOLIDATE=$3
W=$(mktemp -d /tmp/cx_gang_restart.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
RUN="--model mlp --width 64 --depth 1 --data fake --steps 400 --parallel ddp --ckpt-every 50 --log-every 50 --threads 1"

"$LAUNCH" --nproc 2 "$TRAIN" $RUN --ckpt-dir "$W/full" > "$W/full.out" 2>&1 || { cat "$W/full.out"; fail "uninterrupted run"; }

"$LAUNCH" --nproc 2 --max-restarts 2 "$TRAIN" $RUN --ckpt-dir "$W/ck" --resume auto > "$W/a.out" 2>&1 &
lpid=$!
# rank 1, once a checkpoint is committed
n=0
until [ -f "$W/ck/ckpt-step-100.commit" ]; do
    n=$((n + 1)); [ $n -lt 600 ] || { kill -9 $lpid; cat "$W/a.out"; fail "the run did not reach step 100"; }
    sleep 0.05
done
victim=""
for p in $(pgrep -f "$TRAIN $RUN --ckpt-dir $W/ck"); do
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx 'RANK=1'; then victim=$p; break; fi
done
[ -n "$victim" ] || { kill -9 $lpid; cat "$W/a.out"; fail "rank 1 not found"; }
kill -9 "$victim"
rc=0; wait $lpid || rc=$?
[ "$rc" -eq 0 ] || { cat "$W/a.out"; fail "the restarted job exited $rc"; }
grep -q "xla-launch: rank 1 killed by signal 9 (detected in [0-9.]* ms)" "$W/a.out" || { cat "$W/a.out"; fail "no detect line"; }
grep -q "xla-launch: restarting the job (restart 1 of 2)" "$W/a.out" || { cat "$W/a.out"; fail "no restart line"; }
grep -q "xla-launch: recovered in [0-9.]* s (restart 1: spawn [0-9.]* s, load [0-9.]* s, compile [0-9.]* s (.*), first step [0-9.]* s)" \
    "$W/a.out" || { cat "$W/a.out"; fail "no recovery line"; }
grep -q "Resumed from .*ckpt-step-[0-9]*" "$W/a.out" || { cat "$W/a.out"; fail "the restart did not resume"; }
# the parameters in the last checkpoints of both runs, bit for bit
"$CONSOLIDATE" --ckpt-prefix "$W/full/ckpt-step-400" --save-path "$W/full.h5" > /dev/null || fail "consolidate (full)"
"$CONSOLIDATE" --ckpt-prefix "$W/ck/ckpt-step-400" --save-path "$W/restarted.h5" > /dev/null || fail "consolidate (restarted)"
h5diff "$W/full.h5" "$W/restarted.h5" /model > "$W/diff" 2>&1 || { head "$W/diff"; fail "parameters differ from the uninterrupted run"; }

# failing before the first step: not retried
rc=0
"$LAUNCH" --nproc 2 --max-restarts 3 "$TRAIN" --model mlp --data mnist --data-dir "$W/none" --steps 10 --parallel ddp \
    > "$W/b.out" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "a job without data succeeded"
grep -q "not restarting: the job failed before its first step completed" "$W/b.out" || { cat "$W/b.out"; fail "no refusal line"; }
if grep -q "restarting the job" "$W/b.out"; then cat "$W/b.out"; fail "it was restarted"; fi
echo "gang restart: ok ($(grep -o 'recovered in [0-9.]* s' "$W/a.out"))"
