"""One official Python SDK Streamable HTTP client that calls one tool and reports, line by
line, what it received, so that a test can cut its connection mid-call and watch it resume.

Usage: resume_client.py MCP_URL TOOL ARGS_JSON

Runs initialize, then call_tool(TOOL, ARGS) with a progress callback (so the request carries
a progressToken). Prints one JSON object per line on stdout, flushed at once:
  {"event": "initialized", "protocol": ..., "server": ...}
  {"event": "progress", "progress": ..., "total": ..., "message": ...}   (each notification)
  {"event": "result", "is_error": ..., "texts": [...]}
and exits 0. The SDK's own log (INFO, including its reconnections) goes to stderr. Exits
non-zero (with a traceback) on any failure, or when the whole run takes over 60 s.

The SDK resumes by itself: when a request's event stream ends before its response and an
event of that stream carried an id, it waits the server's `retry` (or 1 s) and sends
`GET MCP_URL` with `Last-Event-ID`, without sending the request again.
"""

import json
import logging
import sys

import anyio
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

TIMEOUT_S = 60


def say(**fields):
    print(json.dumps(fields), flush=True)


async def main(url, tool, args):
    async def on_progress(progress, total, message):
        say(event="progress", progress=progress, total=total, message=message)

    with anyio.fail_after(TIMEOUT_S):
        async with streamable_http_client(url) as (read, write):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                say(
                    event="initialized",
                    protocol=init.protocol_version,
                    server=init.server_info.name,
                )
                result = await session.call_tool(tool, args, progress_callback=on_progress)
                texts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
                say(event="result", is_error=bool(result.is_error), texts=texts)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    logging.getLogger("mcp.client.streamable_http").setLevel(logging.INFO)
    anyio.run(main, sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
