"""A small OTLP/HTTP protobuf receiver for Switchboard's trace tests and benchmark.

Usage: otlp_receiver.py OUT_DIR     (OUT_DIR `-`: only count, write nothing)

Listens on 127.0.0.1 (a port of its own; its number is the first line it prints), takes
`POST /v1/traces` and `POST /v1/metrics` as an OpenTelemetry collector does, decodes each
body with the official protobuf definitions (the `opentelemetry-proto` package) and appends
what it holds, one JSON object a line, to OUT_DIR/spans.jsonl and OUT_DIR/metrics.jsonl.
A span: {"service", "scope", "trace_id", "span_id", "parent_span_id", "name", "kind"
(SPAN_KIND_SERVER, ...), "start_ns", "end_ns", "status" (STATUS_CODE_...), "status_message",
"attributes" {key: value}, "links" [{"trace_id", "span_id"}], "trace_state"}. A metric data
point: {"service", "name", "unit", "attributes", "count", "sum", "bounds", "buckets"}.
`GET /count` answers the spans received so far as JSON (with OUT_DIR `-`, bodies are
decoded only then, so a benchmark's receiver takes no CPU while calls are measured): {"spans": total, "by": {"<kind>
<name>": count}} (what the benchmark counts against the calls it made).
"""

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

LOCK = threading.Lock()
SPANS = 0
BY = {}
# Trace bodies taken but not counted yet (count-only mode).
PENDING = []


def value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return attributes(v.kvlist_value.values)
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind) if kind else None


def attributes(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


def service_of(resource):
    return attributes(resource.attributes).get("service.name")


def spans_of(request):
    for rs in request.resource_spans:
        service = service_of(rs.resource)
        for ss in rs.scope_spans:
            for s in ss.spans:
                yield {
                    "service": service,
                    "resource": attributes(rs.resource.attributes),
                    "scope": ss.scope.name,
                    "trace_id": s.trace_id.hex(),
                    "span_id": s.span_id.hex(),
                    "parent_span_id": s.parent_span_id.hex(),
                    "name": s.name,
                    "kind": Span.SpanKind.Name(s.kind),
                    "start_ns": s.start_time_unix_nano,
                    "end_ns": s.end_time_unix_nano,
                    "status": Status.StatusCode.Name(s.status.code),
                    "status_message": s.status.message,
                    "attributes": attributes(s.attributes),
                    "links": [
                        {"trace_id": l.trace_id.hex(), "span_id": l.span_id.hex()} for l in s.links
                    ],
                    "trace_state": s.trace_state,
                }


def points_of(request):
    for rm in request.resource_metrics:
        service = service_of(rm.resource)
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.WhichOneof("data") != "histogram":
                    continue
                for p in m.histogram.data_points:
                    yield {
                        "service": service,
                        "name": m.name,
                        "unit": m.unit,
                        "attributes": attributes(p.attributes),
                        "count": p.count,
                        "sum": p.sum,
                        "bounds": list(p.explicit_bounds),
                        "buckets": list(p.bucket_counts),
                    }


def count(request):
    global SPANS
    names = [
        f"{Span.SpanKind.Name(s.kind)} {s.name}"
        for rs in request.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    ]
    with LOCK:
        SPANS += len(names)
        for name in names:
            BY[name] = BY.get(name, 0) + 1


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body, content_type="application/x-protobuf"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path != "/count":
            return self.answer(404, b"", "text/plain")
        with LOCK:
            pending = PENDING[:]
            PENDING.clear()
        for body in pending:
            count(ExportTraceServiceRequest.FromString(body))
        with LOCK:
            counted = json.dumps({"spans": SPANS, "by": BY})
        self.answer(200, counted.encode(), "application/json")

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Type") != "application/x-protobuf":
            return self.answer(415, b"", "text/plain")
        if self.path == "/v1/traces" and OUT == "-":
            # Only counting: decoded when counted, so that a benchmark's receiver takes
            # no CPU from the proxy it measures (a collector runs elsewhere).
            with LOCK:
                PENDING.append(body)
            lines, reply = [], ExportTraceServiceResponse()
        elif self.path == "/v1/traces":
            request = ExportTraceServiceRequest.FromString(body)
            count(request)
            lines = [json.dumps(s) for s in spans_of(request)]
            name, reply = "spans.jsonl", ExportTraceServiceResponse()
        elif self.path == "/v1/metrics":
            request = ExportMetricsServiceRequest.FromString(body)
            lines = [] if OUT == "-" else [json.dumps(p) for p in points_of(request)]
            name, reply = "metrics.jsonl", ExportMetricsServiceResponse()
        else:
            return self.answer(404, b"", "text/plain")
        if lines:
            with LOCK, open(os.path.join(OUT, name), "a") as out:
                out.writelines(line + "\n" for line in lines)
        self.answer(200, reply.SerializeToString())


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    OUT = sys.argv[1]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()
