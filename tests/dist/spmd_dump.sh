#!/bin/sh
# IR dumps of partitioned graphs (XLA_SAVE_TENSORS_FILE, text and dot): the
# tensor-parallel block's first graph shows each node's propagated sharding
# and marks the 4 all-reduces over the model axis the partitioner added, on
# the nodes whose values they move; the dot form marks the same nodes.
# usage: spmd_dump.sh XLA_LAUNCH DIST_SPMD_TP
set -eu
LAUNCH=$1 PROG=$2
W=$(mktemp -d /tmp/cx_spmd_dump.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
XLA_SAVE_TENSORS_FILE="$W/ir.txt" "$LAUNCH" --nproc 2 "$PROG" > "$W/out" 2>&1 || { cat "$W/out"; fail "the run"; }
[ -s "$W/ir.txt.0" ] && [ -s "$W/ir.txt.1" ] || fail "no per-rank dump files"
# the tensor-parallel block's graphs: those whose header says 4 all-reduces and nothing else
awk '/^\[cx_graph/ { g++ } /the partitioner added 4 all-reduce, 0 all-gather, 0 reduce-scatter, 0 all-to-all/ { if (!first) first = g }
     first && g == first && /\+ spmd all-reduce over \(model\)/ { marks++ }
     first && g == first && /spmd=\{.*partial over \(model\)/ { partial++ }
     first && g == first && /spmd=\{.*spec=\(None, None, model\)/ { splits++ }
     END { if (!first) { print "no graph with the block'"'"'s 4 all-reduces"; exit 1 }
           if (marks != 4) { print marks " marked all-reduces in graph " first "; want 4"; exit 1 }
           if (!partial || !splits) { print "graph " first ": propagated shardings missing (partial " partial ", split " splits ")"; exit 1 } }' \
    "$W/ir.txt.0" || { sed -n '1,60p' "$W/ir.txt.0"; fail "the text dump"; }
XLA_SAVE_TENSORS_FILE="$W/ir.dot" XLA_SAVE_TENSORS_FMT=dot "$LAUNCH" --nproc 2 "$PROG" > "$W/out" 2>&1 || { cat "$W/out"; fail "the dot run"; }
n=$(grep -c 'color="#d04000"' "$W/ir.dot.1" || true)
[ "$n" -ge 4 ] || fail "the dot dump marks $n nodes whose values the partitioner moved"
grep -q '+ spmd all-reduce over (model)' "$W/ir.dot.1" || fail "the dot labels do not name the collectives"
echo "spmd_dump: ok (text: 4 all-reduces marked in the tensor-parallel block's graph; dot: $n marked nodes)"
