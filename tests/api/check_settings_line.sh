#!/bin/sh
# A bad CX_COLLECTIVE_TIMEOUT reads the same in xla-launch (which refuses to
# start, exit 2) and in the library (which logs it once and uses the
# default): one line each, equal but for the program's prefix and the
# library's "; the value is ignored", which says it went on.
# usage: check_settings_line.sh XLA_LAUNCH SETTINGS_TOOL
set -u
launch=$1 tool=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "check_settings_line: $*"; exit 1; }

CX_COLLECTIVE_TIMEOUT=abc "$launch" --nproc 1 /bin/true > "$tmp/launch.out" 2> "$tmp/launch"
rc=$?
[ $rc -eq 2 ] || { cat "$tmp/launch"; fail "xla-launch exited $rc on a bad CX_COLLECTIVE_TIMEOUT, not 2"; }
[ "$(wc -l < "$tmp/launch")" -eq 1 ] || { cat "$tmp/launch"; fail "xla-launch: not one line"; }

CX_COLLECTIVE_TIMEOUT=abc "$tool" --get CX_COLLECTIVE_TIMEOUT > "$tmp/value" 2> "$tmp/lib" ||
    fail "settings_tool failed"
[ "$(cat "$tmp/value")" = 300 ] || fail "the library read $(cat "$tmp/value"), not the default 300"
[ "$(wc -l < "$tmp/lib")" -eq 1 ] || { cat "$tmp/lib"; fail "library: not one line"; }

l=$(sed 's/^xla-launch: //' "$tmp/launch")
b=$(sed 's/^cxla: //; s/; the value is ignored$//' "$tmp/lib")
grep -q "; the value is ignored$" "$tmp/lib" || fail "the library's line does not say the value is ignored: $(cat "$tmp/lib")"
[ "$l" = "$b" ] || fail "different lines: xla-launch '$(cat "$tmp/launch")', library '$(cat "$tmp/lib")'"
case $l in
"bad CX_COLLECTIVE_TIMEOUT 'abc': want "*) ;;
*) fail "the line does not name the variable and its value: $l" ;;
esac
echo "check_settings_line: $l"
