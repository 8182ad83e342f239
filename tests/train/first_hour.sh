#!/bin/sh
# What a newcomer sees of `train` in one process (issue 29): --help says
# --batch-size is per rank; --resume auto without --ckpt-dir, a missing
# checkpoint, a directory and another model's checkpoint are each one line
# saying what was expected and what was found; a resume with nothing left
# stops with one line (no epoch of 0 images); --parallel ddp without the
# launcher says it runs on 1 rank; progress lines give the share of
# --steps, a rate and an ETA, and one summary line ends the run.
# usage: first_hour.sh TRAIN [GPT]
set -eu
TRAIN=$1 GPT=${2:-}
W=$(mktemp -d /tmp/cx_first_hour.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
A="--model mlp --width 16 --depth 1 --data fake --batch-size 12"
# run NAME ARGS...: stdout in $W/NAME.out, stderr in $W/NAME.err, exit code in $rc
run() { name=$1; shift; rc=0; "$TRAIN" "$@" > "$W/$name.out" 2> "$W/$name.err" || rc=$?; }
show() { echo "--- stdout"; cat "$W/$1.out"; echo "--- stderr"; cat "$W/$1.err"; }
# the one line of stderr, exactly
one_err_line() {
    [ "$(wc -l < "$W/$1.err")" = 1 ] || { show "$1"; fail "$1: not one line on stderr"; }
    [ "$(cat "$W/$1.err")" = "$2" ] || { show "$1"; fail "$1: expected '$2'"; }
}

# --batch-size: per rank, and the global batch
"$TRAIN" --help > "$W/help" 2>&1
grep -A1 -- '--batch-size N' "$W/help" | grep -q "on each rank: the global" || { cat "$W/help"; fail "--help: --batch-size does not say per rank"; }
grep -q "batch is N x ranks (spmd: N is the global batch)" "$W/help" || fail "--help: no global batch"

# --resume auto needs --ckpt-dir: a usage error, before any work
run auto $A --steps 2 --resume auto
[ $rc = 2 ] || { show auto; fail "--resume auto without --ckpt-dir exited $rc, not 2"; }
[ ! -s "$W/auto.out" ] || { show auto; fail "--resume auto without --ckpt-dir did work"; }
one_err_line auto "train: --resume auto needs --ckpt-dir (the directory to take the latest checkpoint from)"

# a path with no checkpoint, a directory, a missing full file
run missing $A --steps 2 --resume "$W/nothere"
[ $rc = 1 ] || { show missing; fail "missing checkpoint exited $rc"; }
one_err_line missing "train: cannot resume --model mlp: no checkpoint at $W/nothere (no file $W/nothere, and no sharded checkpoint $W/nothere_rank-*-of-*.h5)"
mkdir "$W/dir"
run dir $A --steps 2 --resume "$W/dir"
[ $rc = 1 ] || fail "a directory exited $rc"
one_err_line dir "train: cannot resume --model mlp: no checkpoint at $W/dir: it is a directory, a checkpoint is a prefix naming files PREFIX_rank-*-of-*.h5 (e.g. $W/dir/ckpt-step-<N>)"
run nofile $A --steps 2 --resume "$W/full.h5"
[ $rc = 1 ] || fail "a missing .h5 exited $rc"
one_err_line nofile "train: cannot resume --model mlp: no checkpoint file at $W/full.h5 (No such file or directory)"

# a finished run: its summary is the last line; then a resume with nothing left
run first $A --steps 10 --log-every 5 --ckpt-dir "$W/ck" --ckpt-every 10
[ $rc = 0 ] || { show first; fail "the first run exited $rc"; }
grep -q "^Train Epoch: 1 \[60/120 (50%)\]	Loss: [0-9.]*  ([0-9.]* images/s, ETA [0-9]*:[0-9][0-9])$" "$W/first.out" ||
    { show first; fail "no loss line with the share of --steps, the rate and the ETA"; }
tail -n 1 "$W/first.out" | grep -q "^Done: 10 steps in [0-9.]* s, [0-9.]* images/s over 1 rank(s); test accuracy [0-9.]*%; checkpoint $W/ck/ckpt-step-10$" ||
    { show first; fail "the last line is not the summary"; }
run again $A --steps 10 --ckpt-dir "$W/ck" --resume auto
[ $rc = 0 ] || { show again; fail "a resume with nothing left exited $rc"; }
tail -n 1 "$W/again.out" | grep -qx "train: checkpoint $W/ck/ckpt-step-10 is already at the end of training (step 10; --epochs 1, --steps 10): nothing left to do; raise --epochs or --steps to go on" ||
    { show again; fail "no 'already at the end' line last"; }
grep -q "^Resumed from $W/ck/ckpt-step-10" "$W/again.out" || { show again; fail "no resume line"; }
if grep -q "^Epoch\|^Test accuracy\|^Done" "$W/again.out"; then show again; fail "the finished checkpoint was trained or evaluated again"; fi
[ "$(ls "$W/ck" | wc -l)" = 2 ] || { ls "$W/ck"; fail "a resume with nothing to do saved a checkpoint"; }
# the same checkpoint with a second epoch: epoch 1 is skipped, not run for 0 images
run more $A --steps 10 --epochs 2 --ckpt-dir "$W/ck" --resume auto
[ $rc = 0 ] || { show more; fail "--epochs 2 from the end of epoch 1 exited $rc"; }
if grep -q "^Epoch 1" "$W/more.out"; then show more; fail "epoch 1 ran again"; fi
grep -q "^Epoch 2: 10 steps, 120 images" "$W/more.out" || { show more; fail "epoch 2 did not run its 10 steps"; }

# another model's checkpoint says what it holds
run cnn --model cnn --data fake --steps 2 --resume "$W/ck/ckpt-step-10"
[ $rc = 1 ] || fail "cnn from an mlp checkpoint exited $rc"
one_err_line cnn "train: cannot resume --model cnn: checkpoint $W/ck/ckpt-step-10 holds another model: its 4 tensors are 1.weight, 1.bias, ..., the model's 8 are conv1.weight, conv1.bias, ..."
if [ -n "$GPT" ]; then
    i=0
    while [ $i -lt 40 ]; do echo "And it came to pass in the day $i that the word was spoken."; i=$((i + 1)); done > "$W/corpus.txt"
    "$GPT" train --data "$W/corpus.txt" --n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --steps 1 --batch-size 2 \
        --ckpt-dir "$W/gpt" > "$W/gpt.out" 2>&1 || { cat "$W/gpt.out"; fail "gpt train"; }
    run gpt $A --steps 2 --resume "$W/gpt/ckpt-step-1"
    [ $rc = 1 ] || fail "mlp from a gpt checkpoint exited $rc"
    one_err_line gpt "train: cannot resume --model mlp: checkpoint $W/gpt/ckpt-step-1 holds another model: its 16 tensors are transformer.*, the model's 4 are 1.weight, 1.bias, ..."
fi

# --parallel ddp without the launcher: one line, then it trains as 1 rank
run ddp $A --steps 2 --parallel ddp
[ $rc = 0 ] || { show ddp; fail "--parallel ddp alone exited $rc"; }
one_err_line ddp "train: notice: --parallel ddp without xla-launch runs on 1 rank; for N ranks run xla-launch --nproc N train ..."
run none $A --steps 2
[ ! -s "$W/none.err" ] || { show none; fail "--parallel none printed to stderr"; }
echo "first_hour: ok"
