#!/bin/sh
# `train` under xla-launch (issue 29): rank 0 speaks for the job (the
# other ranks print nothing on success), with the images of all ranks and
# the share of --steps; --log-all-ranks brings back every rank's own
# lines, speeds "on this rank"; --nproc 1 is a launched world of one, so
# --parallel ddp gives no notice.
# usage: first_hour_dist.sh XLA_LAUNCH TRAIN
set -eu
LAUNCH=$1 TRAIN=$2
W=$(mktemp -d /tmp/cx_first_hour_dist.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
A="--model mlp --width 16 --depth 1 --data fake --batch-size 12 --steps 10 --log-every 5 --parallel ddp"

"$LAUNCH" --nproc 2 "$TRAIN" $A --ckpt-dir "$W/ck" > "$W/two" 2>&1 || { cat "$W/two"; fail "2 ranks"; }
if grep -q '^\[rank 1\]' "$W/two"; then cat "$W/two"; fail "rank 1 printed"; fi
# 2 ranks x 12 images a step: step 5 is 120 of the 240 images of 10 steps
[ "$(grep -c '^\[rank 0\] Train Epoch' "$W/two")" = 2 ] || { cat "$W/two"; fail "not 2 loss lines"; }
grep -q '^\[rank 0\] Train Epoch: 1 \[120/240 (50%)\]	Loss: [0-9.]*  ([0-9.]* images/s, ETA [0-9]*:[0-9][0-9])$' "$W/two" ||
    { cat "$W/two"; fail "no global loss line"; }
grep -q '^\[rank 0\] Epoch 1: 10 steps, 240 images in [0-9.]* s ([0-9.]* images/s on 2 ranks)' "$W/two" ||
    { cat "$W/two"; fail "no global epoch line"; }
grep -v '^xla-launch' "$W/two" | tail -n 1 |
    grep -q "^\[rank 0\] Done: 10 steps in [0-9.]* s, [0-9.]* images/s over 2 rank(s); test accuracy [0-9.]*%; checkpoint $W/ck/ckpt-step-10$" ||
    { cat "$W/two"; fail "the summary is not the last line"; }

"$LAUNCH" --nproc 2 "$TRAIN" $A --log-all-ranks > "$W/all" 2>&1 || { cat "$W/all"; fail "2 ranks, --log-all-ranks"; }
for r in 0 1; do
    [ "$(grep -c "^\[rank $r\] Train Epoch: 1 \[[0-9]*/240 ([0-9]*%)\]	Loss: [0-9.]*  ([0-9.]* images/s on this rank" "$W/all")" = 2 ] ||
        { cat "$W/all"; fail "rank $r: not 2 loss lines of its own"; }
    grep -q "^\[rank $r\] Epoch 1: 10 steps, 120 images in [0-9.]* s ([0-9.]* images/s on this rank)" "$W/all" ||
        { cat "$W/all"; fail "rank $r: no epoch line of its own"; }
done
[ "$(grep -c 'Done:' "$W/all")" = 1 ] || { cat "$W/all"; fail "not one summary line"; }

"$LAUNCH" --nproc 1 "$TRAIN" $A > "$W/one" 2>&1 || { cat "$W/one"; fail "--nproc 1"; }
if grep -q "notice" "$W/one"; then cat "$W/one"; fail "--nproc 1 is meant: no notice"; fi
echo "first_hour_dist: ok"
