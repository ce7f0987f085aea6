#!/usr/bin/env bash
# Switchboard's soak benchmark: does memory stay flat under session churn?
#
#   tests/soak.sh [--binary switchboard|switchboard-blocking|both] [--sessions N]
#                 [--per-round S] [--calls C] [--inflight K] [--budget SECS] [--no-build]
#                 [--no-write]
#
# Builds the release binaries, then for each binary (default both): starts it on loopback
# in front of the echo backend answering calls out of order (a random 0-5 ms), with
# --request-timeout 1s and --session-idle 3s (so that sessions that vanished, and calls
# left to time out, end within the run), and runs `loadgen --soak`: rounds of S sessions
# at once (default 50) until N sessions were served (default 25,000), half legacy (/sse)
# and half Streamable (/mcp), each making C calls (default 100) with K in flight (default
# 4); of every ten of a transport one vanishes mid-calls without closing, one cancels a
# call the backend never answers, one has such a call time out, and the rest close
# properly. After each round it samples the binary's RSS, threads and open descriptors
# (/proc/PID/status, /proc/PID/fd); after the last it waits (at most 30 s) for threads
# and descriptors to come back to their idle level and prints those idle-after figures.
#
# Writes a table per binary and an SVG plot of RSS against sessions served
# (tests/soak.svg) into tests/BENCHMARKS.md between `<!-- soak:begin -->` and
# `<!-- soak:end -->` (created if missing; --no-write only prints). Raw lines:
# target/soak/last.jsonl. Every loop is bounded: rounds by count and by --budget
# seconds per binary (default 1200), each round by loadgen's --timeout (60 s), the whole
# loadgen run by `timeout`. Every process started here is stopped on exit.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

binaries=(switchboard switchboard-blocking)
sessions=25000
per_round=50
calls=100
inflight=4
budget=1200
build=1
write=1
usage() { sed -n '4,6p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 64; }
while (($#)); do
    case "$1" in
    --binary)
        case "${2:-}" in
        both) binaries=(switchboard switchboard-blocking) ;;
        switchboard | switchboard-blocking) binaries=("$2") ;;
        *) usage ;;
        esac
        shift 2
        ;;
    --sessions) sessions="${2:?}"; shift 2 ;;
    --per-round) per_round="${2:?}"; shift 2 ;;
    --calls) calls="${2:?}"; shift 2 ;;
    --inflight) inflight="${2:?}"; shift 2 ;;
    --budget) budget="${2:?}"; shift 2 ;;
    --no-build) build=0; shift ;;
    --no-write) write=0; shift ;;
    *) usage ;;
    esac
done
for n in "$sessions" "$per_round" "$calls" "$inflight" "$budget"; do
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || usage
done
rounds=$(((sessions + per_round - 1) / per_round))

target_dir="${CARGO_TARGET_DIR:-$root/target}"
[[ "$target_dir" = /* ]] || target_dir="$root/$target_dir"
bin="$target_dir/release"

if ((build)); then
    echo "soak: building (release)"
    cargo build --release -p switchboard -p switchboard-blocking
    cargo build --release -p switchboard-tests --bin loadgen --bin echo-backend
fi

tool=soak
# shellcheck source=tests/servers.sh
source "$root/tests/servers.sh"

echo "soak: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg) at the start"
failed=0
timings=()
for t in "${binaries[@]}"; do
    echo "soak: $t: $rounds rounds of $per_round sessions ($calls calls, $inflight in flight)"
    start "$t" "$bin/$t" --listen 127.0.0.1:0 --grace 1s --request-timeout 1s \
        --session-idle 3s -- "$bin/echo-backend" --delay-ms 5 --reorder
    sleep 1 # past start-up: the idle figures are the settled ones
    began=$SECONDS
    if ! timeout -k 5 $((budget + 120)) "$bin/loadgen" --url "$SERVER_URL" --pid "$SERVER_PID" \
        --soak "$rounds" -s "$per_round" -c "$calls" -k "$inflight" --budget "$budget" \
        --timeout 60 --drain-ms 100 --idle-wait 30 --tag "target=$t" >>"$results"; then
        echo "soak: $t: the soak reported failures (see above)" >&2
        failed=1
    fi
    timings+=("$t $((SECONDS - began)) s")
    stop "$SERVER_PID"
done
echo "soak: done (${timings[*]}); load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"

mkdir -p "$target_dir/soak"
cp "$results" "$target_dir/soak/last.jsonl"
section="$work/section.md"
svg="tests/soak.svg"
((write)) || svg="$target_dir/soak/soak.svg"
{
    echo "\`tests/soak.sh --sessions $sessions --per-round $per_round --calls $calls --inflight $inflight\`"
    echo "on $(date -u +%Y-%m-%d), $(nproc) CPUs shared with other work: each binary in front of"
    echo "\`echo-backend --delay-ms 5 --reorder\`, with \`--request-timeout 1s --session-idle 3s\`;"
    echo "figures after each round (RSS: VmRSS; descriptors: /proc/PID/fd). Took ${timings[*]}."
    echo
    echo "![RSS against sessions served](soak.svg)"
    echo
    "$bin/loadgen" --soak-report "$results" --svg "$svg"
} >"$section"
cat "$section"
if ((write)); then
    md="tests/BENCHMARKS.md"
    if [[ ! -f "$md" ]]; then
        printf '## Soak\n\n<!-- soak:begin -->\n<!-- soak:end -->\n' >"$md"
    fi
    if ! grep -q '^<!-- soak:begin -->$' "$md" || ! grep -q '^<!-- soak:end -->$' "$md"; then
        printf '\n## Soak\n\n<!-- soak:begin -->\n<!-- soak:end -->\n' >>"$md"
    fi
    awk -v section="$section" '
        $0 == "<!-- soak:begin -->" { print; while ((getline l < section) > 0) print l; skip = 1; next }
        $0 == "<!-- soak:end -->" { skip = 0 }
        !skip { print }
    ' "$md" >"$work/BENCHMARKS.md"
    cp "$work/BENCHMARKS.md" "$md"
    echo "soak: wrote $md and $svg"
fi
exit "$failed"
