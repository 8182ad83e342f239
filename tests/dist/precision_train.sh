#!/bin/sh
# train --precision bf16-mixed on 2 ranks against 1 rank: FSDP (the mlp,
# parameters gathered in bf16, gradients reduce-scattered in f32) and SPMD
# (the seed's cnn shardings), each on the same global batch as the single
# process's bf16-mixed run, compared as consolidated checkpoints.
#
# Tolerances: each rank's bf16 weight gradients may be rounded from its own
# rows' partial sum where the single process rounds the whole batch's: up
# to 2^-8 of a gradient per step (2^-9 each side). train's SGD (lr 0.01,
# momentum 0.5) moves a parameter by at most 0.01 * (1 + 1.5 + 1.75 +
# 1.875 + 1.94) = 0.08 gradients in 5 steps, so the runs differ by at most
# 0.08 * 2^-8 = 3.2e-4 for gradients up to 1: TOL 1e-3 (the cnn's 3 steps:
# less). A bf16-mixed run lies about 1e-4 from an f32 one, inside TOL, so
# each 2-rank run must also differ from the f32 single process by more
# than the 1e-6 that separates f32 runs on 1 and 2 ranks.
# The GPT under SPMD (its tied wte: a whole bf16-rounded lm_head gradient
# joins the partial embedding one) must run, the ranks issuing the same
# collectives, to the single process's val loss within 1e-3 (printed to 4
# places; the f32 run's is 4e-4 away, so this checks only that it runs).
# --precision bf16 (XLA_USE_BF16) under SPMD: the loader's sharded batches
# are held as bf16 as a single process's are, so the cnn's convs and
# matmuls compile to bf16 kernels (they had run in f32, the batch never
# rounded and the bf16 weights widened each step). The GPT under FSDP with
# --precision bf16 (its decay masks held as bf16) runs to the single
# process's val loss within 1e-3.
# usage: precision_train.sh LAUNCHER TRAIN CONSOLIDATE CKPT_COMPARE GPT
set -eu
launch=$1 train=$2 consolidate=$3 compare=$4 gpt=$5
dir=$(mktemp -d /tmp/cx_precision_train_XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() { echo "precision_train: $*"; exit 1; }
run() {
  out=$1 steps=$2; shift 2
  "$@" --data fake --steps "$steps" --ckpt-dir "$dir/$out" > "$dir/$out.log" 2>&1 || { cat "$dir/$out.log"; fail "$out failed"; }
  "$consolidate" --ckpt-prefix "$dir/$out/ckpt-step-$steps" > /dev/null || fail "$out: cannot consolidate"
}
h5() { echo "$dir/$1/ckpt-step-$2_consolidated.h5"; }
close() { "$compare" "$(h5 "$1" "$3")" "$(h5 "$2" "$3")" "$4" || fail "$1 is not within $4 of $2"; }
apart() { if "$compare" "$(h5 "$1" "$3")" "$(h5 "$2" "$3")" 1e-6 > /dev/null; then fail "$1 is within 1e-6 of $2: bf16 did not engage"; fi; }

mlp="--model mlp --width 32"
run mlp_f32 5 "$train" $mlp --batch-size 16
run mlp_bf16 5 "$train" $mlp --batch-size 16 --precision bf16-mixed
run mlp_fsdp 5 "$launch" --nproc 2 "$train" $mlp --batch-size 8 --parallel fsdp --precision bf16-mixed
close mlp_fsdp mlp_bf16 5 1e-3
apart mlp_fsdp mlp_f32 5
# the run's first line says the precision (an f32 run's line is as before)
grep -q ", parallel fsdp, precision bf16-mixed$" "$dir/mlp_fsdp.log" || { cat "$dir/mlp_fsdp.log"; fail "no precision in the banner"; }
grep -q ", parallel none$" "$dir/mlp_f32.log" || { cat "$dir/mlp_f32.log"; fail "the f32 banner changed"; }

run cnn_f32 3 "$train" --model cnn --batch-size 16
run cnn_bf16 3 "$train" --model cnn --batch-size 16 --precision bf16-mixed
run cnn_spmd 3 "$launch" --nproc 2 "$train" --model cnn --batch-size 16 --parallel spmd --precision bf16-mixed
close cnn_spmd cnn_bf16 3 1e-3
apart cnn_spmd cnn_f32 3
CX_DUMP_DIR="$dir/dump" "$launch" --nproc 2 "$train" --model cnn --data fake --steps 1 --batch-size 16 --parallel spmd \
    --precision bf16 > "$dir/cnn_spmd_b.log" 2>&1 || { cat "$dir/cnn_spmd_b.log"; fail "cnn spmd --precision bf16 failed"; }
products=$(cat "$dir"/dump/*.program.txt | grep -E '^  k[0-9]+ (conv2d|matmul) ') || fail "no conv2d or matmul in the dump"
grep -q ", parallel spmd, precision bf16$" "$dir/cnn_spmd_b.log" || { cat "$dir/cnn_spmd_b.log"; fail "no precision in the banner"; }
if echo "$products" | grep -qv -E ' (conv2d|matmul) bf16\['; then
  echo "$products"
  fail "cnn spmd --precision bf16 computes products outside bf16"
fi

# the gpt's val loss on 2 ranks (run with the given flags) against 1 rank's
gpt_pair() {
  tag=$1; shift
  "$gpt" "$@" > "$dir/gpt1_$tag.log" 2>&1 || { cat "$dir/gpt1_$tag.log"; fail "gpt $tag on 1 rank failed"; }
  "$launch" --nproc 2 "$gpt" "$@" --parallel "$tag" > "$dir/gpt2_$tag.log" 2>&1 ||
    { cat "$dir/gpt2_$tag.log"; fail "gpt $tag failed"; }
  v1=$(sed -n 's/.*gpt: done: .* val loss \([0-9.]*\);.*/\1/p' "$dir/gpt1_$tag.log")
  v2=$(sed -n 's/.*gpt: done: .* val loss \([0-9.]*\);.*/\1/p' "$dir/gpt2_$tag.log")
  [ -n "$v1" ] && [ -n "$v2" ] || fail "no val loss in the gpt $tag logs"
  awk -v a="$v1" -v b="$v2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-3) }' ||
    fail "gpt $tag val loss $v2, 1 rank $v1"
}
g="train --steps 3 --n-layer 2 --n-embd 64 --block-size 32 --batch-size 8"
# shellcheck disable=SC2086
gpt_pair spmd $g --precision bf16-mixed
vspmd=$v2
# shellcheck disable=SC2086
gpt_pair fsdp $g --precision bf16
echo "precision_train: fsdp and spmd bf16-mixed on 2 ranks match 1 rank (gpt spmd val loss $vspmd), spmd bf16 computes" \
     "in bf16, gpt fsdp bf16 val loss $v2 (1 rank $v1)"
