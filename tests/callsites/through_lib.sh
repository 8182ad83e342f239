#!/bin/sh
# PT_XLA_DEBUG_LEVEL=1 through a library without debug information
# (through_lib.c): the frames read, below libcxla's,
#   sync_in_callback (<path>/through_lib.c:<@site callback>)
#   nodebug_call+0x<off> (<library>+0x<off>)
#   main (<path>/through_lib.c:<@site main>)
# and no debuginfod server is asked for the library's debug info, though
# DEBUGINFOD_URLS names one (Debian's profile sets it): its client would
# create the cache directory DEBUGINFOD_CACHE_PATH.
# usage: through_lib.sh PROGRAM SOURCE
set -u
prog=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
err() { echo "through_lib: $*" >&2; fail=1; }
line_of() { grep -n "@site $1 " "$src" | cut -d: -f1; }

DEBUGINFOD_URLS=http://127.0.0.1:9/ DEBUGINFOD_CACHE_PATH="$tmp/dcache" PT_XLA_DEBUG_LEVEL=1 CX_NUM_THREADS=1 \
    "$prog" > "$tmp/out" 2> "$tmp/err" || err "the program failed"
frames=$(awk '/Analysis: C Frames Triggered Execution:$/ { on = 1; next }
              on && /Analysis: -----/ { exit }
              on { sub(/^[A-Za-z ]*Analysis:   /, ""); if ($0 !~ /^cx_/) print }' "$tmp/err")
want="sync_in_callback \\(/.*/through_lib\\.c:$(line_of callback)\\)
nodebug_call\+0x[0-9a-f]+ \([^ ]*nodebug[^ ]*\.so\+0x[0-9a-f]+\)
main \\(/.*/through_lib\\.c:$(line_of main)\\)"
[ "$(echo "$frames" | wc -l)" = 3 ] || err "$(echo "$frames" | wc -l) frames below libcxla, want 3"
i=1
echo "$want" | while IFS= read -r re; do
    got=$(echo "$frames" | sed -n "${i}p")
    echo "$got" | grep -q -E "^$re\$" || { echo "through_lib: frame $i is '$got', want /$re/" >&2; touch "$tmp/bad"; }
    i=$((i + 1))
done
[ -e "$tmp/bad" ] && fail=1
[ -e "$tmp/dcache" ] && err "a debuginfod client ran (it created $tmp/dcache)"
[ $fail = 0 ] || { echo "--- stderr:"; cat "$tmp/err"; exit 1; }
echo "through_lib: the program's frames by line, the library's by symbol, no debuginfod"
