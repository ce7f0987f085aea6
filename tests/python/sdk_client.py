"""Drive Switchboard with the official Python MCP SDK clients, over both HTTP transports.

Usage: sdk_client.py BASE_URL TOOL CLIENT [CLIENT ...]   where CLIENT is sse=ARGS_JSON or
mcp=ARGS_JSON

One SDK client per CLIENT, all at once, each in its own task with its own session: `sse` is
the legacy HTTP+SSE client (`sse_client`, BASE_URL/sse), `mcp` the Streamable HTTP one
(`streamable_http_client`, BASE_URL/mcp). Every SDK client numbers its requests from 0, so
the sessions' ids collide by construction. Each runs initialize, list_tools (which must list
TOOL), then call_tool(TOOL, ARGS) once every client has initialized, so the calls overlap.
Prints one JSON line on stdout:
{"clients": [{"transport": ..., "server": ..., "protocol": ..., "tools": [...], "is_error": ...,
"texts": [...]}]} in the order of the CLIENTs given. Exits non-zero (with a traceback) on any
failure.
"""

import json
import sys

import anyio
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

TIMEOUT_S = 60


def transport(base_url, kind):
    if kind == "sse":
        return sse_client(f"{base_url}/sse", timeout=10, sse_read_timeout=TIMEOUT_S)
    if kind == "mcp":
        return streamable_http_client(f"{base_url}/mcp")
    raise SystemExit(f"unknown transport {kind!r} (sse or mcp)")


async def one_client(base_url, tool, kind, args, index, ready, all_ready, results):
    async with transport(base_url, kind) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            tools = await session.list_tools()
            names = [t.name for t in tools.tools]
            if tool not in names:
                raise SystemExit(f"client {index}: tool {tool!r} not listed: {names}")
            ready[index] = True
            if all(ready):
                all_ready.set()
            await all_ready.wait()
            result = await session.call_tool(tool, args)
            texts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
            results[index] = {
                "transport": kind,
                "server": init.server_info.name,
                "protocol": init.protocol_version,
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
            for i, (kind, args) in enumerate(clients):
                tg.start_soon(one_client, base_url, tool, kind, args, i, ready, all_ready, results)
    print(json.dumps({"clients": results}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    clients = []
    for spec in sys.argv[3:]:
        kind, sep, args = spec.partition("=")
        if not sep:
            raise SystemExit(f"{spec!r}: expected sse=ARGS_JSON or mcp=ARGS_JSON")
        clients.append((kind, json.loads(args)))
    anyio.run(main, sys.argv[1].rstrip("/"), sys.argv[2], clients)
