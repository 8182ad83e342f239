#!/bin/sh
# Checkpoints of --precision runs hold f32: bf16-mixed keeps f32 master
# weights, and bf16 (XLA_USE_BF16) saves its bf16-held tensors as f32, as
# PyTorch/XLA does when it moves them to the CPU. A bf16 run resumes from
# its own checkpoint (f32 in the file, bf16 again in memory).
# usage: precision_ckpt.sh TRAIN
set -eu
train=$1
dir=$(mktemp -d /tmp/cx_precision_ckpt_XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() { echo "precision_ckpt: $*"; exit 1; }
run() { "$train" --data fake --model mlp --width 32 --steps 4 "$@" > "$dir/log" 2>&1 || { cat "$dir/log"; fail "train $* failed"; }; }
for p in bf16-mixed bf16; do
  run --precision "$p" --ckpt-dir "$dir/$p"
  f=$(ls "$dir/$p"/ckpt-step-4*.h5 | head -1)
  [ -f "$f" ] || fail "$p: no checkpoint file in $dir/$p"
  h5dump -H "$f" > "$dir/h" || fail "$p: h5dump $f failed"
  grep -q "H5T_IEEE_F32LE" "$dir/h" || fail "$p: no f32 dataset in $f"
  # bf16 is stored as raw 16-bit words (ckpt_h5.c)
  if grep -q "H5T_STD_U16LE" "$dir/h"; then fail "$p: a bf16 dataset in $f"; fi
done
run --precision bf16 --ckpt-dir "$dir/bf16b" --resume "$dir/bf16/ckpt-step-4" --epochs 2
grep -q "Resumed from" "$dir/log" || { cat "$dir/log"; fail "bf16: did not resume"; }
echo "precision_ckpt: bf16-mixed and bf16 checkpoints hold f32; bf16 resumes from its own"
