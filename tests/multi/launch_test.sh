#!/usr/bin/env bash
# Tests of xla-launch. Usage: launch_test.sh CASE XLA_LAUNCH LAUNCH_PROBE [LAUNCH_MPI_PROBE]
# Each CASE checks one behaviour and exits non-zero (with "FAIL: ...") when it breaks.
set -u

CASE=$1
LAUNCH=$2
PROBE=$3
MPI_PROBE=${4:-}

# Variables the launcher derives must not leak in from the developer's shell.
unset CX_NUM_THREADS OMP_NUM_THREADS OPENBLAS_NUM_THREADS MASTER_ADDR MASTER_PORT \
      XLA_LAUNCH_RESTART_COUNT TORCHELASTIC_RESTART_COUNT XLA_LAUNCH_MPIRUN OMP_THREAD_LIMIT

WORK=$(mktemp -d "${TMPDIR:-/tmp}/launch_test.XXXXXX")
# A unique word on every rank's command line, so the job's processes can be found.
TAG="xlt_${CASE}_$$_${RANDOM}"
CORES=$(nproc)

fail() {
    echo "FAIL [$CASE]: $*"
    for f in "$WORK"/out "$WORK"/err; do
        [ -f "$f" ] && { echo "--- $(basename "$f")"; head -c 4000 "$f"; echo; }
    done
    exit 1
}

# On any exit: kill (by pid) whatever of this test's job is still alive, drop the files.
cleanup() {
    local pids
    pids=$(pgrep -f "$TAG")
    if [ -n "$pids" ]; then kill -9 $pids 2>/dev/null; fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

now_ms() { date +%s%3N; }

# run ARGS...: run the launcher; sets RC and ELAPSED_MS, output in $WORK/out, $WORK/err.
run() {
    local t0
    t0=$(now_ms)
    timeout -k 5 50 "$LAUNCH" "$@" >"$WORK/out" 2>"$WORK/err"
    RC=$?
    ELAPSED_MS=$(( $(now_ms) - t0 ))
}

# No process of the job may survive the launcher.
expect_no_survivors() {
    local pids
    pids=$(pgrep -f "$TAG")
    if [ -n "$pids" ]; then
        ps -o pid,ppid,pgid,stat,args -p $(echo $pids | tr ' ' ',')
        fail "processes of the job survived the launcher: $pids"
    fi
}

expect_rc() { [ "$RC" -eq "$1" ] || fail "exit status $RC, expected $1"; }
expect_fast() {
    [ "$ELAPSED_MS" -lt "$1" ] || fail "took ${ELAPSED_MS} ms, limit $1 ms"
}
# expect_line FILE LINE: LINE occurs in FILE as a whole line.
expect_line() { grep -qxF -- "$2" "$1" || fail "missing line in $(basename "$1"): '$2'"; }
# expect_failure_line FILE LINE: LINE, followed by the time the launcher took
# to learn of it when the rank ran on this node (" (detected in X ms)").
expect_failure_line() {
    grep -F -- "$2 (detected in " "$1" | grep -qE -- '^xla-launch: .* \(detected in [0-9.]+ ms\)$' ||
        fail "missing line in $(basename "$1"): '$2 (detected in X ms)'"
}
# Launcher messages on stderr: exactly the given number of "xla-launch:" lines, and
# none of mpirun's boxed reports.
expect_launcher_lines() {
    local n
    n=$(grep -c '^xla-launch:' "$WORK/err")
    [ "$n" -eq "$1" ] || fail "$n 'xla-launch:' lines on stderr, expected $1"
    if grep -qE '^-{20,}|mpirun (noticed|detected)|Primary job' "$WORK/err"; then
        fail "mpirun's own report was not suppressed"
    fi
}

threads_for() { # cores / ranks, at least 1
    local t=$(( CORES / $1 ))
    [ "$t" -lt 1 ] && t=1
    echo "$t"
}

check_env() { # N: every rank printed the right variables
    local n=$1 t
    t=$(threads_for "$n")
    for ((r = 0; r < n; r++)); do
        expect_line "$WORK/out" "[rank $r] RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n CX_NUM_THREADS=$t OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t MASTER_ADDR=$2 MASTER_PORT=$3 RESTART=0 NODE_RANK=0 NNODES=1"
        expect_line "$WORK/err" "[rank $r] stderr-line rank=$r"
    done
    local lines
    lines=$(wc -l <"$WORK/out")
    [ "$lines" -eq "$n" ] || fail "$lines stdout lines, expected $n"
    # every line of the job is rank-prefixed
    if grep -vqE '^\[rank [0-9]+\] ' "$WORK/out"; then fail "unprefixed stdout line"; fi
}

# check_lines N LINES LEN: the output of `launch_probe lines` from N ranks arrived whole.
# Lines were written in odd-sized pieces: every line must arrive once, intact, with the
# right prefix, on the right stream.
check_lines() {
    local n=$1 lines=$2 len=$3 bad r o e
    expect_rc 0
    for s in out err; do
        bad=$(grep -vcE '^\[rank ([0-9])\] r\1:[0-9]+:[a-z]+$' "$WORK/$s")
        [ "$bad" -eq 0 ] || fail "$bad damaged or interleaved lines on std$s"
        bad=$(awk -v len="$len" '{ if (length($0) != len + 9) n++ } END { print n + 0 }' "$WORK/$s")
        [ "$bad" -eq 0 ] || fail "$bad lines of the wrong length on std$s"
    done
    for ((r = 0; r < n; r++)); do
        o=$(grep -c "^\[rank $r\] " "$WORK/out")
        e=$(grep -c "^\[rank $r\] " "$WORK/err")
        [ $((o + e)) -eq "$lines" ] || fail "rank $r: $((o + e)) lines, expected $lines"
        [ "$e" -eq $((lines / 3)) ] || fail "rank $r: $e stderr lines, expected $((lines / 3))"
    done
}

case "$CASE" in
ranks2)
    run --nproc 2 "$PROBE" env "$TAG"
    expect_rc 0
    check_env 2 127.0.0.1 29500
    expect_launcher_lines 0
    ;;
ranks4)
    # more ranks than cores: oversubscribed, one thread each at least
    # (torchrun's '_' spellings are the same flags)
    run --nproc 4 --master_addr=10.1.2.3 --master_port 23456 "$PROBE" env "$TAG"
    expect_rc 0
    check_env 4 10.1.2.3 23456
    ;;
logdir)
    run --nproc 2 --log-dir "$WORK/logs/nested" "$PROBE" env "$TAG"
    expect_rc 0
    for r in 0 1; do
        log="$WORK/logs/nested/rank_$r.log"
        [ -f "$log" ] || fail "no log $log"
        expect_line "$log" "stderr-line rank=$r"
        grep -q "^RANK=$r LOCAL_RANK=$r " "$log" || fail "rank $r's output missing from $log"
        [ "$(wc -l <"$log")" -eq 2 ] || fail "$log has $(wc -l <"$log") lines, expected 2"
    done
    ;;
lines)
    run --nproc 4 "$PROBE" lines "$TAG" 400 3000
    check_lines 4 400 3000
    ;;
tcp)
    # Ranks that cannot reach the launcher's Unix socket (as on other nodes) report over
    # TCP; output must stay intact and failures precise all the same.
    printf 'localhost slots=4\n' >"$WORK/hosts"
    NO_UNIX=(--mpirun-arg -x --mpirun-arg XLA_LAUNCH_SOCKET=/nonexistent/sock)
    run --hostfile "$WORK/hosts" "${NO_UNIX[@]}" "$PROBE" lines "$TAG" 400 3000
    check_lines 4 400 3000
    run --hostfile "$WORK/hosts" "${NO_UNIX[@]}" "$PROBE" fail "$TAG" 2 3
    expect_no_survivors
    expect_rc 1
    expect_fast 10000
    expect_line "$WORK/err" "xla-launch: rank 2 exited with status 3"   # from another node: no detect time (other clock)
    expect_launcher_lines 1
    ;;
forwarded)
    # No connection at all: lines and reports travel through mpirun's forwarding.
    NO_CONN=(--mpirun-arg -x --mpirun-arg XLA_LAUNCH_SOCKET=/nonexistent/sock
             --mpirun-arg -x --mpirun-arg XLA_LAUNCH_TCP=)
    run --nproc 2 "${NO_CONN[@]}" "$PROBE" env "$TAG"
    expect_rc 0
    check_env 2 127.0.0.1 29500
    run --nproc 3 "${NO_CONN[@]}" "$PROBE" sigkill "$TAG" 1
    expect_no_survivors
    expect_rc 1
    expect_fast 10000
    expect_line "$WORK/err" "xla-launch: rank 1 killed by signal 9"   # no report channel: no detect time
    expect_launcher_lines 1
    ;;
exit_status)
    run --nproc 4 "$PROBE" fail "$TAG" 2 3
    expect_no_survivors
    [ "$RC" -ne 0 ] || fail "launcher exited 0 although rank 2 failed"
    expect_rc 1
    expect_fast 10000
    expect_failure_line "$WORK/err" "xla-launch: rank 2 exited with status 3"
    expect_launcher_lines 1
    echo "time to exit: ${ELAPSED_MS} ms (rank 2 fails ~0.5 s after start)"
    ;;
signal_kill)
    run --nproc 3 "$PROBE" sigkill "$TAG" 1
    expect_no_survivors
    expect_rc 1
    expect_fast 10000
    expect_failure_line "$WORK/err" "xla-launch: rank 1 killed by signal 9"
    expect_launcher_lines 1
    echo "time to exit: ${ELAPSED_MS} ms"
    ;;
stubborn)
    # Surviving ranks ignore SIGTERM and leave daemonized grandchildren behind: the
    # job must still be gone within 10 s.
    run --nproc 3 "$PROBE" stubborn "$TAG" 0
    expect_no_survivors
    expect_rc 1
    expect_fast 11000 # rank 0 fails 1 s in
    expect_failure_line "$WORK/err" "xla-launch: rank 0 exited with status 3"
    echo "time to exit: ${ELAPSED_MS} ms"
    ;;
sigint | sigterm)
    sig=INT
    [ "$CASE" = sigterm ] && sig=TERM
    "$LAUNCH" --nproc 3 "$PROBE" sleep "$TAG" >"$WORK/out" 2>"$WORK/err" &
    lpid=$!
    ready() { grep -c ready "$WORK/out" 2>/dev/null || true; }
    for _ in $(seq 100); do # wait until every rank runs
        [ "$(ready)" -eq 3 ] && break
        sleep 0.1
    done
    [ "$(ready)" -eq 3 ] || { kill -9 $lpid; fail "ranks did not start"; }
    t0=$(now_ms)
    kill -$sig $lpid
    for _ in $(seq 150); do kill -0 $lpid 2>/dev/null || break; sleep 0.1; done
    if kill -0 $lpid 2>/dev/null; then kill -9 $lpid; fail "launcher still running 15 s after SIG$sig"; fi
    wait $lpid
    RC=$?
    ELAPSED_MS=$(( $(now_ms) - t0 ))
    expect_no_survivors
    expect_rc $([ $sig = INT ] && echo 130 || echo 143)
    expect_fast 10000
    expect_line "$WORK/err" "xla-launch: interrupted by SIG$sig; job stopped"
    echo "time to exit after SIG$sig: ${ELAPSED_MS} ms"
    ;;
usage_errors)
    run --nproc 2 "/nonexistent/prog_$TAG"
    expect_rc 2
    expect_line "$WORK/err" "xla-launch: program '/nonexistent/prog_$TAG' not found"
    [ "$(wc -l <"$WORK/err")" -eq 1 ] || fail "more than one line for a missing program"
    run --nproc 2 "noprog_$TAG"
    expect_rc 2
    expect_line "$WORK/err" "xla-launch: program 'noprog_$TAG' not found"
    run --nproc 2 "$WORK"
    expect_rc 2
    expect_line "$WORK/err" "xla-launch: program '$WORK' is not an executable file"
    XLA_LAUNCH_MPIRUN=/nonexistent/mpirun run --nproc 2 "$PROBE" env "$TAG"
    expect_rc 2
    [ "$(wc -l <"$WORK/err")" -eq 1 ] && grep -q "^xla-launch: mpirun '/nonexistent/mpirun' not found" "$WORK/err" \
        || fail "missing mpirun not reported in one line"
    run --mpirun /nonexistent/mpirun2 --nproc 2 "$PROBE" env "$TAG"
    expect_rc 2
    grep -q "^xla-launch: mpirun '/nonexistent/mpirun2' not found" "$WORK/err" || fail "--mpirun not honoured"
    run --bogus 1 "$PROBE" env "$TAG"
    expect_rc 2
    expect_line "$WORK/err" "xla-launch: unknown flag --bogus (see xla-launch --help)"
    # mpirun's spelling is a mistake, not a program named "-np"
    run -np 2 "$PROBE" env "$TAG"
    expect_rc 2
    expect_line "$WORK/err" "xla-launch: unknown flag -np (see xla-launch --help)"
    run --nproc zero "$PROBE" env "$TAG"
    expect_rc 2
    [ "$(wc -l <"$WORK/err")" -eq 1 ] || fail "bad --nproc: not one line"
    run --nproc
    expect_rc 2
    run
    expect_rc 2
    grep -q "^xla-launch: no program given" "$WORK/err" || fail "no program: wrong message"
    run --nnodes 2 "$PROBE" env "$TAG"
    expect_rc 2
    [ "$(wc -l <"$WORK/err")" -eq 1 ] && grep -q "needs --hostfile" "$WORK/err" \
        || fail "--nnodes 2 without a hostfile not explained in one line"
    run --help
    expect_rc 0
    grep -q "^usage: xla-launch" "$WORK/out" || fail "--help prints no usage"
    expect_no_survivors
    ;;
standalone)
    # torchrun's habit: --standalone is the one-node default here
    run --standalone --nproc_per_node 2 "$PROBE" env "$TAG"
    expect_rc 0
    check_env 2 127.0.0.1 29500
    expect_launcher_lines 0
    printf 'localhost slots=2\n' >"$WORK/hosts"
    run --standalone --hostfile "$WORK/hosts" "$PROBE" env "$TAG"
    expect_rc 2
    [ "$(cat "$WORK/err")" = "xla-launch: --standalone is one node: it cannot go with --hostfile (see xla-launch --help)" ] ||
        fail "--standalone with --hostfile: not the one line"
    run --nnodes 2 --standalone "$PROBE" env "$TAG"
    expect_rc 2
    expect_line "$WORK/err" "xla-launch: --standalone is one node: it cannot go with --nnodes 2 (see xla-launch --help)"
    expect_no_survivors
    ;;
help)
    # each default said once: the parser adds "(default X)", the help texts do not
    run --help
    expect_rc 0
    if grep -n '(default.*(default' "$WORK/out"; then fail "a default said twice in --help"; fi
    [ "$(grep -c '(default 60)' "$WORK/out")" -eq 1 ] || fail "--preempt-grace's default not said once"
    grep -q -- '--standalone' "$WORK/out" || fail "--standalone not in --help"
    ;;
restart)
    # without restarts the failure is final ...
    run --nproc 2 "$PROBE" restart "$TAG" 1
    expect_rc 1
    expect_failure_line "$WORK/err" "xla-launch: rank 1 exited with status 3"
    # ... with one restart the second run sees the count and succeeds
    run --nproc 2 --max-restarts 1 "$PROBE" restart "$TAG" 1
    expect_rc 0
    expect_failure_line "$WORK/err" "xla-launch: rank 1 exited with status 3"
    expect_line "$WORK/err" "xla-launch: restarting the job (restart 1 of 1)"
    # (rank 0 of the first run may be stopped before it prints: not checked)
    expect_line "$WORK/out" "[rank 1] restart_count=0 torchelastic=0"
    for r in 0 1; do
        expect_line "$WORK/out" "[rank $r] restart_count=1 torchelastic=1"
    done
    [ "$(grep -c 'restart_count=1' "$WORK/out")" -eq 2 ] || fail "the job ran more than twice"
    expect_no_survivors
    ;;
hostfile)
    # a comment longer than any line buffer is still one comment, not a host
    printf '# test nodes %s\n  localhost   slots=2\n' "$(printf 'x%.0s' $(seq 3000))" >"$WORK/hosts"
    run --hostfile "$WORK/hosts" --nnodes 1 "$PROBE" env "$TAG"
    expect_rc 0
    check_env 2 localhost 29500
    run --hostfile "$WORK/hosts" --nnodes 2 "$PROBE" env "$TAG"
    expect_rc 2
    grep -q "lists 1 host(s), fewer than --nnodes 2" "$WORK/err" || fail "hostfile/nnodes mismatch not reported"
    run --hostfile "$WORK/nohosts" "$PROBE" env "$TAG"
    expect_rc 2
    expect_line "$WORK/err" "xla-launch: hostfile '$WORK/nohosts' not found"
    ;;
mpi)
    [ -n "$MPI_PROBE" ] || fail "no MPI probe given"
    run --nproc 2 "$MPI_PROBE" "$TAG"
    expect_rc 0
    expect_line "$WORK/out" "[rank 0] mpi rank=0 size=2 env_match=1 allreduce=ok"
    expect_line "$WORK/out" "[rank 1] mpi rank=1 size=2 env_match=1 allreduce=ok"
    ;;
*)
    fail "unknown case"
    ;;
esac

echo "PASS [$CASE]"
exit 0
