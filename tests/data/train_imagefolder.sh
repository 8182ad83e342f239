#!/bin/sh
# train --data imagefolder on a folder make_imagefolder writes from
# Fashion-MNIST (1000 train + 200 val images, 28x28 JPEGs and PNGs, two bad
# files): an MLP with Adam reaches 60% test accuracy in 8 epochs (69.5%
# when written; chance is 10%), through 2 loader workers, and the run's
# accuracies are the same with 0 workers (determinism whatever N). Bad
# files are named once each and counted; a missing --data-dir (exit 2),
# --model cnn on RGB images (exit 2), train and val with different classes
# and a root without train/ (exit 3) are one line; with --bad-images stop
# the first bad file read ends the run in one line naming it (exit 1).
# usage: train_imagefolder.sh TRAIN MAKE_IMAGEFOLDER
set -eu
TRAIN=$1 MAKE=$2
[ -d /usr/share/datasets/fashion-mnist ] || { echo "skipped: no dataset-fashion-mnist"; exit 0; }
W=$(mktemp -d /tmp/cx_train_if.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
"$MAKE" --help | grep -q "^usage: make_imagefolder ROOT" || fail "make_imagefolder --help"
"$MAKE" "$W/p/q/small" --train 10 --val 10 > /dev/null && [ -d "$W/p/q/small/val/class0" ] || fail "make_imagefolder: no mkdir -p"
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
[ $rc = 2 ] && [ "$(wc -l < "$W/e")" = 1 ] && grep -q "needs --data-dir" "$W/e" || { cat "$W/e"; fail "no --data-dir: exit $rc"; }
# the 1-channel 28 x 28 models on a folder's RGB images: a usage error before any work
rc=0
"$TRAIN" --model cnn --data imagefolder --data-dir "$W/if" > "$W/o" 2> "$W/e" || rc=$?
[ $rc = 2 ] && [ ! -s "$W/o" ] && [ "$(cat "$W/e")" = "train: --model cnn takes 1 x 28 x 28 images; an image folder gives 3 x S x S (use mlp or a resnet)" ] ||
    { cat "$W/e"; fail "--model cnn on an image folder: exit $rc"; }
# train and val with other classes: one line naming the first that differs
mkdir "$W/c3" "$W/c4" && cp -r "$W/if/train" "$W/if/val" "$W/c3/" && cp -r "$W/if/train" "$W/if/val" "$W/c4/"
rm -r "$W/c3/train/class9"
mv "$W/c4/val/class9" "$W/c4/val/zzz"
for d in c3 c4; do
    rc=0
    "$TRAIN" --model mlp --data imagefolder --data-dir "$W/$d" --image-size 28 --steps 1 > "$W/o" 2> "$W/e$d" || rc=$?
    [ $rc = 3 ] && [ "$(wc -l < "$W/e$d")" = 1 ] || { cat "$W/e$d"; fail "$d: classes differ between train and val: exit $rc"; }
done
grep -q "class class9 is in val/ only (train/ has 9 classes, val/ 10" "$W/ec3" || { cat "$W/ec3"; fail "c3: the missing class not named"; }
grep -q "class 9 is class9 in train/ but zzz in val/" "$W/ec4" || { cat "$W/ec4"; fail "c4: the renamed class not named"; }
mkdir "$W/empty"
rc=0
"$TRAIN" --model mlp --data imagefolder --data-dir "$W/empty" > "$W/o" 2> "$W/e" || rc=$?
[ $rc = 3 ] && [ "$(wc -l < "$W/e")" = 1 ] && grep -q "$W/empty/train: no such directory" "$W/e" || { cat "$W/e"; fail "no train/: exit $rc"; }
# --bad-images stop: the first bad file read ends the run, named in one line
rc=0
"$TRAIN" $A --epochs 1 --bad-images stop > "$W/o" 2> "$W/e" || rc=$?
[ $rc = 1 ] && [ "$(wc -l < "$W/e")" = 1 ] && grep -q "_bad\.[a-z]*: " "$W/e" || { cat "$W/e"; fail "--bad-images stop: exit $rc"; }
echo "ok"
