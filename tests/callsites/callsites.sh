#!/bin/sh
# PT_XLA_DEBUG_LEVEL=1 and the desync check name the user's own lines:
# user_callsites.c's syncs appear as "<api> (<its path>:<line>)", the lines
# found by the program's "@site NAME" comments, and no line of any other C
# file (libcxla's own syncs, in the DDP wrap or the broadcast of rank 0's
# parameters, are named by the C stack instead).
# usage: callsites.sh PROGRAM SOURCE            one process
#        callsites.sh PROGRAM SOURCE LAUNCHER   DDP on 2 ranks, and a desync
set -u
prog=$1 src=$2 launch=${3:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
err() { echo "callsites: $*" >&2; fail=1; }

site() {
    n=$(grep -c "@site $1 " "$src")
    [ "$n" = 1 ] || { echo "callsites: $n lines marked '@site $1' in $src" >&2; exit 1; }
    echo "$(basename "$src"):$(grep -n "@site $1 " "$src" | cut -d: -f1)"
}

# at least MIN lines in the output naming API at the site
expect() {
    api=$1 at=$(site "$2") min=$3
    got=$(grep -c "Analysis:   $api (.*/$at)\$" "$tmp/err")
    [ "$got" -ge "$min" ] || err "$got reports of $api at $at, want $min or more"
}

# frames name the library by its public functions only; a file:line is the user's
only_user_lines() {
    others=$(grep -oE '[A-Za-z0-9_.-]+\.c:[0-9]+' "$tmp/err" | grep -v "^$(basename "$src"):" | sort -u)
    [ -z "$others" ] || err "library lines named as call sites: $(echo $others)"
}

if [ -z "$launch" ]; then
    PT_XLA_DEBUG_LEVEL=1 CX_NUM_THREADS=1 "$prog" single 2> "$tmp/err" || { cat "$tmp/err"; err "the program failed"; }
    expect cx_sync sync 1
    expect cx_item item 3     # one compile per batch shape
    expect cx_step_end step 3
    only_user_lines
else
    # level 2: the wrap's sync runs a graph the broadcast compiled
    PT_XLA_DEBUG_LEVEL=2 CX_NUM_THREADS=1 "$launch" --nproc 2 "$prog" ddp > "$tmp/out" 2> "$tmp/err" ||
        { cat "$tmp/out" "$tmp/err"; err "the program failed"; }
    expect cx_step_end ddp 3
    # the wrap's own sync was analysed, and named by the stack (the
    # broadcast's too, but its frame is gone in a tail call)
    grep -q "Analysis:   cx_ddp_wrap+0x" "$tmp/err" || err "no frame of cx_ddp_wrap in the analysis"
    at=$(site desync)
    for r in 0 1; do
        line=$(grep "rank $r desync: " "$tmp/err")
        [ -n "$line" ] || { err "rank $r printed no desync message"; continue; }
        # each rank's graph is described with the line that ran it
        got=$(echo "$line" | grep -o "from [^ ]*/$at\b" | wc -l)
        [ "$got" = 2 ] || err "rank $r's desync message names $at $got times, not once per rank: $line"
    done
    only_user_lines
fi
[ $fail = 0 ] || { echo "--- stderr:"; cat "$tmp/err"; exit 1; }
echo "callsites: every call site named is $(basename "$src")'s own"
