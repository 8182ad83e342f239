#!/bin/sh
# gpt as a newcomer meets it in one process (issue 29): a checkpoint holds
# the model's shape, so eval, sample and --resume need no model flags, and
# a model flag that disagrees with it is one line naming both values; the
# help has no raw newline in a default, says the batch is global and lists
# --cache-dir and --log-all-ranks; --cache-dir fills the persistent compile
# cache; sample prints UTF-8 (an invalid byte becomes U+FFFD); a warm-up
# longer than the run is one warning line.
# usage: gpt_newcomer.sh GPT_BINARY
set -eu
GPT=$1
W=$(mktemp -d /tmp/cx_gpt_newcomer.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
i=0
while [ $i -lt 300 ]; do
    echo "And God called the light Day $i, and the darkness he called Night."
    i=$((i + 1))
done > "$W/corpus.txt"
MODEL="--n-layer 2 --n-head 2 --n-embd 32 --block-size 32"
RECIPE="--data $W/corpus.txt --steps 20 --batch-size 8 --warmup 3 --lr 3e-3 --log-every 10"

# ---- the checkpoint carries the model's shape
"$GPT" train $RECIPE $MODEL --ckpt-dir "$W/ck" > "$W/train.out" 2>&1 || { cat "$W/train.out"; fail "train"; }
VAL=$(sed -n 's/^val loss: //p' "$W/train.out")
[ -n "$VAL" ] || { cat "$W/train.out"; fail "train: no val loss"; }
"$GPT" eval --data "$W/corpus.txt" --ckpt "$W/ck/ckpt-step-20" > "$W/eval.out" 2>&1 || { cat "$W/eval.out"; fail "eval without model flags"; }
[ "$(sed -n 's/^val loss: //p' "$W/eval.out")" = "$VAL" ] || { cat "$W/eval.out"; fail "eval without model flags: not train's val loss $VAL"; }
"$GPT" sample --ckpt "$W/ck/ckpt-step-20" --prompt "And" --tokens 10 > "$W/sample.out" 2>&1 || { cat "$W/sample.out"; fail "sample without model flags"; }
# flags given anyway: the same values pass, another is one line, exit 2
"$GPT" eval --data "$W/corpus.txt" $MODEL --ckpt "$W/ck/ckpt-step-20" > /dev/null 2>&1 || fail "eval with train's model flags"
grep -q "notice" "$W/eval.out" && { cat "$W/eval.out"; fail "a notice on an eval at the checkpoint's precision"; }
# another precision than the checkpoint's loads, and says so in one line
"$GPT" eval --data "$W/corpus.txt" --precision bf16-mixed --ckpt "$W/ck/ckpt-step-20" > "$W/eval16.out" 2>&1 ||
    { cat "$W/eval16.out"; fail "eval of an f32 checkpoint in bf16-mixed"; }
[ "$(grep -c "^gpt eval: notice: the checkpoint was saved by a --precision f32 run, and this one runs bf16-mixed" "$W/eval16.out")" = 1 ] ||
    { cat "$W/eval16.out"; fail "eval in bf16-mixed: no one-line notice of the checkpoint's f32"; }
set +e
"$GPT" eval --data "$W/corpus.txt" --n-layer 4 --ckpt "$W/ck/ckpt-step-20" > "$W/err.out" 2>&1; rc=$?
set -e
[ $rc -eq 2 ] || { cat "$W/err.out"; fail "a disagreeing --n-layer: exit $rc, want 2"; }
[ "$(wc -l < "$W/err.out")" -eq 1 ] || { cat "$W/err.out"; fail "a disagreeing --n-layer: not one line"; }
grep -q "^gpt eval: --n-layer 4 disagrees with the checkpoint's 2 " "$W/err.out" || { cat "$W/err.out"; fail "disagreeing --n-layer: message"; }
if "$GPT" sample --n-head 4 --ckpt "$W/ck/ckpt-step-20" > "$W/err.out" 2>&1; then fail "a disagreeing --n-head was accepted"; fi
grep -q "^gpt sample: --n-head 4 disagrees with the checkpoint's 2 " "$W/err.out" || { cat "$W/err.out"; fail "disagreeing --n-head: message"; }
# --resume takes the shape from the checkpoint too
"$GPT" train --data "$W/corpus.txt" --steps 30 --batch-size 8 --warmup 3 --lr 3e-3 --log-every 10 --ckpt-dir "$W/ck" --resume auto \
    > "$W/resume.out" 2>&1 || { cat "$W/resume.out"; fail "resume without model flags"; }
grep -q "^step 30/30" "$W/resume.out" || { cat "$W/resume.out"; fail "resume did not reach step 30"; }
# the shape is the checkpoint's program_meta, written by every save, resumed ones too
if command -v h5dump > /dev/null 2>&1; then
    h5dump -a /program_meta "$W/ck/ckpt-step-30_rank-0-of-1.h5" |
        grep -q '"vocab_size=256 block_size=32 n_layer=2 n_head=2 n_embd=32 precision=f32"' || fail "step 30's file lacks gpt's program_meta"
    if h5dump -H "$W/ck/ckpt-step-30_rank-0-of-1.h5" | grep -q 'DATASET "model_args"'; then fail "a model_args tensor"; fi
fi

# ---- help
"$GPT" --help > "$W/help.out" || fail "--help"
if grep -q "(default *$" "$W/help.out"; then grep -n "(default *$" "$W/help.out"; fail "a default in --help ends in a raw newline"; fi
grep -q "^ *--prompt TEXT .*(default: a newline)" "$W/help.out" || { cat "$W/help.out"; fail "--prompt's default"; }
grep -q "^ *--cache-dir DIR" "$W/help.out" || fail "--help lists no --cache-dir"
grep -q "^ *--log-all-ranks" "$W/help.out" || fail "--help lists no --log-all-ranks"
grep -A1 "^ *--batch-size" "$W/help.out" | grep -q "global batch" || fail "--help does not say --batch-size is global"
grep -q "U+FFFD" "$W/help.out" || fail "--help does not say how sample prints invalid UTF-8"

# ---- --cache-dir: the persistent compile cache
"$GPT" sample --ckpt "$W/ck/ckpt-step-20" --tokens 3 --cache-dir "$W/cache" > /dev/null 2>&1 || fail "sample --cache-dir"
[ -n "$(ls -A "$W/cache" 2>/dev/null)" ] || fail "--cache-dir left the cache empty"
: > "$W/afile"
if "$GPT" sample --ckpt "$W/ck/ckpt-step-20" --tokens 3 --cache-dir "$W/afile/sub" > "$W/err.out" 2>&1; then fail "a --cache-dir under a file accepted"; fi
[ "$(wc -l < "$W/err.out")" -eq 1 ] && grep -q -- "--cache-dir $W/afile/sub" "$W/err.out" || { cat "$W/err.out"; fail "bad --cache-dir: one line naming it"; }

# ---- sample prints UTF-8: the prompt's invalid byte, and whatever is drawn
"$GPT" sample --ckpt "$W/ck/ckpt-step-20" --prompt "$(printf 'a\377b')" --tokens 300 --temperature 5 --seed 7 \
    > "$W/utf8.out" 2> /dev/null || fail "sample an invalid prompt"
[ "$(head -c 5 "$W/utf8.out" | od -An -tx1 | tr -d ' \n')" = "61efbfbd62" ] ||
    { head -c 5 "$W/utf8.out" | od -An -tx1; fail "the prompt's byte 0xff was not printed as U+FFFD"; }
iconv -f UTF-8 -t UTF-8 "$W/utf8.out" > /dev/null 2>&1 || fail "sample printed invalid UTF-8"

# ---- a warm-up longer than the run: one warning; none otherwise
"$GPT" train --data "$W/corpus.txt" $MODEL --steps 3 --batch-size 8 --warmup 5 > "$W/warm.out" 2>&1 || { cat "$W/warm.out"; fail "train --warmup 5 --steps 3"; }
[ "$(grep -c "warning: --warmup 5 is longer than --steps 3" "$W/warm.out")" -eq 1 ] || { cat "$W/warm.out"; fail "no warm-up warning"; }
if grep -q "warning" "$W/train.out"; then cat "$W/train.out"; fail "a warning for a warm-up shorter than the run"; fi
echo "gpt newcomer: ok (val loss $VAL without model flags)"
