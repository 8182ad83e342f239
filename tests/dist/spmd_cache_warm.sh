#!/bin/sh
# SPMD programs in the persistent cache (issue 26, part 5). Each rank's
# partitioned programs are its own entries (the key holds the rank):
# - `train --parallel spmd --cache-dir` run twice on 2 ranks: the warm run
#   reads PersistentCacheHit and no UncachedCompile on every rank (each
#   rank's XLA_METRICS_FILE), with the cold run's losses;
# - a gang restart (rank 1 SIGKILLed) with a cache a whole run and a resumed one filled: the restarted ranks
#   compile nothing (their last metrics report) and the "recovered in" line
#   counts persistent-cache hits with compile 0.000 s, where the same
#   restart without the cache compiles every graph again. (This cnn
#   compiles in well under a millisecond, so the line's compile figure
#   rounds to 0.000 s in both; the counters tell them apart.)
# usage: spmd_cache_warm.sh XLA_LAUNCH TRAIN
set -eu
LAUNCH=$1 TRAIN=$2
W=$(mktemp -d /tmp/cx_spmd_cache.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# (each run evaluates the 10000 fake test images, in 500-image steps: in
# the training batch's 16, 313 steps a rank, the test took 216 s under
# ASan + UBSan against 173 s, and 30.5 against 28.2 s in release, Zen 4)
EVAL="--test_set_batch_size 500"
ARGS="--model cnn --data fake --steps 3 --log-every 1 --batch-size 16 $EVAL --parallel spmd --threads 1"

# the last report's value of counter $2 in metrics file $1 (0 when absent;
# a restarted process appends its reports to its predecessor's)
counter() {
    awk -v want="$2" '/^\[MetricsData/ { v = 0 } /^Counter:/ { n = $2 } /^  Value:/ { if (n == want) v = $2 }
                      END { print v + 0 }' "$1"
}

for run in cold warm; do
    rm -f "$W"/m.*
    XLA_METRICS_FILE="$W/m" "$LAUNCH" --nproc 2 "$TRAIN" $ARGS --cache-dir "$W/cache" > "$W/$run.out" 2>&1 ||
        { cat "$W/$run.out"; fail "the $run run failed"; }
    for r in 0 1; do
        [ -f "$W/m.$r" ] || fail "$run run: no metrics file for rank $r"
        hit=$(counter "$W/m.$r" PersistentCacheHit) unc=$(counter "$W/m.$r" UncachedCompile)
        echo "$run run, rank $r: PersistentCacheHit $hit, UncachedCompile $unc"
        if [ $run = cold ]; then
            [ "$unc" -gt 0 ] || fail "the cold run compiled nothing on rank $r"
        else
            [ "$hit" -gt 0 ] || fail "warm run: no PersistentCacheHit on rank $r"
            [ "$unc" -eq 0 ] || fail "warm run: rank $r compiled $unc graphs"
        fi
    done
done
grep -o 'Loss: [0-9.]*' "$W/cold.out" > "$W/cold.loss"
grep -o 'Loss: [0-9.]*' "$W/warm.out" > "$W/warm.loss"
[ -s "$W/cold.loss" ] && cmp -s "$W/cold.loss" "$W/warm.loss" ||
    { paste "$W/cold.loss" "$W/warm.loss"; fail "the warm run's losses differ from the cold run's"; }

# gang restart: rank 1 killed once a checkpoint is committed
RUN="--model cnn --data fake --steps 120 --batch-size 16 $EVAL --log-every 60 --parallel spmd --ckpt-every 20 --threads 1"
restart() {   # $1: name, $2...: extra flags
    name=$1; shift
    rm -f "$W"/m.*
    XLA_METRICS_FILE="$W/m" "$LAUNCH" --nproc 2 --max-restarts 1 "$TRAIN" $RUN --ckpt-dir "$W/ck_$name" --resume auto "$@" \
        > "$W/$name.out" 2>&1 &
    lpid=$!
    n=0
    until [ -f "$W/ck_$name/ckpt-step-40.commit" ]; do
        n=$((n + 1)); [ $n -lt 1200 ] || { kill -9 $lpid; cat "$W/$name.out"; fail "$name: the run did not reach step 40"; }
        sleep 0.05
    done
    victim=""
    for p in $(pgrep -f "$TRAIN $RUN --ckpt-dir $W/ck_$name"); do
        if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx 'RANK=1'; then victim=$p; break; fi
    done
    [ -n "$victim" ] || { kill -9 $lpid; cat "$W/$name.out"; fail "$name: rank 1 not found"; }
    kill -9 "$victim"
    rc=0; wait $lpid || rc=$?
    [ "$rc" -eq 0 ] || { cat "$W/$name.out"; fail "$name: the restarted job exited $rc"; }
    line=$(grep "xla-launch: recovered in" "$W/$name.out") || { cat "$W/$name.out"; fail "$name: no recovery line"; }
    echo "$name: $line"
    unc0=$(counter "$W/m.0" UncachedCompile) unc1=$(counter "$W/m.1" UncachedCompile)
    echo "$name: the restarted ranks' UncachedCompile: $unc0 $unc1"
}
restart nocache
echo "$line" | grep -q "(no persistent cache hits)" || fail "without a cache: $line"
[ "$unc0" -gt 0 ] && [ "$unc1" -gt 0 ] || fail "without a cache the restarted ranks compiled nothing"
cold="$unc0 and $unc1"
# the cache holds every graph of the run and of a resumed one: the
# evaluation, which the killed attempt never reaches, and the resume
"$LAUNCH" --nproc 2 "$TRAIN" $RUN --ckpt-dir "$W/ck_prime" --cache-dir "$W/cache_gang" > "$W/prime.out" 2>&1 ||
    { cat "$W/prime.out"; fail "the run that fills the cache failed"; }
"$LAUNCH" --nproc 2 "$TRAIN" $RUN --ckpt-dir "$W/ck_prime" --cache-dir "$W/cache_gang" --resume "$W/ck_prime/ckpt-step-40" \
    > "$W/prime2.out" 2>&1 || { cat "$W/prime2.out"; fail "the resumed run that fills the cache failed"; }
restart cache --cache-dir "$W/cache_gang"
echo "$line" | grep -q "compile 0.000 s (persistent cache: [1-9][0-9]* hits)" || fail "with the cache the restart compiled: $line"
[ "$unc0" -eq 0 ] && [ "$unc1" -eq 0 ] || fail "with the cache the restarted ranks compiled $unc0 and $unc1 graphs"
echo "spmd_cache_warm: ok (a restart compiles $cold graphs on its ranks without the cache, none with it)"
