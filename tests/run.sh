#!/usr/bin/env bash
# The one test command: sets up the Python SDK venv, builds every binary the end-to-end
# suites start, then runs the whole workspace's tests.
#
#   tests/run.sh                 # everything
#   tests/run.sh -p switchboard-tests -- tokio::   # extra arguments go to `cargo test`
#
# The venv lives at <repo>/.venv (git-ignored) and is reused when it already has `mcp` and
# `mcp-server-time`. Set SWITCHBOARD_PYTHON to use another Python with both installed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

if [[ -z "${SWITCHBOARD_PYTHON:-}" ]]; then
    venv="$root/.venv"
    if [[ ! -x "$venv/bin/python" ]]; then
        echo "run.sh: creating $venv"
        python3 -m venv "$venv"
    fi
    if ! "$venv/bin/python" -c 'import mcp.client.sse, mcp.client.streamable_http' 2>/dev/null || [[ ! -x "$venv/bin/mcp-server-time" ]]; then
        echo "run.sh: installing mcp and mcp-server-time into $venv"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "mcp==2.3.0" "mcp-server-time==2026.10.19"
    fi
    export SWITCHBOARD_PYTHON="$venv/bin/python"
fi

# The suites hold a thousand sessions open at once: allow the file descriptors they need.
ulimit -Sn "$(ulimit -Hn)" 2>/dev/null || ulimit -Sn 8192 2>/dev/null || true

echo "run.sh: building the binaries under test"
cargo build -p switchboard -p switchboard-blocking -p switchboard-tests --bins

echo "run.sh: cargo test --workspace (SWITCHBOARD_PYTHON=$SWITCHBOARD_PYTHON)"
if [[ $# -gt 0 ]]; then
    exec cargo test "$@"
fi
exec cargo test --workspace --no-fail-fast
