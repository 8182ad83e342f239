#!/bin/sh
# The shared library exports exactly the functions that include/cxla/*.h
# declares: nothing private leaks (the build hides everything by default),
# and no public declaration lacks its CX_API mark or its definition.
# usage: check_exports.sh CC INCLUDE_DIR LIBCXLA [GENERATED_INCLUDE_DIR]
set -eu
cc=$1 inc=$2 lib=$3 gen=${4:-$2}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# GCC's -aux-info lists every function prototype with the file declaring it.
# The headers' static inline functions (the default functions, which must
# build their struct at the caller's size: docs/api.md, "Growing structs")
# are compiled into the caller and must not be exported; they only need the
# cx_ prefix.
echo '#include <cxla/cxla.h>' > "$tmp/api.c"
"$cc" -DCX_NO_CALLSITE_MACROS -I"$inc" -I"$gen" -fsyntax-only -aux-info "$tmp/api.aux" "$tmp/api.c"
names() { sed -n 's/.*[ *]\([A-Za-z_][A-Za-z0-9_]*\) (.*/\1/p' | sort -u; }
grep "$inc/cxla/" "$tmp/api.aux" | grep -v '\*/ static ' | names > "$tmp/declared"
grep "$inc/cxla/" "$tmp/api.aux" | grep '\*/ static ' | names > "$tmp/inline"
[ -s "$tmp/declared" ] || { echo "check_exports: found no declarations in $inc/cxla" >&2; exit 1; }

nm -D --defined-only "$lib" | awk '{print $NF}' | grep -v '^_' | sort -u > "$tmp/exported"
[ -s "$tmp/exported" ] || { echo "check_exports: $lib exports nothing" >&2; exit 1; }

status=0
for s in $(comm -23 "$tmp/exported" "$tmp/declared"); do
    echo "exported but declared in no public header: $s"; status=1
done
for s in $(comm -13 "$tmp/exported" "$tmp/declared"); do
    echo "declared in a public header but not exported (missing CX_API or definition): $s"; status=1
done
for s in $(comm -12 "$tmp/exported" "$tmp/inline"); do
    echo "static inline in a public header but also exported: $s"; status=1
done
for s in $(cat "$tmp/declared" "$tmp/inline" | grep -v '^cx_' || true); do
    echo "public function without the cx_ prefix: $s"; status=1
done
[ $status -eq 0 ] && echo "check_exports: $(wc -l < "$tmp/declared") public functions, all exported, nothing else" \
    "($(wc -l < "$tmp/inline") static inline, none exported)"
exit $status
