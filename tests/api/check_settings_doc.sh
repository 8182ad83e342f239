#!/bin/sh
# The README's table of environment variables is the settings table
# (util/cx_settings.c) as settings_tool prints it: a variable added to,
# removed from or documented differently in one and not the other fails.
# usage: check_settings_doc.sh README SETTINGS_TOOL
set -eu
readme=$1 tool=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
begin='<!-- settings table: printed by settings_tool --markdown (tests/api), from util/cx_settings.c -->'
end='<!-- end of settings table -->'
grep -qxF "$begin" "$readme" || { echo "check_settings_doc: no '$begin' line in $readme"; exit 1; }
grep -qxF "$end" "$readme" || { echo "check_settings_doc: no '$end' line in $readme"; exit 1; }
awk -v b="$begin" -v e="$end" '$0 == e { on = 0 } on { print } $0 == b { on = 1 }' "$readme" > "$tmp/readme"
"$tool" --markdown > "$tmp/table"
[ -s "$tmp/table" ] || { echo "check_settings_doc: settings_tool printed nothing"; exit 1; }
if ! diff -u "$tmp/table" "$tmp/readme"; then
    echo "check_settings_doc: README's table differs from the settings table (-: table, +: README);"
    echo "replace it with the output of: settings_tool --markdown"
    exit 1
fi
echo "check_settings_doc: README lists the $(($(wc -l < "$tmp/table") - 2)) settings of the table"
