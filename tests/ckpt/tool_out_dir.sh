#!/bin/sh
# consolidate_ckpts makes the directory its output names, as mkdir -p would
# (--reshard's --out-prefix ck1r/r1, --save-path out/a/full.h5): the output
# is written and loads; a directory that cannot be made is one line naming
# it, exit 1.
# usage: tool_out_dir.sh TRAIN CONSOLIDATE_CKPTS
set -eu
TRAIN=$(realpath "$1") TOOL=$(realpath "$2")
W=$(mktemp -d /tmp/cx_tool_out_dir.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
cd "$W"
RUN="--data fake --model mlp --width 32 --steps 2"
"$TRAIN" $RUN --ckpt-dir ck > train.out 2>&1 || { cat train.out; fail "train"; }

"$TOOL" --ckpt-prefix ck/ckpt-step-2 --with-optimizer --reshard 1 --out-prefix ck1r/r1 > o.txt 2> e.txt || { cat o.txt e.txt; fail "--reshard into a missing directory"; }
[ -f ck1r/r1.commit ] && [ -f ck1r/r1_rank-0-of-1.h5 ] || { ls -R; fail "resharded checkpoint not written"; }
"$TRAIN" $RUN --resume ck1r/r1 > resume.out 2>&1 || { cat resume.out; fail "resume from the resharded checkpoint"; }
grep -q "^Resumed from ck1r/r1: step 2" resume.out || { cat resume.out; fail "did not resume from ck1r/r1"; }

"$TOOL" --ckpt-prefix ck/ckpt-step-2 --with-optimizer --save-path out/a/full.h5 > o.txt 2> e.txt || { cat o.txt e.txt; fail "--save-path into a missing directory"; }
[ -f out/a/full.h5 ] || fail "consolidated file not written"
"$TRAIN" $RUN --resume out/a/full.h5 > resume.out 2>&1 || { cat resume.out; fail "resume from the consolidated file"; }

touch afile
for q in afile/r1 afile/sub/r1; do
    rc=0; "$TOOL" --ckpt-prefix ck/ckpt-step-2 --reshard 1 --out-prefix $q > o.txt 2> e.txt || rc=$?
    [ $rc -eq 1 ] || fail "exit $rc when the directory of $q cannot be made, want 1"
    want="consolidate_ckpts: --out-prefix $q: cannot create directory ${q%/r1}: Not a directory"
    [ "$(cat e.txt)" = "$want" ] || { cat e.txt; fail "want the one line: $want"; }
done
echo "tool_out_dir: ok"
