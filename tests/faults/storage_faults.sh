#!/bin/sh
# A write that fails while a checkpoint is saved (ENOSPC, EIO, a short
# write; injected with the write_fault LD_PRELOAD shim) is one clear line
# and a non-zero exit; the last committed checkpoint stays intact and
# loadable, and nothing of the failed one is left behind.
# usage: storage_faults.sh TRAIN SHIM CONSOLIDATE_CKPTS
set -eu
TRAIN=$1 SHIM=$2 CONSOLIDATE=$3
W=$(mktemp -d /tmp/cx_storage_faults.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
RUN="--model mlp --width 64 --depth 1 --data fake --steps 20 --ckpt-every 10 --log-every 1000"
# one checkpoint is about 400 kB: the first save fits, the second fails in the middle
for kind in ENOSPC EIO SHORT; do
    rm -rf "$W/ck"
    if LD_PRELOAD=$SHIM CX_FAULT_MATCH=ckpt-step- CX_FAULT_AFTER=600000 CX_FAULT_KIND=$kind \
       ASAN_OPTIONS=verify_asan_link_order=0 "$TRAIN" $RUN --ckpt-dir "$W/ck" > "$W/out" 2>&1; then
        cat "$W/out"; fail "$kind: the run succeeded"
    fi
    case $kind in EIO) want="Input/output error" ;; *) want="No space left on device" ;; esac
    line=$(grep "checkpoint save failed" "$W/out") || { cat "$W/out"; fail "$kind: no error line"; }
    [ "$(echo "$line" | wc -l)" -eq 1 ] || fail "$kind: more than one line"
    echo "$line" | grep -q "ckpt-step-20.*$want" || fail "$kind: '$line' does not name the file and the error"
    [ -f "$W/ck/ckpt-step-10.commit" ] || fail "$kind: the committed checkpoint is gone"
    "$CONSOLIDATE" --ckpt-prefix "$W/ck/ckpt-step-10" --save-path "$W/full.h5" > /dev/null ||
        fail "$kind: the committed checkpoint does not load"
    if ls "$W/ck" | grep -q "ckpt-step-20"; then ls "$W/ck"; fail "$kind: files of the failed save were left"; fi
done
echo "storage faults: ok"
