#!/bin/sh
# PT_XLA_DEBUG_LEVEL=1 names a program's own C frames by function, file and
# line when the program has debug information (the project's programs are
# built with -g, and so is a user's program built with -g); they were
# "?? (train+0x6be7)". Each analysis's frames below libcxla must be
# "<function> (<path>/<source>.c:<line>)" with <source> one of the
# program's, the first of them a line that calls the library (it holds
# "cx_"), the last main: the C runtime's frames below main are not shown.
# Without debug information the frames still name their function from the
# symbol table: "<function>+0x<off> (<program>+0x<off>)", never "??".
# usage: frames.sh lines   MIN SOURCE... -- PROGRAM ARGS...
#        frames.sh symbols MIN -- PROGRAM ARGS...
set -u
mode=$1 min=$2
shift 2
srcs=""
while [ $# -gt 0 ] && [ "$1" != -- ]; do srcs="$srcs $1"; shift; done
[ $# -gt 1 ] || { echo "usage: frames.sh lines|symbols MIN SOURCE... -- PROGRAM ARGS..." >&2; exit 2; }
shift
prog=$(basename "$1")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
err() { echo "frames: $*" >&2; fail=1; }

PT_XLA_DEBUG_LEVEL=1 CX_NUM_THREADS=1 "$@" > "$tmp/out" 2> "$tmp/err" || { cat "$tmp/err"; err "$prog failed"; }
# each analysis's frames below the library's, one block a line, "|"-joined;
# a frame line starting "cx_" is libcxla's, or the call site it was given
awk '/Analysis: C Frames Triggered Execution:$/ { on = 1; blk = ""; next }
     on && /Analysis: -----/ { on = 0; if (blk != "") print substr(blk, 2); next }
     on { sub(/^[A-Za-z ]*Analysis:   /, ""); if ($0 !~ /^cx_/) blk = blk "|" $0 }' "$tmp/err" > "$tmp/blocks"
n=$(wc -l < "$tmp/blocks")
[ "$n" -ge "$min" ] || err "$n analyses with frames of $prog, want $min or more"
grep -q '??' "$tmp/blocks" && err "unnamed frames: $(grep -o '[^|]*??[^|]*' "$tmp/blocks" | sort -u | head -3 | tr '\n' ';')"

if [ "$mode" = symbols ]; then
    bad=$(tr '|' '\n' < "$tmp/blocks" | grep -v -E "^[A-Za-z_][A-Za-z0-9_.]*\+0x[0-9a-f]+ \($prog\+0x[0-9a-f]+\)\$" | sort -u)
    [ -z "$bad" ] || err "frames not named by their symbol: $(echo "$bad" | head -3 | tr '\n' ';')"
    while IFS= read -r blk; do
        case ${blk##*|} in "main+0x"*) ;; *) err "the last frame is not main: $blk" ;; esac
    done < "$tmp/blocks"
else
    alt=$(for s in $srcs; do basename "$s"; done | sed 's/\./\\./g' | paste -sd'|' -)
    frame_re="^[A-Za-z_][A-Za-z0-9_]* \(/.*/($alt):[0-9]+\)\$"
    bad=$(tr '|' '\n' < "$tmp/blocks" | grep -v -E "$frame_re" | sort -u)
    [ -z "$bad" ] || err "frames not named by file and line: $(echo "$bad" | head -3 | tr '\n' ';')"
    while IFS= read -r blk; do
        first=${blk%%|*} last=${blk##*|}
        case $last in "main ("*) ;; *) err "the last frame is not main: $blk" ;; esac
        # the first frame's line is the program's call into the library
        file=$(echo "$first" | sed 's/.* (\(.*\):[0-9]*)$/\1/') line=$(echo "$first" | sed 's/.*:\([0-9]*\))$/\1/')
        [ -f "$file" ] || { err "$file, named by '$first', is no file"; continue; }
        sed -n "${line}p" "$file" | grep -q 'cx_' || err "'$first' names a line that calls no cx_ function: $(sed -n "${line}p" "$file")"
    done < "$tmp/blocks"
fi
[ $fail = 0 ] || { echo "--- stderr:"; cat "$tmp/err"; exit 1; }
echo "frames: $n analyses of $prog, every frame of it named by $([ "$mode" = symbols ] && echo symbol || echo 'file and line')"
