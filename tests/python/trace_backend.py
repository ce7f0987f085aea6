"""A stdio MCP server (the official Python SDK's MCPServer) with OpenTelemetry on, for
Switchboard's trace tests: the SDK's own instrumentation makes a SERVER span for each
request, its parent read from `params._meta.traceparent`, exported over OTLP/HTTP.

Usage: trace_backend.py OTLP_BASE_URL

Its one tool, `seen_meta`, answers the trace context the request carried in `_meta` as JSON
(`{"traceparent": ..., "tracestate": ...}`), so a test sees what reached the backend.
"""

import json
import sys

from mcp.server.mcpserver import Context, MCPServer
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

server = MCPServer("trace-backend")


@server.tool()
def seen_meta(ctx: Context) -> str:
    """The trace context this request carried in `_meta`."""
    meta = ctx.request_context.meta or {}
    carried = {key: meta.get(key) for key in ("traceparent", "tracestate")}
    return json.dumps(carried)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    provider = TracerProvider(resource=Resource.create({"service.name": "trace-backend"}))
    exporter = OTLPSpanExporter(endpoint=sys.argv[1].rstrip("/") + "/v1/traces")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    server.run("stdio")
