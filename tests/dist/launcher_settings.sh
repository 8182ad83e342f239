#!/bin/sh
# xla-launch passes the user's settings to every rank: every CX_*, XLA_*,
# PT_XLA_*, OMP_* and OPENBLAS_* variable is exported with mpirun -x (so it
# also reaches other nodes); torchrun's --nproc-per-node and --rdzv-endpoint
# work; a program that sees WORLD_SIZE > 1 without an MPI world refuses to
# train alone.
# usage: launcher_settings.sh XLA_LAUNCH TRAIN
set -eu
LAUNCH=$1 TRAIN=$2
fail() { echo "FAIL: $*" >&2; exit 1; }
out=$(CX_FOO=bar PT_XLA_DEBUG_LEVEL=1 XLA_METRICS_FILE=/tmp/x.txt OMP_SCHEDULE=static \
      "$LAUNCH" --verbose --nproc-per-node 2 --rdzv-endpoint 10.9.8.7:29777 \
      sh -c 'echo "env $CX_FOO $PT_XLA_DEBUG_LEVEL $XLA_METRICS_FILE $OMP_SCHEDULE $MASTER_ADDR $MASTER_PORT $WORLD_SIZE"' 2>&1)
for r in 0 1; do
    echo "$out" | grep -q "^\[rank $r\] env bar 1 /tmp/x.txt static 10.9.8.7 29777 2$" || { echo "$out"; fail "rank $r's settings"; }
done
for v in CX_FOO PT_XLA_DEBUG_LEVEL XLA_METRICS_FILE OMP_SCHEDULE; do
    echo "$out" | grep -q -- "-x $v " || { echo "$out"; fail "$v is not exported to other nodes"; }
done
if err=$(WORLD_SIZE=4 "$TRAIN" --data fake --steps 1 2>&1); then fail "WORLD_SIZE=4 without MPI trained alone"; fi
echo "$err" | grep -q "WORLD_SIZE=4 but this process is in no MPI world.*xla-launch --nproc-per-node" || { echo "$err"; fail "message"; }
echo "launcher settings: ok"
