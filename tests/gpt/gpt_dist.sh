#!/bin/sh
# gpt under xla-launch on 2 ranks: DDP and FSDP (ZeRO-3, each block a unit,
# sharded checkpoints) train the same tiny model; FSDP's checkpoint is
# consolidated into one file, and `gpt eval` of that file prints the val
# loss the sharded run ended with. A global batch that does not split over
# the ranks is a one-line error. SPMD (--parallel spmd, the batch split
# over the mesh's data axis by the loader, the compiler partitioning the
# step) prints the losses and val loss of one process with the same global
# batch, and so does Megatron-style tensor parallelism (--mesh
# data=1,model=2: the blocks split over the model axis), whose per-rank
# checkpoints consolidate into a model with the run's val loss and resume
# to the same end; heads that do not split over the model axis are a
# one-line error. FSDPv2 (--parallel fsdpv2) equals one process too, and
# resumes from its checkpoints to the same end.
# usage: gpt_dist.sh XLA_LAUNCH GPT CONSOLIDATE_CKPTS
set -eu
LAUNCH=$1 GPT=$2 CONSOLIDATE=$3
W=$(mktemp -d /tmp/cx_gpt_dist.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
i=0
while [ $i -lt 300 ]; do
    echo "In the beginning $i the earth was without form, and void; and darkness was upon the deep."
    i=$((i + 1))
done > "$W/corpus.txt"
MODEL="--n-layer 2 --n-head 2 --n-embd 32 --block-size 32"
RECIPE="--data $W/corpus.txt $MODEL --steps 30 --batch-size 8 --warmup 3 --lr 3e-3 --log-every 10"

"$LAUNCH" --nproc 2 "$GPT" train $RECIPE --parallel ddp > "$W/ddp.out" 2>&1 || { cat "$W/ddp.out"; fail "ddp"; }
grep -q "val loss: " "$W/ddp.out" || { cat "$W/ddp.out"; fail "ddp: no val loss"; }

"$LAUNCH" --nproc 2 "$GPT" train $RECIPE --parallel fsdp --zero 3 --ckpt-dir "$W/ck" > "$W/fsdp.out" 2>&1 ||
    { cat "$W/fsdp.out"; fail "fsdp"; }
VAL=$(sed -n 's/^\[rank 0\] val loss: //p' "$W/fsdp.out")
[ -n "$VAL" ] || { cat "$W/fsdp.out"; fail "fsdp: no val loss"; }
[ -f "$W/ck/ckpt-step-30_rank-1-of-2.h5" ] || fail "no sharded checkpoint"
"$CONSOLIDATE" --ckpt-prefix "$W/ck/ckpt-step-30" --save-path "$W/full.h5" > /dev/null || fail "consolidate"
EVAL=$("$GPT" eval --data "$W/corpus.txt" $MODEL --ckpt "$W/full.h5" | sed -n 's/^val loss: //p')
[ "$EVAL" = "$VAL" ] || fail "the consolidated model's val loss '$EVAL' differs from the sharded run's '$VAL'"

"$GPT" train $RECIPE > "$W/one.out" 2>&1 || { cat "$W/one.out"; fail "one process"; }
"$LAUNCH" --nproc 2 "$GPT" train $RECIPE --parallel spmd > "$W/spmd.out" 2>&1 || { cat "$W/spmd.out"; fail "spmd"; }
sed -n 's/^step \([0-9]*\)\/.*: loss \([0-9.]*\),.*/\1 \2/p; s/^val loss: /val /p' "$W/one.out" > "$W/one.l"
sed -n 's/^\[rank 0\] step \([0-9]*\)\/.*: loss \([0-9.]*\),.*/\1 \2/p; s/^\[rank 0\] val loss: /val /p' "$W/spmd.out" > "$W/spmd.l"
[ "$(wc -l < "$W/one.l")" -ge 4 ] || { cat "$W/one.out"; fail "one process: no losses"; }
cmp -s "$W/one.l" "$W/spmd.l" || { paste "$W/one.l" "$W/spmd.l"; fail "spmd's losses differ from one process's"; }
"$LAUNCH" --nproc 2 "$GPT" train $RECIPE --parallel spmd --mesh data=1,model=2 --ckpt-dir "$W/tp" --ckpt-every 15 > "$W/tp.out" 2>&1 ||
    { cat "$W/tp.out"; fail "spmd tensor parallel"; }
sed -n 's/^\[rank 0\] step \([0-9]*\)\/.*: loss \([0-9.]*\),.*/\1 \2/p; s/^\[rank 0\] val loss: /val /p' "$W/tp.out" > "$W/tp.l"
cmp -s "$W/one.l" "$W/tp.l" || { paste "$W/one.l" "$W/tp.l"; fail "tensor parallelism's losses differ from one process's"; }
# its checkpoints hold each rank's shards: consolidated, the model evaluates
# as the run did; resumed from step 15, the run ends where it ended
"$CONSOLIDATE" --ckpt-prefix "$W/tp/ckpt-step-30" --save-path "$W/tp_full.h5" > /dev/null || fail "consolidate the tp checkpoint"
TPEVAL=$("$GPT" eval --data "$W/corpus.txt" $MODEL --ckpt "$W/tp_full.h5" | sed -n 's/^val loss: //p')
[ "$TPEVAL" = "$(sed -n 's/^val //p' "$W/tp.l")" ] || fail "the consolidated tp model's val loss '$TPEVAL' differs from the run's"
mkdir "$W/tp15" && cp "$W/tp/ckpt-step-15"* "$W/tp15/"
"$LAUNCH" --nproc 2 "$GPT" train $RECIPE --parallel spmd --mesh data=1,model=2 --ckpt-dir "$W/tp15" --resume auto > "$W/tpr.out" 2>&1 ||
    { cat "$W/tpr.out"; fail "tp resume"; }
[ "$(sed -n 's/^\[rank 0\] val loss: //p' "$W/tpr.out")" = "$TPEVAL" ] || { cat "$W/tpr.out"; fail "the resumed tp run ends elsewhere"; }
if "$LAUNCH" --nproc 2 "$GPT" train $RECIPE --n-head 3 --n-embd 48 --parallel spmd --mesh data=1,model=2 > "$W/tp3.out" 2>&1; then
    fail "3 heads over a model axis of 2 were accepted"
fi
grep -q "3 heads do not split over 2 ranks" "$W/tp3.out" || { cat "$W/tp3.out"; fail "3 heads: no clear error"; }

# FSDPv2 (--parallel fsdpv2: parameters and batch split over the mesh's
# fsdp axis, each block wrapped): the losses of one process, on (fsdp=2,
# model=1) and on (fsdp=1, model=2), whose model axis only replicates; its
# checkpoints (parameters and AdamW state each rank's shards) resume to the
# same end; a mesh of the spmd form is a one-line error naming the flag
"$LAUNCH" --nproc 2 "$GPT" train $RECIPE --parallel fsdpv2 --ckpt-dir "$W/v2" --ckpt-every 15 > "$W/v2.out" 2>&1 ||
    { cat "$W/v2.out"; fail "fsdpv2"; }
sed -n 's/^\[rank 0\] step \([0-9]*\)\/.*: loss \([0-9.]*\),.*/\1 \2/p; s/^\[rank 0\] val loss: /val /p' "$W/v2.out" > "$W/v2.l"
cmp -s "$W/one.l" "$W/v2.l" || { paste "$W/one.l" "$W/v2.l"; fail "fsdpv2's losses differ from one process's"; }
"$LAUNCH" --nproc 2 "$GPT" train $RECIPE --parallel fsdpv2 --mesh fsdp=1,model=2 > "$W/v2m.out" 2>&1 ||
    { cat "$W/v2m.out"; fail "fsdpv2 fsdp=1,model=2"; }
sed -n 's/^\[rank 0\] step \([0-9]*\)\/.*: loss \([0-9.]*\),.*/\1 \2/p; s/^\[rank 0\] val loss: /val /p' "$W/v2m.out" > "$W/v2m.l"
cmp -s "$W/one.l" "$W/v2m.l" || { paste "$W/one.l" "$W/v2m.l"; fail "fsdpv2 on fsdp=1,model=2 differs from one process"; }
mkdir "$W/v215" && cp "$W/v2/ckpt-step-15"* "$W/v215/"
"$LAUNCH" --nproc 2 "$GPT" train $RECIPE --parallel fsdpv2 --ckpt-dir "$W/v215" --resume auto > "$W/v2r.out" 2>&1 ||
    { cat "$W/v2r.out"; fail "fsdpv2 resume"; }
[ "$(sed -n 's/^\[rank 0\] val loss: //p' "$W/v2r.out")" = "$(sed -n 's/^val //p' "$W/v2.l")" ] ||
    { cat "$W/v2r.out"; fail "the resumed fsdpv2 run ends elsewhere"; }
if "$LAUNCH" --nproc 2 "$GPT" train $RECIPE --parallel fsdpv2 --mesh data=2,model=1 > "$W/v2e.out" 2>&1; then
    fail "fsdpv2 accepted --mesh data=2,model=1"
fi
grep -q "mesh 'data=2,model=1' is not fsdp=N,model=M" "$W/v2e.out" || { cat "$W/v2e.out"; fail "fsdpv2 bad mesh: no clear error"; }

if "$LAUNCH" --nproc 2 "$GPT" train $RECIPE --batch-size 7 --parallel ddp > "$W/err.out" 2>&1; then
    fail "a batch of 7 over 2 ranks was accepted"
fi
grep -q "batch-size 7 does not split over 2 ranks" "$W/err.out" || { cat "$W/err.out"; fail "batch split error"; }
echo "gpt on 2 ranks: ok (ddp and fsdp; consolidated val loss $EVAL; spmd data and tensor parallel, and fsdpv2, equal one process: $(tail -1 "$W/spmd.l"))"
