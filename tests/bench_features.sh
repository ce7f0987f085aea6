#!/usr/bin/env bash
# What the authorization policy, the audit log and traces cost, side by side in one run:
#
#   tests/bench_features.sh
#
# Builds everything in release, then starts, on loopback and each in front of its own fast
# echo backend, both binaries (`switchboard`, `switchboard-blocking`) in six
# configurations:
#   plain   no policy, no audit log, no traces
#   policy  --authz-config: a ToolHive Cedar file permitting `tools/call` of `echo` (the
#           only tool loadgen calls; initialize, notifications and lists are never asked)
#   audit   --audit-log FILE
#   both    --authz-config and --audit-log
#   traced  --otlp-endpoint: every request sampled (loadgen sends no trace context), spans
#           exported over OTLP/HTTP to tests/python/otlp_receiver.py (counting only)
#   unsampled  --otlp-endpoint with OTEL_TRACES_SAMPLER=parentbased_traceidratio at 0
# and drives each with loadgen: 10 sessions x 1,000 calls, 4 in flight per session
# (10,000 calls a run), over legacy HTTP+SSE (/sse) and Streamable HTTP (/mcp), in
# BENCH_ROUNDS interleaved rounds (default 5): the configuration order rotates every
# round, the binaries' and the transports' orders alternate, so machine noise hits every
# configuration alike and the ratios policy/plain, audit/plain, both/plain (and
# both/policy: auditing on against off under the policy) come from the medians of one run.
#
# After every run against an audit configuration the new lines of its audit file are
# parsed (python3): each must be a JSON event, and they must be exactly one
# `mcp_tool_call` (outcome success) per call made, with 10,000 distinct (session,
# request id) pairs, plus one `session_open`, one `mcp_initialize` and one
# `session_close` per session, and nothing else. After every run the proxy's /metrics
# must show `switchboard_policy_denied_total` and `switchboard_audit_dropped_total` at 0.
# After every `traced` run the receiver must have counted one SERVER span `tools/call
# echo` per call made, less the spans the proxy counted lost
# (`switchboard_otel_dropped_total`, reported); after an `unsampled` run, none.
# Any failed call, missing or extra event or span, denial or dropped event fails the
# script (exit 1); the ratios are reported (the issues' targets: audit on >= 0.9x audit
# off, traced >= 0.85x and unsampled >= 0.97x plain) but fail it only with BENCH_STRICT=1.
#
# Prints a table (medians per binary x transport x configuration, the ratios, the event
# counts). Raw lines: target/bench/features.jsonl, the report: target/bench/features.txt;
# when every check passed the report also replaces what lies between the lines
# `<!-- features:begin -->` and `<!-- features:end -->` of tests/BENCHMARKS.md (nothing
# else there is touched).
#
# Environment: BENCH_ROUNDS (5), BENCH_BUDGET (seconds after the build, default 300: runs
# that would start later are skipped and reported), BENCH_TRANSPORTS ("sse mcp"),
# BENCH_STRICT (0), BENCH_NO_BUILD=1 (use the binaries already built), BENCH_DOC (the page
# the report goes into, default tests/BENCHMARKS.md; empty: none), BENCH_CONFIGS (the
# configurations, default all six). Needs python3, and for the receiver a Python with
# `opentelemetry-proto` (SWITCHBOARD_PYTHON, else the venv tests/run.sh makes). Every
# process started here is stopped on exit (trap EXIT); every wait is bounded.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

rounds="${BENCH_ROUNDS:-5}"
budget="${BENCH_BUDGET:-300}"
strict="${BENCH_STRICT:-0}"
doc="${BENCH_DOC-tests/BENCHMARKS.md}"
read -r -a transports <<<"${BENCH_TRANSPORTS:-sse mcp}"
sessions=10
calls=1000
inflight=4
run_timeout=60  # seconds, per loadgen run (its own --timeout; `timeout` backs it up)
audit_wait=15   # seconds an audit file may take to hold a run's events

command -v python3 >/dev/null || { echo "bench_features: needs python3" >&2; exit 1; }
otel_python="${SWITCHBOARD_PYTHON:-$root/.venv/bin/python}"
span_wait=30    # seconds a traced run's spans may take to reach the receiver

target_dir="${CARGO_TARGET_DIR:-$root/target}"
[[ "$target_dir" = /* ]] || target_dir="$root/$target_dir"
bin="$target_dir/release"

if [[ "${BENCH_NO_BUILD:-0}" != 1 ]]; then
    echo "bench_features: building (release)"
    cargo build --release --workspace --bins
fi

tool=bench_features
# shellcheck source=tests/servers.sh
source "$root/tests/servers.sh"

bench_start=$SECONDS
in_budget() { ((SECONDS - bench_start < budget)); }

load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
echo "bench_features: $(nproc) CPUs, load average $load_start at the start"

# The policy: every call loadgen makes is `tools/call` of `echo` (tests/src/bin/loadgen.rs,
# call_body), which the echo backend answers; nothing else it sends is asked of a policy.
policy="$work/policy.json"
cat >"$policy" <<'EOF'
{"version":"1.0","type":"cedarv1","cedar":{"policies":["permit(principal, action == Action::\"call_tool\", resource == Tool::\"echo\");"],"entities_json":"[]"}}
EOF

# metrics URL: prints "<policy denied> <audit dropped> <spans lost>" from the proxy's
# /metrics.
metrics() {
    python3 - "$1/metrics" <<'EOF'
import sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
values = {}
for line in text.splitlines():
    parts = line.split()
    if len(parts) == 2 and not line.startswith("#"):
        values[parts[0]] = parts[1]
print(values.get("switchboard_policy_denied_total", "missing"),
      values.get("switchboard_audit_dropped_total", "missing"),
      values.get("switchboard_otel_dropped_total", "0"))
EOF
}

# audit_lines FILE OFFSET: how many complete lines FILE holds after byte OFFSET.
audit_lines() {
    tail -c "+$(($2 + 1))" "$1" 2>/dev/null | wc -l
}

# audit_check FILE OFFSET SESSIONS CALLS TAGS_JSON: one JSON line (kind audit) describing
# the events written after byte OFFSET, and whether they are exactly those of the run.
audit_check() {
    python3 - "$@" <<'EOF'
import collections, json, sys
path, offset, sessions, calls, tags = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5])
with open(path, "rb") as f:
    f.seek(offset)
    data = f.read()
lines = data.split(b"\n")
partial = lines.pop() != b""  # the text after the last newline: an event still being written
by_type, outcomes, calls_seen, bad = collections.Counter(), collections.Counter(), set(), 0
for line in lines:
    try:
        e = json.loads(line)
    except ValueError:
        bad += 1
        continue
    kind = e.get("type")
    by_type[kind] += 1
    outcomes[(kind, e.get("outcome"))] += 1
    if kind == "mcp_tool_call":
        extra = (e.get("source") or {}).get("extra") or {}
        calls_seen.add((extra.get("session_id"), json.dumps(extra.get("request_id"))))
want = {"mcp_tool_call": calls, "session_open": sessions, "mcp_initialize": sessions,
        "session_close": sessions}
problems = []
if bad:
    problems.append(f"{bad} lines that are not JSON")
if partial:
    problems.append("a line without its newline")
for kind, n in want.items():
    if by_type[kind] != n:
        problems.append(f"{by_type[kind]} {kind} events, expected {n}")
    if outcomes[(kind, "success")] != by_type[kind]:
        problems.append(f"{by_type[kind] - outcomes[(kind, 'success')]} {kind} events not a success")
others = {k: n for k, n in by_type.items() if k not in want}
if others:
    problems.append(f"unexpected events {others}")
if len(calls_seen) != calls:
    problems.append(f"{len(calls_seen)} distinct (session, request id) tool calls, expected {calls}")
out = {"kind": "audit", "lines": len(lines), "types": dict(by_type),
       "distinct_calls": len(calls_seen), "ok": not problems, "problems": problems}
out.update(tags)
print(json.dumps(out))
EOF
}

# spans_served: how many SERVER spans `tools/call echo` the receiver counted so far.
spans_served() {
    python3 - "$receiver_url/count" <<'EOF'
import json, sys, urllib.request
counts = json.load(urllib.request.urlopen(sys.argv[1], timeout=5))
print(counts["by"].get("SPAN_KIND_SERVER tools/call echo", 0))
EOF
}

binaries=(switchboard switchboard-blocking)
read -r -a configs <<<"${BENCH_CONFIGS:-plain policy audit both traced unsampled}"
declare -A url pid audit_file
echo_backend="$bin/echo-backend"
receiver_url=""
if [[ " ${configs[*]} " == *" traced "* || " ${configs[*]} " == *" unsampled "* ]]; then
    "$otel_python" -c 'import opentelemetry.proto' 2>/dev/null ||
        { echo "bench_features: $otel_python lacks opentelemetry-proto (run tests/run.sh)" >&2; exit 1; }
    "$otel_python" "$root/tests/python/otlp_receiver.py" - >"$work/receiver.port" 2>"$work/receiver.log" &
    started_pids+=("$!")
    for _ in $(seq 200); do
        [[ -s "$work/receiver.port" ]] && break
        sleep 0.05
    done
    receiver_url="http://127.0.0.1:$(head -n1 "$work/receiver.port")"
fi
for b in "${binaries[@]}"; do
    for c in "${configs[@]}"; do
        flags=() env=()
        case "$c" in
        policy | both) flags+=(--authz-config "$policy") ;;
        traced) flags+=(--otlp-endpoint "$receiver_url") env+=(OTEL_BSP_SCHEDULE_DELAY=200) ;;
        unsampled)
            flags+=(--otlp-endpoint "$receiver_url")
            env+=(OTEL_TRACES_SAMPLER=parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG=0)
            ;;
        esac
        case "$c" in
        audit | both)
            audit_file[$b/$c]="$work/$b-$c.audit.jsonl"
            flags+=(--audit-log "${audit_file[$b/$c]}")
            ;;
        esac
        start "$b-$c" env "${env[@]}" "$bin/$b" --listen 127.0.0.1:0 --grace 1s "${flags[@]}" -- "$echo_backend"
        url[$b/$c]=$SERVER_URL pid[$b/$c]=$SERVER_PID
    done
done

# A short warm-up of each server on each transport (not recorded).
for b in "${binaries[@]}"; do
    for c in "${configs[@]}"; do
        for path in "${transports[@]}"; do
            timeout -k 5 $((run_timeout + 15)) "$bin/loadgen" --url "${url[$b/$c]}" \
                --transport "$path" -s 2 -c 500 -k "$inflight" --timeout "$run_timeout" \
                >/dev/null || echo "bench_features: warm-up of $b $c /$path failed" >&2
        done
    done
done

failures=0
skipped=0
fail() {
    echo "bench_features: $*" >&2
    failures=$((failures + 1))
}

# run ROUND BINARY CONFIG TRANSPORT: one loadgen run, its audit events, its metrics.
run() {
    local round="$1" b="$2" c="$3" path="$4" key="$2/$3"
    local tags offset=0 file="${audit_file[$key]:-}" line spans_before=0 lost_before=0
    tags=(--tag "round=$round" --tag "binary=$b" --tag "config=$c" --tag "transport=$path")
    [[ -n "$file" ]] && offset="$(stat -c %s "$file" 2>/dev/null || echo 0)"
    if [[ "$c" == traced || "$c" == unsampled ]]; then
        spans_before="$(spans_served)"
        read -r _ _ lost_before <<<"$(metrics "${url[$key]}")"
    fi
    line="$(timeout -k 5 $((run_timeout + 15)) "$bin/loadgen" --url "${url[$key]}" \
        --pid "${pid[$key]}" --transport "$path" -s "$sessions" -c "$calls" -k "$inflight" \
        --timeout "$run_timeout" --json "${tags[@]}" || true)"
    if [[ -z "$line" ]]; then
        fail "$b $c /$path round $round: loadgen gave no result"
        return 0
    fi
    echo "$line" >>"$results"
    if ! grep -q '"ok":true' <<<"$line" || ! grep -q "\"completed\":$((sessions * calls))[,}]" <<<"$line"; then
        fail "$b $c /$path round $round failed: $(cut -c1-400 <<<"$line")"
    fi
    if [[ -n "$file" ]]; then
        # The events are written by the proxy's audit thread: wait (bounded) for all of
        # them, session closes included, then a moment more for any extra one.
        local want=$((sessions * calls + 3 * sessions)) waited=0
        while (($(audit_lines "$file" "$offset") < want)) && ((waited < audit_wait * 20)); do
            sleep 0.05
            waited=$((waited + 1))
        done
        sleep 0.2
        local tag_json
        tag_json="$(printf '{"round":"%s","binary":"%s","config":"%s","transport":"%s"}' \
            "$round" "$b" "$c" "$path")"
        line="$(audit_check "$file" "$offset" "$sessions" "$((sessions * calls))" "$tag_json")"
        echo "$line" >>"$results"
        grep -q '"ok": true' <<<"$line" || fail "$b $c /$path round $round: audit events: $line"
    fi
    if [[ "$c" == traced || "$c" == unsampled ]]; then
        # Every sampled call's SERVER span reaches the receiver or is counted lost.
        local want=0 got lost waited=0
        [[ "$c" == traced ]] && want=$((sessions * calls))
        while :; do
            got=$(($(spans_served) - spans_before))
            read -r _ _ lost <<<"$(metrics "${url[$key]}")"
            lost=$((lost - lost_before))
            ((got + lost >= want && waited >= 4)) && break
            ((waited >= span_wait * 4)) && break
            sleep 0.25
            waited=$((waited + 1))
        done
        printf '{"kind":"spans","round":"%s","binary":"%s","config":"%s","transport":"%s","calls":%d,"server_spans":%d,"lost":%d}\n' \
            "$round" "$b" "$c" "$path" "$want" "$got" "$lost" >>"$results"
        ((got + lost == want)) ||
            fail "$b $c /$path round $round: $got SERVER spans received and $lost lost for $want sampled calls"
    fi
    local denied dropped
    read -r denied dropped _ <<<"$(metrics "${url[$key]}" || echo "unreadable unreadable")"
    printf '{"kind":"metrics","round":"%s","binary":"%s","config":"%s","transport":"%s","policy_denied":"%s","audit_dropped":"%s"}\n' \
        "$round" "$b" "$c" "$path" "$denied" "$dropped" >>"$results"
    [[ "$denied" == 0 ]] || fail "$b $c /$path round $round: switchboard_policy_denied_total $denied"
    [[ "$dropped" == 0 ]] || fail "$b $c /$path round $round: switchboard_audit_dropped_total $dropped"
}

for round in $(seq "$rounds"); do
    order=()
    for i in "${!configs[@]}"; do
        order+=("${configs[$(((i + round - 1) % ${#configs[@]}))]}")
    done
    bins=()
    for i in "${!binaries[@]}"; do
        bins+=("${binaries[$(((i + round - 1) % ${#binaries[@]}))]}")
    done
    paths=()
    for i in "${!transports[@]}"; do
        paths+=("${transports[$(((i + round - 1) % ${#transports[@]}))]}")
    done
    echo "bench_features: round $round/$rounds (${order[*]}; ${bins[*]}; ${paths[*]}), $((SECONDS - bench_start)) s in"
    for path in "${paths[@]}"; do
        for b in "${bins[@]}"; do
            for c in "${order[@]}"; do
                if ! in_budget; then
                    skipped=$((skipped + 1))
                    continue
                fi
                run "$round" "$b" "$c" "$path"
            done
        done
    done
done
((skipped == 0)) || echo "bench_features: time budget of $budget s reached: $skipped runs skipped" >&2

for key in "${!pid[@]}"; do
    stop "${pid[$key]}"
done
load_end="$(cut -d' ' -f1-3 /proc/loadavg)"
echo "bench_features: done in $((SECONDS - bench_start)) s; load average $load_end at the end"
echo

mkdir -p "$target_dir/bench"
cp "$results" "$target_dir/bench/features.jsonl"
report="$target_dir/bench/features.txt"
python3 - "$results" "$sessions" "$calls" "$inflight" "$rounds" "$strict" "${transports[*]}" "${configs[*]}" >"$report" <<'EOF' || failures=$((failures + 1))
import collections, json, statistics, sys
path, sessions, calls, inflight, rounds, strict = sys.argv[1], *map(int, sys.argv[2:7])
transports = sys.argv[7].split()
binaries = ["switchboard", "switchboard-blocking"]
configs = sys.argv[8].split()
runs = collections.defaultdict(list)
spans = collections.defaultdict(list)
audits = collections.defaultdict(list)
metrics = collections.defaultdict(list)
for line in open(path):
    v = json.loads(line)
    key = (v.get("binary"), v.get("transport"), v.get("config"))
    kind = v.get("kind")
    if kind == "audit":
        audits[key].append(v)
    elif kind == "spans":
        spans[key].append(v)
    elif kind == "metrics":
        metrics[key].append(v)
    else:
        runs[key].append(v)

def med(key, field):
    xs = [r[field] for r in runs[key] if r.get("ok") and r.get(field) is not None]
    return statistics.median(xs) if xs else None

def fmt(x, digits=0):
    return "-" if x is None else f"{x:,.{digits}f}"

total = sessions * calls
print(f"{sessions} sessions x {calls:,} calls, {inflight} in flight per session "
      f"({total:,} calls a run), fast echo backend; {rounds} interleaved rounds; medians.")
print()
print("| binary | transport | config | runs ok | calls/s | min-max | p50 µs | p99 µs | proxy CPU µs/call | x plain |")
print("|---|---|---|---|---|---|---|---|---|---|")
ratios = {}
for b in binaries:
    for t in transports:
        base = med((b, t, "plain"), "calls_per_s")
        for c in configs:
            key = (b, t, c)
            rs = runs[key]
            ok = [r for r in rs if r.get("ok")]
            cps = med(key, "calls_per_s")
            ratio = cps / base if cps and base else None
            ratios[key] = ratio
            lo = min((r["calls_per_s"] for r in ok), default=None)
            hi = max((r["calls_per_s"] for r in ok), default=None)
            print(f"| {b} | /{t} | {c} | {len(ok)}/{len(rs)} | {fmt(cps)} | {fmt(lo)}-{fmt(hi)} "
                  f"| {fmt(med(key, 'p50_us'))} | {fmt(med(key, 'p99_us'))} "
                  f"| {fmt(med(key, 'target_cpu_us_per_call'), 1)} | {fmt(ratio, 3)} |")
print()
print("Ratios of the medians above (calls/s; same run, same load):")
print()
pairs = [(on, off, target) for on, off, target in (
    ("policy", "plain", None), ("audit", "plain", 0.9), ("both", "plain", None),
    ("both", "policy", 0.9), ("traced", "plain", 0.85), ("unsampled", "plain", 0.97))
    if on in configs and off in configs]
print("| binary | transport | " + " | ".join(f"{on}/{off}" for on, off, _ in pairs) + " |")
print("|---|---|" + "---|" * len(pairs))
checks = []
for b in binaries:
    for t in transports:
        m = {c: med((b, t, c), "calls_per_s") for c in configs}
        r = lambda x, y: m[x] / m[y] if m[x] and m[y] else None
        print(f"| {b} | /{t} | " + " | ".join(fmt(r(on, off), 3) for on, off, _ in pairs) + " |")
        for on, off, target in pairs:
            if target is not None:
                x = r(on, off)
                checks.append((f"{b} /{t}: {on}/{off} = {fmt(x, 3)} >= {target}", x is not None and x >= target))
print()
print("Audit events, summed over the runs of each audit configuration (each run checked on "
      f"its own: exactly {total:,} mcp_tool_call, {sessions} session_open, {sessions} "
      f"mcp_initialize and {sessions} session_close, nothing else):")
print()
print("| binary | transport | config | runs checked ok | calls made | mcp_tool_call | distinct calls | session_open | mcp_initialize | session_close | other | lines |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
failed = False
for b in binaries:
    for t in transports:
        for c in [c for c in ("audit", "both") if c in configs]:
            a = audits[(b, t, c)]
            made = sum(r.get("completed", 0) for r in runs[(b, t, c)])
            types = collections.Counter()
            for v in a:
                types.update(v["types"])
            known = ("mcp_tool_call", "session_open", "mcp_initialize", "session_close")
            other = sum(n for k, n in types.items() if k not in known)
            okc = sum(1 for v in a if v["ok"])
            failed |= okc != len(a) or not a or types["mcp_tool_call"] != made
            print(f"| {b} | /{t} | {c} | {okc}/{len(a)} | {made:,} | {types['mcp_tool_call']:,} "
                  f"| {sum(v['distinct_calls'] for v in a):,} | {types['session_open']} "
                  f"| {types['mcp_initialize']} | {types['session_close']} | {other} "
                  f"| {sum(v['lines'] for v in a):,} |")
if any(c in configs for c in ("traced", "unsampled")):
    print()
    print("Spans, summed over the runs (each run checked on its own: the receiver's SERVER spans "
          "`tools/call echo` plus those the proxy counted lost equal the sampled calls):")
    print()
    print("| binary | transport | config | runs checked | calls sampled | SERVER spans received | lost |")
    print("|---|---|---|---|---|---|---|")
    for b in binaries:
        for t in transports:
            for c in [c for c in ("traced", "unsampled") if c in configs]:
                s = spans[(b, t, c)]
                failed |= not s or any(v["server_spans"] + v["lost"] != v["calls"] for v in s)
                print(f"| {b} | /{t} | {c} | {len(s)} | {sum(v['calls'] for v in s):,} "
                      f"| {sum(v['server_spans'] for v in s):,} | {sum(v['lost'] for v in s):,} |")
denied = sum(1 for vs in metrics.values() for v in vs if v["policy_denied"] != "0")
dropped = sum(1 for vs in metrics.values() for v in vs if v["audit_dropped"] != "0")
reads = sum(len(vs) for vs in metrics.values())
print()
print(f"/metrics after each of the {reads} runs: switchboard_policy_denied_total 0 "
      f"{'everywhere' if not denied else f'NOT 0 after {denied} runs'}, "
      f"switchboard_audit_dropped_total 0 {'everywhere' if not dropped else f'NOT 0 after {dropped} runs'}.")
print()
print("Targets (auditing on >= 0.9x the calls/s of auditing off; traces with every request "
      "sampled >= 0.85x, with the sampler at 0 >= 0.97x plain):")
print()
for what, ok in checks:
    print(f"- {'MET' if ok else 'MISS'} {what}")
failed |= bool(denied or dropped)
missing = [k for k in [(b, t, c) for b in binaries for t in transports for c in configs] if not runs[k]]
if missing:
    print()
    print(f"No run at all for {missing}")
    failed = True
if failed or (strict and not all(ok for _, ok in checks)):
    sys.exit(1)
EOF
cat "$report"

if ((failures)); then
    echo "bench_features: $failures checks FAILED (raw lines: target/bench/features.jsonl); the report is not written into the page" >&2
    exit 1
fi

if [[ -n "$doc" ]]; then
    write_doc features "$doc" "$report"
fi
