#!/bin/sh
# Functions stay readable on one screen: none under the layer folders or
# launch/ (the launcher, a program the library's users run on every job)
# is longer than the limit (lines from its opening to its closing brace;
# the project's style puts both in column 0). The other programs'
# functions (examples, tools, bench) are not checked.
# usage: check_function_length.sh SOURCE_DIR [LIMIT]
set -eu
src=$1 limit=${2:-100}
status=0
for d in util core nn optim parallel checkpoint launch; do
    for f in $(find "$src/$d" -name '*.c' | sort); do
        awk -v limit="$limit" -v file="${f#$src/}" '
            /^[A-Za-z_].*\(/ { sig = $0 }
            /^\{/ { start = NR; name = sig }
            /^\}/ && start {
                n = NR - start + 1
                if (n > limit) { sub(/\(.*/, "", name); printf "%s:%d: %s is %d lines (limit %d)\n", file, start, name, n, limit; bad = 1 }
                start = 0
            }
            END { exit bad }' "$f" || status=1
    done
done
[ $status -eq 0 ] && echo "check_function_length: every library and launcher function is at most $limit lines"
exit $status
