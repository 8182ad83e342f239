#!/bin/sh
# A resnet18 trains on an image folder on 2 ranks, as the seed's ImageNet
# recipes do, twice: with DDP, and with nested ZeRO-3 (each BasicBlock its
# own FSDP unit) plus gradient checkpointing of the blocks. The folder is
# made by make_imagefolder from Fashion-MNIST (800 train + 200 val 28x28
# JPEGs and PNGs, decoded to RGB, random-resized-cropped to 32). Adam at
# 1e-3 for 4 epochs must reach 45% test accuracy each way (chance is 10%;
# 58.5% with DDP and ~60% with FSDP when written, on the Zen 4).
# usage: resnet_imagefolder_dist.sh XLA_LAUNCH TRAIN MAKE_IMAGEFOLDER
set -eu
LAUNCH=$1 TRAIN=$2 MAKE=$3
[ -d /usr/share/datasets/fashion-mnist ] || { echo "skipped: no dataset-fashion-mnist"; exit 0; }
W=$(mktemp -d /tmp/cx_resnet_if.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# CX_TEST_SHORT (the sanitizer build, ~20x slower): the same paths on a
# small folder for one epoch, without the accuracy target
if [ -n "${CX_TEST_SHORT:-}" ]; then
    "$MAKE" "$W/if" --train 128 --val 64 > /dev/null
    A="--num_epochs 1 --eval_interval 1"
else
    "$MAKE" "$W/if" --train 800 --val 200 > /dev/null
    A="--num_epochs 4 --eval_interval 4 --target-accuracy 45"
fi
A="--model resnet18 --datadir $W/if --image-size 32 --batch_size 32 --optimizer adam --lr 0.001 --num-workers 2
   --log-every 1000 $A"
run() {   # name, flags...
    name=$1; shift
    rc=0
    "$LAUNCH" --nproc 2 "$TRAIN" --data imagefolder $A "$@" > "$W/$name.out" 2>&1 || rc=$?
    [ $rc = 0 ] || { cat "$W/$name.out"; fail "$name: exit $rc"; }
    grep "Test accuracy" "$W/$name.out" | tail -1
}
run ddp --parallel ddp
run zero3 --use_nested_fsdp --zero 3 --use_gradient_checkpointing
grep -q "blocks of resnet18 (BasicBlock): 9 FSDP units, 8 checkpointed" "$W/zero3.out" ||
    { cat "$W/zero3.out"; fail "zero3: the residual blocks are not the units"; }
[ "$(grep -c 'Test accuracy' "$W/ddp.out")" = 1 ] || fail "--eval_interval: evaluated more than once"
echo "ok"
