//! SPEC section 14's traces end to end on both binaries and both transports, against real
//! OpenTelemetry software: every span Switchboard exports over OTLP/HTTP reaches a small
//! receiver (`tests/python/otlp_receiver.py`) that decodes it with the official protobuf
//! definitions (`opentelemetry-proto`). A call by the official Python SDK client with its
//! OpenTelemetry instrumentation on (`tests/python/trace_client.py`) is one trace through
//! Switchboard into an instrumented Python SDK backend (`tests/python/trace_backend.py`):
//! client span → Switchboard SERVER → CLIENT → backend span. The spans carry the
//! conventions' names, kinds and attributes and never a token, an argument or a result;
//! a collector that is down fails no request and its lost spans are counted.
//!
//! Needs `SWITCHBOARD_PYTHON` with `mcp`, `opentelemetry-sdk`,
//! `opentelemetry-exporter-otlp-proto-http` and `opentelemetry-proto`; `tests/run.sh`
//! installs them. Without them the tests skip loudly, or fail when `CI=true`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};
use switchboard_tests::mcp::McpSession;
use switchboard_tests::python::{python, run_script};
use switchboard_tests::{suite, wait_until, workspace_root};
use switchboard_tests::{Proxy, ProxyBuilder, Target, TempDir, WAIT};

const BACKEND: &str = env!("CARGO_BIN_EXE_test-backend");
const ALICE: (&str, &str) = ("alice", "alice-token-0123456789abcdef");
/// A value no span may carry: it is only ever an argument.
const SECRET_ARGUMENT: &str = "argument-secret-4f1c9a";

/// A Python with the SDK and the OpenTelemetry packages, or `None` after saying why.
fn otel_python() -> Option<PathBuf> {
    let python = python()?;
    let probe = Command::new(&python)
        .args([
            "-c",
            "import opentelemetry.proto, opentelemetry.sdk, opentelemetry.exporter.otlp.proto.http",
        ])
        .stderr(Stdio::piped())
        .output();
    let why = match probe {
        Ok(o) if o.status.success() => return Some(python),
        Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_owned(),
        Err(e) => e.to_string(),
    };
    let why = format!(
        "{} lacks the OpenTelemetry packages: {why}",
        python.display()
    );
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("the trace tests cannot run in CI: {why}");
    }
    let msg = format!("\n**********\nSKIPPED: trace test: {why}\n**********\n");
    let _ = std::io::stderr().write_all(msg.as_bytes());
    None
}

/// The OTLP receiver, stopped when dropped.
struct Receiver {
    child: Child,
    url: String,
    dir: TempDir,
}

impl Receiver {
    fn start(python: &Path) -> Receiver {
        let dir = TempDir::new("otlp");
        let mut child = Command::new(python)
            .arg(workspace_root().join("tests/python/otlp_receiver.py"))
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the OTLP receiver");
        let mut port = String::new();
        let stdout = child.stdout.take().expect("its stdout");
        BufReader::new(stdout).read_line(&mut port).unwrap();
        let url = format!("http://127.0.0.1:{}", port.trim());
        Receiver { child, url, dir }
    }

    fn lines(&self, file: &str) -> Vec<Value> {
        let text = std::fs::read_to_string(self.dir.file(file)).unwrap_or_default();
        text.lines()
            .map(|l| serde_json::from_str(l).expect("the receiver writes JSON lines"))
            .collect()
    }

    /// The spans received, once `ready` holds for them.
    fn spans_when(&self, what: &str, ready: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        wait_until(what, WAIT, || {
            let spans = self.lines("spans.jsonl");
            ready(&spans).then_some(spans)
        })
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Switchboard exporting to `receiver` quickly (spans within 100 ms, metrics every 500).
fn traced(target: Target, receiver: &Receiver) -> ProxyBuilder {
    Proxy::builder(target)
        .args(["--otlp-endpoint", receiver.url.as_str()])
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("OTEL_METRIC_EXPORT_INTERVAL", "500")
}

fn of_service<'a>(spans: &'a [Value], service: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["service"] == service).collect()
}

fn child_of<'a>(spans: &'a [Value], parent: &Value, kind: &str) -> Option<&'a Value> {
    spans.iter().find(|s| {
        s["parent_span_id"] == parent["span_id"]
            && s["trace_id"] == parent["trace_id"]
            && s["kind"] == kind
    })
}

fn an_instrumented_sdk_call_is_one_trace_through_switchboard_into_the_backend(target: Target) {
    let Some(python) = otel_python() else { return };
    let receiver = Receiver::start(&python);
    let backend = workspace_root().join("tests/python/trace_backend.py");
    let p = traced(target, &receiver)
        .backend([
            python.display().to_string(),
            backend.display().to_string(),
            receiver.url.clone(),
        ])
        .start();
    for transport in ["sse", "mcp", "modern"] {
        let args = [
            format!("http://{}", p.addr),
            transport.into(),
            receiver.url.clone(),
        ];
        let out = run_script(&python, &p, "trace_client.py", &args);
        assert_eq!(out["is_error"], false, "{out}");
        let seen = out["seen"]["traceparent"].as_str().expect("a traceparent");
        let fields: Vec<&str> = seen.split('-').collect();
        let (trace_id, hop_id) = (fields[1], fields[2]);
        let spans = receiver.spans_when("the four spans of the call", |spans| {
            let of_call = spans.iter().filter(|s| s["trace_id"] == trace_id);
            of_call.count() >= 4
        });
        let of_call: Vec<Value> = spans
            .into_iter()
            .filter(|s| s["trace_id"] == trace_id)
            .collect();
        let client = of_call
            .iter()
            .find(|s| s["service"] == "trace-client" && s["kind"] == "SPAN_KIND_CLIENT")
            .unwrap_or_else(|| panic!("{transport}: no client span: {of_call:#?}"));
        let server = child_of(&of_call, client, "SPAN_KIND_SERVER").unwrap_or_else(|| {
            panic!("{transport}: no SERVER span under the client's: {of_call:#?}")
        });
        assert_eq!(server["service"], "switchboard", "{server}");
        assert_eq!(server["name"], "tools/call seen_meta", "{server}");
        let hop = child_of(&of_call, server, "SPAN_KIND_CLIENT")
            .unwrap_or_else(|| panic!("{transport}: no CLIENT span: {of_call:#?}"));
        assert_eq!(hop["service"], "switchboard", "{hop}");
        assert_eq!(
            hop["span_id"], hop_id,
            "the backend read the CLIENT span's context"
        );
        assert_eq!(seen, format!("00-{trace_id}-{hop_id}-01"));
        let inside = child_of(&of_call, hop, "SPAN_KIND_SERVER")
            .unwrap_or_else(|| panic!("{transport}: no backend span: {of_call:#?}"));
        assert_eq!(inside["service"], "trace-backend", "{inside}");
        assert_eq!(inside["name"], "tools/call seen_meta", "{inside}");

        let a = &server["attributes"];
        assert_eq!(a["mcp.method.name"], "tools/call", "{server}");
        assert_eq!(a["gen_ai.tool.name"], "seen_meta", "{server}");
        assert_eq!(a["gen_ai.operation.name"], "execute_tool", "{server}");
        assert!(a["jsonrpc.request.id"].is_string(), "{server}");
        match transport {
            // A legacy SSE client names no version after its `initialize`: the span
            // carries the one it negotiated (SPEC 14).
            "sse" | "mcp" => {
                assert!(a["mcp.session.id"].is_string(), "{server}");
                assert!(a["mcp.protocol.version"].is_string(), "{server}");
            }
            _ => {
                // SPEC 13: a 2026-07-28 request belongs to no session.
                assert!(a.get("mcp.session.id").is_none(), "{server}");
                assert_eq!(a["mcp.protocol.version"], "2026-07-28", "{server}");
            }
        }
        assert_eq!(a["network.transport"], "tcp", "{server}");
        assert_eq!(a["network.protocol.name"], "http", "{server}");
        assert_eq!(a["network.protocol.version"], "1.1", "{server}");
        assert_eq!(a["client.address"], "127.0.0.1", "{server}");
        let port = a["client.port"].as_i64().unwrap_or_default();
        assert!((1..=65535).contains(&port), "client.port: {server}");
        assert!(a.get("error.type").is_none(), "{server}");
        assert_eq!(server["status"], "STATUS_CODE_UNSET", "{server}");
        assert_eq!(hop["attributes"]["network.transport"], "pipe", "{hop}");
        for span in [server, hop] {
            assert_eq!(span["status_message"], "", "{span}");
            assert!(
                span["start_ns"].as_u64() <= span["end_ns"].as_u64(),
                "{span}"
            );
        }
        assert!(server["start_ns"].as_u64() <= hop["start_ns"].as_u64());
        assert!(hop["end_ns"].as_u64() <= server["end_ns"].as_u64());
    }
    durations_are_exported_and_served(&receiver, &p);
}

/// SPEC section 14's histograms: `mcp.server.operation.duration` over OTLP (the
/// conventions' buckets, in seconds, no session or request id) and on `/metrics`.
fn durations_are_exported_and_served(receiver: &Receiver, p: &Proxy) {
    let calls = wait_until("the calls' durations exported", WAIT, || {
        let points = receiver.lines("metrics.jsonl");
        let calls: Vec<Value> = (points.into_iter())
            .filter(|m| m["name"] == "mcp.server.operation.duration")
            .filter(|m| m["attributes"]["mcp.method.name"] == "tools/call")
            .collect();
        (!calls.is_empty()).then_some(calls)
    });
    // SPEC section 14's buckets.
    let bounds =
        json!([0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0]);
    for call in &calls {
        assert_eq!(call["service"], "switchboard", "{call}");
        assert_eq!(call["unit"], "s", "{call}");
        assert_eq!(call["bounds"], bounds, "{call}");
        assert!(call["count"].as_u64() >= Some(1), "{call}");
        let a = &call["attributes"];
        assert_eq!(a["network.transport"], "tcp", "{call}");
        assert!(a.get("mcp.session.id").is_none(), "{call}");
        assert!(a.get("jsonrpc.request.id").is_none(), "{call}");
    }
    let text = p.metrics();
    assert!(
        text.contains("# TYPE mcp_server_operation_duration_seconds histogram"),
        "{text}"
    );
    let calls: Vec<&str> = (text.lines())
        .filter(|l| l.starts_with("mcp_server_operation_duration_seconds_count{"))
        .filter(|l| l.contains(r#"mcp_method_name="tools/call""#))
        .collect();
    assert!(!calls.is_empty(), "{text}");
    let inf = (text.lines())
        .filter(|l| l.starts_with("mcp_server_operation_duration_seconds_bucket{"))
        .filter(|l| l.contains(r#"mcp_method_name="tools/call""#))
        .filter(|l| l.contains(r#"le="+Inf""#));
    assert_eq!(inf.count(), calls.len(), "{text}");
    assert!(!text.contains("mcp_session_id"), "{text}");
    assert!(!text.contains("jsonrpc_request_id"), "{text}");

    // The backend hop's duration (network.transport=pipe), over OTLP and on /metrics.
    let hops = wait_until("the backend hops' durations exported", WAIT, || {
        let points = receiver.lines("metrics.jsonl");
        let hops: Vec<Value> = (points.into_iter())
            .filter(|m| m["name"] == "mcp.client.operation.duration")
            .filter(|m| m["attributes"]["mcp.method.name"] == "tools/call")
            .collect();
        (!hops.is_empty()).then_some(hops)
    });
    for hop in &hops {
        assert_eq!(hop["unit"], "s", "{hop}");
        assert_eq!(hop["bounds"], bounds, "{hop}");
        assert_eq!(hop["attributes"]["network.transport"], "pipe", "{hop}");
    }
    assert!(
        (text.lines())
            .filter(|l| l.starts_with("mcp_client_operation_duration_seconds_count{"))
            .any(|l| l.contains(r#"mcp_method_name="tools/call""#)),
        "{text}"
    );
    // The 2025 clients' sessions ended: their durations, with no session id.
    let sessions = wait_until("the sessions' durations served", WAIT, || {
        let text = p.metrics();
        let ended: f64 = (text.lines())
            .filter(|l| l.starts_with("mcp_server_session_duration_seconds_count"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        (ended >= 1.0).then_some(text)
    });
    assert!(!sessions.contains("mcp_session_id"), "{sessions}");
}

fn spans_follow_the_conventions_and_carry_no_secret(target: Target) {
    const SERVICE: &str = "gateway-under-test";
    let Some(python) = otel_python() else { return };
    let receiver = Receiver::start(&python);
    let p = traced(target, &receiver)
        .backend([BACKEND])
        .tokens(&[ALICE])
        .env("OTEL_SERVICE_NAME", SERVICE)
        .env("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
        .record()
        .start();
    let session = McpSession::start(&p, Some(ALICE.1));
    // Parent from the HTTP header alone: the backend gets the CLIENT span's context.
    let header = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let args = json!({"secret": SECRET_ARGUMENT});
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "echo", "arguments": args}});
    let (_, answer) = session
        .post_with(&[("traceparent", header)], &call.to_string())
        .response();
    assert!(answer["result"].is_object(), "{answer}");
    // Both: `_meta` names the parent, the header's context is a link.
    let meta = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let call = json!({"jsonrpc": "2.0", "id": "eight", "method": "tools/call",
        "params": {"name": "echo", "arguments": {}, "_meta": {"traceparent": meta, "tracestate": "vendor=v1"}}});
    let (_, answer) = session
        .post_with(&[("traceparent", header)], &call.to_string())
        .response();
    assert!(answer["result"].is_object(), "{answer}");
    // A caller's error: the code only, no error.type, status unset.
    let unknown = r#"{"jsonrpc":"2.0","id":9,"method":"no/such/method","params":{}}"#;
    let (_, answer) = session.post(unknown).response();
    let code = answer["error"]["code"].clone();
    assert!(code.is_i64(), "{answer}");

    let spans = receiver.spans_when("the three requests' spans", |spans| {
        let mine = of_service(spans, SERVICE);
        let ids = ["7", "eight", "9"];
        let servers = mine.iter().filter(|s| {
            let id = &s["attributes"]["jsonrpc.request.id"];
            s["kind"] == "SPAN_KIND_SERVER" && ids.iter().any(|want| id == want)
        });
        let hops = mine.iter().filter(|s| s["kind"] == "SPAN_KIND_CLIENT");
        servers.count() == 3 && hops.count() >= 2
    });
    assert!(
        of_service(&spans, "switchboard").is_empty(),
        "OTEL_SERVICE_NAME names the service"
    );
    let mine = of_service(&spans, SERVICE);
    assert_eq!(mine[0]["resource"]["deployment.environment"], "test");
    let by_id = |id: &str| {
        *mine
            .iter()
            .find(|s| {
                s["kind"] == "SPAN_KIND_SERVER" && s["attributes"]["jsonrpc.request.id"] == id
            })
            .unwrap_or_else(|| panic!("no SERVER span for id {id}: {mine:#?}"))
    };
    let first = by_id("7");
    assert_eq!(
        first["trace_id"], "0af7651916cd43dd8448eb211c80319c",
        "{first}"
    );
    assert_eq!(first["parent_span_id"], "b7ad6b7169203331", "{first}");
    assert_eq!(first["name"], "tools/call echo", "{first}");
    assert_eq!(first["attributes"]["user.id"], "alice", "{first}");
    assert_eq!(
        first["attributes"]["mcp.session.id"],
        session.sid.as_str(),
        "{first}"
    );
    let hop = child_of(&spans, first, "SPAN_KIND_CLIENT").expect("the first call's hop");
    let forwarded = p.wait_recorded("the first call", |l| l.contains(SECRET_ARGUMENT));
    let forwarded: Value = serde_json::from_str(&forwarded).unwrap();
    let carried = format!(
        "00-0af7651916cd43dd8448eb211c80319c-{}-01",
        hop["span_id"].as_str().unwrap()
    );
    assert_eq!(
        forwarded["params"]["_meta"]["traceparent"], carried,
        "{forwarded}"
    );

    let second = by_id("eight");
    assert_eq!(
        second["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736",
        "{second}"
    );
    assert_eq!(second["parent_span_id"], "00f067aa0ba902b7", "{second}");
    assert_eq!(second["trace_state"], "vendor=v1", "{second}");
    assert_eq!(
        second["links"],
        json!([{"trace_id": "0af7651916cd43dd8448eb211c80319c", "span_id": "b7ad6b7169203331"}]),
        "{second}"
    );

    let third = by_id("9");
    assert_eq!(
        third["attributes"]["rpc.response.status_code"],
        code.to_string(),
        "{third}"
    );
    assert!(third["attributes"].get("error.type").is_none(), "{third}");
    assert_eq!(third["status"], "STATUS_CODE_UNSET", "{third}");

    let text = std::fs::read_to_string(receiver.dir.file("spans.jsonl")).unwrap();
    assert!(!text.contains(ALICE.1), "a bearer token in a span");
    assert!(
        !text.contains(SECRET_ARGUMENT),
        "an argument or a result in a span"
    );
}

fn a_collector_that_is_down_fails_no_request_and_its_spans_are_counted_lost(target: Target) {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .args([
            "--otlp-endpoint".to_owned(),
            format!("http://127.0.0.1:{port}"),
        ])
        .env("OTEL_BSP_SCHEDULE_DELAY", "20")
        .env("OTEL_EXPORTER_OTLP_TIMEOUT", "500")
        .start();
    let session = McpSession::start(&p, None);
    for n in 0..20 {
        let response = session.call(json!(n), "echo", json!({"n": n}));
        assert!(response["result"].is_object(), "{response}");
    }
    // Every call after the failed batches reports them; one more call collects the rest.
    let lost = wait_until("the lost spans counted", WAIT, || {
        session.call(json!("again"), "echo", json!({}));
        let lost = p.metric("switchboard_otel_dropped_total")?;
        (lost >= 40.0).then_some(lost)
    });
    assert!(lost >= 40.0, "20 calls' SERVER and CLIENT spans: {lost}");
}

suite!(
    an_instrumented_sdk_call_is_one_trace_through_switchboard_into_the_backend,
    spans_follow_the_conventions_and_carry_no_secret,
    a_collector_that_is_down_fails_no_request_and_its_spans_are_counted_lost
);
