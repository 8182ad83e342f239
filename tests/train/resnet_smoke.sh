#!/bin/sh
# train's ResNets on fake ImageNet-shaped data, a few steps each.
#   resnet_smoke.sh one TRAIN: resnet18 on 1 rank at 32x32 (3 channels, 1000
#     classes), the loss near ln(1000) and finite; --image-size with an MNIST
#     set or the cnn (28 x 28 only) is one line and exit 2.
#   resnet_smoke.sh fsdp TRAIN XLA_LAUNCH: resnet50 on 2 ranks, FSDP with a
#     unit per Conv2d / Linear, at 64x64; the checkpoint is consolidated and
#     the reloaded model's accuracy equals the sharded one's.
set -eu
MODE=$1 TRAIN=$2
W=$(mktemp -d /tmp/cx_resnet_smoke.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
if [ "$MODE" = one ]; then
    "$TRAIN" --model resnet18 --data fake --image-size 32 --batch-size 4 --steps 3 --log-every 1 > "$W/out" 2>&1 ||
        { cat "$W/out"; fail "resnet18"; }
    grep -q '^model resnet18: 11689512 parameters; .* data fake, 60000 train / 4 test images' "$W/out" ||
        { cat "$W/out"; fail "not torchvision's resnet18 (11689512 parameters with 1000 classes) on fake data"; }
    # cross entropy of 1000 classes from an untrained net: about ln(1000) = 6.9
    [ "$(grep -c 'Loss: [5-9]\.[0-9]*' "$W/out")" = 3 ] || { cat "$W/out"; fail "not 3 losses near ln(1000)"; }
    grep -q '^Done: 3 steps' "$W/out" || { cat "$W/out"; fail "no summary"; }
    if "$TRAIN" --model resnet18 --data mnist --image-size 64 > "$W/bad" 2>&1; then fail "--image-size 64 with mnist ran"; fi
    [ "$(wc -l < "$W/bad")" = 1 ] && grep -q -- '--image-size 64: --data mnist takes 28 x 28 images' "$W/bad" ||
        { cat "$W/bad"; fail "not one line naming --image-size"; }
    if "$TRAIN" --model cnn --data fake --image-size 32 > "$W/bad" 2>&1; then fail "--image-size 32 with the cnn ran"; fi
    [ "$(wc -l < "$W/bad")" = 1 ] && grep -q -- '--image-size 32: --model cnn takes 28 x 28 images' "$W/bad" ||
        { cat "$W/bad"; fail "not one line naming --image-size for the cnn"; }
else
    LAUNCH=$3
    "$LAUNCH" --nproc 2 "$TRAIN" --model resnet50 --data fake --image-size 64 --batch-size 4 --steps 2 --parallel fsdp \
        --nested --ckpt-dir "$W/ck" > "$W/out" 2>&1 || { cat "$W/out"; fail "resnet50 fsdp"; }
    grep -q 'model resnet50: 25557032 parameters' "$W/out" || { cat "$W/out"; fail "not torchvision's resnet50"; }
    grep -q 'Checkpoint consolidated, Accuracy=' "$W/out" || { cat "$W/out"; fail "no consolidation check"; }
    [ -s "$W/ck/ckpt-step-2_consolidated.h5" ] || fail "no consolidated file"
    grep -q 'Done: 2 steps' "$W/out" || { cat "$W/out"; fail "no summary"; }
fi
echo "resnet_smoke $MODE: ok"
