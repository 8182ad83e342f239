#!/bin/sh
# What gpt prints under `xla-launch --nproc 2` (issue 29): rank 0 alone
# prints progress (share of --steps, ETA), each step's line before its
# checkpoint's, after the banner, and one summary line at the end;
# --log-all-ranks adds every rank's own lines; a global batch that does not
# split over the ranks is one line with the nearest values that do; an
# FSDP checkpoint, consolidated, evaluates without model flags (its config
# is the file's program_meta, the state dict only PyTorch's keys).
# usage: gpt_launch_lines.sh XLA_LAUNCH GPT CONSOLIDATE_CKPTS
set -eu
LAUNCH=$1 GPT=$2 CONSOLIDATE=$3
W=$(mktemp -d /tmp/cx_gpt_lines.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
i=0
while [ $i -lt 300 ]; do
    echo "And the spirit of God moved upon the face of the waters $i."
    i=$((i + 1))
done > "$W/corpus.txt"
MODEL="--n-layer 2 --n-head 2 --n-embd 32 --block-size 32"
RECIPE="--data $W/corpus.txt $MODEL --steps 20 --batch-size 8 --warmup 3 --lr 3e-3 --log-every 10"

"$LAUNCH" --nproc 2 "$GPT" train $RECIPE --parallel ddp --ckpt-dir "$W/ck" --ckpt-every 10 > "$W/ddp.out" 2>&1 ||
    { cat "$W/ddp.out"; fail "ddp"; }
# the order of rank 0's lines
line_of() { grep -n -- "$1" "$W/ddp.out" | head -1 | cut -d: -f1; }
BANNER=$(line_of "^\[rank 0\] gpt: .* parameters")
S10=$(line_of "^\[rank 0\] step 10/20 (50%): loss [0-9.]*, .* tokens/s, ETA ")
SAVED10=$(line_of "^\[rank 0\] gpt: saved .*/ckpt-step-10$")
S20=$(line_of "^\[rank 0\] step 20/20 (100%)")
SAVED20=$(line_of "^\[rank 0\] gpt: saved .*/ckpt-step-20$")
[ -n "$BANNER" ] && [ -n "$S10" ] && [ -n "$SAVED10" ] && [ -n "$S20" ] && [ -n "$SAVED20" ] || { cat "$W/ddp.out"; fail "a line is missing"; }
[ "$BANNER" -lt "$S10" ] && [ "$S10" -lt "$SAVED10" ] && [ "$SAVED10" -lt "$S20" ] && [ "$S20" -lt "$SAVED20" ] ||
    { cat "$W/ddp.out"; fail "out of order: banner $BANNER, step 10 $S10, saved 10 $SAVED10, step 20 $S20, saved 20 $SAVED20"; }
if grep -q "^\[rank 1\]" "$W/ddp.out"; then cat "$W/ddp.out"; fail "rank 1 printed without --log-all-ranks"; fi
[ "$(grep -c "step [0-9]*/20 " "$W/ddp.out")" -eq 2 ] || { cat "$W/ddp.out"; fail "progress printed more than once a step"; }
tail -1 "$W/ddp.out" | grep -q "^\[rank 0\] gpt: done: 20 steps in [0-9.]* s, [0-9]* tokens/s, loss [0-9.]*, val loss [0-9.]*; checkpoint .*/ckpt-step-20$" ||
    { cat "$W/ddp.out"; fail "the last line is not the summary"; }

"$LAUNCH" --nproc 2 "$GPT" train $RECIPE --parallel ddp --log-all-ranks > "$W/all.out" 2>&1 || { cat "$W/all.out"; fail "--log-all-ranks"; }
grep -q "^\[rank 0\] step 10/20 .* on this rank" "$W/all.out" && grep -q "^\[rank 1\] step 10/20 .* on this rank" "$W/all.out" ||
    { cat "$W/all.out"; fail "--log-all-ranks: not every rank's lines"; }

set +e
"$LAUNCH" --nproc 2 "$GPT" train $RECIPE --batch-size 7 --parallel ddp > "$W/err.out" 2>&1; rc=$?
set -e
[ $rc -ne 0 ] || fail "a batch of 7 over 2 ranks was accepted"
[ "$(grep -c "does not split" "$W/err.out")" -eq 1 ] || { cat "$W/err.out"; fail "the batch error is not one line"; }
grep -q "batch-size 7 does not split over 2 ranks (it is the global batch); the nearest that does: 6 or 8" "$W/err.out" ||
    { cat "$W/err.out"; fail "the batch error suggests no value"; }

"$LAUNCH" --nproc 2 "$GPT" train $RECIPE --parallel fsdp --ckpt-dir "$W/fs" > "$W/fsdp.out" 2>&1 || { cat "$W/fsdp.out"; fail "fsdp"; }
VAL=$(sed -n 's/^\[rank 0\] val loss: //p' "$W/fsdp.out")
"$CONSOLIDATE" --ckpt-prefix "$W/fs/ckpt-step-20" --save-path "$W/full.h5" > /dev/null || fail "consolidate"
EVAL=$("$GPT" eval --data "$W/corpus.txt" --ckpt "$W/full.h5" | sed -n 's/^val loss: //p')
[ -n "$VAL" ] && [ "$EVAL" = "$VAL" ] || fail "the consolidated model without model flags: val loss '$EVAL', the run's '$VAL'"
EVAL=$("$GPT" eval --data "$W/corpus.txt" --ckpt "$W/fs/ckpt-step-20" | sed -n 's/^val loss: //p')
[ "$EVAL" = "$VAL" ] || fail "the sharded checkpoint without model flags: val loss '$EVAL', the run's '$VAL'"
# the config is the file's metadata, not a tensor: the state dict stays
# PyTorch's (load_state_dict(strict=True) takes it)
if command -v h5dump > /dev/null 2>&1; then
    h5dump -a /program_meta "$W/full.h5" | grep -q '"vocab_size=256 block_size=32 n_layer=2 n_head=2 n_embd=32 precision=f32"' ||
        { h5dump -A "$W/full.h5" | head -40; fail "the consolidated file lacks gpt's program_meta"; }
    if h5dump -H "$W/full.h5" | grep -q 'DATASET "model_args"'; then fail "the state dict holds a model_args tensor"; fi
fi
echo "gpt lines on 2 ranks: ok"
