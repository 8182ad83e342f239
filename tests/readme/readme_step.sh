#!/bin/sh
# The README's "A training step" block, as a reader copies it: extracted,
# compiled against the library with the flags a user's build gets, run, and
# its loss must fall (the last printed loss at most a tenth of the first).
# usage: readme_step.sh README CC INCLUDE_DIR... -- LIBDIR
# (CX_USER_CFLAGS: what a program built against this library needs too, the
# sanitizers of a sanitized build)
set -eu
readme=$1 cc=$2
shift 2
incs=""
while [ "$1" != "--" ]; do incs="$incs -I$1"; shift; done
libdir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
awk '/^## A training step/ { inside = 1 } inside && /^```c$/ { code = 1; next } code && /^```$/ { exit } code' \
    "$readme" > "$work/step.c"
[ -s "$work/step.c" ] || { echo "readme_step: no C block under '## A training step' in $readme"; exit 1; }
# shellcheck disable=SC2086
"$cc" -std=c11 -Wall -Wextra -Werror ${CX_USER_CFLAGS:-} $incs "$work/step.c" -L"$libdir" -Wl,-rpath,"$libdir" -lcxla -lm \
    -o "$work/step"
"$work/step" > "$work/out" 2>&1 || { cat "$work/out"; echo "readme_step: the README's program failed"; exit 1; }
cat "$work/out"
awk '/^step [0-9]+ loss / { if (first == "") first = $4; last = $4 }
     END {
         if (first == "" || last == "") { print "readme_step: no loss printed"; exit 1 }
         if (!(last + 0 <= first / 10)) { printf "readme_step: loss went %s -> %s, not down tenfold\n", first, last; exit 1 }
         printf "readme_step: loss %s -> %s\n", first, last
     }' "$work/out"
