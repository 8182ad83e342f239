#!/bin/sh
# A write that fails on one rank while a sharded (FSDP) checkpoint is saved
# on 2 ranks: every rank prints one line naming the rank and the file that
# failed and the system's error, the job exits non-zero, the last committed
# checkpoint loads, and nothing of the failed save is left, not even the
# shard the other rank wrote successfully.
# usage: storage_faults_dist.sh XLA_LAUNCH TRAIN SHIM CONSOLIDATE_CKPTS
set -eu
LAUNCH=$1 TRAIN=$2 SHIM=$3 CONSOLIDATE=$4
W=$(mktemp -d /tmp/cx_storage_faults_dist.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
RUN="--model mlp --width 64 --depth 1 --data fake --steps 20 --ckpt-every 10 --log-every 1000 --parallel fsdp"
for bad in 0 1; do
    rm -rf "$W/ck"
    if LD_PRELOAD=$SHIM CX_FAULT_MATCH="ckpt-step-20_rank-$bad-" CX_FAULT_AFTER=100000 CX_FAULT_KIND=ENOSPC \
       ASAN_OPTIONS="${ASAN_OPTIONS:-}:verify_asan_link_order=0" \
       "$LAUNCH" --nproc 2 "$TRAIN" $RUN --ckpt-dir "$W/ck" > "$W/out" 2>&1; then
        cat "$W/out"; fail "rank $bad failing: the job succeeded"
    fi
    for r in 0 1; do
        n=$(grep -c "^\[rank $r\] train: checkpoint save failed: rank $bad: .*ckpt-step-20_rank-$bad-of-2.*No space left on device" "$W/out" || true)
        [ "$n" -eq 1 ] || { cat "$W/out"; fail "rank $bad failing: rank $r printed $n lines naming it"; }
    done
    [ -f "$W/ck/ckpt-step-10.commit" ] || fail "rank $bad failing: the committed checkpoint is gone"
    "$CONSOLIDATE" --ckpt-prefix "$W/ck/ckpt-step-10" --save-path "$W/full.h5" > /dev/null ||
        fail "rank $bad failing: the committed checkpoint does not load"
    if ls "$W/ck" | grep -q "ckpt-step-20"; then ls "$W/ck"; fail "rank $bad failing: files of the failed save were left"; fi
done
echo "storage faults on 2 ranks: ok"
