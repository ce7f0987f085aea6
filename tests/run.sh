#!/usr/bin/env bash
# The one test command: sets up the Python SDK venv and the Node tools (tests/node), builds
# every binary the end-to-end suites start, then runs the whole workspace's tests.
#
#   tests/run.sh                 # everything
#   tests/run.sh -p switchboard-tests -- tokio::   # extra arguments go to `cargo test`
#
# The venv lives at <repo>/.venv (git-ignored) and is reused when it already has `mcp` and
# `mcp-server-time` (and OpenTelemetry's SDK, OTLP/HTTP exporter and protobuf definitions).
# Set SWITCHBOARD_PYTHON to use another Python with all of them installed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

if [[ -z "${SWITCHBOARD_PYTHON:-}" ]]; then
    venv="$root/.venv"
    if [[ ! -x "$venv/bin/python" ]]; then
        echo "run.sh: creating $venv"
        python3 -m venv "$venv"
    fi
    # The trace tests' OTLP receiver and instrumented SDK client and backend need the
    # OpenTelemetry SDK, its OTLP/HTTP exporter and the protobuf definitions.
    otel="opentelemetry-sdk==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2 opentelemetry-proto==1.45.2"
    if ! "$venv/bin/python" -c 'import mcp.client.sse, mcp.client.streamable_http, opentelemetry.sdk, opentelemetry.proto, opentelemetry.exporter.otlp.proto.http' 2>/dev/null || [[ ! -x "$venv/bin/mcp-server-time" ]]; then
        echo "run.sh: installing mcp, mcp-server-time and OpenTelemetry into $venv"
        # shellcheck disable=SC2086
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "mcp==2.3.0" "mcp-server-time==2026.10.19" $otel
    fi
    export SWITCHBOARD_PYTHON="$venv/bin/python"
fi

# The Node tools (the MCP conformance suite, the TypeScript SDK), pinned by
# tests/node/package-lock.json. `npm ci` runs when node_modules is missing or was installed
# from another lockfile (a copy of the lockfile is kept as the stamp). Without node and npm
# the Node suites skip loudly (and fail under CI=true). Set SWITCHBOARD_NODE_DIR to use
# another folder with both installed.
if [[ -z "${SWITCHBOARD_NODE_DIR:-}" ]]; then
    node_dir="$root/tests/node"
    stamp="$node_dir/node_modules/.switchboard-lock.json"
    if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
        echo "run.sh: WARNING: node or npm not found: the conformance and TypeScript SDK suites will skip (they fail under CI=true)" >&2
    elif cmp -s "$node_dir/package-lock.json" "$stamp"; then
        export SWITCHBOARD_NODE_DIR="$node_dir"
    else
        echo "run.sh: npm ci in $node_dir"
        if (cd "$node_dir" && npm ci --no-audit --no-fund); then
            cp "$node_dir/package-lock.json" "$stamp"
            export SWITCHBOARD_NODE_DIR="$node_dir"
        elif [[ "${CI:-}" == "true" ]]; then
            echo "run.sh: npm ci failed" >&2
            exit 1
        else
            echo "run.sh: WARNING: npm ci failed: the Node suites will skip" >&2
        fi
    fi
fi

# tests/tests/nginx.rs runs real nginx in front of three instances. Install it (the Debian
# package, once) when it is missing: as root with apt-get; without root only warn, and the
# nginx tests skip loudly (under CI=true they fail instead).
if ! command -v nginx >/dev/null 2>&1 && [[ ! -x /usr/sbin/nginx ]] && [[ -z "${SWITCHBOARD_NGINX:-}" ]]; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "run.sh: installing nginx (apt-get) for tests/tests/nginx.rs"
        if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
            { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null ||
                DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null; }; }; then
            echo "run.sh: WARNING: could not install nginx: tests/tests/nginx.rs will skip (fail under CI=true)" >&2
        fi
    else
        echo "run.sh: WARNING: nginx is not installed and this is not root: tests/tests/nginx.rs will skip (apt-get install nginx)" >&2
    fi
fi

# The suites hold a thousand sessions open at once: allow the file descriptors they need.
ulimit -Sn "$(ulimit -Hn)" 2>/dev/null || ulimit -Sn 8192 2>/dev/null || true

echo "run.sh: building the binaries under test"
cargo build -p switchboard -p switchboard-blocking -p switchboard-tests --bins

echo "run.sh: cargo test --workspace (SWITCHBOARD_PYTHON=$SWITCHBOARD_PYTHON SWITCHBOARD_NODE_DIR=${SWITCHBOARD_NODE_DIR:-})"
if [[ $# -gt 0 ]]; then
    exec cargo test "$@"
fi
exec cargo test --workspace --no-fail-fast
