#!/bin/sh
# CX_MEMORY_LIMIT below what DDP needs and above what ZeRO-3 needs: DDP stops
# with the out-of-memory error, FSDP ZeRO-3 trains. Usage: memory_limit.sh LAUNCHER TRAIN
set -u
launch=$1
train=$2
args="--model mlp --width 2048 --depth 4 --data fake --steps 3 --epochs 1"
out=$(CX_MEMORY_LIMIT=180MB "$launch" --nproc 2 "$train" $args --parallel ddp 2>&1)
rc=$?
if [ $rc -eq 0 ]; then echo "FAIL: DDP trained under a 180 MB limit"; echo "$out"; exit 1; fi
echo "$out" | grep -q "out of memory: .*over the limit of 180000000 bytes (CX_MEMORY_LIMIT)" ||
    { echo "FAIL: DDP did not report the limit"; echo "$out"; exit 1; }
out=$(CX_MEMORY_LIMIT=180MB "$launch" --nproc 2 "$train" $args --parallel fsdp --zero 3 --nested 2>&1)
rc=$?
if [ $rc -ne 0 ]; then echo "FAIL: ZeRO-3 did not train under a 180 MB limit (exit $rc)"; echo "$out"; exit 1; fi
echo "$out" | grep -q "Test accuracy" || { echo "FAIL: ZeRO-3 run did not finish"; echo "$out"; exit 1; }
echo "ok: DDP stopped with the out-of-memory error, ZeRO-3 trained under CX_MEMORY_LIMIT=180MB"
