#!/usr/bin/env bash
# What one client's large bodies cost everyone else: the latency a small session sees while
# two other connections post 8 MiB bodies, on both binaries, in one run:
#
#   tests/bench_stall.sh                       # the binaries of this tree
#   BENCH_BEFORE=DIR tests/bench_stall.sh      # and, side by side, DIR/switchboard{,-blocking}
#
# Each server runs on loopback in front of the fast echo backend. A probe (its own
# Streamable session on `/mcp`) sends BENCH_PINGS `ping` requests one after another (for
# at most BENCH_PROBE_SECS) and times each POST to its JSON answer, first with nothing else going on (idle), then while two
# hog processes, each with its own session and connection, POST a ~8 MiB `tools/call` in a
# loop (at most BENCH_HOG_POSTS each, and only while the probe runs). A hog's body is one
# object of ~490,000 members whose last key repeats an earlier one: the proxy reads it whole
# (every key checked) and refuses it 400, so nothing reaches the backend and the cost is
# the parse alone. Reported: the probe's p50, p99 and max in ms, and how many hog posts
# were answered meanwhile. A benchmark, not a test: nothing here fails on a figure.
#
# Environment: BENCH_PINGS (300), BENCH_PROBE_SECS (60), BENCH_HOG_POSTS (200), BENCH_ROUNDS (3: the targets'
# order rotates every round; medians), BENCH_NO_BUILD=1 (use the release binaries already
# built), BENCH_BIN (where the binaries and echo-backend are, default target/release),
# BENCH_DOC (default tests/BENCHMARKS.md; empty: none). Needs python3. Every
# process started here is stopped on exit (trap EXIT); every wait is bounded.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

pings="${BENCH_PINGS:-300}"
hog_posts="${BENCH_HOG_POSTS:-200}"
budget="${BENCH_PROBE_SECS:-60}"
rounds="${BENCH_ROUNDS:-3}"
doc="${BENCH_DOC-tests/BENCHMARKS.md}"
before="${BENCH_BEFORE:-}"

command -v python3 >/dev/null || { echo "bench_stall: needs python3" >&2; exit 1; }

target_dir="${CARGO_TARGET_DIR:-$root/target}"
[[ "$target_dir" = /* ]] || target_dir="$root/$target_dir"
bin="${BENCH_BIN:-$target_dir/release}"

if [[ "${BENCH_NO_BUILD:-0}" != 1 ]]; then
    echo "bench_stall: building (release)"
    cargo build --release -p switchboard -p switchboard-blocking -p switchboard-tests --bins
fi

tool=bench_stall
# shellcheck source=tests/servers.sh
source "$root/tests/servers.sh"

load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
echo "bench_stall: $(nproc) CPUs, load average $load_start at the start"

# The probe and the hogs: one python3 program, its role from its arguments.
driver="$work/stall.py"
cat >"$driver" <<'EOF'
import http.client, json, multiprocessing, sys, time
from urllib.parse import urlparse

HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
           "MCP-Protocol-Version": "2025-06-18"}

def session(host, port):
    conn = http.client.HTTPConnection(host, port, timeout=60)
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "bench_stall", "version": "1"}}}
    conn.request("POST", "/mcp", json.dumps(init), HEADERS)
    r = conn.getresponse()
    r.read()
    sid = r.getheader("Mcp-Session-Id")
    assert r.status == 200 and sid, f"initialize: {r.status}"
    headers = dict(HEADERS, **{"Mcp-Session-Id": sid})
    conn.request("POST", "/mcp", '{"jsonrpc":"2.0","method":"notifications/initialized"}', headers)
    r = conn.getresponse()
    r.read()
    return conn, headers

def hog(host, port, limit, stop, counts, i):
    members = ",".join(f'"k{n}":{n}' for n in range(490_000))
    body = ('{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo",'
            '"arguments":{' + members + ',"k0":0}}}').encode()
    assert len(body) <= 8 << 20, len(body)
    conn, headers = session(host, port)
    done = 0
    deadline = time.monotonic() + 120
    while done < limit and not stop.is_set() and time.monotonic() < deadline:
        try:
            conn.request("POST", "/mcp", body, headers)
            r = conn.getresponse()
            r.read()
        except (OSError, http.client.HTTPException):
            # The connection went away (a busy machine's timeout): a new one, and on.
            conn.close()
            conn, headers = session(host, port)
            continue
        assert r.status == 400, f"hog post: {r.status}"
        done += 1
        counts[i] = done

def probe(conn, headers, n, budget):
    times = []
    deadline = time.monotonic() + budget
    for k in range(n):
        if time.monotonic() > deadline:
            break
        body = json.dumps({"jsonrpc": "2.0", "id": k + 1, "method": "ping"})
        for attempt in (1, 2):
            t = time.perf_counter()
            try:
                conn.request("POST", "/mcp", body, headers)
                r = conn.getresponse()
                r.read()
                break
            except (OSError, http.client.HTTPException):
                # A keep-alive connection idle past --header-timeout was closed: the
                # session lives on, on a new connection (http.client opens it).
                conn.close()
                if attempt == 2:
                    raise
        times.append((time.perf_counter() - t) * 1000)
        assert r.status == 200, f"ping: {r.status}"
    return times

def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]

def main():
    url, pings, limit, budget = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    tags = json.loads(sys.argv[5])
    u = urlparse(url)
    conn, headers = session(u.hostname, u.port)
    probe(conn, headers, 20, budget)  # warm-up
    for hogs in (0, 2):
        stop = multiprocessing.Event()
        counts = multiprocessing.Array("i", hogs)
        procs = [multiprocessing.Process(target=hog, args=(u.hostname, u.port, limit, stop, counts, i))
                 for i in range(hogs)]
        for p in procs:
            p.start()
        if hogs:
            # Until every hog has had a body answered: they are in their loop.
            deadline = time.monotonic() + 60
            while min(counts) < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
        times = probe(conn, headers, pings, budget)
        stop.set()
        for p in procs:
            p.join(timeout=120)
            if p.is_alive():
                p.terminate()
        out = {"hogs": hogs, "pings": len(times), "p50_ms": pct(times, 50),
               "p99_ms": pct(times, 99), "max_ms": max(times), "hog_posts": sum(counts)}
        out.update(tags)
        print(json.dumps(out), flush=True)

main()
EOF

declare -A binary
binary[tokio/after]="$bin/switchboard"
binary[blocking/after]="$bin/switchboard-blocking"
builds=(after)
if [[ -n "$before" ]]; then
    binary[tokio/before]="$before/switchboard"
    binary[blocking/before]="$before/switchboard-blocking"
    builds=(before after)
fi
targets=()
for b in tokio blocking; do
    for v in "${builds[@]}"; do
        targets+=("$b/$v")
    done
done

declare -A url
for t in "${targets[@]}"; do
    start "${t//\//-}" "${binary[$t]}" --listen 127.0.0.1:0 -- "$bin/echo-backend"
    url[$t]=$SERVER_URL
done

for round in $(seq "$rounds"); do
    echo "bench_stall: round $round/$rounds, $SECONDS s in"
    for i in "${!targets[@]}"; do
        t="${targets[$(((i + round - 1) % ${#targets[@]}))]}"
        tags="$(printf '{"round":%d,"binary":"%s","build":"%s"}' "$round" "${t%/*}" "${t#*/}")"
        timeout -k 5 600 python3 "$driver" "${url[$t]}" "$pings" "$hog_posts" "$budget" "$tags" >>"$results" ||
            echo "bench_stall: $t round $round failed" >&2
    done
done

load_end="$(cut -d' ' -f1-3 /proc/loadavg)"
echo "bench_stall: done in $SECONDS s; load average $load_end at the end"
echo

mkdir -p "$target_dir/bench"
cp "$results" "$target_dir/bench/stall.jsonl"
report="$target_dir/bench/stall.txt"
python3 - "$results" "$pings" "$rounds" >"$report" <<'EOF'
import collections, json, statistics, sys
path, pings, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
runs = collections.defaultdict(list)
for line in open(path):
    v = json.loads(line)
    runs[(v["binary"], v["build"], v["hogs"])].append(v)
print(f"A probe session's `ping` on `/mcp`, up to {pings} in a row, alone (idle) and while two other "
      f"connections each POST ~8 MiB bodies (refused 400 after the whole parse) in a loop; "
      f"medians of {rounds} rounds; ms.")
print()
print("| binary | build | load | pings | p50 ms | p99 ms | max ms | hog posts answered meanwhile |")
print("|---|---|---|---|---|---|---|---|")
for binary in ("tokio", "blocking"):
    for build in ("before", "after"):
        for hogs in (0, 2):
            rs = runs.get((binary, build, hogs))
            if not rs:
                continue
            med = lambda f: statistics.median(r[f] for r in rs)
            load = "idle" if hogs == 0 else "2 x 8 MiB posts"
            print(f"| {binary} | {build} | {load} | {med('pings'):.0f} | {med('p50_ms'):.2f} | {med('p99_ms'):.1f} "
                  f"| {med('max_ms'):.1f} | {med('hog_posts'):.0f} |")
EOF
cat "$report"

if [[ -n "$doc" ]]; then
    write_doc stall "$doc" "$report"
fi
