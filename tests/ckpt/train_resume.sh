#!/bin/sh
# Resume equivalence through `train`: 2k steps with a save at k equal, bit
# for bit, k steps resumed from that save plus k more (model and optimizer);
# with CX_RESUME_TOL set, the model within that relative tolerance
# (CX_CKPT_COMPARE names the ckpt_compare program). The same again resumed
# from the save consolidated into one file (--with-optimizer): its sampler
# position counts every rank's samples, and the resumed ranks must each
# take their share (a 2-rank FSDP run had resumed twice as far on, the
# data of the steps between skipped).
# usage: train_resume.sh LAUNCHER TRAIN NPROC PARALLEL [EXTRA FLAGS...]
set -eu
launch=$1; train=$2; np=$3; par=$4; shift 4
extra="$*"   # the script's flags (run's own "$@" would hide them): words without spaces
dir=$(mktemp -d /tmp/cx_train_resume_XXXXXX)
trap 'rm -rf "$dir"' EXIT
# shellcheck disable=SC2086
run() { "$launch" --nproc "$np" "$train" --data fake --model mlp --width 32 --steps 6 --parallel "$par" $extra "$@" > "$dir/log" 2>&1 || { cat "$dir/log"; exit 1; }; }
run --ckpt-every 3 --ckpt-dir "$dir/a"
run --ckpt-dir "$dir/b" --resume "$dir/a/ckpt-step-3"
grep -q "Resumed from" "$dir/log" || { cat "$dir/log"; exit 1; }
consolidate=$(dirname "$train")/../tools/consolidate_ckpts
"$consolidate" --ckpt-prefix "$dir/a/ckpt-step-3" --with-optimizer > /dev/null
run --ckpt-dir "$dir/c" --resume "$dir/a/ckpt-step-3_consolidated.h5"
grep -q "Resumed from" "$dir/log" || { cat "$dir/log"; exit 1; }
for x in a b c; do "$consolidate" --ckpt-prefix "$dir/$x/ckpt-step-6" --with-optimizer > /dev/null; done
if [ -n "${CX_RESUME_TOL:-}" ]; then
  # within a tolerance: see CX_RESUME_TOL in tests/ckpt/CMakeLists.txt
  for x in b c; do
    "$CX_CKPT_COMPARE" "$dir/a/ckpt-step-6_consolidated.h5" "$dir/$x/ckpt-step-6_consolidated.h5" "$CX_RESUME_TOL"
  done
  echo "train_resume $par $extra np$np: model within $CX_RESUME_TOL, resumed from the save and from it consolidated"
  exit 0
fi
for x in b c; do
  h5diff "$dir/a/ckpt-step-6_consolidated.h5" "$dir/$x/ckpt-step-6_consolidated.h5" /model
  h5diff "$dir/a/ckpt-step-6_consolidated.h5" "$dir/$x/ckpt-step-6_consolidated.h5" /optimizer
done
echo "train_resume $par $extra np$np: bit-exact, resumed from the save and from it consolidated"
