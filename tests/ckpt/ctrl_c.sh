#!/bin/sh
# Ctrl-C with --ckpt-dir saves as a preemption does, in one process and
# under xla-launch: the checkpoint of the step is committed, one line says
# "saved step N in DIR; rerun with --resume auto", the exit status is the
# documented one (train 75; xla-launch 128+SIGINT = 130, its last line
# repeating the save), and --resume auto continues from that step.
# usage: ctrl_c.sh single|np2 XLA_LAUNCH TRAIN
set -eu
mode=$1 LAUNCH=$2 TRAIN=$3
W=$(mktemp -d /tmp/cx_ctrl_c.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL ($mode): $*" >&2; exit 1; }
show() { echo "--- stdout"; cat "$W/out"; echo "--- stderr"; cat "$W/err"; }
RUN="--data fake --model mlp --width 256 --epochs 2 --log-every 10 --ckpt-dir $W/ck"
case $mode in
single) set -- "$TRAIN"; want_rc=75; pre="" ;;
np2) set -- "$LAUNCH" --nproc 2 "$TRAIN" --parallel ddp; want_rc=130; pre="\[rank 0\] " ;;
*) fail "unknown mode" ;;
esac

# A terminal's Ctrl-C reaches a foreground job whose SIGINT is not ignored;
# a script's background job inherits an ignored SIGINT: undo that.
# shellcheck disable=SC2086
env --default-signal=INT "$@" $RUN > "$W/out" 2> "$W/err" &
pid=$!
n=0
until grep -q "Train Epoch: 1 \[" "$W/out" 2>/dev/null; do
    n=$((n + 1)); [ $n -lt 600 ] || { kill -9 $pid; show; fail "training did not start"; }
    sleep 0.05
done
kill -INT $pid
rc=0; wait $pid || rc=$?
[ "$rc" -eq "$want_rc" ] || { show; fail "exit status $rc after Ctrl-C, want $want_rc"; }
line=$(cat "$W/out" "$W/err" | grep "saved step [0-9]* in " || true)
[ "$(echo "$line" | grep -c "^${pre}train: preempted: saved step [0-9]* in $W/ck; rerun with --resume auto\$")" -eq 1 ] ||
    { show; fail "not one 'saved step N in $W/ck; rerun with --resume auto' line from the program"; }
STEP=$(echo "$line" | sed -n "s/^${pre}train: preempted: saved step \([0-9]*\) in .*/\1/p")
[ -f "$W/ck/ckpt-step-$STEP.commit" ] || { ls "$W/ck"; fail "checkpoint of step $STEP not committed"; }
if [ "$mode" = np2 ]; then
    # the launcher's last line repeats it, after the ranks' output
    last=$(tail -n 1 "$W/err")
    [ "$last" = "xla-launch: interrupted by SIGINT; saved step $STEP in $W/ck; rerun with --resume auto" ] ||
        { show; fail "the launcher's last line is '$last'"; }
    grep -q "^xla-launch: SIGINT: asking the ranks to save and stop" "$W/err" || { show; fail "no grace line"; }
fi

# shellcheck disable=SC2086
"$@" $RUN --resume auto > "$W/out" 2> "$W/err" || { show; fail "resume"; }
grep -q "^${pre}Resumed from $W/ck/ckpt-step-$STEP: step $STEP," "$W/out" || { show; fail "did not resume at step $STEP"; }
grep -q "^${pre}Test accuracy:" "$W/out" || { show; fail "the resumed run did not finish"; }
echo "ctrl_c $mode: ok (saved step $STEP, resumed from it)"
