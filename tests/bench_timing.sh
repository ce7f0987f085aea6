#!/usr/bin/env bash
# The times the end-to-end suites measure but do not assert (a time bound lies on a loaded
# machine, so the tests assert the behaviour and print the time as a `FIGURE` line):
#
#   tests/bench_timing.sh
#
#   departure_noticed                 a client that closed its idle SSE stream (nothing is
#                                     written to it): the first 404 for its POSTs
#                                     (robustness.rs, departed_client_is_noticed_within_a_second)
#   burst_of_100_after_load_slowest   100 GET /sse at once after a load run: the slowest
#                                     endpoint event, worst of 3 bursts (robustness.rs)
#   burst_of_100_beside_busy_slowest  the same beside 50 streams kept busy (robustness.rs)
#   sigterm_exit_grace_2s             SIGTERM with live sessions and a 60 s call in flight,
#                                     --grace 2s: until the proxy exited 0 (resilience.rs)
#
# Builds both binaries in release (the tests' own helpers stay debug), then runs those three
# tests of both binaries one at a time, BENCH_ROUNDS times (default 5), and reports median,
# min and max per binary and figure. Prints the report, keeps it in target/bench/timing.txt
# and puts it between `<!-- timing:begin -->` and `<!-- timing:end -->` of
# tests/BENCHMARKS.md. Environment: BENCH_ROUNDS (5), BENCH_PROFILE (release; `debug`: the
# binaries the suites run), BENCH_NO_BUILD=1 (use the binaries already built), BENCH_DOC
# (the page to write, default tests/BENCHMARKS.md; empty: none).
# Every test bounds its own waits; nothing is left running.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

rounds="${BENCH_ROUNDS:-5}"
profile="${BENCH_PROFILE:-release}"
doc="${BENCH_DOC-tests/BENCHMARKS.md}"
target_dir="${CARGO_TARGET_DIR:-$root/target}"

tool=bench_timing
# shellcheck source=tests/servers.sh
source "$root/tests/servers.sh"

if [[ "${BENCH_NO_BUILD:-0}" != 1 ]]; then
    echo "bench_timing: building ($profile binaries, debug test helpers)"
    if [[ "$profile" == release ]]; then
        cargo build --release -p switchboard -p switchboard-blocking
    fi
    cargo build -p switchboard -p switchboard-blocking -p switchboard-tests --bins --tests
fi
export SWITCHBOARD_BIN="$target_dir/$profile/switchboard"
export SWITCHBOARD_BLOCKING_BIN="$target_dir/$profile/switchboard-blocking"
export CI=true  # a missing binary fails instead of skipping
ulimit -Sn "$(ulimit -Hn)" 2>/dev/null || true

load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
figures="$work/figures.txt"
for round in $(seq "$rounds"); do
    echo "bench_timing: round $round of $rounds"
    out="$work/round-$round.txt"
    cargo test -q -p switchboard-tests --test robustness --test resilience -- \
        --nocapture --test-threads=1 \
        departed_client_is_noticed burst_of_streams_after_load sigterm_with_live_sessions \
        >"$out" 2>&1 || { cat "$out" >&2; echo "bench_timing: a test failed" >&2; exit 1; }
    # libtest may print a test's name on the same line before its output.
    grep -o 'FIGURE [^ ]* [^ ]* [0-9.]* ms' "$out" >>"$figures" || true
done
load_end="$(cut -d' ' -f1-3 /proc/loadavg)"

report="$work/report.md"
{
    echo "Both binaries built $profile, ${rounds} rounds, each test alone (\`--test-threads=1\`); milliseconds."
    echo
    echo "| binary | figure | runs | median | min | max |"
    echo "|---|---|---|---|---|---|"
    # FIGURE <binary> <name> <ms> ms
    awk '{print $2, $3, $4}' "$figures" | sort -k1,1 -k2,2 -k3,3g | awk '
        function flush() {
            if (n == 0) return
            med = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
            printf "| %s | %s | %d | %.1f | %.1f | %.1f |\n", b, f, n, med, v[1], v[n]
        }
        { if ($1 != b || $2 != f) { flush(); b = $1; f = $2; n = 0 } v[++n] = $3 }
        END { flush() }'
} >"$report"

mkdir -p "$target_dir/bench"
cp "$report" "$target_dir/bench/timing.txt"
cat "$report"
if [[ -n "$doc" ]]; then
    write_doc timing "$doc" "$report"
fi
