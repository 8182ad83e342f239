#!/bin/sh
# Soak test of gang restarts (not in CI): a DDP run and a ZeRO-3 run of the
# reference trainer on 2 ranks, each SIGKILLing a random rank every MIN-MAX
# seconds with --max-restarts 20 and --resume auto. Each must end with
# parameters bit-identical to an uninterrupted run of the same steps. Prints
# per mode the restarts and the launcher's detect and recovery times
# (median, min-max).
# usage: tests/soak/soak.sh [SECONDS_PER_RUN [MIN MAX [BUILD]]]   (defaults 600, 30 60, ./build)
set -eu
SECS=${1:-600} MIN=${2:-30} MAX=${3:-60}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${4:-$ROOT/build}
LAUNCH=$B/launch/xla-launch TRAIN=$B/examples/train CONSOLIDATE=$B/tools/consolidate_ckpts
for f in "$LAUNCH" "$TRAIN" "$CONSOLIDATE"; do [ -x "$f" ] || { echo "soak: $f not built" >&2; exit 1; }; done
W=$(mktemp -d /tmp/cx_soak.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "soak: FAIL: $*" >&2; exit 1; }
# a random integer in [lo, hi]
rand() { awk -v lo="$1" -v hi="$2" -v s="$(od -An -N4 -tu4 /dev/urandom)" 'BEGIN { srand(s); print lo + int(rand() * (hi - lo + 1)) }'; }
# median and range of numbers, one per line
stats() { sort -g | awk '{ v[NR] = $1 } END { if (!NR) { print "none"; exit } m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "median %g, %g-%g (n=%d)\n", m, v[1], v[NR], NR }'; }

for mode in ddp zero3; do
    case $mode in
    ddp) PAR="--parallel ddp" ;;
    zero3) PAR="--parallel fsdp --zero 3" ;;
    esac
    BASE="--model mlp --width 1024 --depth 2 --data fake --threads 1 --log-every 1000000 $PAR --steps 400"
    # epochs of 400 steps for about SECS seconds: time one
    t0=$(date +%s.%N)
    "$LAUNCH" --nproc 2 "$TRAIN" $BASE > "$W/cal.out" 2>&1 || { cat "$W/cal.out"; fail "$mode: calibration"; }
    t1=$(date +%s.%N)
    EPOCHS=$(awk -v a="$t0" -v b="$t1" -v s="$SECS" 'BEGIN { n = int(s / (b - a)); print n < 2 ? 2 : n }')
    STEPS=$((EPOCHS * 400))
    EVERY=100
    RUN="$BASE --epochs $EPOCHS --ckpt-every $EVERY"
    echo "soak $mode: $STEPS steps, a checkpoint every $EVERY, a rank killed every $MIN-$MAX s"
    "$LAUNCH" --nproc 2 "$TRAIN" $RUN --ckpt-dir "$W/ref-$mode" > "$W/ref.out" 2>&1 || { cat "$W/ref.out"; fail "$mode: reference run"; }
    "$LAUNCH" --nproc 2 --max-restarts 20 "$TRAIN" $RUN --ckpt-dir "$W/ck-$mode" --resume auto > "$W/$mode.out" 2>&1 &
    lpid=$!
    kills=0
    while kill -0 "$lpid" 2>/dev/null; do
        sleep "$(rand "$MIN" "$MAX")"
        kill -0 "$lpid" 2>/dev/null || break
        r=$(rand 0 1)
        for p in $(pgrep -f "$TRAIN $RUN --ckpt-dir $W/ck-$mode" || true); do
            if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$r"; then
                kill -9 "$p" 2>/dev/null && kills=$((kills + 1))
                break
            fi
        done
    done
    rc=0; wait "$lpid" || rc=$?
    [ "$rc" -eq 0 ] || { tail -20 "$W/$mode.out"; fail "$mode: the job exited $rc after $kills kills"; }
    "$CONSOLIDATE" --ckpt-prefix "$W/ref-$mode/ckpt-step-$STEPS" --save-path "$W/ref.h5" > /dev/null || fail "$mode: consolidate"
    "$CONSOLIDATE" --ckpt-prefix "$W/ck-$mode/ckpt-step-$STEPS" --save-path "$W/soak.h5" > /dev/null || fail "$mode: consolidate"
    h5diff "$W/ref.h5" "$W/soak.h5" /model > "$W/diff" 2>&1 || { head "$W/diff"; fail "$mode: parameters differ"; }
    restarts=$(grep -c "restarting the job" "$W/$mode.out" || true)
    echo "soak $mode: ok, bit-identical after $kills kills and $restarts restarts"
    echo "  detected (ms): $(sed -n 's/.*(detected in \([0-9.]*\) ms).*/\1/p' "$W/$mode.out" | stats)"
    echo "  recovered (s): $(sed -n 's/.*recovered in \([0-9.]*\) s.*/\1/p' "$W/$mode.out" | stats)"
    echo "    spawn (s):   $(sed -n 's/.*recovered in .*spawn \([0-9.]*\) s.*/\1/p' "$W/$mode.out" | stats)"
    echo "    load (s):    $(sed -n 's/.*recovered in .*load \([0-9.]*\) s.*/\1/p' "$W/$mode.out" | stats)"
    echo "    compile (s): $(sed -n 's/.*recovered in .*compile \([0-9.]*\) s.*/\1/p' "$W/$mode.out" | stats)"
    echo "    step (s):    $(sed -n 's/.*recovered in .*first step \([0-9.]*\) s.*/\1/p' "$W/$mode.out" | stats)"
done
