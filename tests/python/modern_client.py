"""Drive Switchboard with the Python SDK 2.x `Client`, in either protocol era, several at once.

Usage: modern_client.py BASE_URL TOOL CLIENT [CLIENT ...]   where CLIENT is MODE=ARGS_JSON

MODE is a `Client(mode=...)` value on BASE_URL/mcp (`auto`, `legacy`, or a pinned modern
version such as `2026-07-28`), or `sse` for the legacy HTTP+SSE transport on BASE_URL/sse
(in `legacy` mode). One client per CLIENT, all at once; every client numbers its requests
from 0, so their ids collide by construction. Each connects, lists tools (which must list
TOOL), then calls TOOL with ARGS once every client has listed, so the calls overlap.
Prints one JSON line on stdout:
{"clients": [{"mode", "protocol", "server", "tools", "is_error", "texts"}]} in the order of
the CLIENTs given (`protocol` is the era the SDK negotiated). Exits non-zero (with a
traceback) on any failure.
"""

import json
import sys

import anyio
from mcp import Client
from mcp.client.sse import sse_client

TIMEOUT_S = 60


def client(base_url, mode):
    if mode == "sse":
        return Client(sse_client(f"{base_url}/sse", timeout=10, sse_read_timeout=TIMEOUT_S), mode="legacy")
    # No client-side cache: every list must reach the proxy.
    return Client(f"{base_url}/mcp", mode=mode, cache=None)


async def one_client(base_url, tool, mode, args, index, ready, all_ready, results):
    async with client(base_url, mode) as c:
        tools = await c.list_tools()
        names = [t.name for t in tools.tools]
        if tool not in names:
            raise SystemExit(f"client {index} ({mode}): tool {tool!r} not listed: {names}")
        ready[index] = True
        if all(ready):
            all_ready.set()
        await all_ready.wait()
        result = await c.call_tool(tool, args)
        texts = [b.text for b in result.content if getattr(b, "type", None) == "text"]
        info = c.server_info
        results[index] = {
            "mode": mode,
            "protocol": c.protocol_version,
            "server": info.name if info is not None else None,
            "tools": names,
            "is_error": bool(result.is_error),
            "texts": texts,
        }


async def main(base_url, tool, clients):
    ready = [False] * len(clients)
    results = [None] * len(clients)
    all_ready = anyio.Event()
    with anyio.fail_after(TIMEOUT_S):
        async with anyio.create_task_group() as tg:
            for i, (mode, args) in enumerate(clients):
                tg.start_soon(one_client, base_url, tool, mode, args, i, ready, all_ready, results)
    print(json.dumps({"clients": results}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    clients = []
    for spec in sys.argv[3:]:
        mode, sep, args = spec.partition("=")
        if not sep:
            raise SystemExit(f"{spec!r}: expected MODE=ARGS_JSON")
        clients.append((mode, json.loads(args)))
    anyio.run(main, sys.argv[1].rstrip("/"), sys.argv[2], clients)
