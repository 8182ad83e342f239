#!/bin/sh
# The gpt program end to end on a small generated corpus, tiny model:
# train (log file, checkpoints) ends with "val loss: X"; eval of the last
# checkpoint prints the same val loss; sample gives the same text for the
# same seed with 0 compiles after the first token; resume continues from
# the last checkpoint; bad flags and a missing corpus are one-line errors.
# usage: gpt_program.sh GPT_BINARY
set -eu
GPT=$1
W=$(mktemp -d /tmp/cx_gpt_test.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# a corpus with structure a tiny model can learn a little of
i=0
while [ $i -lt 400 ]; do
    echo "And it came to pass in the day $i that the word was spoken unto them, saying: go in peace."
    i=$((i + 1))
done > "$W/corpus.txt"

MODEL="--n-layer 2 --n-head 2 --n-embd 32 --block-size 32"
"$GPT" train --data "$W/corpus.txt" $MODEL --steps 60 --batch-size 8 --warmup 5 --lr 3e-3 --log-every 10 --eval-every 30 \
    --log-file "$W/log.jsonl" --ckpt-dir "$W/ckpt" --ckpt-every 30 > "$W/train.out" 2>&1 || { cat "$W/train.out"; fail "train"; }
VAL=$(sed -n 's/^val loss: //p' "$W/train.out")
[ -n "$VAL" ] || { cat "$W/train.out"; fail "no 'val loss:' line"; }
# the loss went down from ln(256) = 5.55
awk -v v="$VAL" 'BEGIN { exit !(v < 3.0) }' || fail "val loss $VAL did not fall below 3.0"
[ "$(grep -c '"step"' "$W/log.jsonl")" -ge 4 ] || fail "log file has too few lines"
grep -q '"val_loss"' "$W/log.jsonl" || fail "log file has no val_loss"
[ -f "$W/ckpt/ckpt-step-60.commit" ] || fail "no committed checkpoint at step 60"

EVAL=$("$GPT" eval --data "$W/corpus.txt" $MODEL --ckpt "$W/ckpt/ckpt-step-60" 2>&1 | sed -n 's/^val loss: //p')
[ "$EVAL" = "$VAL" ] || fail "eval gives val loss '$EVAL', train ended with '$VAL'"

S1=$("$GPT" sample $MODEL --ckpt "$W/ckpt/ckpt-step-60" --prompt "And it" --tokens 40 --top-k 5 --seed 3 2>"$W/s1.err")
S2=$("$GPT" sample $MODEL --ckpt "$W/ckpt/ckpt-step-60" --prompt "And it" --tokens 40 --top-k 5 --seed 3 2>/dev/null)
[ "$S1" = "$S2" ] || fail "the same seed gave different text"
grep -q "40 tokens, 0 compiles after the first token" "$W/s1.err" || { cat "$W/s1.err"; fail "sampling recompiled"; }
# --precision bf16-mixed samples under autocast: its products compile to bf16 kernels
CX_DUMP_DIR="$W/sdump" "$GPT" sample $MODEL --ckpt "$W/ckpt/ckpt-step-60" --prompt "And it" --tokens 2 \
    --precision bf16-mixed > /dev/null 2>"$W/s3.err" || { cat "$W/s3.err"; fail "sample --precision bf16-mixed"; }
grep -qE '^  k[0-9]+ matmul bf16\[' "$W"/sdump/*.program.txt || fail "sample --precision bf16-mixed ran no bf16 matmul"

# resume from step 30 and finish: the same final checkpoint values are not
# required (the loader's prefetch order is), but it must pick up at 30
"$GPT" train --data "$W/corpus.txt" $MODEL --steps 60 --batch-size 8 --warmup 5 --lr 3e-3 --log-every 10 \
    --ckpt-dir "$W/ckpt" --resume "$W/ckpt/ckpt-step-30" > "$W/resume.out" 2>&1 || { cat "$W/resume.out"; fail "resume"; }
grep -q "resumed from .*ckpt-step-30 at step 30" "$W/resume.out" || { cat "$W/resume.out"; fail "resume message"; }
grep -q "^step 40/60" "$W/resume.out" || { cat "$W/resume.out"; fail "resume did not continue after step 30"; }

# errors: one line naming the thing, non-zero exit
if "$GPT" train --data "$W/missing.txt" $MODEL --steps 2 > "$W/err.out" 2>&1; then fail "missing corpus accepted"; fi
grep -q "missing.txt" "$W/err.out" || { cat "$W/err.out"; fail "missing corpus not named"; }
if "$GPT" eval $MODEL --data "$W/corpus.txt" --ckpt "$W/nope" > "$W/err.out" 2>&1; then fail "missing checkpoint accepted"; fi
grep -q "nope" "$W/err.out" || { cat "$W/err.out"; fail "missing checkpoint not named"; }
if "$GPT" train --n-head 3 $MODEL --n-head 3 --data "$W/corpus.txt" > "$W/err.out" 2>&1; then fail "bad heads accepted"; fi
grep -q "n_head" "$W/err.out" || { cat "$W/err.out"; fail "bad config not named"; }
if "$GPT" frobnicate > "$W/err.out" 2>&1; then fail "unknown command accepted"; fi
"$GPT" train --precision fp16 $MODEL --data "$W/corpus.txt" > "$W/err.out" 2>&1 && fail "--precision fp16 accepted"
[ "$(wc -l < "$W/err.out")" -eq 1 ] && grep -q "precision fp16: cxla has no float16" "$W/err.out" ||
    { cat "$W/err.out"; fail "--precision fp16 is not one line naming it"; }

if command -v gnuplot > /dev/null; then
    "$GPT" plot --log-file "$W/log.jsonl" --out "$W/loss.svg" > /dev/null || fail "plot"
    grep -q "<svg" "$W/loss.svg" || fail "plot wrote no svg"
fi
echo "gpt program: ok (val loss $VAL)"
