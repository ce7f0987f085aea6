#!/usr/bin/env bash
# What an idle session costs in memory (issue 42, item 4), one command from a fresh clone:
#
#   tests/bench_idle.sh
#
# For each target (the floor for reference, switchboard, switchboard-blocking) and each
# transport (/sse: a session is its open event stream; /mcp: an initialized Streamable
# session holding its keep-alive connection, no GET stream; /mcp closed: the same session
# with its connection closed once initialized, `loadgen --idle-closed`, as a client that
# keeps no connection between requests leaves it): a fresh server in front of the
# echo backend is warmed up with 200 calls on that transport, left a second, and its VmRSS
# and RssAnon (private anonymous memory: heap and stacks, no code) read from
# /proc/PID/status; then `loadgen --idle N -s 0` opens N idle sessions and reads the same
# two figures with all N open. Per session = (with N - before) / N. The fresh server's
# RssAnon before any request is the idle private memory.
#
# Environment: BENCH_IDLE (5000 sessions for the floor and switchboard), BENCH_IDLE_BLOCKING
# (2000 for switchboard-blocking: a thread each), BENCH_DOC (the page the report goes into
# between `<!-- idle:begin -->` and `<!-- idle:end -->`, default tests/BENCHMARKS.md;
# empty: none). Prints the table; raw results in target/bench/idle.jsonl.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
tool=bench_idle
idle="${BENCH_IDLE:-5000}"
idle_blocking="${BENCH_IDLE_BLOCKING:-2000}"
doc="${BENCH_DOC-tests/BENCHMARKS.md}"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
[[ "$target_dir" = /* ]] || target_dir="$root/$target_dir"
bin="$target_dir/release"

echo "bench_idle: building (release)"
cargo build --release -q -p switchboard -p switchboard-blocking -p switchboard-tests --bins

# Each idle session holds a socket on each side.
hard="$(ulimit -Hn)"
if [[ "$hard" == unlimited ]] || ((hard > 65536)); then hard=65536; fi
ulimit -n "$hard"
cap=$((hard - 1000))
if ((cap < 100)); then
    echo "bench_idle: ulimit -n is at most $hard: too few descriptors to hold idle sessions" >&2
    exit 1
fi
for n in idle idle_blocking; do
    if ((${!n} > cap)); then
        echo "bench_idle: ulimit -n is at most $hard; holding $cap idle sessions instead of ${!n}" >&2
        printf -v "$n" '%s' "$cap"
    fi
done

# shellcheck source=tests/servers.sh
source "$root/tests/servers.sh"
rounds=1
load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
raw="$target_dir/bench/idle.jsonl"
mkdir -p "$(dirname "$raw")"
: >"$raw"

kb() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status" 2>/dev/null || true; }

for target in floor switchboard switchboard-blocking; do
    n=$idle
    [[ $target == switchboard-blocking ]] && n=$idle_blocking
    for transport in sse mcp mcp-closed; do
        flags=(--transport "${transport%-closed}")
        [[ $transport == mcp-closed ]] && flags+=(--idle-closed)
        case $target in
            floor) start "$target-$transport" "$bin/floor" ;;
            *) start "$target-$transport" "$bin/$target" --listen 127.0.0.1:0 --grace 1s \
                --max-sessions $((n + 100)) -- "$bin/echo-backend" ;;
        esac
        pid=$SERVER_PID url=$SERVER_URL
        fresh_anon="$(kb "$pid" RssAnon)"
        [[ -n "$fresh_anon" ]] || { echo "bench_idle: no RssAnon in /proc/$pid/status" >&2; exit 1; }
        "$bin/loadgen" --url "$url" --transport "${transport%-closed}" -s 1 -c 200 -k 1 \
            --timeout 60 --json >/dev/null
        sleep 1
        rss="$(kb "$pid" VmRSS)" anon="$(kb "$pid" RssAnon)"
        out="$("$bin/loadgen" --url "$url" "${flags[@]}" --idle "$n" -s 0 \
            --pid "$pid" --timeout 120 --json)"
        # The server's own count of sessions (`/health`) must be the N held: a closed
        # session is counted by the client once it has an id, and confirmed here.
        held="$(python3 -c '
import json, sys
d = json.loads(sys.argv[1])
n, health = d.get("idle_sessions"), d.get("health_sessions")
if not n or health != n or d.get("idle_rss_kb") is None or d.get("idle_anon_kb") is None:
    sys.exit(f"held {n} idle sessions, /health says {health}: {sys.argv[1][:300]}")
print(n, d["idle_rss_kb"], d["idle_anon_kb"])' "$out")" || {
            echo "bench_idle: $target /$transport: the idle sessions were not all held" >&2
            exit 1
        }
        read -r open idle_rss idle_anon <<<"$held"
        printf '{"target":"%s","transport":"%s","sessions":%s,"fresh_anon_kb":%s,"rss_kb":%s,"anon_kb":%s,"idle_rss_kb":%s,"idle_anon_kb":%s}\n' \
            "$target" "$transport" "$open" "$fresh_anon" "$rss" "$anon" "$idle_rss" "$idle_anon" >>"$raw"
        stop "$pid"
    done
done
load_end="$(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$raw" >"$work/report.md" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| target | transport | idle sessions | RssAnon fresh | VmRSS / RssAnon warmed | with the sessions | VmRSS per session | RssAnon per session |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for r in rows:
    n = max(r["sessions"], 1)
    mib = lambda kb: f"{kb / 1024:.1f} MiB"
    print(f'| {r["target"]} | /{r["transport"].replace("-", " ")} | {r["sessions"]} | {mib(r["fresh_anon_kb"])} '
          f'| {mib(r["rss_kb"])} / {mib(r["anon_kb"])} | {mib(r["idle_rss_kb"])} / {mib(r["idle_anon_kb"])} '
          f'| {(r["idle_rss_kb"] - r["rss_kb"]) / n:.1f} KiB | {(r["idle_anon_kb"] - r["anon_kb"]) / n:.1f} KiB |')
EOF
cat "$work/report.md"
[[ -z "$doc" ]] || write_doc idle "$doc" "$work/report.md"
