#!/bin/sh
# cxla-bench's JSON lines say which way each figure improves: "better" is
# "higher" for a rate (matmul GFLOP/s) and "lower" for a time (the cache-hit
# overhead in us), next to the ratio it speaks of; --help names the field.
# usage: bench_lines.sh CXLA_BENCH
set -eu
BENCH=$1
W=$(mktemp -d /tmp/cx_bench_lines.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
"$BENCH" core --rounds 1 --min-time 0 > "$W/out" 2> "$W/err" || { cat "$W/out" "$W/err"; fail "cxla-bench core"; }
python3 - "$W/out" <<'PY' || { cat "$W/out"; fail "the lines"; }
import json, sys
want = {"fused_elementwise_gbps": "higher", "matmul_gflops": "higher", "cache_hit_overhead_us": "lower",
        "ir_debug_cache_hit_us": "lower"}
keys = ["bench", "value", "unit", "ref", "ratio", "better", "rounds", "ratio_min", "ratio_max"]
got = {}
for line in open(sys.argv[1]):
    d = json.loads(line)
    if list(d) != keys: sys.exit("fields %s, want %s" % (list(d), keys))
    got[d["bench"]] = d["better"]
if got != want: sys.exit("better: %s, want %s" % (got, want))
PY
"$BENCH" --help > "$W/help"
grep -q "{bench, value, unit, ref, ratio, better, rounds, ratio_min, ratio_max}" "$W/help" || fail "--help does not list better"
grep -q 'better is' "$W/help" || fail "--help does not say what better means"
# a bad --figure or a --gemm-n its figure does not read: the one error line,
# exit 2, and no machine line before it (nothing ran)
bad_flags() {
  want=$1; shift
  if "$BENCH" precision "$@" > "$W/out" 2> "$W/err"; then fail "precision $*: exit 0"; fi
  [ "$(wc -l < "$W/err")" -eq 1 ] || { cat "$W/err"; fail "precision $*: not one line"; }
  grep -q "$want" "$W/err" || { cat "$W/err"; fail "precision $*: no '$want'"; }
}
bad_flags "unknown figure 'nope'" --figure nope
bad_flags "gemm-n sizes bf16_gemm_gflops, which --figure cnn_bf16_images_per_s does not run" \
  --figure cnn_bf16_images_per_s --gemm-n 64
echo "bench_lines: ok"
