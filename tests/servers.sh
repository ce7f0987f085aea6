# Sourced by tests/bench.sh, tests/bench_features.sh and tests/soak.sh (which set `tool` to
# their name first): a scratch folder `$work` with `$results`, servers started on loopback
# and waited for, a cleanup that stops every one of them however the script ends, and
# `write_doc` for the benchmark reports.

work="$(mktemp -d "${TMPDIR:-/tmp}/switchboard-$tool.XXXXXX")"
results="$work/results.jsonl"
: >"$results"
started_pids=()

cleanup() {
    local status=$?
    trap - EXIT INT TERM HUP
    local pid
    for pid in "${started_pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for _ in $(seq 50); do
        local alive=0
        for pid in "${started_pids[@]}"; do
            if kill -0 "$pid" 2>/dev/null; then alive=1; fi
        done
        ((alive)) || break
        sleep 0.1
    done
    for pid in "${started_pids[@]}"; do
        kill -KILL "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# GET /health over bash's /dev/tcp; prints the status code.
health_status() { # port
    local line=""
    if { exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null; then
        printf 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&3
        IFS= read -r -t 5 line <&3 || true
        exec 3<&- 3>&-
    fi
    set -- $line
    echo "${2:-}"
}

# start NAME CMD... : starts a server on 127.0.0.1:0, waits until /health says 200, and
# sets SERVER_PID and SERVER_URL.
start() {
    local name="$1"
    shift
    local log="$work/$name.log"
    NO_COLOR=1 "$@" >"$log" 2>&1 &
    SERVER_PID=$!
    started_pids+=("$SERVER_PID")
    SERVER_URL=""
    for _ in $(seq 200); do
        SERVER_URL="$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$log" | head -n1 || true)"
        [[ -n "$SERVER_URL" ]] && break
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then break; fi
        sleep 0.05
    done
    if [[ -z "$SERVER_URL" ]]; then
        echo "$tool: $name did not start:" >&2
        cat "$log" >&2
        exit 1
    fi
    local port="${SERVER_URL##*:}"
    for _ in $(seq 200); do
        [[ "$(health_status "$port")" == 200 ]] && return 0
        sleep 0.05
    done
    echo "$tool: $name never answered /health with 200:" >&2
    cat "$log" >&2
    exit 1
}

stop() { # pid
    kill -TERM "$1" 2>/dev/null || true
    for _ in $(seq 100); do
        kill -0 "$1" 2>/dev/null || break
        sleep 0.05
    done
    kill -KILL "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
    forget "$1"
}

# A reaped child leaves the list, so that cleanup never signals a recycled pid.
forget() { # pid
    local kept=() p
    for p in "${started_pids[@]}"; do
        [[ "$p" == "$1" ]] || kept+=("$p")
    done
    started_pids=("${kept[@]}")
}

# write_doc NAME DOC REPORT: replaces the lines between `<!-- NAME:begin -->` and
# `<!-- NAME:end -->` of DOC (each alone on its line, once, in that order) with a line saying
# which run this was (the caller's `$rounds`, `$load_start`, `$load_end`) and the REPORT; DOC
# keeps every other line. Without both markers DOC is left alone.
write_doc() {
    local name="$1" doc="$2" report="$3"
    local begin="<!-- $name:begin -->" end="<!-- $name:end -->"
    local b e
    b="$(grep -nxF -- "$begin" "$doc" 2>/dev/null | cut -d: -f1 || true)"
    e="$(grep -nxF -- "$end" "$doc" 2>/dev/null | cut -d: -f1 || true)"
    if [[ ! "$b" =~ ^[0-9]+$ || ! "$e" =~ ^[0-9]+$ ]] || ((b >= e)); then
        echo "$tool: $doc has no single '$begin' line before a single '$end' line: the report is not written there" >&2
        return 0
    fi
    local commit dirty=""
    commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    if ! git diff --quiet HEAD -- . ":(exclude)$doc" 2>/dev/null; then
        dirty=" with local changes"
    fi
    {
        head -n "$b" "$doc"
        echo
        echo "The last run: \`tests/$tool.sh\`, $rounds round$( ((rounds == 1)) || echo s)," \
            "on $(nproc) CPUs, load average" \
            "$load_start at the start and $load_end at the end; $(date -u +%Y-%m-%d)," \
            "commit $commit$dirty."
        echo
        cat "$report"
        echo
        tail -n "+$e" "$doc"
    } >"$doc.new"
    mv "$doc.new" "$doc"
    echo "$tool: the report is in $doc"
}
