#!/bin/sh
# The layers of docs/architecture.md, checked on the build's own compile
# commands and on the sources:
#   - util, core, nn and optim compile without MPI or HDF5 on their include
#     path; only parallel/ sees MPI and only checkpoint/ sees HDF5;
#   - no layer but core sees core/'s private headers;
#   - among the layers only parallel sees proto/, the formats it shares
#     with the programs, and proto/ holds headers that include nothing but
#     system headers (the launcher builds them without the library);
#   - the programs (examples, tools, bench, launch) never see HDF5: they
#     read checkpoints through the public API only (cx_ckpt_read_meta for
#     what a program must know before it builds its model);
#   - no source reaches into another folder with a relative include.
# usage: check_layers.sh SOURCE_DIR BUILD_DIR
set -eu
src=$1 build=$2
db=$build/compile_commands.json
[ -f "$db" ] || { echo "check_layers: $db is missing (CMAKE_EXPORT_COMPILE_COMMANDS)" >&2; exit 1; }

status=0
# one line per library object: "<source path> <its -I flags>"
awk -v src="$src/" '
    /"command":/ {
        line = $0; incs = ""; file = ""; obj = ""
        n = split(line, w, " ")
        for (i = 1; i <= n; i++) {
            if (w[i] ~ /^-I/ || w[i] ~ /^-isystem/) incs = incs " " w[i] (w[i] == "-isystem" ? w[i+1] : "")
            if (w[i] == "-c") file = w[i+1]
            if (w[i] == "-o") obj = w[i+1]
        }
        gsub(/[",]/, "", file)
        # a program may compile a util/ source into itself (xla-launch):
        # that object is the program'"'"'s, not the layer'"'"'s
        rel = substr(file, length(src) + 1)
        if (index(file, src) == 1 && (obj ~ /CMakeFiles\/cx_/ || rel !~ /^util\//)) print rel, incs
    }' "$db" > "$build/layers.txt"
[ -s "$build/layers.txt" ] || { echo "check_layers: no library sources in $db" >&2; exit 1; }

while read -r file incs; do
    layer=${file%%/*}
    case $layer in
    examples|tools|bench|launch)
        case "$incs" in *hdf5*) echo "$file: HDF5 on the include path of program folder $layer"; status=1 ;; esac
        continue ;;
    util|core|nn|optim|parallel|checkpoint) ;;
    *) continue ;;
    esac
    case "$incs" in *openmpi*|*mpich*) [ "$layer" = parallel ] || { echo "$file: MPI on the include path of layer $layer"; status=1; } ;; esac
    case "$incs" in *hdf5*) [ "$layer" = checkpoint ] || { echo "$file: HDF5 on the include path of layer $layer"; status=1; } ;; esac
    case " $incs " in *"-I$src/core/"*) [ "$layer" = core ] || { echo "$file: core/ private headers visible to layer $layer"; status=1; } ;; esac
    case " $incs " in *"-I$src/proto "*) [ "$layer" = parallel ] || { echo "$file: proto/ visible to layer $layer"; status=1; } ;; esac
done < "$build/layers.txt"

others=$(find "$src/proto" -type f ! -name '*.h' 2>/dev/null || true)
[ -z "$others" ] || { echo "proto/ holds only headers:"; echo "$others"; status=1; }
hits=$(grep -n '#include "' "$src/proto" -r 2>/dev/null || true)
[ -z "$hits" ] || { echo "proto/ headers include only system headers:"; echo "$hits"; status=1; }

hits=$(grep -rn '#include <hdf5' "$src/examples" "$src/tools" "$src/bench" "$src/launch" --include='*.c' --include='*.h' 2>/dev/null || true)
[ -z "$hits" ] || { echo "a program includes HDF5 (use the public checkpoint API):"; echo "$hits"; status=1; }
for d in util core nn optim parallel checkpoint proto launch examples bench tools; do
    hits=$(grep -rn '#include "\.\./' "$src/$d" --include='*.c' --include='*.h' 2>/dev/null || true)
    [ -z "$hits" ] || { echo "relative include across folders:"; echo "$hits"; status=1; }
done
[ $status -eq 0 ] && echo "check_layers: $(wc -l < "$build/layers.txt") library sources respect their layers"
exit $status
