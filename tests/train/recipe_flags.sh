#!/bin/sh
# The seed's ImageNet recipe flags in `train` (issue 28), one process:
# spelled as test_train_mp_imagenet(_fsdp).py spells them, and acting.
# - the learning rate of every step follows WarmupAndExponentialDecayScheduler
#   (a golden list from torch 1.13's _LRScheduler running the seed's
#   scheduler, and the scheduler's rule replayed here for other values),
#   and changing it each step compiles nothing more;
# - evaluation only every --eval_interval epochs and after the last;
# - --drop_last drops the last batch of train and test, and
#   --test_set_batch_size is the evaluation's batch;
# - --log-file (null for a non-finite number; a resume cuts it back to the
#   checkpoint's step) and `train plot` (whichever curves have points);
#   every bad value is one line, exit 2.
# usage: recipe_flags.sh TRAIN
set -eu
TRAIN=$1
W=$(mktemp -d /tmp/cx_recipe_flags.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
A="--model mlp --width 16 --depth 1 --fake_data --batch_size 8 --steps 4 --log_steps 1 --lr 0.4"
run() { name=$1; shift; rc=0; "$TRAIN" "$@" > "$W/$name.out" 2> "$W/$name.err" || rc=$?; }
show() { echo "--- stdout"; cat "$W/$1.out"; echo "--- stderr"; cat "$W/$1.err"; }
lrs() { grep '"loss"' "$1" | sed 's/.*"lr": \([^,]*\),.*/\1/' | tr '\n' ' '; }

# 6 epochs of 4 steps, warm-up 1.5 epochs, / 10 every 2 epochs
run sched $A --num_epochs 6 --num_warmup_epochs 1.5 --lr_scheduler_divide_every_n_epochs 2 \
    --lr_scheduler_divisor 10 --eval_interval 4 --log-file "$W/sched.jsonl" --metrics
[ $rc = 0 ] || { show sched; fail "schedule run exited $rc"; }
golden="0.133333333 0.2 0.266666667 0.333333333 0.4 0.4 0.4 0.4 0.04 0.04 0.04 0.04 0.04 0.04 0.04 0.04 0.004 0.004 0.004 0.004 0.004 0.004 0.004 0.004 "
[ "$(lrs "$W/sched.jsonl")" = "$golden" ] || { cat "$W/sched.jsonl"; fail "lr per step is not torch's: want $golden"; }

# the scheduler's rule (torch_xla test/schedulers.py on _LRScheduler: it
# steps once when made, and moves the optimizer's rate only when the rate
# of its count changed by 1e-6 or more), against the log's every step
check_rule() {   # LOG LR E K D STEPS_PER_EPOCH
    awk -v lr="$2" -v E="$3" -v K="$4" -v D="$5" -v spe="$6" '
        function ceil(x) { return x == int(x) ? x : int(x) + 1 }
        function rate(n,   e, r) { e = int(n / spe); if (e < ceil(E)) { r = lr * ((n + 1.0) / (E * spe)); return r < lr ? r : lr }
                                   return lr / D ^ int(e / K) }
        function sched_step(   now) { now = rate(count); count++; if (now - prev >= 1e-6 || prev - now >= 1e-6) { cur = rate(count); prev = now } }
        BEGIN { count = 0; prev = -1; sched_step(); at = 0; bad = 0; n = 0 }
        /"loss"/ { s = $0; sub(/.*"step": /, "", s); s = int(s) - 1; while (at < s) { sched_step(); at++ }
                   v = $0; sub(/.*"lr": /, "", v); v += 0; n++
                   if (v - cur > 1e-8 * cur || cur - v > 1e-8 * cur) { print "step " s ": lr " v ", the rule says " cur; bad++ } }
        END { if (bad || n == 0) exit 1 }' "$1"
}
check_rule "$W/sched.jsonl" 0.4 1.5 2 10 4 || fail "lr differs from the scheduler's rule"
run frac $A --steps 3 --num_epochs 5 --num_warmup_epochs 0.9 --lr_scheduler_divide_every_n_epochs 1 \
    --lr_scheduler_divisor 5 --eval_interval 100 --log-file "$W/frac.jsonl"
[ $rc = 0 ] || { show frac; fail "fractional warm-up run exited $rc"; }
check_rule "$W/frac.jsonl" 0.4 0.9 1 5 3 || fail "lr (warm-up 0.9 epochs, / 5 every epoch) differs from the rule"
[ "$(grep -c '"loss"' "$W/frac.jsonl")" = 15 ] || fail "not 15 logged steps"

# evaluated after epochs 4 and 6 only (--eval_interval 4, and the last)
[ "$(grep -o '"epoch": [0-9]*, "test_accuracy"' "$W/sched.jsonl" | tr -dc '0-9\n' | tr '\n' ' ')" = "4 6 " ] ||
    { cat "$W/sched.jsonl"; fail "evaluations not after epochs 4 and 6"; }
[ "$(grep -c '^Test accuracy' "$W/sched.out")" = 2 ] || { show sched; fail "not 2 test accuracy lines"; }
# a new rate every step is a runtime scalar: as many compiles as a constant rate
run const $A --num_epochs 6 --eval_interval 4 --metrics
compiles() { grep -A1 '^Counter: UncachedCompile' "$W/$1.out" | sed -n 's/ *Value: //p'; }
[ -n "$(compiles sched)" ] && [ "$(compiles sched)" = "$(compiles const)" ] ||
    fail "the schedule compiled $(compiles sched) programs, a constant lr $(compiles const)"

# --drop_last: 60000 / 7000 is 8 full batches and one of 4000; the test set's
# 10000 at --test_set_batch_size 3000 is 3 full batches and one of 1000
B="--model mlp --width 8 --depth 1 --fake_data --batch_size 7000"
run keep $B --test_set_batch_size 3000 --log-file "$W/keep.jsonl"
run drop $B --test_set_batch_size 3000 --drop_last --log-file "$W/drop.jsonl"
run drop4 $B --test_set_batch_size 4000 --drop_last --log-file "$W/drop4.jsonl"
grep -q '^Epoch 1: 9 steps, 60000 images' "$W/keep.out" || { show keep; fail "without --drop_last: not 9 steps"; }
grep -q '^Epoch 1: 8 steps, 56000 images' "$W/drop.out" || { show drop; fail "--drop_last: not 8 steps"; }
grep -q '"test_images": 10000}' "$W/keep.jsonl" || fail "without --drop_last: not the whole test set"
grep -q '"test_images": 9000}' "$W/drop.jsonl" || fail "--drop_last --test_set_batch_size 3000: not 9000 test images"
grep -q '"test_images": 8000}' "$W/drop4.jsonl" || fail "--drop_last --test_set_batch_size 4000: not 8000 test images"

# the seed's other spellings: --num_epochs, --fake_data, --log_steps, --datadir, --pjrt_distributed
run spell --model mlp --width 8 --depth 1 --fake_data --num_epochs 2 --steps 1 --pjrt_distributed
[ $rc = 0 ] && [ "$(grep -c '^Epoch [12]:' "$W/spell.out")" = 2 ] && grep -q 'data fake' "$W/spell.out" ||
    { show spell; fail "--fake_data --num_epochs 2"; }
run datadir --model mlp --data mnist --datadir "$W/none" --steps 1
[ $rc = 3 ] && grep -q "$W/none/train-images-idx3-ubyte" "$W/datadir.err" || { show datadir; fail "--datadir not used"; }
"$TRAIN" --help > "$W/help"
for f in "--num_epochs N  *synonym of --epochs" "--fake_data  *synonym of --data fake" "--datadir DIR  *synonym of --data-dir" \
         "--pjrt_distributed  *accepted" "--use_nested_fsdp" "--use_gradient_checkpointing" "--lr_scheduler_divisor D"; do
    grep -q -- "$f" "$W/help" || fail "--help has no '$f'"
done

# the learning curve: train plot draws it (gnuplot: scripts/install-deps.sh)
if command -v gnuplot > /dev/null; then
    "$TRAIN" plot --log-file "$W/sched.jsonl" --out "$W/curve.svg" > "$W/plot.out" 2> "$W/plot.err" || { cat "$W/plot.err"; fail "train plot"; }
    grep -q "<svg" "$W/curve.svg" && grep -q "test accuracy" "$W/curve.svg" || fail "train plot wrote no curves"
    grep -q "^wrote $W/curve.svg$" "$W/plot.out" || fail "train plot did not say what it wrote"
else
    rc=0; "$TRAIN" plot --log-file "$W/sched.jsonl" --out "$W/curve.svg" 2> "$W/plot.err" || rc=$?
    [ $rc = 1 ] && grep -q "install gnuplot-nox" "$W/plot.err" || fail "train plot without gnuplot: rc $rc"
fi
run plotout plot --log-file "$W/sched.jsonl" --out "$W/curve.pdf"
[ $rc = 2 ] && [ "$(cat "$W/plotout.err")" = "train plot: --out $W/curve.pdf: want a .png or .svg name" ] || { show plotout; fail "plot .pdf"; }
: > "$W/empty.jsonl"
run plotempty plot --log-file "$W/empty.jsonl" --out "$W/e.svg"
[ $rc = 3 ] && [ "$(cat "$W/plotempty.err")" = "train plot: $W/empty.jsonl holds no logged step" ] || { show plotempty; fail "plot of an empty log"; }

# logs with one series only, or none finite: whatever has points is drawn
# (a notice names the missing one); no finite value, an --out directory
# that does not exist: one line (exit 3, 2)
grep '"loss"' "$W/sched.jsonl" > "$W/noeval.jsonl"
grep '"test_accuracy"' "$W/sched.jsonl" > "$W/evalonly.jsonl"
printf '{"step": 1, "epoch": 1, "loss": null, "lr": 0.1, "images_per_s": 5.0}\n{"step": 2, "epoch": 1, "loss": nan}\n' > "$W/nan.jsonl"
printf '{"step": 1, "epoch": 1, "loss": null, "lr": 0.1, "images_per_s": 5.0}\n{"step": 2, "epoch": 1, "loss": 2.5}\n' > "$W/null.jsonl"
if command -v gnuplot > /dev/null; then
    run noeval plot --log-file "$W/noeval.jsonl" --out "$W/noeval.svg"
    [ $rc = 0 ] && [ "$(cat "$W/noeval.err")" = "train plot: notice: no test accuracy in the log" ] &&
        grep -q "train loss" "$W/noeval.svg" || { show noeval; fail "plot of a log without evaluations"; }
    run evalonly plot --log-file "$W/evalonly.jsonl" --out "$W/evalonly.png"
    [ $rc = 0 ] && [ "$(cat "$W/evalonly.err")" = "train plot: notice: no train loss in the log" ] && [ -s "$W/evalonly.png" ] ||
        { show evalonly; fail "plot of a log with evaluations only"; }
    run null plot --log-file "$W/null.jsonl" --out "$W/null.svg"
    [ $rc = 0 ] || { show null; fail "plot of a log with a null loss"; }
fi
run nanplot plot --log-file "$W/nan.jsonl" --out "$W/nan.svg"
[ $rc = 3 ] && [ "$(cat "$W/nanplot.err")" = "train plot: $W/nan.jsonl holds no finite value to draw (every one is null or NaN)" ] ||
    { show nanplot; fail "plot of an all-NaN log"; }
run nodir plot --log-file "$W/sched.jsonl" --out "$W/nodir/c.svg"
[ $rc = 2 ] && [ "$(cat "$W/nodir.err")" = "train plot: --out $W/nodir/c.svg: cannot write in $W/nodir: No such file or directory" ] ||
    { show nodir; fail "plot into a missing directory"; }

# a diverged loss is JSON null, not nan
run diverge $A --steps 3 --lr 1e30 --log-file "$W/diverge.jsonl"
grep -q '"loss": null' "$W/diverge.jsonl" && ! grep -qi 'nan\|inf' "$W/diverge.jsonl" ||
    { cat "$W/diverge.jsonl"; show diverge; fail "non-finite loss not written as null"; }

# a resume from an older checkpoint cuts the log back to its step: each
# step and each evaluation once, in order
C="$A --num_epochs 2 --log-file $W/resume.jsonl --ckpt-dir $W/ck --ckpt-every 2"
run first $C
[ $rc = 0 ] || { show first; fail "checkpointed run exited $rc"; }
run resumed $C --resume "$W/ck/ckpt-step-6"
[ $rc = 0 ] || { show resumed; fail "resumed run exited $rc"; }
[ "$(sed 's/.*"step": \([0-9]*\),.*/\1/' "$W/resume.jsonl" | tr '\n' ' ')" = "1 2 3 4 4 5 6 7 8 8 " ] &&
    [ "$(grep -c test_accuracy "$W/resume.jsonl")" = 2 ] || { cat "$W/resume.jsonl"; fail "resumed log not cut back to step 6"; }
ls "$W" | grep -q 'resume.jsonl.' && fail "the log's temporary file was left"

# every bad value: one line naming the flag, exit 2, no work
bad() {   # EXPECTED-LINE ARGS...
    want=$1; shift
    run bad "$@"
    [ $rc = 2 ] && [ ! -s "$W/bad.out" ] && [ "$(cat "$W/bad.err")" = "$want" ] || { show bad; fail "$*: want '$want' and exit 2, got $rc"; }
}
bad "train: --lr_scheduler_divisor: expected an integer in [1, 1000000], got '0' (see train --help)" --lr_scheduler_divisor 0
bad "train: --lr_scheduler_divide_every_n_epochs: expected an integer in [1, 1000000], got '0' (see train --help)" \
    --lr_scheduler_divide_every_n_epochs 0
bad "train: --num_warmup_epochs: expected a number in [0, 1e+06], got '-1' (see train --help)" --num_warmup_epochs -1
bad "train: --eval_interval: expected an integer in [1, 1000000], got '0' (see train --help)" --eval_interval 0
bad "train: --test_set_batch_size: expected an integer in [1, 1048576], got '0' (see train --help)" --test_set_batch_size 0
bad "train: --num_epochs: expected an integer in [1, 1000000], got '0' (see train --help)" --num_epochs 0
bad "train: --fake_data takes no value (see train --help)" --fake_data=yes
bad "train: --data mnist and --fake_data set one flag to different values: give one (see train --help)" --data mnist --fake_data
bad "train: --datadir /x and --data-dir /y set one flag to different values: give one (see train --help)" --datadir /x --data-dir /y
bad "train: --use_nested_fsdp wraps the model's blocks as FSDP units: it goes with --parallel fsdp (or alone), not --parallel ddp (see train --help)" \
    --use_nested_fsdp --parallel ddp
bad "train: --use_nested_fsdp makes the model's blocks the units: drop --nested (see train --help)" --use_nested_fsdp --nested
bad "train: --use_nested_fsdp makes the model's blocks the units: drop --auto-wrap-min-params (see train --help)" \
    --use_nested_fsdp --auto-wrap-min-params 100
bad "train: --use_gradient_checkpointing (the model's blocks) and --grad-ckpt (each unit, or each child of the model) are two policies: give one (see train --help)" \
    --use_gradient_checkpointing --grad-ckpt
echo "recipe_flags: ok"
