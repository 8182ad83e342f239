#!/bin/sh
# Slurm tests on a real Slurm (slurm.sh): 2 namespace hosts, 2 CPUs each,
# munged, slurmctld and a slurmd per host. Each CASE brings the cluster up
# and tears it down (only what it started), also after a failure.
#   srun_ddp    srun -N2 -n4 --mpi=pmix train: the losses of 4 ranks on one node (1e-5)
#   plain_srun  srun -n4 without --mpi: every task stops with the one line
#               saying to add --mpi=pmix, and nothing trains; cxla-bench comm
#               under srun --mpi=pmix prints each figure once, from rank 0
#   alloc       xla-launch in an allocation: the allocation's tasks by
#               default, on its nodes (RANK, LOCAL_RANK, hostnames,
#               MASTER_ADDR); more than granted refused without
#               --oversubscribe; --max-restarts restarts inside it
#   sbatch_zero3  an sbatch script running xla-launch ZeRO-3 on 2 x 2 writes a
#               4-shard checkpoint that consolidates, losses as on one node
#   scancel     scancel of a running sbatch job leaves a committed checkpoint;
#               the same script submitted again resumes it (--resume auto)
#               and ends bit-identical to an uninterrupted job
#   usr1        the early warning of --signal=B:USR1@T (sent here at once
#               with scancel --batch --signal=USR1) saves and stops the same way
#   requeue     scontrol requeue of a --requeue job: it saves, runs again and resumes
#   timelimit   a job's time limit (--time=1) ends it with SIGTERM: it saves, and
#               the same script submitted again resumes
#   node_kill   host 2's slurmd, step daemon and ranks killed at once: the job
#               ends within seconds, naming the node and its ranks
#   readme      the README's sbatch script as written: DDP, ZeRO-3 and SPMD
#               jobs on 2 nodes; scancel of the DDP job saves, and the same
#               script submitted again resumes
# usage: slurm_test.sh CASE BUILD_DIR SOURCE_DIR
set -eu
CASE=$1 B=$(cd "$2" && pwd) SRC=${3:-}
HERE=$(cd "$(dirname "$0")" && pwd)
SL="sh $HERE/slurm.sh"
LAUNCH=$B/launch/xla-launch TRAIN=$B/examples/train CONSOLIDATE=$B/tools/consolidate_ckpts
W=$(mktemp -d /tmp/cx_slurm_$CASE.XXXXXX)
cleanup() { $SL down "$W/s" 2> /dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
# a failure shows what the daemons said of the jobs, for a CI log to explain
daemon_lines() {
    for f in "$W"/s/slurmctld.log "$W"/s/slurmd-*.log; do
        [ -f "$f" ] || continue
        echo "--- the end of $(basename "$f"):"
        grep -v -e "state file" -e "NOTE: Trying" -e "auth_p_get_host" -e "rmdir_recursive" -e "pmixp_" "$f" | tail -n 12
    done
}
fail() { daemon_lines >&2; echo "FAIL [slurm $CASE]: $*" >&2; exit 1; }
$SL up 2 "$W/s" > "$W/up.out" 2>&1 || { cat "$W/up.out"; fail "the Slurm cluster did not come up"; }
# a Slurm client command on host 1, the submit host
on1() { timeout 300 $SL exec 1 "$W/s" "$@"; }
# rank 0's losses, one per line, with or without xla-launch's prefix
losses() { sed -n 's/^\(\[rank 0\] \)\{0,1\}Train Epoch: .*Loss: \([^ ]*\).*/\2/p' "$1"; }
same_losses() {
    [ "$(wc -l < "$1")" -gt 0 ] || fail "no losses in $1"
    paste "$1" "$2" | awk '{ d = $1 - $2; if (d < 0) d = -d; s = $1 < 0 ? -$1 : $1; if (NF != 2 || d > 1e-5 * (s > 1 ? s : 1)) bad = 1 }
                           END { exit bad }' || { paste "$1" "$2" | head; fail "losses differ"; }
}
# an sbatch script NAME on 2 nodes x 2 tasks running the rest as its command
script() {
    name=$1
    shift
    { echo "#!/bin/sh"; echo "#SBATCH -N 2 -n 4 -o $W/$name.%j.out"; echo "exec $*"; } > "$W/$name.sh"
}
# the job's output file
out_of() { echo "$W/$1.$2.out"; }
# waits until job J has left the queue, at most SECONDS (default 60)
gone() {
    end=$(($(date +%s) + ${2:-60}))
    while on1 squeue -h -j "$1" 2> /dev/null | grep -q .; do
        [ "$(date +%s)" -lt "$end" ] || fail "job $1 is still in the queue after ${2:-60} s"
        sleep 0.1
    done
}
# waits for job J to end, as sbatch --wait does, and is true when it
# completed with exit 0. sbatch --wait polls after 2, 8 and then every 32
# s, so a 3-second job took 42 s of the test; here squeue is asked every
# 0.1 s (gone), and the job's record (kept MinJobAge = 300 s) gives its end.
ended_ok() {
    gone "$1" 300
    st=$(on1 scontrol -o show job "$1") || fail "job $1: slurmctld has no record of it"
    case $st in *" JobState=COMPLETED "*" ExitCode=0:0 "*) return 0 ;; esac
    return 1
}
# waits until FILE has a line matching RE, at most SECONDS (default 60)
await() {
    k=0
    until grep -q "$2" "$1" 2> /dev/null; do
        k=$((k + 1))
        [ $k -lt $((${3:-60} * 20)) ] || { cat "$1" 2> /dev/null; on1 squeue 2>&1; fail "no '$2' in $1"; }
        sleep 0.05
    done
}
DDP="--model mlp --width 64 --depth 2 --data fake --steps 40 --log-every 5 --threads 1 --parallel ddp"

case $CASE in
srun_ddp)
    "$LAUNCH" --nproc 4 "$TRAIN" $DDP > "$W/one.out" 2>&1 || { cat "$W/one.out"; fail "one-node run"; }
    on1 srun -N 2 -n 4 --mpi=pmix "$TRAIN" $DDP > "$W/srun.out" 2>&1 || { cat "$W/srun.out"; fail "srun --mpi=pmix run"; }
    grep -q "4 rank(s), parallel ddp" "$W/srun.out" || { cat "$W/srun.out"; fail "not one world of 4 ranks"; }
    losses "$W/one.out" > "$W/one.l"
    losses "$W/srun.out" > "$W/srun.l"
    same_losses "$W/one.l" "$W/srun.l"
    echo "slurm srun_ddp: ok ($(wc -l < "$W/one.l") losses equal)"
    ;;
plain_srun)
    rc=0
    on1 srun -N 2 -n 4 "$TRAIN" $DDP > "$W/plain.out" 2>&1 || rc=$?
    [ "$rc" -ne 0 ] || { cat "$W/plain.out"; fail "a plain srun of 4 tasks succeeded"; }
    n=$(grep -c "srun started 4 tasks with no PMIx, so each would run alone as rank 0 of 1: add --mpi=pmix" "$W/plain.out" || true)
    [ "$n" -eq 4 ] || { cat "$W/plain.out"; fail "want the --mpi=pmix line once from each of the 4 tasks, got $n"; }
    ! grep -q "Train Epoch" "$W/plain.out" || { cat "$W/plain.out"; fail "a task trained alone"; }
    on1 srun -N 1 -n 2 --mpi=pmix "$B/bench/cxla-bench" comm --rounds 1 --min-time 0 > "$W/bench.out" 2> "$W/bench.err" ||
        { cat "$W/bench.out" "$W/bench.err"; fail "cxla-bench comm under srun"; }
    lines=$(grep -c '^{"bench"' "$W/bench.out" || true)
    names=$(grep -o '^{"bench": *"[^"]*"' "$W/bench.out" | sort -u | wc -l)
    [ "$lines" -gt 0 ] && [ "$lines" -eq "$names" ] ||
        { cat "$W/bench.out"; fail "cxla-bench comm: $lines result lines for $names figures (one per figure, rank 0 only)"; }
    echo "slurm plain_srun: ok (4 tasks refused; cxla-bench comm: $lines figures once each)"
    ;;
alloc)
    rc=0
    on1 salloc -n 1 "$LAUNCH" --nproc 2 sh -c true > "$W/over.out" 2>&1 || rc=$?
    [ "$rc" -ne 0 ] && grep -q "xla-launch: --nproc 2 is more than the 1 task(s) Slurm job [0-9]* grants" "$W/over.out" ||
        { cat "$W/over.out"; fail "2 ranks in a 1-task allocation were not refused"; }
    on1 salloc -n 1 "$LAUNCH" --nproc 2 --oversubscribe sh -c 'echo "R $RANK"' > "$W/os.out" 2>&1 ||
        { cat "$W/os.out"; fail "--oversubscribe"; }
    [ "$(grep -c '^\[rank [01]\] R [01]$' "$W/os.out")" -eq 2 ] || { cat "$W/os.out"; fail "--oversubscribe: want 2 ranks"; }
    on1 salloc -N 2 -n 4 "$LAUNCH" sh -c 'echo "ENV $RANK $(hostname) $LOCAL_RANK $LOCAL_WORLD_SIZE $WORLD_SIZE $MASTER_ADDR"' \
        > "$W/env.out" 2>&1 || { cat "$W/env.out"; fail "xla-launch in a 2 x 2 allocation"; }
    for r in 0 1 2 3; do
        h=$((r / 2 + 1)) l=$((r % 2))
        grep -qx "\[rank $r\] ENV $r cxhost$h $l 2 4 cxhost1" "$W/env.out" ||
            { cat "$W/env.out"; fail "rank $r: want host cxhost$h, local rank $l of 2, world 4, MASTER_ADDR cxhost1"; }
    done
    [ "$(grep -c '^\[rank [0-9]\] ENV' "$W/env.out")" -eq 4 ] || { cat "$W/env.out"; fail "want the allocation's 4 tasks"; }
    on1 salloc -N 2 -n 4 "$LAUNCH" --max-restarts 1 sh -c \
        '[ "$XLA_LAUNCH_RESTART_COUNT" = 0 ] && [ "$RANK" = 3 ] && exit 3; echo "ok $RANK $SLURM_JOB_ID"' > "$W/rs.out" 2>&1 ||
        { cat "$W/rs.out"; fail "--max-restarts 1 in an allocation"; }
    grep -q "xla-launch: restarting the job (restart 1 of 1)" "$W/rs.out" || { cat "$W/rs.out"; fail "no restart"; }
    sed -n '/restarting the job/,$p' "$W/rs.out" > "$W/rs2.out"
    [ "$(sed -n 's/^\[rank [0-9]\] ok [0-9] \([0-9]*\)$/\1/p' "$W/rs.out" | sort -u | wc -l)" -eq 1 ] &&
        [ "$(grep -c '^\[rank [0-9]\] ok' "$W/rs2.out")" -eq 4 ] || { cat "$W/rs.out"; fail "the restart did not run 4 ranks in the same allocation"; }
    echo "slurm alloc: ok"
    ;;
sbatch_zero3)
    RUN="--model mlp --width 64 --depth 2 --data fake --steps 20 --log-every 5 --threads 1 --parallel fsdp --zero 3"
    "$LAUNCH" --nproc 4 "$TRAIN" $RUN > "$W/one.out" 2>&1 || { cat "$W/one.out"; fail "one-node run"; }
    script z3 "$LAUNCH" "$TRAIN" $RUN --ckpt-dir "$W/ck"
    J=$(on1 sbatch --parsable "$W/z3.sh") && ended_ok "$J" || { cat "$W"/z3.*.out; fail "the sbatch job failed"; }
    O=$(out_of z3 "$J")
    grep -q "4 rank(s), parallel fsdp" "$O" || { cat "$O"; fail "not the allocation's 4 ranks"; }
    [ -f "$W/ck/ckpt-step-20.commit" ] && [ "$(ls "$W/ck" | grep -c 'ckpt-step-20_rank-')" -eq 4 ] ||
        { ls "$W/ck"; fail "no 4-shard checkpoint of step 20"; }
    "$CONSOLIDATE" --ckpt-prefix "$W/ck/ckpt-step-20" --save-path "$W/z3.h5" > "$W/cons.out" 2>&1 ||
        { cat "$W/cons.out"; fail "the checkpoint does not consolidate"; }
    losses "$W/one.out" > "$W/one.l"
    losses "$O" > "$W/z3.l"
    same_losses "$W/one.l" "$W/z3.l"
    echo "slurm sbatch_zero3: ok"
    ;;
scancel | usr1 | requeue)
    # long enough that the signal, sent once epoch 2 starts, lands while it
    # trains however fast the steps are (at 3 epochs a faster build finished
    # before slurm delivered USR1: "job stopped", nothing left to save)
    RUN="--model mlp --width 64 --depth 2 --data fake --epochs 8 --log-every 50 --threads 1 --parallel ddp"
    script ref "$LAUNCH" "$TRAIN" $RUN --ckpt-dir "$W/ref"
    J=$(on1 sbatch --parsable "$W/ref.sh") && ended_ok "$J" || { cat "$W"/ref.*.out; fail "the uninterrupted job failed"; }
    script run "$LAUNCH" "$TRAIN" $RUN --ckpt-dir "$W/ck" --resume auto
    flags=""
    [ "$CASE" = requeue ] && flags="--requeue --open-mode=append"
    J=$(on1 sbatch --parsable $flags "$W/run.sh")
    O=$(out_of run "$J")
    await "$O" "Train Epoch: 2"
    case $CASE in
    scancel) on1 scancel "$J"; how=SIGTERM ;;
    usr1) on1 scancel --batch --signal=USR1 "$J"; how=SIGUSR1 ;;
    requeue) on1 scontrol requeue "$J"; how=SIGTERM ;;
    esac
    await "$O" "xla-launch: interrupted by $how; saved step [0-9]* in $W/ck; rerun with --resume auto"
    step=$(sed -n "s/^xla-launch: interrupted by $how; saved step \([0-9]*\) in .*/\1/p" "$O")
    [ -f "$W/ck/ckpt-step-$step.commit" ] || { ls "$W/ck"; fail "no committed checkpoint of step $step"; }
    if [ "$CASE" = requeue ]; then
        # a requeued job, back in the queue, waits a while before it may
        # start again; now
        k=0
        until [ "$(on1 squeue -h -j "$J" -o %T 2> /dev/null)" = PENDING ]; do
            k=$((k + 1)); [ $k -lt 600 ] || fail "job $J did not come back to the queue"
            sleep 0.1
        done
        # slurmd refuses a relaunch whose credential dates from the second
        # it revoked the first run's in, or before, and slurmctld then drops
        # the job as non-startable, silently: a CI run's requeued job left
        # the queue with no output. Slurm waits 121 s before a relaunch for
        # that; a start two seconds on, past the requeue's second, is as safe.
        on1 scontrol update jobid="$J" StartTime=now+2
        await "$O" "Done: " 300
        gone "$J"
    else
        gone "$J"
        J2=$(on1 sbatch --parsable "$W/run.sh") && ended_ok "$J2" || { cat "$W"/run.*.out; fail "the second job failed"; }
        O=$(out_of run "$J2")
    fi
    grep -q "Resumed from $W/ck/ckpt-step-$step:" "$O" || { cat "$O"; fail "did not resume from step $step"; }
    last=$(ls "$W/ref" | sed -n 's/^\(ckpt-step-[0-9]*\)\.commit$/\1/p' | sort -t- -k3 -n | tail -1)
    [ -f "$W/ck/$last.commit" ] || { ls "$W/ref" "$W/ck"; fail "the resumed job did not reach $last"; }
    "$CONSOLIDATE" --ckpt-prefix "$W/ref/$last" --save-path "$W/ref.h5" > /dev/null || fail "consolidate (uninterrupted)"
    "$CONSOLIDATE" --ckpt-prefix "$W/ck/$last" --save-path "$W/res.h5" > /dev/null || fail "consolidate (resumed)"
    h5diff "$W/ref.h5" "$W/res.h5" /model > "$W/diff" 2>&1 || { head "$W/diff"; fail "parameters differ"; }
    echo "slurm $CASE: ok (saved step $step, resumed, bit-identical at $last)"
    ;;
node_kill)
    T=$(cat "$W/s/cl/tag")
    script k "$LAUNCH" "$TRAIN" --model mlp --data fake --epochs 100 --parallel ddp --log-every 100 --threads 1
    J=$(on1 sbatch --parsable "$W/k.sh")
    O=$(out_of k "$J")
    await "$O" "Train Epoch: 2"
    # host 2 dies at once: its slurmd, the step's daemon and the ranks
    P=$(ip netns pids "cxc$T-h2")
    kill -STOP $P 2> /dev/null || true
    kill -9 $P 2> /dev/null || true
    start=$(date +%s)
    await "$O" "^xla-launch: \(lost node\|rank\|srun\)"
    took=$(( $(date +%s) - start ))
    [ "$took" -le 10 ] || { cat "$O"; fail "the job took $took s to end"; }
    grep -q "^xla-launch: lost node cxhost2 (10.251.0.2; ranks 2,3): every process of it ended without a report" "$O" ||
        { cat "$O"; fail "the node and its ranks are not named"; }
    sleep 1
    left=$(ip netns pids "cxc$T-h1" | while read -r p; do tr '\0' ' ' < "/proc/$p/cmdline" 2> /dev/null; echo; done |
           grep -e "$TRAIN" -e 'rank-wrapper' -e "$LAUNCH" || true)
    [ -z "$left" ] || fail "processes of the job survive on host 1: $left"
    echo "slurm node_kill: ok (ended in $took s)"
    ;;
timelimit)
    # the end of a time limit: Slurm signals every step and the batch
    # shell with SIGTERM (SIGKILL KillWait later); the job's checkpoint is
    # committed, and the same script submitted again resumes it
    { echo "#!/bin/sh"; echo "#SBATCH -N 2 -n 4 --time=1 -o $W/tl.%j.out"
      echo "exec $LAUNCH $TRAIN --model mlp --width 64 --depth 2 --data fake --epochs \${EPOCHS:-1000} --log-every 50 --threads 1 --parallel ddp --ckpt-dir $W/ck --resume auto"
    } > "$W/tl.sh"
    J=$(on1 sbatch --parsable "$W/tl.sh")
    O=$(out_of tl "$J")
    await "$O" "Train Epoch: 1"
    # Slurm looks at time limits every 30 s: the end comes 60-90 s in
    await "$O" "xla-launch: interrupted by SIGTERM; saved step [0-9]* in $W/ck; rerun with --resume auto" 200
    gone "$J"
    on1 scontrol show job "$J" | grep -q "JobState=TIMEOUT" || { on1 scontrol show job "$J"; fail "job $J did not end by its time limit"; }
    step=$(sed -n "s/^xla-launch: interrupted by SIGTERM; saved step \([0-9]*\) in .*/\1/p" "$O")
    [ -f "$W/ck/ckpt-step-$step.commit" ] || { ls "$W/ck"; fail "no committed checkpoint of step $step"; }
    epoch=$(sed -n 's/^\(\[rank 0\] \)\{0,1\}Train Epoch: \([0-9]*\).*/\2/p' "$O" | tail -1)
    J2=$(on1 sbatch --parsable --export=ALL,EPOCHS=$((epoch + 1)) "$W/tl.sh") && ended_ok "$J2" ||
        { cat "$W"/tl.*.out; fail "the second job failed"; }
    O2=$(out_of tl "$J2")
    grep -q "Resumed from $W/ck/ckpt-step-$step:" "$O2" || { cat "$O2"; fail "did not resume from step $step"; }
    grep -q "Done: " "$O2" || { cat "$O2"; fail "the resumed job did not finish"; }
    echo "slurm timelimit: ok (time limit at step $step, saved, resumed)"
    ;;
readme)
    mkdir "$W/r"
    # the block after the marker, from its opening fence to the closing one
    sed -n '/^<!-- sbatch script: run as written by ctest slurm_readme -->$/,$p' "$SRC/README.md" |
        sed -n '3,$p' | sed '/^```$/,$d' > "$W/r/train.sbatch"
    grep -q '^#SBATCH' "$W/r/train.sbatch" || fail "no sbatch script in the README"
    ln -s "$B" "$W/r/build"
    # as the README submits it, from the directory of build/
    sub() { on1 sh -c 'cd "$1" && shift && exec "$@"' sh "$W/r" "$@"; }
    J=$(sub sbatch --parsable -J ddp train.sbatch)
    await "$W/r/train-ddp.out" "Train Epoch: 1"
    on1 scancel --name ddp
    await "$W/r/train-ddp.out" "^xla-launch: interrupted by SIGTERM; saved step [0-9]* in ckpt-ddp; rerun with --resume auto"
    gone "$J"
    step=$(sed -n 's/^xla-launch: interrupted by SIGTERM; saved step \([0-9]*\) .*/\1/p' "$W/r/train-ddp.out")
    J=$(sub sbatch --parsable -J ddp train.sbatch) && ended_ok "$J" || { cat "$W/r/train-ddp.out"; fail "the resumed DDP job failed"; }
    grep -q "Resumed from ckpt-ddp/ckpt-step-$step:" "$W/r/train-ddp.out" || { cat "$W/r/train-ddp.out"; fail "no resume from step $step"; }
    J=$(PARALLEL="fsdp --zero 3" sub sbatch --parsable -J zero3 train.sbatch) && ended_ok "$J" || { cat "$W/r/train-zero3.out"; fail "ZeRO-3 job"; }
    J=$(PARALLEL=spmd sub sbatch --parsable -J spmd train.sbatch) && ended_ok "$J" || { cat "$W/r/train-spmd.out"; fail "SPMD job"; }
    for m in ddp zero3 spmd; do
        grep -q "^\[rank 0\] Done: .* over 4 rank(s)" "$W/r/train-$m.out" || { cat "$W/r/train-$m.out"; fail "$m: no 4-rank Done line"; }
        [ -n "$(ls "$W/r/ckpt-$m" | grep '\.commit$')" ] || fail "$m: no committed checkpoint"
    done
    echo "slurm readme: ok (DDP saved step $step on scancel and resumed; ZeRO-3 and SPMD done)"
    ;;
*) fail "unknown case" ;;
esac
