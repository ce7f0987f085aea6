"""One MCP session of the official Python SDK client with OpenTelemetry on, for Switchboard's
trace tests: the SDK makes a CLIENT span for each request it sends and writes its context
into `params._meta.traceparent`; the spans go over OTLP/HTTP to the test's receiver.

Usage: trace_client.py BASE_URL TRANSPORT OTLP_BASE_URL

TRANSPORT is `sse` (BASE_URL/sse), `mcp` (a 2025 session on BASE_URL/mcp) or `modern` (a
client pinned to 2026-07-28 on BASE_URL/mcp, no session). The client calls `seen_meta`
(tests/python/trace_backend.py), after its `initialize` in the 2025 era, then flushes its
spans. Prints one JSON line:
{"seen": what the backend saw in `_meta`, "is_error": ...}.
"""

import json
import sys

import anyio
from mcp import Client, ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

TIMEOUT_S = 60


def transport(base_url, kind):
    if kind == "sse":
        return sse_client(f"{base_url}/sse", timeout=10, sse_read_timeout=TIMEOUT_S)
    return streamable_http_client(f"{base_url}/mcp")


async def main(base_url, kind):
    if kind == "modern":
        with anyio.fail_after(TIMEOUT_S):
            async with Client(f"{base_url}/mcp", mode="2026-07-28", cache=None) as client:
                result = await client.call_tool("seen_meta", {})
        text = result.content[0].text
        return {"seen": json.loads(text), "is_error": bool(result.is_error)}
    with anyio.fail_after(TIMEOUT_S):
        async with transport(base_url, kind) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                result = await session.call_tool("seen_meta", {})
    text = result.content[0].text
    return {"seen": json.loads(text), "is_error": bool(result.is_error)}


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    provider = TracerProvider(resource=Resource.create({"service.name": "trace-client"}))
    exporter = OTLPSpanExporter(endpoint=sys.argv[3].rstrip("/") + "/v1/traces")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    out = anyio.run(main, sys.argv[1].rstrip("/"), sys.argv[2])
    provider.shutdown()
    print(json.dumps(out), flush=True)
