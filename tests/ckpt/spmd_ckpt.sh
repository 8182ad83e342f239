#!/bin/sh
# SPMD checkpoints end to end (ckpt_spmd.c does each step):
#  - 4 ranks on a (2, 2) mesh train 2 AdamW steps and save; each shard is
#    written once (by the lowest rank holding it), a replicated tensor by
#    rank 0 only, a shard that is all padding by nobody;
#  - the checkpoint loads bit for bit on a (4, 1) mesh with other shardings
#    and in one process without SPMD;
#  - consolidate_ckpts makes it one full file of today's layout, which
#    loads bit for bit in one process and into the (4, 1) shardings;
#  - it loads into an FSDP wrapper, and reshards into an FSDP checkpoint;
#  - a corrupt or a missing rank file is one clear error naming the file,
#    on every rank, and the model is left untouched.
# usage: spmd_ckpt.sh XLA_LAUNCH CKPT_SPMD CONSOLIDATE_CKPTS
set -eu
launch=$1 prog=$2 consolidate=$3
dir=$(mktemp -d /tmp/cx_spmd_ckpt_XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
run() { "$@" > "$dir/log" 2>&1 || { cat "$dir/log"; fail "$*"; }; grep -v '^\[rank [1-9]' "$dir/log" || true; }

run "$launch" --nproc 4 "$prog" save "$dir"
grep -q "^strategy spmd$" "$dir/ck.commit" || fail "the commit marker does not say strategy spmd: $(cat "$dir/ck.commit")"
has() { h5ls -r "$dir/ck_rank-$1-of-4.h5" | grep -q "^$2 "; }
# 0.bias splits over model only: ranks 0 and 2 (1 and 3) hold the same shard
has 0 /model/0.bias && has 1 /model/0.bias || fail "ranks 0 and 1 must write their shards of 0.bias"
! has 2 /model/0.bias && ! has 3 /model/0.bias || fail "ranks 2 and 3 wrote 0.bias, which ranks 0 and 1 hold"
# scale's 5 rows over 4 ranks: rank 3 holds only padding
has 2 /model/scale && ! has 3 /model/scale || fail "scale: rank 2 must write its row, rank 3 (only padding) nothing"
# the 0-d step states are replicated: rank 0 alone
has 0 /optimizer/0.weight/step && ! has 1 /optimizer/0.weight/step || fail "a replicated state written by a rank other than 0"
h5dump -a /model/0.weight/sharding "$dir/ck_rank-1-of-4.h5" | grep -q "model in 3 blocks" ||
    fail "no readable sharding on 0.weight"

run "$launch" --nproc 4 "$prog" load41 "$dir"
run "$prog" single "$dir"

run "$consolidate" --ckpt-prefix "$dir/ck" --with-optimizer
full="$dir/ck_consolidated.h5"
h5ls -r "$full" | grep -q "^/model/0.weight  *Dataset {12, 8}$" || fail "the consolidated file lacks the full 0.weight"
h5ls -r "$full" | grep -q "^/optimizer/2.weight/exp_avg  *Dataset {7, 12}$" || fail "the consolidated file lacks a full state"
! h5ls -r "$full" | grep -q spmd_metadata || fail "the consolidated file has SPMD metadata"
! h5dump -A "$full" | grep -q shard_boxes || fail "the consolidated file has shard boxes"
run "$prog" single "$dir" "$full"
run "$launch" --nproc 4 "$prog" load41 "$dir" "$full"

# into FSDP: loaded by an FSDP wrapper on 2 ranks (saved again, consolidated,
# compared), and resharded by the tool into an FSDP checkpoint of 3 ranks
run "$launch" --nproc 2 "$prog" fsdp "$dir"
run "$consolidate" --ckpt-prefix "$dir/fsdp" --with-optimizer
run "$prog" single "$dir" "$dir/fsdp_consolidated.h5"
run "$consolidate" --ckpt-prefix "$dir/ck" --with-optimizer --reshard 3 --out-prefix "$dir/re"
run "$prog" single "$dir" "$dir/re"

# compressed (chunked zstd datasets): the same, read through the same hyperslabs
mkdir "$dir/z"
run "$launch" --nproc 4 "$prog" save "$dir/z" 3
h5dump -p -H -d /model/2.weight "$dir/z/ck_rank-0-of-4.h5" | grep -q CHUNKED || fail "the compressed save is not chunked"
run "$launch" --nproc 4 "$prog" load41 "$dir/z"
run "$prog" single "$dir/z"

# a corrupt rank file (same size, other bytes), in a tensor's data (the
# file's checksum) and in HDF5's metadata: one process, and 4 ranks
mkdir "$dir/bad"
cp "$dir"/ck.commit "$dir"/ck_rank-*.h5 "$dir/ref.bin" "$dir/bad/"
f2="$dir/bad/ck_rank-2-of-4.h5"
at=$(h5dump -p -H -d /model/2.weight "$f2" | sed -n 's/^ *OFFSET \([0-9]*\)$/\1/p')
[ -n "$at" ] || fail "no offset of /model/2.weight's data"
poke() { printf '\377\377\377\377\377\377\377\377' | dd of="$f2" bs=1 seek="$1" conv=notrunc 2> /dev/null; }
poke "$at"
run "$prog" fail "$dir/bad" "ck_rank-2-of-4.h5: checksum mismatch"
run "$launch" --nproc 4 "$prog" fail "$dir/bad" "ck_rank-2-of-4.h5: checksum mismatch"
[ "$(grep -c 'ck_rank-2-of-4.h5: checksum mismatch' "$dir/log")" -ge 4 ] || fail "not every rank reported the corrupt file"
cp "$dir/ck_rank-2-of-4.h5" "$f2"
poke $(($(wc -c < "$f2") - 600))
run "$prog" fail "$dir/bad" "ck_rank-2-of-4.h5"
run "$launch" --nproc 4 "$prog" fail "$dir/bad" "ck_rank-2-of-4.h5"
[ "$(grep -c 'ck_rank-2-of-4.h5' "$dir/log")" -ge 4 ] || fail "not every rank reported the corrupt file"
# a missing rank file
cp "$dir/ck_rank-2-of-4.h5" "$dir/bad/"
rm "$dir/bad/ck_rank-3-of-4.h5"
run "$prog" fail "$dir/bad" "ck_rank-3-of-4.h5"
run "$launch" --nproc 4 "$prog" fail "$dir/bad" "ck_rank-3-of-4.h5"
echo "spmd_ckpt: ok"
