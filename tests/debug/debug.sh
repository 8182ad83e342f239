#!/bin/sh
# The debugging scenarios of the README, run as a user runs them, checked
# on the text the user reads. The lines a message must name are found by
# trainer_debug.c's "@site NAME" comments.
# usage: debug.sh SCENARIO PROGRAM SOURCE [LAUNCHER]
#   shape   PT_XLA_DEBUG_LEVEL=1: a batch whose shape changes is named, with
#           its dimension and (XLA_IR_DEBUG=1) the program's line
#   const   ... a float baked into the graph each step is named
#   live    ... a tensor kept alive one step in three is named
#   dump    XLA_FLAGS=--xla_dump_to / CX_DUMP_DIR: the program file agrees
#           with cx_last_exec_info (kernels, collectives); with LAUNCHER on
#           2 ranks, one file per rank
#   hlo     XLA_SAVE_TENSORS_FMT=hlo: cx_ir_text is the lowered program
#   oom     a step over CX_MEMORY_LIMIT keeps its graph, the error names the file
#   desync  (LAUNCHER) the desync message names the program's line, and the
#           graph is kept
#   sharding (LAUNCHER, SPMD) a changed sharding is named, with both
#           shardings and the line; the dump has each rank's partitioned
#           graph, and the graph of a step that cannot compile
set -u
what=$1 prog=$2 src=$3 launch=${4:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
err() { echo "debug $what: $*" >&2; fail=1; }

site() {
    n=$(grep -c "@site $1 " "$src")
    [ "$n" = 1 ] || { echo "debug: $n lines marked '@site $1' in $src" >&2; exit 1; }
    echo "$(basename "$src"):$(grep -n "@site $1 " "$src" | cut -d: -f1)"
}

has() {   # FILE PATTERN WHAT
    grep -qE -- "$2" "$1" || err "no $3 (want /$2/); the output was:
$(cat "$1")"
}

# the program file of the key in exec line $1 agrees with that line; $2:
# the graph has a matmul
check_program() {
    mm=${2:-matmul}
    set -- $1
    rank=$3 kernels=$5 colls=$7 key=$9
    f="$tmp/d/cxla_$key.r$rank.program.txt"
    [ -f "$f" ] || { err "no $f; the dump has: $(ls "$tmp/d")"; return; }
    [ -f "$tmp/d/cxla_$key.r$rank.captured.txt" ] || err "no captured graph for $key on rank $rank"
    has "$f" "^Kernels: $kernels, collectives: $colls," "header with $kernels kernels and $colls collectives"
    k=$(grep -cE '^  k[0-9]+ ' "$f")
    [ "$k" = "$kernels" ] || err "rank $rank: $k kernels in $f, cx_last_exec_info says $kernels"
    c=$(sed -n '/^## Collectives/,/^## Arena/p' "$f" | grep -cE '^  [a-z_]+ .*: start k[0-9]+, wait before k[0-9]+')
    [ "$c" = "$colls" ] || err "rank $rank: $c collectives in $f, cx_last_exec_info says $colls"
    has "$f" '^Key parts: library .*options ".*xla_dump_to' "cache key parts"
    has "$f" '^## Arena: [0-9]+ bytes' "arena plan"
    if [ "$mm" = matmul ]; then
        has "$f" 'path: sgemm, (OpenBLAS|oneDNN)' "kernel path"
        has "$f" '^    ops: .*matmul' "fusion group ops"
    else
        has "$f" '^    ops: .*mul' "fusion group ops"
    fi
}

run() { CX_NUM_THREADS=1 "$@"; }

case $what in
shape)
    PT_XLA_DEBUG_LEVEL=1 XLA_IR_DEBUG=1 run "$prog" shape 2> "$tmp/err" || err "the program failed: $(cat "$tmp/err")"
    at=$(site batch)
    has "$tmp/err" "Closest cached graph: [0-9a-f]{32}" "closest cached graph"
    has "$tmp/err" "differs: input [0-9]+ is f32\[5,8\], was f32\[4,8\]; dimension 0 changed: 4 -> 5, made at .*/$at\$" \
        "changed input naming dimension 0 and $at"
    has "$tmp/err" "dimension 0 changed: 4 -> 6" "second shape change"
    has "$tmp/err" "^Compilation Analysis:   Outputs made at: .*/trainer_debug.c:[0-9]+" "the lines that made the outputs"
    # without XLA_IR_DEBUG: the same, and how to get the line
    PT_XLA_DEBUG_LEVEL=1 run "$prog" shape 2> "$tmp/err" || err "the program failed: $(cat "$tmp/err")"
    has "$tmp/err" "dimension 0 changed: 4 -> 5 \(set XLA_IR_DEBUG=1 to see the line that made it\)" "hint"
    ;;
const)
    PT_XLA_DEBUG_LEVEL=1 XLA_IR_DEBUG=1 run "$prog" const 2> "$tmp/err" || err "the program failed: $(cat "$tmp/err")"
    at=$(site const)
    has "$tmp/err" "differs: a new scalar baked in as a constant: %[0-9]+ constant holds 0.333333333, was 0.5, made at .*/$at;" \
        "baked constant at $at"
    has "$tmp/err" "holds 0.25, was 0.5" "the next step's constant"
    ;;
live)
    PT_XLA_DEBUG_LEVEL=1 XLA_IR_DEBUG=1 run "$prog" live 2> "$tmp/err" || err "the program failed: $(cat "$tmp/err")"
    has "$tmp/err" "differs: a different set of live tensors: the graph computes 5 outputs, the cached one 4 " "output count"
    has "$tmp/err" "differs: a different set of live tensors: %[0-9]+ add is an output now \(a tensor still alive\), made at .*/$(site forward)\$" \
        "the kept tensor's line"
    ;;
dump)
    if [ -z "$launch" ]; then
        XLA_FLAGS="--xla_dump_to=$tmp/d" run "$prog" dump > "$tmp/out" 2> "$tmp/err" || err "the program failed: $(cat "$tmp/err")"
        check_program "$(grep '^exec:' "$tmp/out")"
        # the CX_ spelling
        rm -rf "$tmp/d"
        CX_DUMP_DIR="$tmp/d" run "$prog" dump > "$tmp/out" 2> "$tmp/err" || err "the program failed: $(cat "$tmp/err")"
        n=$(ls "$tmp/d" | grep -c 'program.txt$')
        [ "$n" -ge 1 ] || err "CX_DUMP_DIR wrote no program"
        # the IR dumps with each node's line, as text and as dot
        XLA_IR_DEBUG=1 XLA_SAVE_TENSORS_FILE="$tmp/ir.txt" run "$prog" dump > /dev/null 2> "$tmp/err" || err "failed: $(cat "$tmp/err")"
        has "$tmp/ir.txt" " matmul\(%[0-9]+, %[0-9]+\), location=step@.*/trainer_debug.c:[0-9]+\$" "text IR with locations"
        XLA_IR_DEBUG=1 XLA_SAVE_TENSORS_FILE="$tmp/ir.dot" XLA_SAVE_TENSORS_FMT=dot run "$prog" dump > /dev/null 2> "$tmp/err" ||
            err "failed: $(cat "$tmp/err")"
        has "$tmp/ir.dot" '%[0-9]+ matmul\\n.*\\nlocation=step@.*/trainer_debug.c:[0-9]+"' "dot IR with locations"
    else
        XLA_FLAGS="--xla_dump_to=$tmp/d" run "$launch" --nproc 2 "$prog" dump dist > "$tmp/out" 2> "$tmp/err" ||
            err "the job failed: $(cat "$tmp/err" "$tmp/out")"
        [ "$(grep -c 'exec:' "$tmp/out")" = 2 ] || err "want an exec line from each rank: $(cat "$tmp/out")"
        grep 'exec:' "$tmp/out" | sed 's/^\[rank [0-9]*\] //' > "$tmp/exec"
        while read -r line; do
            check_program "$line"
            set -- $line
            [ "$7" -ge 1 ] || err "rank $3: no collective in a step that all-reduces"
        done < "$tmp/exec"
    fi
    ;;
hlo)
    XLA_SAVE_TENSORS_FMT=hlo run "$prog" hlo > "$tmp/out" 2> "$tmp/err" || err "the program failed: $(cat "$tmp/err")"
    set -- $(grep '^exec:' "$tmp/out")
    has "$tmp/out" "^Kernels: $5, collectives: 0," "cx_ir_text's program with the executable's $5 kernels"
    k=$(grep -cE '^  k[0-9]+ ' "$tmp/out")
    [ "$k" = "$5" ] || err "$k kernels in cx_ir_text's program, cx_last_exec_info says $5"
    ;;
oom)
    CX_MEMORY_LIMIT=1M XLA_IR_DEBUG=1 XLA_SAVE_HLO_FILE="$tmp/failed.txt" run "$prog" oom 2> "$tmp/err" ||
        err "the program failed: $(cat "$tmp/err")"
    has "$tmp/err" "CX_MEMORY_LIMIT\) \(graph saved to $tmp/failed.txt\)" "error naming the saved graph"
    [ -f "$tmp/failed.txt" ] || { err "no $tmp/failed.txt"; exit 1; }
    has "$tmp/failed.txt" "^\[cx_failed_graph\] CX_ERR_OOM: " "failed graph header"
    has "$tmp/failed.txt" "matmul\(%0, %1\), location=oom_step@.*/$(site outer)\$" "the matmul's line"
    has "$tmp/failed.txt" "^## Arena: 4000064 bytes" "the program's arena plan"
    # no file named: into the dump directory
    CX_MEMORY_LIMIT=1M CX_DUMP_DIR="$tmp/d" run "$prog" oom 2> "$tmp/err" || err "the program failed: $(cat "$tmp/err")"
    has "$tmp/err" "\(graph saved to $tmp/d/cxla_[0-9a-f]{32}\.r0\.failed\.txt\)" "error naming the dump directory's file"
    # a file that cannot be written: the step's error stays, and says so
    CX_MEMORY_LIMIT=1M XLA_SAVE_HLO_FILE="$tmp/none/failed.txt" run "$prog" oom 2> "$tmp/err" || err "the program failed: $(cat "$tmp/err")"
    has "$tmp/err" "CX_MEMORY_LIMIT\) \(graph not saved: cannot write $tmp/none/failed.txt: No such file or directory\)" \
        "error saying the graph was not saved"
    ;;
desync)
    XLA_IR_DEBUG=1 XLA_SAVE_HLO_FILE="$tmp/failed.txt" run "$launch" --nproc 2 "$prog" desync dist > "$tmp/out" 2> "$tmp/err"
    cat "$tmp/out" >> "$tmp/err"
    at=$(site desync)
    has "$tmp/err" "rank 0 at #[0-9]+: all_reduce f32\[1,4\] \(made at $at\); rank 1 at #[0-9]+: all_reduce f32\[1,3\] \(made at $at\)" \
        "desync naming $at"
    has "$tmp/err" "\(graph saved to $tmp/failed.txt.1\)" "rank 1's saved graph"
    [ -f "$tmp/failed.txt.0" ] && [ -f "$tmp/failed.txt.1" ] || err "want failed.txt.0 and .1: $(ls "$tmp")"
    ;;
sharding)
    PT_XLA_DEBUG_LEVEL=1 XLA_IR_DEBUG=1 XLA_FLAGS="--xla_dump_to=$tmp/d" run "$launch" --nproc 2 "$prog" sharding dist \
        > "$tmp/out" 2> "$tmp/err" || err "the job failed: $(cat "$tmp/err" "$tmp/out")"
    cat "$tmp/out" >> "$tmp/err"
    has "$tmp/err" "differs: the sharding of input 0 changed: \{devices=\[1,2\] mesh=\(data=2\) spec=\(None, data\)\}, was \{devices=\[2,1\] mesh=\(data=2\) spec=\(data, None\)\}, made at .*/$(site shard)\$" \
        "changed sharding"
    for r in 0 1; do
        n=$(ls "$tmp/d" | grep -c "\.r$r\.partitioned\.txt\$")
        [ "$n" -ge 2 ] || err "rank $r: $n partitioned graphs in the dump, want 2 (one per sharding)"
        # the last step cannot compile (an explicit all-reduce beside shardings): its graph is kept
        has "$tmp/err" "\\[rank $r\\] step 3: spmd partition: .*explicit all_reduce \\(graph saved to $tmp/d/cxla_[0-9a-f]{32}\\.r$r\\.failed\\.txt\\)" \
            "rank $r's compile error naming its saved graph"
    done
    has "$(ls "$tmp"/d/*.r0.failed.txt | head -1)" "^\\[cx_failed_graph\\] CX_ERR_STATE: spmd partition" "failed graph's header"
    # each rank's partitioned program agrees with its executable
    grep 'exec:' "$tmp/err" | sed 's/^\[rank [0-9]*\] //' > "$tmp/exec"
    [ "$(wc -l < "$tmp/exec")" = 2 ] || err "want an exec line from each rank: $(cat "$tmp/exec")"
    while read -r line; do check_program "$line" nomatmul; done < "$tmp/exec"
    ;;
*) echo "debug.sh: unknown scenario $what" >&2; exit 2 ;;
esac
[ "$fail" = 0 ] && echo "debug $what: ok"
exit "$fail"
