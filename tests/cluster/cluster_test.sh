#!/bin/sh
# Multi-node tests on a cluster of 2 namespace hosts (cluster.sh), 2 ranks
# each, through xla-launch --hostfile (mpirun over ssh, TCP between hosts).
# Each CASE brings the cluster up and tears it down, also after a failure.
#   ddp, zero3, spmd
#               the trainer's losses on 2 x 2 equal 4 ranks on one node (1e-5)
#   env         LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and hostnames right
#               on every host; every XLA_*, PT_XLA_*, CX_*, OMP_*, OPENBLAS_*
#               setting reaches every rank; one trace folder per rank
#   ckpt        a sharded checkpoint written by both hosts, resumed on both,
#               ends bit-identical to an uninterrupted run on them
#   host_kill   every process of host 2 killed at once: the job ends within
#               seconds, naming the node and its ranks; nothing survives
#   host_kill_order  the same, with a rank of host 1 killed by SIGTERM just
#               before (the launcher hears of it first): the lost node is
#               still what is named
#   shm         the collectives test with CX_SHM_HIERARCHICAL=1: all-reduces
#               go node by node (shared memory inside, MPI between) and equal
#               MPI's results; and without it, flat MPI
# usage: cluster_test.sh CASE BUILD_DIR
set -eu
CASE=$1 B=$2
HERE=$(cd "$(dirname "$0")" && pwd)
CL="sh $HERE/cluster.sh"
LAUNCH=$B/launch/xla-launch TRAIN=$B/examples/train CONSOLIDATE=$B/tools/consolidate_ckpts
W=$(mktemp -d /tmp/cx_cluster_$CASE.XXXXXX)
cleanup() { $CL down "$W/cl" 2> /dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
fail() { echo "FAIL [$CASE]: $*" >&2; exit 1; }
$CL up 2 "$W/cl" || fail "the cluster did not come up"
HOSTS="$W/cl/hostfile"
# runs xla-launch on host 1 over both hosts
# (the sanitizer settings of the ASan build go to the other host too)
on_cluster() {
    if [ -n "${ASAN_OPTIONS:-}" ]; then
        timeout 300 $CL exec 1 "$W/cl" "$LAUNCH" --hostfile "$HOSTS" --nproc 4 --mpirun-arg -x --mpirun-arg ASAN_OPTIONS "$@"
    else
        timeout 300 $CL exec 1 "$W/cl" "$LAUNCH" --hostfile "$HOSTS" --nproc 4 "$@"
    fi
}
# rank 0's losses, one per line
losses() { sed -n 's/^\[rank 0\] Train Epoch: .*Loss: \([^ ]*\).*/\1/p' "$1"; }
# same numbers within 1e-5 (relative), line by line, and as many
same_losses() {
    [ "$(wc -l < "$1")" -gt 0 ] || fail "no losses in $1"
    paste "$1" "$2" | awk '{ d = $1 - $2; if (d < 0) d = -d; s = $1 < 0 ? -$1 : $1; if (NF != 2 || d > 1e-5 * (s > 1 ? s : 1)) bad = 1 }
                           END { exit bad }' || { paste "$1" "$2" | head; fail "losses differ"; }
}

case $CASE in
ddp | zero3 | spmd)
    case $CASE in
    ddp) RUN="--model mlp --width 64 --depth 2 --data fake --steps 40 --log-every 5 --threads 1 --parallel ddp" ;;
    zero3) RUN="--model mlp --width 64 --depth 2 --data fake --steps 40 --log-every 5 --threads 1 --parallel fsdp --zero 3" ;;
    spmd) RUN="--model cnn --data fake --steps 6 --log-every 1 --batch-size 32 --threads 1 --parallel spmd" ;;
    esac
    "$LAUNCH" --nproc 4 "$TRAIN" $RUN > "$W/one.out" 2>&1 || { cat "$W/one.out"; fail "one-node run"; }
    on_cluster "$TRAIN" $RUN > "$W/two.out" 2>&1 || { cat "$W/two.out"; fail "2-host run"; }
    losses "$W/one.out" > "$W/one.l"
    losses "$W/two.out" > "$W/two.l"
    same_losses "$W/one.l" "$W/two.l"
    echo "cluster $CASE: ok ($(wc -l < "$W/one.l") losses equal)"
    ;;
env)
    XLA_CLUSTER_CHECK=x1 PT_XLA_CLUSTER_CHECK=p2 CX_CLUSTER_CHECK=c3 OMP_CLUSTER_CHECK=o4 OPENBLAS_CLUSTER_CHECK=b5 \
        on_cluster sh -c 'echo "ENV $RANK $(hostname) $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $XLA_CLUSTER_CHECK $PT_XLA_CLUSTER_CHECK $CX_CLUSTER_CHECK $OMP_CLUSTER_CHECK $OPENBLAS_CLUSTER_CHECK"' \
        > "$W/env.out" 2>&1 || { cat "$W/env.out"; fail "the job failed"; }
    for r in 0 1 2 3; do
        h=$((r / 2 + 1)) l=$((r % 2))
        grep -qx "\[rank $r\] ENV $r cxhost$h $l 2 10.251.0.1 x1 p2 c3 o4 b5" "$W/env.out" ||
            { cat "$W/env.out"; fail "rank $r: want host cxhost$h, local rank $l of 2, MASTER_ADDR 10.251.0.1 and every setting"; }
    done
    on_cluster "$TRAIN" --model mlp --data fake --steps 3 --parallel ddp --threads 1 --trace "$W/trace" > "$W/t.out" 2>&1 ||
        { cat "$W/t.out"; fail "traced run"; }
    for r in 0 1 2 3; do [ -s "$W/trace/proc_$r/trace.json" ] || { ls -R "$W/trace"; fail "no trace of rank $r"; }; done
    echo "cluster env: ok"
    ;;
ckpt)
    RUN="--model mlp --width 64 --depth 1 --data fake --steps 20 --log-every 1000 --threads 1 --parallel fsdp --zero 3"
    # the reference runs on the same hosts: another layout sums in another order
    on_cluster "$TRAIN" $RUN --epochs 2 --ckpt-dir "$W/ref" > "$W/ref.out" 2>&1 || { cat "$W/ref.out"; fail "uninterrupted run"; }
    on_cluster "$TRAIN" $RUN --epochs 1 --ckpt-every 10 --ckpt-dir "$W/ck" > "$W/a.out" 2>&1 || { cat "$W/a.out"; fail "first half"; }
    [ -f "$W/ck/ckpt-step-20.commit" ] && [ "$(ls "$W/ck" | grep -c 'ckpt-step-20_rank-')" -eq 4 ] ||
        { ls "$W/ck"; fail "no 4-shard checkpoint of step 20"; }
    on_cluster "$TRAIN" $RUN --epochs 2 --ckpt-dir "$W/ck" --resume auto > "$W/b.out" 2>&1 || { cat "$W/b.out"; fail "resume"; }
    grep -q "Resumed from .*ckpt-step-20" "$W/b.out" || { cat "$W/b.out"; fail "did not resume from step 20"; }
    "$CONSOLIDATE" --ckpt-prefix "$W/ref/ckpt-step-40" --save-path "$W/ref.h5" > /dev/null || fail "consolidate (uninterrupted)"
    "$CONSOLIDATE" --ckpt-prefix "$W/ck/ckpt-step-40" --save-path "$W/two.h5" > /dev/null || fail "consolidate (resumed)"
    h5diff "$W/ref.h5" "$W/two.h5" /model > "$W/diff" 2>&1 || { head "$W/diff"; fail "parameters differ"; }
    echo "cluster ckpt: ok"
    ;;
host_kill | host_kill_order)
    T=$(cat "$W/cl/tag")
    on_cluster "$TRAIN" --model mlp --data fake --epochs 100 --parallel ddp --log-every 100 --threads 1 > "$W/k.out" 2>&1 &
    job=$!
    n=0
    until grep -q "Train Epoch: 2" "$W/k.out" 2> /dev/null; do
        n=$((n + 1)); [ $n -lt 600 ] || { kill $job; cat "$W/k.out"; fail "the job did not get going"; }
        sleep 0.05
    done
    # host 2 dies at once: stop everything of it, then kill it (its sshd too)
    P=$(ip netns pids "cxc$T-h2")
    kill -STOP $P 2> /dev/null || true
    if [ "$CASE" = host_kill_order ]; then
        # rank 1's program on host 1 ends first, by a signal, and its report
        # reaches the launcher before host 2's connections are seen to close
        r1=$(ip netns pids "cxc$T-h1" | while read -r p; do
                 tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx RANK=1 &&
                     tr '\0' ' ' < "/proc/$p/cmdline" 2> /dev/null | grep -q "^$TRAIN " && echo "$p"
             done | head -1)
        [ -n "$r1" ] || { kill -9 $P; fail "rank 1's program not found on host 1"; }
        kill -TERM "$r1"
        sleep 0.3
    fi
    kill -9 $P 2> /dev/null || true
    start=$(date +%s)
    rc=0; wait $job || rc=$?
    took=$(( $(date +%s) - start ))
    [ "$rc" -ne 0 ] || { cat "$W/k.out"; fail "the job succeeded"; }
    [ "$took" -le 10 ] || { cat "$W/k.out"; fail "the job took $took s to end"; }
    grep -q "xla-launch: lost node cxhost2 (10.251.0.2; ranks 2,3)" "$W/k.out" || { cat "$W/k.out"; fail "the node and its ranks are not named"; }
    sleep 0.5
    if [ -n "$(ip netns pids "cxc$T-h1" | while read -r p; do tr '\0' ' ' < "/proc/$p/cmdline" 2> /dev/null | grep -v sshd; done)" ]; then
        fail "processes of the job survive on host 1"
    fi
    echo "cluster $CASE: ok (ended in $took s)"
    ;;
shm)
    CX_SHM_HIERARCHICAL=1 on_cluster "$B/tests/dist/dist_shm" > "$W/s.out" 2>&1 || { cat "$W/s.out"; fail "dist_shm"; }
    on_cluster "$B/tests/dist/dist_shm" > "$W/flat.out" 2>&1 || { cat "$W/flat.out"; fail "dist_shm (flat)"; }
    grep -q "dist_shm: 0 collectives through shared memory, [1-9][0-9]* hierarchical all-reduces" "$W/s.out" ||
        { cat "$W/s.out"; fail "the all-reduces did not go node by node"; }
    echo "cluster shm: ok"
    ;;
*) fail "unknown case" ;;
esac
