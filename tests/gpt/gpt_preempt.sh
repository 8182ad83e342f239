#!/bin/sh
# Preemption: SIGTERM to xla-launch during a 2-rank gpt run makes every rank
# save at the same step and stop (the launcher exits 143, the ranks 75);
# --resume auto continues from that step and ends where an uninterrupted
# run ends; --keep 2 leaves the newest two committed checkpoints.
# usage: gpt_preempt.sh XLA_LAUNCH GPT
set -eu
LAUNCH=$1 GPT=$2
W=$(mktemp -d /tmp/cx_gpt_preempt.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
i=0
while [ $i -lt 300 ]; do
    echo "And the evening and the morning were the day $i; and God saw that it was good."
    i=$((i + 1))
done > "$W/corpus.txt"
RUN="--data $W/corpus.txt --n-layer 2 --n-head 2 --n-embd 32 --block-size 32 --steps 300 --batch-size 8 --warmup 3 --lr 3e-3 --log-every 10 --parallel ddp"

"$LAUNCH" --nproc 2 "$GPT" train $RUN > "$W/full.out" 2>&1 || { cat "$W/full.out"; fail "uninterrupted run"; }
WANT=$(sed -n 's/^\[rank 0\] val loss: //p' "$W/full.out")

"$LAUNCH" --nproc 2 --preempt-grace 30 "$GPT" train $RUN --ckpt-dir "$W/ck" --ckpt-every 40 --keep 2 > "$W/a.out" 2>&1 &
pid=$!
# wait until training is under way, then preempt
n=0
until grep -q "step 60/300" "$W/a.out" 2>/dev/null; do
    n=$((n + 1)); [ $n -lt 300 ] || { kill -9 $pid; cat "$W/a.out"; fail "the run did not start"; }
    sleep 0.1
done
kill -TERM $pid
rc=0; wait $pid || rc=$?
[ "$rc" -eq 143 ] || { cat "$W/a.out"; fail "the launcher exited $rc, want 143"; }
grep -q "gpt: preempted: saved step" "$W/a.out" || { cat "$W/a.out"; fail "no preemption save"; }
STEP=$(sed -n 's/.*gpt: preempted: saved step \([0-9]*\).*/\1/p' "$W/a.out" | head -1)
[ -f "$W/ck/ckpt-step-$STEP.commit" ] || fail "checkpoint of step $STEP not committed"
[ "$(ls "$W/ck" | grep -c '\.commit$')" -le 2 ] || { ls "$W/ck"; fail "--keep 2 kept more"; }

"$LAUNCH" --nproc 2 "$GPT" train $RUN --ckpt-dir "$W/ck" --ckpt-every 40 --keep 2 --resume auto > "$W/b.out" 2>&1 ||
    { cat "$W/b.out"; fail "resume"; }
grep -q "resumed from .*ckpt-step-$STEP at step $STEP" "$W/b.out" || { cat "$W/b.out"; fail "did not resume at $STEP"; }
GOT=$(sed -n 's/^\[rank 0\] val loss: //p' "$W/b.out")
[ "$GOT" = "$WANT" ] || fail "resumed run ends at val loss $GOT, uninterrupted at $WANT"
[ "$(ls "$W/ck" | grep -c '\.commit$')" -eq 2 ] || { ls "$W/ck"; fail "--keep 2"; }
for f in "$W"/ck/*.h5; do
    [ -f "${f%%_rank-*}.commit" ] || { ls "$W/ck"; fail "$f left behind without its commit marker"; }
done
echo "preemption: ok (saved at step $STEP, resumed to val loss $GOT)"
