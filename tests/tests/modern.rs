//! MCP 2026-07-28 ("modern") clients on `/mcp` of each binary (SPEC 13), beside 2025 clients
//! on the same proxy: the Python SDK 2.x `Client` in `auto` mode and pinned to 2026-07-28
//! (`tests/python/modern_client.py`), the TypeScript SDK 2.x `@modelcontextprotocol/client`
//! pinned to 2026-07-28 (`tests/node/modern-client.mjs`), against the real `mcp-server-time`
//! and `@modelcontextprotocol/server-everything`. Every SDK client numbers its requests from
//! 0, so the modern and the 2025 clients always send colliding ids at once: each must get
//! exactly its own answers. A few of §13's rules are also checked on the wire: discover, the
//! version and header refusals, 405 for GET, `--modern off`, colliding ids answered out of
//! order beside a session, the hang-up as the cancel, the audit.
//!
//! Needs `SWITCHBOARD_PYTHON` (the venv `tests/run.sh` makes, with `mcp` 2.x and
//! `mcp-server-time`) and the pinned Node packages in `tests/node`; without them the SDK
//! tests skip loudly, or fail when `CI=true`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use switchboard_tests::mcp::{post, Answer};
use switchboard_tests::node::{node_with, Node};
use switchboard_tests::python::{mcp_server_time, python, run_script};
use switchboard_tests::{
    backend_seen_id, echoed_args, suite, wait_until, Body, Events, Frame, McpSession, Proxy,
    Target, TempDir, WAIT,
};

const BACKEND: &str = env!("CARGO_BIN_EXE_test-backend");

const MODERN: &str = "2026-07-28";

/// Every version the proxy speaks, newest first (SPEC 13, `server/discover`).
const SUPPORTED: [&str; 5] = [
    "2026-07-28",
    "2025-11-25",
    "2025-06-18",
    "2025-03-26",
    "2024-11-05",
];

/// The TypeScript packages these tests need beside the common ones.
const TS_PACKAGES: [&str; 2] = [
    "@modelcontextprotocol/client",
    "@modelcontextprotocol/server-everything",
];

/// How long `modern-client.mjs` may take in all (it gives up after 60 s itself).
const TS_TIMEOUT: Duration = Duration::from_secs(90);

/// Runs `modern_client.py` with one Python SDK client per `(mode, args)`, all at once;
/// returns each client's summary in order.
fn python_clients(
    python: &Path,
    proxy: &Proxy,
    tool: &str,
    clients: &[(&str, Value)],
) -> Vec<Value> {
    let mut args = vec![format!("http://{}", proxy.addr), tool.to_owned()];
    args.extend(clients.iter().map(|(mode, args)| format!("{mode}={args}")));
    let summary = run_script(python, proxy, "modern_client.py", &args);
    let got = summary["clients"].as_array().cloned().unwrap_or_default();
    assert_eq!(got.len(), clients.len(), "{summary}");
    for (got, (mode, _)) in got.iter().zip(clients) {
        assert_eq!(got["mode"], *mode, "{summary}");
        assert_eq!(got["is_error"], false, "{got}");
        let tools = got["tools"].as_array().expect("tools");
        assert!(tools.contains(&json!(tool)), "{mode}: {got}");
    }
    got
}

/// The era a client of `mode` must end up in: modern unless it asked for 2025.
fn assert_era(client: &Value, mode: &str) {
    let protocol = client["protocol"].as_str().unwrap_or_default();
    if mode == "legacy" || mode == "sse" {
        assert!(protocol.starts_with("2025-"), "{mode}: {client}");
    } else {
        assert_eq!(
            protocol, MODERN,
            "{mode} must end up in the 2026-07-28 era: {client}"
        );
    }
}

/// Python SDK 2.x clients of every mode at once through one proxy to `mcp-server-time`: the
/// `auto` and pinned ones end up in the 2026-07-28 era, the 2025 ones (Streamable and
/// legacy SSE) keep theirs, and each gets its own timezone back although all send the same
/// ids.
fn python_sdk_auto_and_pinned_beside_2025_clients(target: Target) {
    let Some(python) = python() else { return };
    let server = mcp_server_time(&python);
    let p = Proxy::builder(target)
        .backend([server.display().to_string()])
        .start();
    // Alone first: the very first request of an `auto` client is `server/discover`.
    for mode in ["auto", MODERN] {
        let one = python_clients(
            &python,
            &p,
            "get_current_time",
            &[(mode, json!({"timezone": "UTC"}))],
        );
        assert_era(&one[0], mode);
        // A pinned client skips discover, so only `auto` learns the server's name up front.
        if mode == "auto" {
            assert_eq!(one[0]["server"], "mcp-time", "{}", one[0]);
        }
        let text = one[0]["texts"][0].as_str().unwrap_or_default();
        time_check("get_current_time", &json!({"timezone": "UTC"}), text).unwrap();
    }
    let clients = [
        ("auto", "Asia/Tokyo"),
        ("legacy", "Europe/Paris"),
        (MODERN, "America/New_York"),
        ("sse", "Africa/Cairo"),
        ("auto", "Asia/Kolkata"),
        (MODERN, "Europe/London"),
    ]
    .map(|(mode, zone)| (mode, json!({"timezone": zone})));
    let all = python_clients(&python, &p, "get_current_time", &clients);
    for (client, (mode, args)) in all.iter().zip(&clients) {
        assert_era(client, mode);
        let text = client["texts"][0].as_str().unwrap_or_default();
        if let Err(e) = time_check("get_current_time", args, text) {
            panic!("{mode} got someone else's answer: {e}");
        }
    }
    // The 2025 clients' sessions end as they leave (an SSE stream's end is seen a moment
    // later); the modern clients never held one.
    wait_until("every session ended", WAIT, || {
        let (_, health) = p.health();
        (health["sessions"] == json!(0)).then_some(())
    });
}

/// The Python SDK 2.x against `server-everything` (a Node backend that declares `logging`),
/// in `auto` mode and pinned, beside a 2025 client.
fn python_sdk_to_server_everything(target: Target) {
    let Some(python) = python() else { return };
    let Some(node) = node_with("Python SDK against server-everything", &TS_PACKAGES) else {
        return;
    };
    let p = Proxy::builder(target).backend(everything(&node)).start();
    let clients = [("auto", "first"), (MODERN, "second"), ("legacy", "third")]
        .map(|(mode, m)| (mode, json!({"message": format!("{mode} {m}")})));
    let all = python_clients(&python, &p, "echo", &clients);
    for (client, (mode, args)) in all.iter().zip(&clients) {
        assert_era(client, mode);
        let text = client["texts"][0].as_str().unwrap_or_default();
        if let Err(e) = everything_check("echo", args, text) {
            panic!("{mode} got someone else's answer: {e}");
        }
    }
}

/// `server-everything` on stdio, from the pinned Node packages.
fn everything(node: &Node) -> [String; 3] {
    let script = node
        .dir
        .join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    [
        "node".to_owned(),
        script.display().to_string(),
        "stdio".to_owned(),
    ]
}

/// Whether `text` is the right first text of `tool` called with `args`.
type Check = fn(&str, &Value, &str) -> Result<(), String>;

fn time_check(tool: &str, args: &Value, text: &str) -> Result<(), String> {
    let time: Value = serde_json::from_str(text).map_err(|e| format!("not JSON ({e}): {text}"))?;
    if tool != "get_current_time"
        || time["timezone"] != args["timezone"]
        || !time["datetime"].is_string()
    {
        return Err(format!("{tool} for {}: {text}", args["timezone"]));
    }
    Ok(())
}

fn everything_check(tool: &str, args: &Value, text: &str) -> Result<(), String> {
    let want = match tool {
        "echo" => format!("Echo: {}", args["message"].as_str().unwrap_or_default()),
        "get-sum" => {
            let (a, b) = (
                args["a"].as_i64().unwrap_or(0),
                args["b"].as_i64().unwrap_or(0),
            );
            format!("The sum of {a} and {b} is {}.", a + b)
        }
        _ => return Err(format!("no such tool {tool}")),
    };
    if text != want {
        return Err(format!("{tool} {args}: want {want:?}, got {text:?}"));
    }
    Ok(())
}

/// One TypeScript client of `modern-client.mjs`: its name, mode (`legacy` or a pinned
/// version), and calls.
struct TsClient {
    name: &'static str,
    mode: &'static str,
    calls: Vec<(&'static str, Value)>,
}

/// Runs the TypeScript SDK clients all at once on `/mcp` and checks each one: its era, its
/// results in order, and on the wire every request answered exactly once under its own id
/// and nothing else received. Returns the reports.
fn ts_clients(node: &Node, proxy: &Proxy, clients: &[TsClient], check: Check) -> Vec<Value> {
    let spec = json!({"clients": clients.iter().map(|c| json!({
        "name": c.name,
        "mode": c.mode,
        "calls": c.calls.iter().map(|(tool, args)| json!({"tool": tool, "arguments": args})).collect::<Vec<_>>(),
    })).collect::<Vec<_>>()});
    let script = node.file("modern-client.mjs");
    let run = node.spawn(
        "node",
        [
            script.display().to_string(),
            format!("http://{}/mcp", proxy.addr),
            spec.to_string(),
        ],
        proxy.dir().path(),
        "ts-modern",
    );
    let out = run.wait(TS_TIMEOUT);
    assert!(
        out.status.success(),
        "the TypeScript SDK clients failed ({}):\n{}\n--- proxy log ---\n{}",
        out.status,
        out.transcript(),
        proxy.log()
    );
    let report: Value = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", out.transcript()));
    let got = report["clients"].as_array().cloned().unwrap_or_default();
    assert_eq!(got.len(), clients.len(), "{report}");
    for (report, client) in got.iter().zip(clients) {
        check_ts_client(report, client, check);
    }
    got
}

fn check_ts_client(report: &Value, client: &TsClient, check: Check) {
    let name = client.name;
    assert_eq!(
        report["errors"],
        json!([]),
        "{name}: the SDK reported errors: {report}"
    );
    let modern = client.mode != "legacy";
    let era = report["protocolVersion"].as_str().unwrap_or_default();
    if modern {
        assert_eq!(era, MODERN, "{name}: {report}");
        assert_eq!(
            report["sessionId"],
            Value::Null,
            "{name}: a modern client has no session"
        );
    } else {
        assert!(era.starts_with("2025-"), "{name}: {report}");
        assert!(report["sessionId"].is_string(), "{name}: {report}");
    }
    let results = report["results"].as_array().expect("results");
    assert_eq!(results.len(), client.calls.len(), "{name}: {report}");
    for (got, (tool, args)) in results.iter().zip(&client.calls) {
        assert_ne!(got["isError"], true, "{name}: {tool} {args}: {got}");
        let text = got["content"][0]["text"].as_str().unwrap_or_default();
        if let Err(e) = check(tool, args, text) {
            panic!("{name} got a wrong answer: {e}");
        }
    }

    // Keyed by the id's JSON text: the TypeScript SDK's discover probe has a string id.
    let sent = report["sent"].as_array().expect("sent");
    let requests: BTreeMap<String, &Value> = sent
        .iter()
        .filter(|m| m.get("method").is_some() && m.get("id").is_some())
        .map(|m| (m["id"].to_string(), m))
        .collect();
    let want_first = if modern {
        "server/discover"
    } else {
        "initialize"
    };
    assert_eq!(
        sent.first().map(|m| &m["method"]),
        Some(&json!(want_first)),
        "{name}: {sent:?}"
    );
    assert!(
        requests.contains_key("0"),
        "{name}: ids from 0, colliding with the other clients': {sent:?}"
    );
    let mut answered = BTreeSet::new();
    for m in report["received"].as_array().expect("received") {
        let id = m["id"].to_string();
        let request = requests
            .get(&id)
            .unwrap_or_else(|| panic!("{name} got an answer to no request of its own: {m}"));
        assert!(
            answered.insert(id.clone()),
            "{name}: two answers to id {id}: {m}"
        );
        assert!(m.get("result").is_some(), "{name}: {request} failed: {m}");
        if request["method"] == "tools/call" {
            let p = &request["params"];
            let text = m["result"]["content"][0]["text"]
                .as_str()
                .unwrap_or_default();
            if let Err(e) = check(
                p["name"].as_str().unwrap_or_default(),
                &p["arguments"],
                text,
            ) {
                panic!("{name} got someone else's answer under id {id} on the wire: {e}");
            }
        }
        if modern {
            assert_modern_result(name, &request["method"], &m["result"]);
        }
    }
    assert_eq!(
        answered.len(),
        requests.len(),
        "{name}: unanswered requests: {report}"
    );
}

/// What SPEC 13 adds to a forwarded modern result, as a modern client receives it.
fn assert_modern_result(name: &str, method: &Value, result: &Value) {
    if method == "server/discover" {
        assert_discover(result);
        return;
    }
    assert_eq!(
        result["resultType"], "complete",
        "{name}: {method}: {result}"
    );
    assert!(
        result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"].is_string(),
        "{name}: {method}: the backend's serverInfo: {result}"
    );
    if method == "tools/list" {
        assert_eq!(result["ttlMs"], 0, "{name}: {result}");
        assert_eq!(result["cacheScope"], "private", "{name}: {result}");
    }
}

/// `server/discover`'s answer (SPEC 13), for any backend.
fn assert_discover(result: &Value) {
    assert_eq!(result["resultType"], "complete", "{result}");
    assert_eq!(result["supportedVersions"], json!(SUPPORTED), "{result}");
    assert_eq!(result["ttlMs"], 60000, "{result}");
    assert_eq!(result["cacheScope"], "public", "{result}");
    assert!(result["capabilities"].is_object(), "{result}");
    assert!(
        result["capabilities"].get("logging").is_none(),
        "logging is never offered: {result}"
    );
    assert!(
        result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"].is_string(),
        "{result}"
    );
}

/// The TypeScript SDK 2.x pinned to 2026-07-28, two clients, beside a 2025 TypeScript
/// client, all calling `mcp-server-time` at once with the same ids.
fn ts_sdk_pinned_beside_a_2025_client_on_mcp_server_time(target: Target) {
    let Some(node) = node_with("TypeScript SDK 2.x interop", &TS_PACKAGES) else {
        return;
    };
    let Some(python) = python() else { return };
    let server = mcp_server_time(&python);
    let _turn = switchboard_tests::node::one_at_a_time();
    let p = Proxy::builder(target)
        .backend([server.display().to_string()])
        .start();
    let clients = [
        (
            "modern-a",
            MODERN,
            ["Asia/Tokyo", "Europe/Paris", "Africa/Cairo"],
        ),
        (
            "legacy",
            "legacy",
            ["UTC", "America/New_York", "Australia/Sydney"],
        ),
        (
            "modern-b",
            MODERN,
            ["America/Sao_Paulo", "Asia/Kolkata", "Europe/London"],
        ),
    ]
    .map(|(name, mode, zones)| TsClient {
        name,
        mode,
        calls: zones
            .map(|z| ("get_current_time", json!({"timezone": z})))
            .to_vec(),
    });
    for r in ts_clients(&node, &p, &clients, time_check) {
        assert_eq!(r["server"]["name"], "mcp-time", "{r}");
        let tools = r["tools"].as_array().expect("tools");
        assert!(tools.contains(&json!("get_current_time")), "{r}");
    }
}

/// The same against `server-everything`, whose `logging` capability a modern client must
/// not be offered.
fn ts_sdk_pinned_beside_a_2025_client_on_server_everything(target: Target) {
    let Some(node) = node_with("TypeScript SDK 2.x interop", &TS_PACKAGES) else {
        return;
    };
    let _turn = switchboard_tests::node::one_at_a_time();
    let p = Proxy::builder(target).backend(everything(&node)).start();
    let calls = |tag: &str, base: i64| {
        vec![
            ("echo", json!({"message": format!("{tag} one")})),
            ("get-sum", json!({"a": base, "b": 1})),
            ("echo", json!({"message": format!("{tag} two")})),
        ]
    };
    let clients = [
        TsClient {
            name: "modern-a",
            mode: MODERN,
            calls: calls("modern-a", 10),
        },
        TsClient {
            name: "legacy",
            mode: "legacy",
            calls: calls("legacy", 20),
        },
        TsClient {
            name: "modern-b",
            mode: MODERN,
            calls: calls("modern-b", 30),
        },
    ];
    for r in ts_clients(&node, &p, &clients, everything_check) {
        let tools = r["tools"].as_array().expect("tools");
        assert!(tools.contains(&json!("get-sum")), "{r}");
    }
}

/// A modern request's body: `params` with the revision's required `_meta` (`version` as
/// its protocol version) added.
fn modern_body(id: u64, method: &str, mut params: Value, version: &str) -> String {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": version,
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

/// POSTs a modern request to `/mcp` with the headers the revision requires (`Mcp-Name` from
/// `name`, when given).
fn modern_post(
    proxy: &Proxy,
    method: &str,
    name: Option<&str>,
    version: &str,
    body: &str,
) -> Answer {
    let mut headers = vec![("MCP-Protocol-Version", version), ("Mcp-Method", method)];
    headers.extend(name.map(|n| ("Mcp-Name", n)));
    post(proxy.addr, "/mcp", &headers, body)
}

/// A refusal as a JSON body: its status and JSON-RPC error.
fn refusal(answer: Answer) -> (u16, Value, Value) {
    let Answer::Whole(r) = answer else {
        panic!("a refusal is a JSON body, not a stream")
    };
    let body = r.json();
    (r.status, body["id"].clone(), body["error"].clone())
}

/// SPEC 13 on the real binary, on the wire: `server/discover` answered by the proxy, a
/// forwarded call changed as the revision requires, the refusals in their order's codes,
/// and 405 for a modern GET; no session is ever made.
fn modern_requests_on_the_wire(target: Target) {
    let p = Proxy::builder(target).start();
    // The very first request of a pinned client is no discover: its result still names the
    // backend.
    let params = json!({"name": "echo", "arguments": {"text": "modern hello"}});
    let call = modern_body(2, "tools/call", params.clone(), MODERN);
    let (_, answer) = modern_post(&p, "tools/call", Some("echo"), MODERN, &call).response();
    assert_eq!(answer["id"], 2, "{answer}");
    let result = &answer["result"];
    assert_eq!(result["content"][0]["text"], "modern hello", "{answer}");
    assert_modern_result("raw", &json!("tools/call"), result);

    let discover = modern_body(1, "server/discover", json!({}), MODERN);
    let (_, result) = modern_post(&p, "server/discover", None, MODERN, &discover).response();
    assert_eq!(result["id"], 1, "{result}");
    assert_discover(&result["result"]);
    let info = &result["result"]["_meta"]["io.modelcontextprotocol/serverInfo"];
    assert_eq!(info["name"], "switchboard-demo", "{result}");

    // A name header may be written in base64; given twice it is a mismatch.
    let headers = [
        ("MCP-Protocol-Version", MODERN),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "=?base64?ZWNobw==?="),
    ];
    let (_, answer) = post(p.addr, "/mcp", &headers, &call).response();
    assert_eq!(
        answer["result"]["content"][0]["text"], "modern hello",
        "{answer}"
    );
    let twice = [
        ("MCP-Protocol-Version", MODERN),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "echo"),
        ("mcp-name", "echo"),
    ];
    let (status, _, error) = refusal(post(p.addr, "/mcp", &twice, &call));
    assert_eq!((status, &error["code"]), (400, &json!(-32020)), "{error}");
    // The version given twice, even with one value, is a mismatch too.
    let version_twice = [
        ("MCP-Protocol-Version", MODERN),
        ("mcp-protocol-version", MODERN),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "echo"),
    ];
    let (status, _, error) = refusal(post(p.addr, "/mcp", &version_twice, &call));
    assert_eq!((status, &error["code"]), (400, &json!(-32020)), "{error}");
    // Modern by its `_meta` alone, so its missing headers are a mismatch.
    let (status, _, error) = refusal(post(p.addr, "/mcp", &[], &call));
    assert_eq!((status, &error["code"]), (400, &json!(-32020)), "{error}");

    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
    }}});
    let answer = modern_post(
        &p,
        "notifications/initialized",
        None,
        MODERN,
        &note.to_string(),
    );
    assert_eq!(answer.status(), 202, "a modern notification is absorbed");

    let old = modern_body(3, "tools/call", params.clone(), "2025-01-01");
    let (status, id, error) = refusal(modern_post(
        &p,
        "tools/call",
        Some("echo"),
        "2025-01-01",
        &old,
    ));
    assert_eq!(
        (status, id, &error["code"]),
        (400, json!(3), &json!(-32022)),
        "{error}"
    );
    assert_eq!(
        error["data"],
        json!({"supported": SUPPORTED, "requested": "2025-01-01"}),
        "{error}"
    );

    let (status, id, error) = refusal(modern_post(&p, "tools/call", Some("add"), MODERN, &call));
    assert_eq!(
        (status, id, &error["code"]),
        (400, json!(2), &json!(-32020)),
        "Mcp-Name is not params.name: {error}"
    );

    let mut bare: Value = serde_json::from_str(&call).unwrap();
    bare["id"] = json!(4);
    bare["params"]["_meta"]
        .as_object_mut()
        .unwrap()
        .remove("io.modelcontextprotocol/clientCapabilities");
    let (status, id, error) = refusal(modern_post(
        &p,
        "tools/call",
        Some("echo"),
        MODERN,
        &bare.to_string(),
    ));
    assert_eq!(
        (status, id, &error["code"]),
        (400, json!(4), &json!(-32602)),
        "{error}"
    );

    let init = modern_body(6, "initialize", json!({"protocolVersion": MODERN}), MODERN);
    let (status, id, error) = refusal(modern_post(&p, "initialize", None, MODERN, &init));
    assert_eq!(
        (status, id, &error["code"]),
        (404, json!(6), &json!(-32601)),
        "{error}"
    );

    let ping = modern_body(5, "ping", json!({}), MODERN);
    let (status, id, error) = refusal(modern_post(&p, "ping", None, MODERN, &ping));
    assert_eq!(
        (status, id, &error["code"]),
        (404, json!(5), &json!(-32601)),
        "{error}"
    );

    let get = p.request(
        "GET",
        "/mcp",
        &[
            ("Accept", "text/event-stream"),
            ("MCP-Protocol-Version", MODERN),
        ],
        Body::None,
    );
    assert_eq!(get.status, 405, "{}", get.text());
    let delete = p.request(
        "DELETE",
        "/mcp",
        &[("MCP-Protocol-Version", MODERN)],
        Body::None,
    );
    assert_eq!(delete.status, 405, "{}", delete.text());

    let (_, health) = p.health();
    assert_eq!(
        health["sessions"],
        json!(0),
        "a modern request makes no session: {health}"
    );
}

/// `--modern off`: a modern request gets §7's plain -32600, so a dual-era client falls back.
fn modern_off_keeps_the_2025_answer(target: Target) {
    let p = Proxy::builder(target).args(["--modern", "off"]).start();
    let discover = modern_body(7, "server/discover", json!({}), MODERN);
    let (status, _, error) = refusal(modern_post(&p, "server/discover", None, MODERN, &discover));
    assert_eq!((status, &error["code"]), (400, &json!(-32600)), "{error}");
}

/// §6 for modern requests on the real binary: two modern clients, a modern request that
/// names a 2025 session's `Mcp-Session-Id` (ignored on a modern request), and that 2025
/// session itself, all send the same ids at once to a backend that answers them out of
/// order; each POST gets exactly its own answers, and the backend saw each modern request
/// under a routing key of its own, never the session's.
fn modern_and_2025_requests_with_colliding_ids_stay_isolated(target: Target) {
    let p = Proxy::builder(target).backend([BACKEND]).record().start();
    let session = McpSession::start(&p, None);
    let gate = p.dir().file("gate");
    let ids = [1u64, 2, 3];
    let who = ["modern-a", "modern-b", "modern-with-sid", "session"];
    let sid = session.sid.clone();
    let answers: Vec<(String, u64, Value)> = std::thread::scope(|scope| {
        let mut calls = Vec::new();
        for (i, id) in ids.iter().copied().enumerate() {
            for (n, who) in who.iter().copied().enumerate() {
                // Later ids and later clients answer sooner: the backend reorders them all.
                let ms = ((ids.len() - i) * 40 + (who.len() - n) * 10) as u64;
                let args = json!({"ms": ms, "who": who, "id": id, "gate": gate});
                let params = json!({"name": "delay", "arguments": args});
                let (session, sid, addr) = (&session, sid.as_str(), p.addr);
                calls.push(scope.spawn(move || {
                    let answer = match who {
                        "session" => {
                            let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
                            session.post(&body.to_string())
                        }
                        _ => {
                            let body = modern_body(id, "tools/call", params, MODERN);
                            let mut headers = vec![
                                ("MCP-Protocol-Version", MODERN),
                                ("Mcp-Method", "tools/call"),
                                ("Mcp-Name", "delay"),
                            ];
                            if who == "modern-with-sid" {
                                headers.push(("Mcp-Session-Id", sid));
                            }
                            post(addr, "/mcp", &headers, &body)
                        }
                    };
                    (who.to_owned(), id, answer.response().1)
                }));
            }
        }
        wait_until("every delayed call at the backend", WAIT, || {
            let sent = p
                .recorded()
                .iter()
                .filter(|l| l.contains(r#""delay""#))
                .count();
            (sent == ids.len() * who.len()).then_some(())
        });
        std::fs::write(&gate, b"open").expect("open the gate");
        calls
            .into_iter()
            .map(|c| c.join().expect("a caller panicked"))
            .collect()
    });
    let mut routed = BTreeSet::new();
    for (who, id, answer) in &answers {
        assert_eq!(answer["id"], *id, "{who}: {answer}");
        let args = echoed_args(answer);
        assert_eq!(
            (&args["who"], &args["id"]),
            (&json!(who), &json!(id)),
            "{who} id {id} got someone else's answer: {answer}"
        );
        let seen = backend_seen_id(answer);
        let seen = seen
            .as_str()
            .unwrap_or_else(|| panic!("{who}: routed id {seen}"));
        assert_eq!(
            seen.starts_with(&format!("{sid}|")),
            who == "session",
            "{who}: the backend saw id {seen}"
        );
        assert!(
            routed.insert(seen.to_owned()),
            "{who}: routed id {seen} twice"
        );
    }
    assert_eq!(answers.len(), ids.len() * who.len());
}

/// Closing the connection that waits for a modern request's JSON answer cancels it at the
/// backend (SPEC 13: the hang-up is the cancel), under the id the backend saw.
fn a_modern_hang_up_cancels_at_the_backend(target: Target) {
    use std::io::Write;
    let p = Proxy::builder(target).backend([BACKEND]).record().start();
    let params = json!({"name": "delay", "arguments": {"ms": 60_000, "who": "hangs up"}});
    let body = modern_body(9, "tools/call", params, MODERN);
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: application/json\r\n\
MCP-Protocol-Version: {MODERN}\r\nMcp-Method: tools/call\r\nMcp-Name: delay\r\nContent-Length: {}\r\n\r\n",
        p.addr,
        body.len()
    );
    let mut conn = std::net::TcpStream::connect(p.addr).expect("connect");
    conn.write_all(format!("{head}{body}").as_bytes())
        .expect("write");
    let line = p.wait_recorded("the delayed call", |l| l.contains("hangs up"));
    let seen: Value = serde_json::from_str(&line).expect("a JSON line");
    drop(conn);
    let cancel = p.wait_recorded("notifications/cancelled", |l| {
        l.contains("notifications/cancelled")
    });
    let cancel: Value = serde_json::from_str(&cancel).expect("a JSON line");
    assert_eq!(cancel["params"]["requestId"], seen["id"], "{cancel}");
}

/// SPEC 13's audit of modern requests: no session, the Streamable transport, the revision's
/// protocol version; `server/discover` is an `mcp_request`.
fn modern_requests_are_audited(target: Target) {
    let dir = TempDir::new("modern-audit");
    let log = dir.file("audit.jsonl");
    let p = Proxy::builder(target)
        .args(["--audit-log".to_owned(), log.display().to_string()])
        .start();
    let discover = modern_body(1, "server/discover", json!({}), MODERN);
    modern_post(&p, "server/discover", None, MODERN, &discover).response();
    let params = json!({"name": "echo", "arguments": {"text": "audited"}});
    let call = modern_body(2, "tools/call", params, MODERN);
    modern_post(&p, "tools/call", Some("echo"), MODERN, &call).response();
    let of = |events: &[Value], method: &str| {
        events
            .iter()
            .find(|e| e["target"]["method"] == method)
            .cloned()
    };
    let events = wait_until("both modern requests audited", WAIT, || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let events: Vec<Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        (of(&events, "server/discover").is_some() && of(&events, "tools/call").is_some())
            .then_some(events)
    });
    for (method, kind) in [
        ("server/discover", "mcp_request"),
        ("tools/call", "mcp_tool_call"),
    ] {
        let e = of(&events, method).expect("audited");
        assert_eq!(e["type"], kind, "{e}");
        assert_eq!(e["source"]["extra"]["session_id"], Value::Null, "{e}");
        assert_eq!(
            e["metadata"]["extra"]["transport"], "streamable-http",
            "{e}"
        );
        assert_eq!(e["metadata"]["extra"]["protocol_version"], MODERN, "{e}");
    }
}

/// The next message of a modern stream (its events may carry no id: it has no resumption).
fn next_message(events: &mut Events) -> Option<Value> {
    loop {
        match events.next_frame(WAIT) {
            Frame::Event { data, .. } if !data.is_empty() => {
                return Some(serde_json::from_str(&data).expect("a JSON event"))
            }
            Frame::Event { .. } | Frame::Comment(_) => continue,
            Frame::Timeout | Frame::Closed => return None,
        }
    }
}

/// `subscriptions/listen` (SPEC 13) on the real binary, sharing a resource subscription with
/// a 2025 session: the acknowledgement names the listen's id and the URIs it got; an update
/// of its URI reaches it with that id; closing it unsubscribes only the URI no one else holds.
fn a_listen_stream_shares_subscriptions_with_a_session(target: Target) {
    const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
    let p = Proxy::builder(target).backend([BACKEND]).record().start();
    let session = McpSession::start(&p, None);
    let (shared, own) = ("test://switchboard/shared", "test://switchboard/own");
    let subscribe = json!({"jsonrpc": "2.0", "id": 1, "method": "resources/subscribe", "params": {"uri": shared}});
    let (_, r) = session.post(&subscribe.to_string()).response();
    assert!(r.get("result").is_some(), "{r}");

    let mut listen: Value = serde_json::from_str(&modern_body(
        0,
        "subscriptions/listen",
        json!({"notifications": {"resourceSubscriptions": [shared, own]}}),
        MODERN,
    ))
    .unwrap();
    listen["id"] = json!("L1");
    let headers = [
        ("MCP-Protocol-Version", MODERN),
        ("Mcp-Method", "subscriptions/listen"),
    ];
    let Answer::Stream(mut events) = post(p.addr, "/mcp", &headers, &listen.to_string()) else {
        panic!("subscriptions/listen is answered with a stream")
    };
    let ack = next_message(&mut events).expect("the acknowledgement");
    assert_eq!(
        ack["method"], "notifications/subscriptions/acknowledged",
        "{ack}"
    );
    assert_eq!(ack["params"]["_meta"][SUBSCRIPTION_ID], "L1", "{ack}");
    // A set of uris: the acknowledgement lists them in its own order.
    let mut acknowledged: Vec<&str> = (ack["params"]["notifications"]["resourceSubscriptions"])
        .as_array()
        .map(|uris| uris.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    acknowledged.sort_unstable();
    let mut asked = [shared, own];
    asked.sort_unstable();
    assert_eq!(acknowledged, asked, "{ack}");
    let sent = |method: &str, uri: &str| {
        let quoted = format!("\"{uri}\"");
        p.recorded()
            .iter()
            .filter(|l| l.contains(&format!("\"{method}\"")) && l.contains(&quoted))
            .count()
    };
    assert_eq!(sent("resources/subscribe", own), 1, "the listen's own uri");

    let updated = json!({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": own}});
    session.call(json!(2), "emit", json!({"lines": [updated]}));
    let m = next_message(&mut events).expect("the update");
    assert_eq!(m["method"], "notifications/resources/updated", "{m}");
    assert_eq!(m["params"]["uri"], own, "{m}");
    assert_eq!(m["params"]["_meta"][SUBSCRIPTION_ID], "L1", "{m}");

    drop(events);
    p.wait_recorded("the listen's uri released", |l| {
        l.contains("\"resources/unsubscribe\"") && l.contains(own)
    });
    // A barrier through the backend: the shared uri, still the session's, stayed subscribed.
    session.call(json!(3), "echo", json!({}));
    assert_eq!(
        sent("resources/unsubscribe", shared),
        0,
        "the session still holds {shared}"
    );
}

suite!(
    modern_requests_on_the_wire,
    modern_and_2025_requests_with_colliding_ids_stay_isolated,
    a_modern_hang_up_cancels_at_the_backend,
    modern_requests_are_audited,
    a_listen_stream_shares_subscriptions_with_a_session,
    modern_off_keeps_the_2025_answer,
    python_sdk_auto_and_pinned_beside_2025_clients,
    python_sdk_to_server_everything,
    ts_sdk_pinned_beside_a_2025_client_on_mcp_server_time,
    ts_sdk_pinned_beside_a_2025_client_on_server_everything,
);
