#!/bin/sh
# Profiles on demand (issue 26, part 6): a 2-rank DDP job started with
# CX_PROFILE_PORT is profiled mid-run by xla-profile, without a restart:
# each rank writes DIR/proc_<rank>/trace.json, and DIR/trace.json merges
# them, one process per rank (named "rank 0", "rank 1"), each with its
# executions and collectives, the collectives' ends lined up; the job runs
# on to its end; --merge-only merges the same traces again. Asking a port
# nobody serves is one clear line.
# usage: profile_on_demand.sh XLA_LAUNCH TRAIN XLA_PROFILE
set -eu
LAUNCH=$1 TRAIN=$2 PROFILE=$3
W=$(mktemp -d /tmp/cx_profile.XXXXXX)
lpid=""
trap '[ -n "$lpid" ] && kill -TERM $lpid 2>/dev/null; rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
PORT=$((20000 + $$ % 20000))

# nothing listening: one line naming the port and what to do
rc=0
"$PROFILE" --port "$PORT" --nproc 2 --dir "$W/none" --duration-ms 100 > "$W/none.out" 2>&1 || rc=$?
[ "$rc" -eq 1 ] || { cat "$W/none.out"; fail "no server: exit $rc"; }
grep -q "xla-profile: no profile server on 127.0.0.1:$PORT (local rank 0): Connection refused; run the job with CX_PROFILE_PORT=$PORT" \
    "$W/none.out" || { cat "$W/none.out"; fail "no server: no clear line"; }

CX_PROFILE_PORT=$PORT "$LAUNCH" --nproc 2 "$TRAIN" --model mlp --width 64 --depth 1 --data fake --epochs 40 \
    --parallel ddp --log-every 200 --threads 1 > "$W/job.out" 2>&1 &
lpid=$!
# the servers start at the ranks' first step end: retry until they answer
n=0
until "$PROFILE" --port "$PORT" --nproc 2 --dir "$W/prof" --duration-ms 300 > "$W/prof.out" 2>&1; do
    grep -q "no profile server" "$W/prof.out" || { cat "$W/prof.out" "$W/job.out"; fail "xla-profile failed"; }
    kill -0 $lpid 2>/dev/null || { cat "$W/job.out"; fail "the job ended before it could be profiled"; }
    n=$((n + 1)); [ $n -lt 300 ] || { cat "$W/prof.out"; fail "the ranks' profile servers never answered"; }
    sleep 0.1
done
cat "$W/prof.out"
grep -q "xla-profile: 2 ranks, 300 ms, [0-9]* events merged into $W/prof/trace.json" "$W/prof.out" || fail "no summary line"
kill -0 $lpid 2>/dev/null || fail "the job did not outlive its profile"
for r in 0 1; do [ -s "$W/prof/proc_$r/trace.json" ] || fail "no trace of rank $r"; done
python3 - "$W/prof/trace.json" <<'EOF' || fail "the merged trace"
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"]
names = {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "process_name"}
assert names == {0: "rank 0", 1: "rank 1"}, names
for r in (0, 1):
    for cat in ("execute", "collective"):
        k = sum(1 for e in ev if e["pid"] == r and e.get("cat") == cat)
        assert k > 0, "rank %d has no %s events" % (r, cat)
ends = {r: [(e["name"], e["ts"] + e["dur"]) for e in ev if e["pid"] == r and e.get("cat") == "collective"] for r in (0, 1)}
gaps = sorted(min(abs(t0 - t1) for n0, t0 in ends[0] if n0 == n1) for n1, t1 in ends[1]
              if any(n0 == n1 for n0, _ in ends[0]))
assert gaps, "no collective of rank 1 matches one of rank 0"
close = sum(1 for g in gaps if g < 1000)
assert close >= len(gaps) // 2, "collectives not lined up: %d of %d end within 1 ms" % (close, len(gaps))
print("merged trace: %d events; %d of rank 1's %d collectives end within 1 ms of rank 0's (median %.1f us)"
      % (len(ev), close, len(gaps), gaps[len(gaps) // 2]))
EOF
# the traces already there merge again alone (hosts captured one by one)
events=$(sed -n 's/.* \([0-9]*\) events merged.*/\1/p' "$W/prof.out")
mv "$W/prof/trace.json" "$W/first.json"
"$PROFILE" --merge-only --dir "$W/prof" > "$W/merge.out" 2>&1 || { cat "$W/merge.out"; fail "--merge-only"; }
grep -q "xla-profile: 2 ranks, $events events merged into $W/prof/trace.json" "$W/merge.out" ||
    { cat "$W/merge.out"; fail "--merge-only merged something else than the capture ($events events)"; }
rc=0; wait $lpid || rc=$?
lpid=""
[ "$rc" -eq 0 ] || { cat "$W/job.out"; fail "the profiled job exited $rc"; }
grep -q "Done: " "$W/job.out" || { cat "$W/job.out"; fail "the job did not finish"; }
echo "profile_on_demand: ok"
