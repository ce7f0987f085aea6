"""One audited MCP session with the official Python SDK client, for Switchboard's audit log.

Usage: audit_client.py BASE_URL TOKEN TRANSPORT

TRANSPORT is `sse` (BASE_URL/sse) or `mcp` (BASE_URL/mcp). The client initializes, lists
the tools, calls `get_current_time` (a result), gets the prompt `missing` (the backend's
JSON-RPC error) and calls `convert_time` (which the test's policy denies), then closes.
Prints one JSON line: {"errors": [code of the prompt's error, code of the denied call]}.
"""

import json
import sys

import anyio
from mcp import ClientSession, MCPError
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

TIMEOUT_S = 60


def transport(base_url, kind, headers):
    if kind == "sse":
        return sse_client(f"{base_url}/sse", headers=headers, timeout=30)
    client = create_mcp_http_client(headers=headers)
    return streamable_http_client(f"{base_url}/mcp", http_client=client)


async def main(base_url, token, kind):
    headers = {"Authorization": f"Bearer {token}", "User-Agent": "audit-client/1"}
    errors = []
    with anyio.fail_after(TIMEOUT_S):
        async with transport(base_url, kind, headers) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                await session.list_tools()
                await session.call_tool("get_current_time", {"timezone": "UTC"})
                for call in (
                    session.get_prompt("missing"),
                    session.call_tool(
                        "convert_time",
                        {"source_timezone": "UTC", "time": "12:00", "target_timezone": "UTC"},
                    ),
                ):
                    try:
                        await call
                        errors.append(None)
                    except MCPError as e:
                        errors.append(e.error.code)
    print(json.dumps({"errors": errors}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    anyio.run(main, sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3])
