"""Drive Switchboard with the official Python MCP SDK client over the legacy HTTP+SSE transport.

Usage: sdk_client.py URL TOOL ARGS_JSON [ARGS_JSON ...]

One SDK client per ARGS_JSON, all at once (each in its own task, with its own SSE session):
each runs initialize, list_tools (which must list TOOL), then call_tool(TOOL, ARGS) once
every client has initialized, so the calls overlap. Prints one JSON line on stdout:
{"clients": [{"server": ..., "protocol": ..., "tools": [...], "is_error": ..., "texts": [...]}]}
in the order of the ARGS_JSON given. Exits non-zero (with a traceback) on any failure.
"""

import json
import sys

import anyio
from mcp import ClientSession
from mcp.client.sse import sse_client

TIMEOUT_S = 60


async def one_client(url, tool, args, index, ready, all_ready, results):
    async with sse_client(url, timeout=10, sse_read_timeout=TIMEOUT_S) as (read, write):
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
                "server": init.server_info.name,
                "protocol": init.protocol_version,
                "tools": names,
                "is_error": bool(result.is_error),
                "texts": texts,
            }


async def main(url, tool, arg_list):
    ready = [False] * len(arg_list)
    results = [None] * len(arg_list)
    all_ready = anyio.Event()
    with anyio.fail_after(TIMEOUT_S):
        async with anyio.create_task_group() as tg:
            for i, args in enumerate(arg_list):
                tg.start_soon(one_client, url, tool, args, i, ready, all_ready, results)
    print(json.dumps({"clients": results}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    anyio.run(main, sys.argv[1], sys.argv[2], [json.loads(a) for a in sys.argv[3:]])
