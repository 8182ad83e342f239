#!/bin/sh
# debug.h's call-site macros (cx_sync() -> cx_sync_at(__FILE__, __LINE__)
# & co.) are for programs: a sync inside libcxla must not be reported as a
# libcxla line, nor clear the user's. Checked three ways:
#   - no library source includes the umbrella cxla.h;
#   - every library object is compiled with CX_BUILDING_LIBRARY, under
#     which debug.h leaves the macros out;
#   - in the built objects, only the one defining cx_sync_at, cx_step_end_at
#     and cx_item_at refers to them.
# usage: check_callsites.sh SOURCE_DIR BUILD_DIR ARCHIVE (the library's objects)
set -eu
src=$1 build=$2 archive=$3
db=$build/compile_commands.json
[ -f "$db" ] || { echo "check_callsites: $db is missing (CMAKE_EXPORT_COMPILE_COMMANDS)" >&2; exit 1; }
[ -f "$archive" ] || { echo "check_callsites: $archive is missing" >&2; exit 1; }
status=0

hits=$(cd "$src" && grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]cxla/cxla\.h[>"]' \
           util core nn optim parallel checkpoint --include='*.c' --include='*.h' || true)
[ -z "$hits" ] || { echo "library sources include cxla/cxla.h (include the public headers they use):"; echo "$hits"; status=1; }

# "<source path relative to SOURCE_DIR> <1 if compiled with CX_BUILDING_LIBRARY>"
awk -v src="$src/" '
    /"command":/ {
        n = split($0, w, " "); file = ""; obj = ""; lib = 0
        for (i = 1; i <= n; i++) {
            if (w[i] == "-DCX_BUILDING_LIBRARY" || w[i] ~ /^-DCX_BUILDING_LIBRARY=/) lib = 1
            if (w[i] == "-c") file = w[i+1]
            if (w[i] == "-o") obj = w[i+1]
        }
        gsub(/[",]/, "", file)
        # the library layers only (object libraries cx_*): a program may
        # compile a util/ source into itself (xla-launch does)
        if (index(file, src) == 1 && obj ~ /CMakeFiles\/cx_/) print substr(file, length(src) + 1), lib
    }' "$db" > "$build/callsites.txt"
nlib=0
while read -r file lib; do
    case ${file%%/*} in util|core|nn|optim|parallel|checkpoint) ;; *) continue ;; esac
    nlib=$((nlib + 1))
    [ "$lib" = 1 ] || { echo "$file: compiled without CX_BUILDING_LIBRARY (debug.h's call-site macros are on)"; status=1; }
done < "$build/callsites.txt"
[ $nlib -gt 0 ] || { echo "check_callsites: no library sources in $db" >&2; exit 1; }

# "member type symbol" for the *_at entry points
nm -A -g "$archive" | awk -F: '{ n = split($NF, w, " "); if (w[n] ~ /^(cx_sync_at|cx_step_end_at|cx_item_at)$/)
                                   print $(NF-1), w[n-1], w[n] }' > "$build/callsites_nm.txt"
definers=$(awk '$2 == "T" { print $1 }' "$build/callsites_nm.txt" | sort -u)
[ "$(awk '$2 == "T"' "$build/callsites_nm.txt" | wc -l)" = 3 ] && [ "$(echo "$definers" | wc -w)" = 1 ] ||
    { echo "check_callsites: expected one object defining the 3 *_at functions, found: $(echo $definers)"; exit 1; }
users=$(awk -v d="$definers" '$2 == "U" && $1 != d { print $1 ": " $3 }' "$build/callsites_nm.txt" | sort -u)
[ -z "$users" ] || { echo "library objects call the *_at entry points (call-site macros active):"; echo "$users"; status=1; }

[ $status -eq 0 ] && echo "check_callsites: $nlib library sources without the call-site macros; the *_at functions appear only in $definers, which defines them"
exit $status
