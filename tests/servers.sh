# Sourced by tests/bench.sh and tests/soak.sh (which set `tool` to their name first): a
# scratch folder `$work` with `$results`, servers started on loopback and waited for, and a
# cleanup that stops every one of them however the script ends.

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
