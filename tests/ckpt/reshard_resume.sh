#!/bin/sh
# Reshard, then continue training: FSDP at FROM ranks for k steps, reshard
# the checkpoint to TO ranks (consolidate_ckpts --reshard), resume there for
# k more steps with the same global batch; the parameters equal those of an
# unresharded 2k-step run at FROM ranks (<= 1e-6 relative). TO = 1 resumes
# an unwrapped single process from the consolidated file.
# usage: reshard_resume.sh LAUNCHER TRAIN COMPARE FROM TO [EXTRA FLAGS...]
set -eu
launch=$1; train=$2; compare=$3; from=$4; to=$5; shift 5
dir=$(mktemp -d /tmp/cx_reshard_XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT
consolidate=$(dirname "$train")/../tools/consolidate_ckpts
global=16
run() { np=$1; shift; "$launch" --nproc "$np" "$train" --data fake --model mlp --width 32 --steps 6 \
            --batch-size $((global / np)) --optimizer adamw --lr 0.01 "$@" > "$dir/log" 2>&1 || { cat "$dir/log"; exit 1; }; }
run "$from" --parallel fsdp --zero 3 --nested --ckpt-every 3 --ckpt-dir "$dir/a" "$@"
mkdir -p "$dir/r"
"$consolidate" --ckpt-prefix "$dir/a/ckpt-step-3" --with-optimizer --reshard "$to" --out-prefix "$dir/r/ckpt-step-3" > "$dir/rlog" 2>&1 ||
    { cat "$dir/rlog"; exit 1; }
if [ "$to" -eq 1 ]; then par="--parallel none"; else par="--parallel fsdp --zero 3 --nested"; fi
run "$to" $par --ckpt-dir "$dir/b" --resume "$dir/r/ckpt-step-3" "$@"
grep -q "Resumed from" "$dir/log" || { cat "$dir/log"; exit 1; }
for x in a b; do "$consolidate" --ckpt-prefix "$dir/$x/ckpt-step-6" > /dev/null; done
"$compare" "$dir/a/ckpt-step-6_consolidated.h5" "$dir/b/ckpt-step-6_consolidated.h5" 1e-6 ||
    { echo "FAIL: resharded $from -> $to run differs beyond 1e-6 relative"; exit 1; }
echo "reshard $from -> $to, then 3 more steps: parameters equal the unresharded run (<= 1e-6 relative)"
