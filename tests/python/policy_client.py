"""Drive Switchboard's authorization policy with the official Python MCP SDK client.

Usage: policy_client.py BASE_URL TOKEN TRANSPORT CALLS_JSON

TRANSPORT is `sse` (the legacy HTTP+SSE client, BASE_URL/sse) or `mcp` (Streamable HTTP,
BASE_URL/mcp); TOKEN is sent as `Authorization: Bearer TOKEN`. The client initializes, lists
the tools, then makes each call of CALLS_JSON (`[["tool", {args}], ...]`) in order. Prints one
JSON line: {"tools": [names], "calls": [{"tool", "ok", "code", "message", "texts"}]}, where a
call refused by the proxy has `ok: false` and the JSON-RPC error's code and message. Exits
non-zero (with a traceback) on any other failure.
"""

import json
import sys

import anyio
import httpx2
from mcp import ClientSession, MCPError
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

# Every wait for something that must happen; never a measure of speed.
WAIT_S = 30
# The whole run, a last resort.
TIMEOUT_S = 120


def transport(base_url, kind, headers):
    if kind == "sse":
        return sse_client(
            f"{base_url}/sse", headers=headers, timeout=WAIT_S, sse_read_timeout=TIMEOUT_S
        )
    if kind == "mcp":
        client = create_mcp_http_client(
            headers=headers, timeout=httpx2.Timeout(WAIT_S, read=TIMEOUT_S)
        )
        return streamable_http_client(f"{base_url}/mcp", http_client=client)
    raise SystemExit(f"unknown transport {kind!r} (sse or mcp)")


async def run(base_url, token, kind, calls):
    headers = {"Authorization": f"Bearer {token}"}
    async with transport(base_url, kind, headers) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = [t.name for t in (await session.list_tools()).tools]
            results = []
            for tool, args in calls:
                try:
                    result = await session.call_tool(tool, args)
                except MCPError as e:
                    results.append(
                        {"tool": tool, "ok": False, "code": e.error.code, "message": e.error.message}
                    )
                    continue
                texts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
                results.append({"tool": tool, "ok": not result.is_error, "texts": texts})
            return {"tools": tools, "calls": results}


async def main(base_url, token, kind, calls):
    with anyio.fail_after(TIMEOUT_S):
        out = await run(base_url, token, kind, calls)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit(__doc__)
    anyio.run(main, sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
