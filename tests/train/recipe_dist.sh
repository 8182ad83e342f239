#!/bin/sh
# The seed's FSDP recipe on 2 ranks (issue 28): --use_nested_fsdp alone is
# --parallel fsdp with the model's blocks as units (cnn: its 4 Linear /
# Conv2d), --use_gradient_checkpointing rematerializes those blocks and
# trains the same losses (within 1e-5) as without; with --drop_last the
# consolidated checkpoint's accuracy, over the images the ranks kept,
# equals the sharded model's (rank 0 replays each rank's share); a log file
# rank 0 cannot write stops every rank.
# usage: recipe_dist.sh XLA_LAUNCH TRAIN
set -eu
LAUNCH=$1 TRAIN=$2
W=$(mktemp -d /tmp/cx_recipe_dist.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
A="--model cnn --fake_data --batch_size 8 --num_epochs 2 --steps 3 --log_steps 1 --threads 1 --use_nested_fsdp --lr 0.05
   --test_set_batch_size 768 --eval_interval 2 --drop_last"

"$LAUNCH" --nproc 2 "$TRAIN" $A --log-file "$W/plain.jsonl" > "$W/plain" 2>&1 || { cat "$W/plain"; fail "nested fsdp"; }
"$LAUNCH" --nproc 2 "$TRAIN" $A --use_gradient_checkpointing --log-file "$W/ckpt.jsonl" > "$W/ckpt" 2>&1 ||
    { cat "$W/ckpt"; fail "nested fsdp + gradient checkpointing"; }
grep -q '^\[rank 0\] model cnn: .* 2 rank(s), parallel fsdp$' "$W/plain" || { cat "$W/plain"; fail "--use_nested_fsdp is not fsdp"; }
grep -q '^\[rank 0\] blocks of cnn (Linear, Conv2d): 4 FSDP units, 0 checkpointed$' "$W/plain" || { cat "$W/plain"; fail "not 4 units"; }
grep -q '^\[rank 0\] blocks of cnn (Linear, Conv2d): 4 FSDP units, 4 checkpointed$' "$W/ckpt" || { cat "$W/ckpt"; fail "not 4 checkpointed units"; }
loss() { grep '"loss"' "$1" | sed 's/.*"loss": \([^,]*\),.*/\1/'; }
[ "$(loss "$W/plain.jsonl" | wc -l)" = 6 ] || { cat "$W/plain.jsonl"; fail "not 6 logged steps"; }
loss "$W/plain.jsonl" > "$W/a"; loss "$W/ckpt.jsonl" > "$W/b"
paste "$W/a" "$W/b" | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5) { print "step " NR ": " $1 " vs " $2; bad = 1 } }
                          END { exit bad }' || fail "checkpointed losses differ by more than 1e-5"
# evaluated after the last epoch only; --drop_last: 6 batches of 768 of each rank's 5000 test images
for r in plain ckpt; do
    [ "$(grep -c '"test_accuracy"' "$W/$r.jsonl")" = 1 ] || { cat "$W/$r.jsonl"; fail "$r: not one evaluation"; }
    grep -q '"epoch": 2, "test_accuracy": [0-9.]*, "test_images": 9216}' "$W/$r.jsonl" || { cat "$W/$r.jsonl"; fail "$r: test images"; }
done
# the consolidated checkpoint, evaluated on rank 0 over each rank's share as --drop_last cut it
B="--model mlp --width 16 --depth 1 --fake_data --batch_size 8 --steps 3 --threads 1 --use_nested_fsdp --test_set_batch_size 768"
"$LAUNCH" --nproc 2 "$TRAIN" $B --drop_last --ckpt-dir "$W/ck" > "$W/cons" 2>&1 || { cat "$W/cons"; fail "consolidation with --drop_last"; }
grep -q '^\[rank 0\] Checkpoint consolidated, Accuracy=' "$W/cons" || { cat "$W/cons"; fail "no consolidation check"; }
# a log file rank 0 cannot write stops every rank (no rank waits for it)
rc=0; timeout 60 "$LAUNCH" --nproc 2 "$TRAIN" --model mlp --width 8 --depth 1 --fake_data --steps 2 --parallel ddp \
    --log-file "$W/no/such/dir/x.jsonl" > "$W/nolog" 2>&1 || rc=$?
[ $rc = 1 ] && grep -q "^\[rank 0\] train: cannot write --log-file $W/no/such/dir/x.jsonl: No such file or directory$" "$W/nolog" ||
    { cat "$W/nolog"; fail "unwritable --log-file: exit $rc"; }
echo "recipe_dist: ok"
