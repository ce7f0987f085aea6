"""List and call tools through Switchboard with the Python SDK 2.x `Client`, in either era.

Usage: tools_client.py BASE_URL CALLS_JSON MODE [MODE ...]

One client per MODE, one after another. MODE is `sse` (the legacy HTTP+SSE transport on
BASE_URL/sse, in `legacy` mode) or a `Client(mode=...)` value on BASE_URL/mcp (`legacy` for a
2025 Streamable session, `auto`, or a pinned modern version such as `2026-07-28`). Each client
connects, lists every tool (following `nextCursor`), then makes each call of CALLS_JSON
(`[["tool", {args}], ...]`) in order. Prints one JSON line, the clients in MODE order:
{"clients": [{"mode", "protocol", "tools": [each tool as listed, all its fields], "calls":
[{"tool", "ok", "texts"}, or {"tool", "ok": false, "code", "message"} for a JSON-RPC error]}]}.
Exits non-zero (with a traceback) on any other failure.
"""

import json
import sys

import anyio
from mcp import Client, MCPError
from mcp.client.sse import sse_client

TIMEOUT_S = 60


def client(base_url, mode):
    if mode == "sse":
        return Client(sse_client(f"{base_url}/sse", timeout=10, sse_read_timeout=TIMEOUT_S), mode="legacy")
    # No client-side cache: every list must reach the proxy.
    return Client(f"{base_url}/mcp", mode=mode, cache=None)


async def run(base_url, mode, calls):
    async with client(base_url, mode) as c:
        tools, cursor = [], None
        for _ in range(10):
            page = await c.list_tools(cursor=cursor) if cursor else await c.list_tools()
            tools.extend(t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        results = []
        for tool, args in calls:
            try:
                result = await c.call_tool(tool, args)
            except MCPError as e:
                results.append({"tool": tool, "ok": False, "code": e.error.code, "message": e.error.message})
                continue
            texts = [b.text for b in result.content if getattr(b, "type", None) == "text"]
            results.append({"tool": tool, "ok": not result.is_error, "texts": texts})
        return {"mode": mode, "protocol": c.protocol_version, "tools": tools, "calls": results}


async def main(base_url, calls, modes):
    with anyio.fail_after(TIMEOUT_S):
        out = [await run(base_url, mode, calls) for mode in modes]
    print(json.dumps({"clients": out}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    anyio.run(main, sys.argv[1].rstrip("/"), json.loads(sys.argv[2]), sys.argv[3:])
