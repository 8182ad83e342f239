#!/bin/sh
# train --data imagefolder on a folder make_imagefolder writes from
# Fashion-MNIST (1000 train + 200 val images, 28x28 JPEGs and PNGs, two bad
# files): an MLP with Adam reaches 60% test accuracy in 8 epochs (69.5%
# when written; chance is 10%), through 2 loader workers, and the run's
# accuracies are the same with 0 workers (determinism whatever N). Bad
# files are named once each and counted; a missing --data-dir and a root
# without train/ are one line and exit 3.
# usage: train_imagefolder.sh TRAIN MAKE_IMAGEFOLDER
set -eu
TRAIN=$1 MAKE=$2
[ -d /usr/share/datasets/fashion-mnist ] || { echo "skipped: no dataset-fashion-mnist"; exit 0; }
W=$(mktemp -d /tmp/cx_train_if.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
"$MAKE" "$W/if" --train 1000 --val 200 --corrupt 2 > /dev/null
A="--model mlp --data imagefolder --data-dir $W/if --image-size 28 --epochs 8 --batch-size 32 --optimizer adam --lr 0.002 --log-every 1000"
for n in 2 0; do
    rc=0
    "$TRAIN" $A --num-workers $n --target-accuracy 60 > "$W/out$n" 2> "$W/err$n" || rc=$?
    [ $rc = 0 ] || { cat "$W/out$n" "$W/err$n"; fail "--num-workers $n: exit $rc"; }
    [ "$(grep -c '_bad\.' "$W/err$n")" = 2 ] || { cat "$W/err$n"; fail "--num-workers $n: bad files not named once each"; }
    grep -q "2 bad image file(s) skipped in the train set" "$W/err$n" || { cat "$W/err$n"; fail "no count"; }
    grep "Test accuracy" "$W/out$n" > "$W/acc$n"
done
cmp -s "$W/acc0" "$W/acc2" || { paste "$W/acc0" "$W/acc2"; fail "accuracies differ between 0 and 2 workers"; }
tail -1 "$W/acc2"

rc=0
"$TRAIN" --model mlp --data imagefolder > "$W/o" 2> "$W/e" || rc=$?
[ $rc = 3 ] && [ "$(wc -l < "$W/e")" = 1 ] && grep -q "needs --data-dir" "$W/e" || { cat "$W/e"; fail "no --data-dir: exit $rc"; }
mkdir "$W/empty"
rc=0
"$TRAIN" --model mlp --data imagefolder --data-dir "$W/empty" > "$W/o" 2> "$W/e" || rc=$?
[ $rc = 3 ] && [ "$(wc -l < "$W/e")" = 1 ] && grep -q "$W/empty/train: no such directory" "$W/e" || { cat "$W/e"; fail "no train/: exit $rc"; }
echo "ok"
