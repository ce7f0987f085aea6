#!/usr/bin/env bash
# The list cache's benchmark (SPEC 16, issue 43): tools/list from 50 Streamable sessions
# against a backend that takes 5 ms per list (tests/python/slow_list_backend.py, serial as a
# stdio server is), with --list-cache on and off, side by side in one run: lists answered
# per second and how many lists the backend was asked.
#
#   tests/bench_lists.sh            # BENCH_SECONDS (10), BENCH_SESSIONS (50), BENCH_ROUNDS (3)
#
# Uses the release switchboard (built here; BENCH_BIN=path to use another build); Python 3's
# standard library only.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
seconds="${BENCH_SECONDS:-10}"
sessions="${BENCH_SESSIONS:-50}"
rounds="${BENCH_ROUNDS:-3}"
bin="${BENCH_BIN:-}"
if [[ -z "$bin" ]]; then
    cargo build --release -q -p switchboard
    bin="${CARGO_TARGET_DIR:-$root/target}/release/switchboard"
fi
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
port=18711
for round in $(seq "$rounds"); do
    for cache in on off; do
        count="$work/count-$cache-$round"
        COUNT_FILE="$count" "$bin" --port "$port" --list-cache "$cache" --log-level warn \
            -- python3 tests/python/slow_list_backend.py &
        proxy=$!
        for _ in $(seq 100); do
            curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
            sleep 0.1
        done
        result=$(timeout $((seconds + 60)) python3 tests/python/list_bench.py \
            "http://127.0.0.1:$port/mcp" "$sessions" "$seconds")
        kill -TERM "$proxy"
        wait "$proxy" || true
        echo "round $round cache $cache: $result backend_lists=$(cat "$count" 2>/dev/null || echo '?')"
    done
done
