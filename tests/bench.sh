#!/usr/bin/env bash
# Switchboard's benchmark, one command from a fresh clone:
#
#   tests/bench.sh
#
# Builds everything in release, then measures calls/s and latency (loadgen) for
#   direct                the echo backend driven over its pipes (what the backend can do)
#   floor                 the same HTTP surface answered in process (what HTTP costs)
#   switchboard           the tokio binary in front of the echo backend
#   switchboard-blocking  the blocking binary in front of the echo backend
# each HTTP target over both transports: legacy HTTP+SSE (/sse, answers on the session's
# stream) and Streamable HTTP (/mcp, each call a POST answered with a JSON body; loadgen
# --transport mcp), back to back (the order alternates every round), so that /mcp÷/sse is
# a ratio measured side by side; the proxies also over /mcp as MCP 2026-07-28 clients
# (loadgen --transport modern: no session, the revision's headers and _meta), in the same
# rounds, so that 2026÷2025 (modern /mcp calls/s ÷ 2025 /mcp calls/s) is measured alike (not
# the floor nor a BENCH_BEFORE build: they speak no 2026-07-28);
# at S,C,K (sessions, calls per session, in flight per session) = 1,2000,1  10,500,4
# 50,100,4 with the fast echo backend, and 10,100,8 with a backend that answers after a
# random 0-5 ms (out of order); in BENCH_ROUNDS interleaved rounds (default 9; the target
# order rotates every round) so that machine noise hits every target alike. Then checks
# that the load generator is not the bottleneck (the floor's load from one process vs the
# same load from two processes at once), and memory: each binary's idle RSS, RSS after
# the matrix, and VmRSS/VmHWM of a fresh `switchboard` (and of the floor, for reference)
# holding BENCH_IDLE (10,000) idle sessions.
#
# Prints a table (medians; ratios against the floor, and against direct for the delayed
# backend) and which targets switchboard meets. Raw results: target/bench/last.jsonl,
# the printed report: target/bench/last.txt. Unless an isolation violation was reported,
# the report also replaces what lies between the lines `<!-- bench:begin -->` and
# `<!-- bench:end -->` of tests/BENCHMARKS.md (nothing else there is touched).
#
# Against an older build, in the same interleaved rounds: BENCH_BEFORE=DIR, where DIR holds
# that build's release `switchboard` and `switchboard-blocking` (e.g. a worktree at an old
# commit built with its own CARGO_TARGET_DIR); they run as the targets `switchboard@before`
# and `switchboard-blocking@before` in front of this tree's echo backend, and the report
# shows their ×floor beside today's.
#
# Environment: BENCH_ROUNDS (9), BENCH_IDLE (10000), BENCH_BUDGET (seconds after the
# build, default 540: runs that would start later are skipped and reported missing),
# BENCH_TRANSPORTS ("sse mcp modern": which paths the HTTP targets are driven over),
# BENCH_IDLE_BLOCKING=1 to also hold the idle sessions against switchboard-blocking,
# BENCH_DOC (the page the report goes into, default tests/BENCHMARKS.md; empty: none).
# Every process started here is stopped on exit (trap EXIT).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

rounds="${BENCH_ROUNDS:-9}"
doc="${BENCH_DOC-tests/BENCHMARKS.md}"
idle_sessions="${BENCH_IDLE:-10000}"
budget="${BENCH_BUDGET:-540}"
before="${BENCH_BEFORE:-}"
run_timeout=60 # seconds, per loadgen run (its own --timeout; `timeout` backs it up)

target_dir="${CARGO_TARGET_DIR:-$root/target}"
[[ "$target_dir" = /* ]] || target_dir="$root/$target_dir"
bin="$target_dir/release"
if [[ -n "$before" ]]; then
    for b in switchboard switchboard-blocking; do
        [[ -x "$before/$b" ]] || { echo "bench: BENCH_BEFORE: no $before/$b" >&2; exit 1; }
    done
fi

echo "bench: building (release)"
cargo build --release -p switchboard -p switchboard-blocking -p switchboard-tests --bins

# Each side of 10,000 idle sessions holds one socket per session.
hard="$(ulimit -Hn)"
if [[ "$hard" == unlimited ]] || ((hard > 65536)); then hard=65536; fi
ulimit -n "$hard"
if ((hard < idle_sessions + 1000)); then
    echo "bench: ulimit -n is at most $hard; holding $((hard - 1000)) idle sessions instead of $idle_sessions" >&2
    idle_sessions=$((hard - 1000))
fi

tool=bench
# shellcheck source=tests/servers.sh
source "$root/tests/servers.sh"

bench_start=$SECONDS
in_budget() { ((SECONDS - bench_start < budget)); }

rss_kb() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status" 2>/dev/null || true; }

record_rss() { # target when kb
    [[ -n "$3" ]] && printf '{"kind":"rss","target":"%s","when":"%s","kb":%s}\n' "$1" "$2" "$3" >>"$results"
    return 0
}

load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
echo "bench: $(nproc) CPUs, load average $load_start at the start"

declare -A url pid url5 pid5
echo_backend="$bin/echo-backend"
slow_backend=("$bin/echo-backend" --delay-ms 5 --reorder)

start floor "$bin/floor"
url[floor]=$SERVER_URL pid[floor]=$SERVER_PID
start floor-5ms "$bin/floor" --delay-ms 5 --reorder
url5[floor]=$SERVER_URL pid5[floor]=$SERVER_PID
# What each proxy target runs: this tree's binaries, and with BENCH_BEFORE the older ones.
declare -A binary=([switchboard]="$bin/switchboard" [switchboard-blocking]="$bin/switchboard-blocking")
proxies=(switchboard switchboard-blocking)
if [[ -n "$before" ]]; then
    binary[switchboard@before]="$before/switchboard"
    binary[switchboard-blocking@before]="$before/switchboard-blocking"
    proxies+=(switchboard@before switchboard-blocking@before)
fi
for t in "${proxies[@]}"; do
    start "$t" "${binary[$t]}" --listen 127.0.0.1:0 --grace 1s -- "$echo_backend"
    url[$t]=$SERVER_URL pid[$t]=$SERVER_PID
    start "$t-5ms" "${binary[$t]}" --listen 127.0.0.1:0 --grace 1s -- "${slow_backend[@]}"
    url5[$t]=$SERVER_URL pid5[$t]=$SERVER_PID
done
sleep 0.5
for t in floor "${proxies[@]}"; do
    record_rss "$t" idle "$(rss_kb "${pid[$t]}" VmRSS)"
done

rows=("1 2000 1" "10 500 4" "50 100 4" "10 100 8 5ms")
targets=(direct floor "${proxies[@]}")
read -r -a transports <<<"${BENCH_TRANSPORTS:-sse mcp modern}"
skipped=0
for round in $(seq "$rounds"); do
    # Rotate the order every round: no target always runs right after the same one.
    order=()
    for i in "${!targets[@]}"; do
        order+=("${targets[$(((i + round - 1) % ${#targets[@]}))]}")
    done
    # ... and the transports' order too, so that neither always runs first.
    paths=()
    for i in "${!transports[@]}"; do
        paths+=("${transports[$(((i + round - 1) % ${#transports[@]}))]}")
    done
    echo "bench: round $round/$rounds (${order[*]}; ${paths[*]}), $((SECONDS - bench_start)) s in"
    for row in "${rows[@]}"; do
        read -r s c k delay <<<"$row"
        for t in "${order[@]}"; do
            if [[ "$t" == direct ]]; then
                run_paths=(pipes)
            elif [[ "$t" == floor || "$t" == *@before ]]; then
                # Neither need speak 2026-07-28 (an older build predates it).
                run_paths=()
                for p in "${paths[@]}"; do
                    [[ "$p" == modern ]] || run_paths+=("$p")
                done
            else
                run_paths=("${paths[@]}")
            fi
            for path in "${run_paths[@]}"; do
                if ! in_budget; then
                    skipped=$((skipped + 1))
                    continue
                fi
                args=()
                if [[ "$t" == direct ]]; then
                    if [[ -n "$delay" ]]; then
                        args=(--direct "${slow_backend[*]}")
                    else
                        args=(--direct "$echo_backend")
                    fi
                elif [[ -n "$delay" ]]; then
                    args=(--url "${url5[$t]}" --pid "${pid5[$t]}" --transport "$path")
                else
                    args=(--url "${url[$t]}" --pid "${pid[$t]}" --transport "$path")
                fi
                tags=(--tag "round=$round" --tag "row=$s,$c,$k" --tag "target=$t")
                [[ "$t" == direct ]] || tags+=(--tag "transport=$path")
                [[ -n "$delay" ]] && tags+=(--tag "delay=$delay")
                if ! timeout -k 5 $((run_timeout + 15)) "$bin/loadgen" "${args[@]}" \
                    -s "$s" -c "$c" -k "$k" --timeout "$run_timeout" --json "${tags[@]}" \
                    >>"$results"; then
                    echo "bench: $t${path:+ /$path} at $s,$c,$k${delay:+ ($delay)} failed: $(tail -n1 "$results" | cut -c1-400)" >&2
                fi
            done
        done
    done
done
((skipped == 0)) || echo "bench: time budget of $budget s reached: $skipped runs skipped" >&2

for t in floor "${proxies[@]}"; do
    record_rss "$t" after "$(rss_kb "${pid[$t]}" VmRSS)"
done

# Is the load generator the bottleneck? Drive the floor at 10,500,4 from one process, then
# the same load split over two processes at once: if one process were the limit, two
# would go faster.
for pair in 1 2 3; do
    in_budget || break
    lg=("$bin/loadgen" --url "${url[floor]}" -c 500 -k 4 --timeout "$run_timeout" --json
        --tag kind=lgcheck --tag "pair=$pair")
    timeout -k 5 $((run_timeout + 15)) "${lg[@]}" -s 10 --tag procs=1 >>"$results" || true
    timeout -k 5 $((run_timeout + 15)) "${lg[@]}" -s 5 --tag procs=2 >>"$results" &
    second=$!
    started_pids+=("$second")
    timeout -k 5 $((run_timeout + 15)) "${lg[@]}" -s 5 --tag procs=2 >>"$results" || true
    wait "$second" || true # only that one: the servers are children too
    forget "$second"
done
# The matrix servers are done: stop them so the idle-session runs have the machine.
for t in floor "${proxies[@]}"; do
    stop "${pid[$t]}"
    stop "${pid5[$t]}"
done

idle_run() { # target CMD...
    local t="$1"
    shift
    if ! in_budget; then
        echo "bench: time budget reached: no idle-session run for $t" >&2
        return 0
    fi
    echo "bench: $idle_sessions idle sessions against $t, $((SECONDS - bench_start)) s in"
    start "$t-idle" "$@"
    local p=$SERVER_PID out
    out="$(timeout -k 5 $((run_timeout + 15)) "$bin/loadgen" --url "$SERVER_URL" --pid "$p" \
        --idle "$idle_sessions" -s 10 -c 100 -k 4 --timeout "$run_timeout" --json \
        --tag kind=idle --tag "target=$t" --tag row=10,100,4 || true)"
    if [[ -n "$out" ]]; then
        echo "$out" >>"$results"
        record_rss "$t" 10k-rss "$(grep -o '"idle_rss_kb":[0-9]*' <<<"$out" | cut -d: -f2)"
    fi
    record_rss "$t" 10k-hwm "$(rss_kb "$p" VmHWM)"
    stop "$p"
}
idle_run switchboard "$bin/switchboard" --listen 127.0.0.1:0 --grace 1s \
    --max-sessions 20000 -- "$echo_backend"
idle_run floor "$bin/floor"
if [[ "${BENCH_IDLE_BLOCKING:-0}" == 1 ]]; then
    idle_run switchboard-blocking "$bin/switchboard-blocking" --listen 127.0.0.1:0 \
        --grace 1s --max-sessions 20000 -- "$echo_backend"
fi

load_end="$(cut -d' ' -f1-3 /proc/loadavg)"
echo "bench: done in $((SECONDS - bench_start)) s; load average $load_end at the end"
echo
mkdir -p "$target_dir/bench"
cp "$results" "$target_dir/bench/last.jsonl"
"$bin/loadgen" --report "$results" | tee "$target_dir/bench/last.txt"
if grep -q '"violations":[1-9]' "$results"; then
    echo "bench: ISOLATION VIOLATIONS were reported (see target/bench/last.jsonl)" >&2
    exit 1
fi

if [[ -n "$doc" ]]; then
    write_doc bench "$doc" "$target_dir/bench/last.txt"
fi
