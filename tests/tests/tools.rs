//! SPEC 16's filtering and renaming end to end: the real `@modelcontextprotocol/server-everything`
//! behind each binary, with an operator's override file in ToolHive's format (`echo` shown as
//! `say` with a new description, `get-sum` as `add`) and `--tools say --tools add --tools
//! get-tiny-image`:
//! - the Python SDK 2.x (`tests/python/tools_client.py`: legacy `/sse`, a 2025 Streamable
//!   session, `auto` and pinned 2026-07-28) and the TypeScript SDK 2.x
//!   (`tests/node/tools-client.mjs`: pinned 2026-07-28 and a 2025 session) list exactly the
//!   shown tools, each the backend's own tool with only its name (and description) changed,
//!   and call `say` and `add` by those names;
//! - a call of any other name (the renamed tool's backend name, a tool outside `--tools`, a case
//!   variant, a name the backend lacks) is -32602 `Unknown tool: <name>` from the proxy (a
//!   2025 answer with HTTP 200 or on the session's stream, a 2026-07-28 one with 400) on `/sse`,
//!   `/mcp` and 2026-07-28, and never reaches the backend (read from a record of its stdin,
//!   written by a `--require`d preload as in `tasks.rs`);
//! - a Cedar policy written for the backend's names still decides: alice (permitted `echo`)
//!   calls `say`, bob gets -32003 and does not see `say` listed, the backend name `echo` stays
//!   unknown to both;
//! - a SIGHUP whose `--config` changes `tools` or the override file sends
//!   `notifications/tools/list_changed` to a legacy session and a Streamable GET stream; a bad
//!   override file keeps the old view (and sends nothing), as does a reload that changes no tool;
//! - an override file with an entry naming nothing, or two tools given one shown name, stops
//!   the proxy at start with the reason.
//!
//! Needs `node` and the Node packages (`SWITCHBOARD_NODE_DIR`, else `tests/node`) and, for the
//! Python clients, `SWITCHBOARD_PYTHON`; without them the tests skip loudly, or fail when
//! `CI=true`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use switchboard_tests::mcp::{post, Answer};
use switchboard_tests::node::{node_with, one_at_a_time, recorded_everything, Node, EVERYTHING};
use switchboard_tests::python::{python, run_script};
use switchboard_tests::{
    open_session, suite, Events, Frame, McpSession, Proxy, Session, Target, TempDir, WAIT,
};

const MODERN: &str = "2026-07-28";
const ALICE: (&str, &str) = ("alice", "alice-secret-token-0123");
const BOB: (&str, &str) = ("bob", "bob-secret-token-456789");

/// The operator's file, in ToolHive's format.
const OVERRIDE: &str = r#"{"toolsOverride": {"echo": {"name": "say", "description": "Says it back."}, "get-sum": {"name": "add"}}}"#;
/// `--tools`, shown names.
const SHOWN: [&str; 3] = ["say", "add", "get-tiny-image"];
/// Names that must never reach the backend: the renamed tools' backend names, a tool outside
/// `--tools`, case variants of a shown name and of a backend name, a name no tool has.
const HIDDEN: [&str; 6] = ["echo", "get-sum", "get-env", "Say", "ECHO", "no-such-tool"];

/// Marks every call that must never reach the backend (in its arguments).
const MARK: &str = "MARK-HIDDEN";

/// A proxy in front of server-everything with a record of what the backend reads.
struct Everything {
    proxy: Proxy,
    record: PathBuf,
    scratch: TempDir,
}

impl Everything {
    /// Started with `args`; `files` are written to the scratch folder first (each arg may
    /// name one as `{dir}/NAME`).
    fn start(
        target: Target,
        node: &Node,
        tokens: &[(&str, &str)],
        files: &[(&str, &str)],
        args: &[&str],
    ) -> Everything {
        let scratch = TempDir::new("tools-backend");
        for (name, text) in files {
            write(&scratch.file(name), text);
        }
        let (backend, (key, value), record) = recorded_everything(node, scratch.path());
        let dir = scratch.path().display().to_string();
        let proxy = Proxy::builder(target)
            .tokens(tokens)
            .args(args.iter().map(|a| a.replace("{dir}", &dir)))
            .env(key, value)
            .backend(backend)
            .start();
        Everything {
            proxy,
            record,
            scratch,
        }
    }

    /// The operator's view: the override file and `--tools say --tools add --tools
    /// get-tiny-image`, plus `extra` flags.
    fn shown(target: Target, node: &Node, tokens: &[(&str, &str)], extra: &[&str]) -> Everything {
        let mut args = vec!["--tools-override", "{dir}/override.json"];
        for tool in SHOWN {
            args.extend(["--tools", tool]);
        }
        args.extend_from_slice(extra);
        Everything::start(target, node, tokens, &[("override.json", OVERRIDE)], &args)
    }

    /// Everything the backend has read so far.
    fn recorded(&self) -> String {
        std::fs::read_to_string(&self.record).unwrap_or_default()
    }

    /// The `tools/call` lines the backend read.
    fn recorded_calls(&self) -> Vec<Value> {
        (self.recorded().lines())
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|m| m["method"] == "tools/call")
            .collect()
    }

    /// Nothing marked as hidden reached the backend, and no call under a shown name that is
    /// not the backend's.
    fn assert_nothing_hidden_forwarded(&self) {
        let calls = self.recorded_calls();
        let leaked: Vec<&Value> = (calls.iter())
            .filter(|m| m.to_string().contains(MARK) || ["say", "add"].contains(&tool_of(m)))
            .collect();
        assert!(
            leaked.is_empty(),
            "calls that must stay at the proxy reached the backend: {leaked:?}"
        );
    }

    fn unknown_tool_rejections(&self) -> f64 {
        (self.proxy)
            .metric(r#"switchboard_rejections_total{reason="unknown_tool"}"#)
            .unwrap_or(0.0)
    }
}

fn tool_of(m: &Value) -> &str {
    m["params"]["name"].as_str().unwrap_or_default()
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

fn everything_node(what: &str) -> Option<Node> {
    node_with(what, &[EVERYTHING, "@modelcontextprotocol/client"])
}

/// How a raw caller reaches the proxy.
enum Via {
    /// `GET /sse` and POSTs to its endpoint; the answers on the stream.
    Legacy(Box<Session>),
    /// A 2025 `/mcp` session.
    Streamable(McpSession),
    /// 2026-07-28 requests (no session).
    Modern(std::net::SocketAddr),
}

/// One caller on the wire, with its token.
struct Caller {
    name: &'static str,
    token: Option<&'static str>,
    via: Via,
    next_id: u64,
}

impl Caller {
    /// A legacy session, a Streamable session and 2026-07-28 requests, all with `token`.
    /// The backend is initialized first by a session of its own, so that what
    /// server-everything sends once it is initialized (`tools/list_changed`: it registers
    /// more tools then) has passed before these sessions open.
    fn all(p: &Proxy, token: Option<&'static str>) -> [Caller; 3] {
        let first = McpSession::start(p, token);
        let mut modern = Caller {
            name: "warm-up",
            token,
            via: Via::Modern(p.addr),
            next_id: 0,
        };
        // The backend answers in order: its notifications of the initialize came before this.
        modern.list();
        assert_eq!(first.delete().status, 204);
        let mut legacy = open_session(p, token);
        legacy.initialize();
        let streamable = McpSession::start(p, token);
        [
            ("sse", Via::Legacy(Box::new(legacy))),
            ("mcp", Via::Streamable(streamable)),
            (MODERN, Via::Modern(p.addr)),
        ]
        .map(|(name, via)| Caller {
            name,
            token,
            via,
            next_id: 100,
        })
    }

    fn is_modern(&self) -> bool {
        matches!(self.via, Via::Modern(_))
    }

    /// A request under a fresh id: the HTTP status it came with (a legacy POST's 202) and
    /// its response, asserted to be under that id.
    fn request(&mut self, method: &str, params: Value) -> (u16, Value) {
        self.request_named(method, params, None)
    }

    /// [`Caller::request`] with `Mcp-Name` given (a 2026-07-28 `tools/call` otherwise sends
    /// `params.name`).
    fn request_named(&mut self, method: &str, params: Value, name: Option<&str>) -> (u16, Value) {
        self.next_id += 1;
        let id = self.next_id;
        let mut body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let (status, answer) = match &mut self.via {
            Via::Legacy(s) => {
                let status = s.post(&body.to_string()).status;
                (status, s.expect_message(&format!("the answer to {method}")))
            }
            Via::Streamable(s) => whole(s.post(&body.to_string())),
            Via::Modern(addr) => {
                body["params"]["_meta"] = json!({
                    "io.modelcontextprotocol/protocolVersion": MODERN,
                    "io.modelcontextprotocol/clientCapabilities": {},
                });
                let auth = self.token.map(|t| format!("Bearer {t}"));
                let mut headers = vec![("MCP-Protocol-Version", MODERN), ("Mcp-Method", method)];
                headers.extend(auth.as_deref().map(|a| ("Authorization", a)));
                let name = name.or(body["params"]["name"].as_str()).map(str::to_owned);
                if method == "tools/call" {
                    headers.extend(name.as_deref().map(|n| ("Mcp-Name", n)));
                }
                whole(post(*addr, "/mcp", &headers, &body.to_string()))
            }
        };
        assert_eq!(answer["id"], id, "{}: {method}: {answer}", self.name);
        (status, answer)
    }

    /// The tools a `tools/list` shows (every page).
    fn list(&mut self) -> Vec<Value> {
        let mut tools = Vec::new();
        let mut params = json!({});
        for _ in 0..10 {
            let (_, m) = self.request("tools/list", params.clone());
            let result = &m["result"];
            assert!(result.is_object(), "{}: tools/list: {m}", self.name);
            tools.extend(result["tools"].as_array().cloned().unwrap_or_default());
            match result["nextCursor"].as_str() {
                Some(c) => params = json!({ "cursor": c }),
                None => return tools,
            }
        }
        panic!("{}: more than 10 pages of tools", self.name);
    }

    fn names(&mut self) -> Vec<String> {
        let mut names: Vec<String> = (self.list().iter())
            .map(|t| t["name"].as_str().unwrap_or_default().to_owned())
            .collect();
        names.sort();
        names
    }

    fn call(&mut self, tool: &str, args: Value) -> (u16, Value) {
        self.request("tools/call", json!({"name": tool, "arguments": args}))
    }

    /// `say` works: the backend's echo comes back.
    fn says(&mut self, text: &str) {
        let (status, m) = self.call("say", json!({ "message": text }));
        assert_eq!(status, self.ok_status(), "{}: say: {m}", self.name);
        assert_eq!(
            m["result"]["content"][0]["text"],
            format!("Echo: {text}"),
            "{}: say: {m}",
            self.name
        );
    }

    /// The status of a request the proxy forwards and the backend answers.
    fn ok_status(&self) -> u16 {
        match self.via {
            Via::Legacy(_) => 202,
            _ => 200,
        }
    }

    /// `m` is the proxy's `Unknown tool: <tool>`, with the status SPEC 13 and 16 give it.
    fn assert_unknown(&self, tool: &str, (status, m): (u16, Value)) {
        let want = if self.is_modern() {
            400
        } else {
            self.ok_status()
        };
        assert_eq!(status, want, "{}: {tool}: {m}", self.name);
        assert_eq!(
            m["error"],
            json!({"code": -32602, "message": format!("Unknown tool: {tool}")}),
            "{}: a call of {tool:?}: {m}",
            self.name
        );
    }

    /// Reads until a `notifications/tools/list_changed` arrives (legacy stream or GET
    /// stream; none for modern requests).
    fn expect_list_changed(&mut self, get: Option<&mut Events>) {
        let m = match (&mut self.via, get) {
            (Via::Legacy(s), _) => s.expect_message("tools/list_changed on the legacy stream"),
            (Via::Streamable(_), Some(get)) => next_event(get, "tools/list_changed on GET"),
            _ => return,
        };
        assert_eq!(
            m,
            json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}),
            "{}",
            self.name
        );
    }
}

/// The next message event of a GET stream (priming and comments skipped).
fn next_event(get: &mut Events, what: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match get.next_frame(left) {
            Frame::Event { data, .. } if !data.is_empty() => {
                return serde_json::from_str(&data).expect("a JSON event")
            }
            Frame::Event { .. } | Frame::Comment(_) => continue,
            Frame::Closed => panic!("{what}: the stream ended"),
            Frame::Timeout => panic!("{what}: nothing within {WAIT:?}"),
        }
    }
}

/// A POST's one response with its status (a stream's last message).
fn whole(answer: Answer) -> (u16, Value) {
    match answer {
        Answer::Whole(r) => {
            let body = serde_json::from_slice(&r.body)
                .unwrap_or_else(|e| panic!("{} not JSON ({e}): {}", r.status, r.text()));
            (r.status, body)
        }
        Answer::Stream(mut e) => {
            let status = e.head.status;
            let mut messages = (e.rest_until_closed(WAIT))
                .unwrap_or_else(|| panic!("an answer stream did not end within {WAIT:?}"));
            (
                status,
                messages.pop().expect("the stream carried the response"),
            )
        }
    }
}

/// The backend's own tools, by name, as a proxy without flags lists them.
fn backend_tools(target: Target, node: &Node) -> serde_json::Map<String, Value> {
    let plain = Everything::start(target, node, &[], &[], &[]);
    let [_, _, mut modern] = Caller::all(&plain.proxy, None);
    let tools = modern.list();
    (tools.into_iter())
        .map(|t| (t["name"].as_str().unwrap_or_default().to_owned(), t))
        .collect()
}

/// What clients must be shown for the backend's `tools`: `echo` as `say` with the new
/// description, `get-sum` as `add`, `get-tiny-image` as it is; every other field kept.
fn expected_view(tools: &serde_json::Map<String, Value>) -> Vec<Value> {
    for name in ["echo", "get-sum", "get-tiny-image", "get-env"] {
        assert!(
            tools.contains_key(name),
            "server-everything has no {name:?}: {:?}",
            tools.keys()
        );
    }
    let mut say = tools["echo"].clone();
    say["name"] = json!("say");
    say["description"] = json!("Says it back.");
    let mut add = tools["get-sum"].clone();
    add["name"] = json!("add");
    vec![say, add, tools["get-tiny-image"].clone()]
}

/// `tools` listed by a client, in name order, against the expected view, but for the fields
/// `dropped`, which the client's SDK leaves out of what it returns.
fn assert_view(who: &str, listed: &Value, expected: &[Value], dropped: &[&str]) {
    let mut listed = listed.as_array().cloned().unwrap_or_default();
    listed.sort_by_key(|t| t["name"].as_str().unwrap_or_default().to_owned());
    let mut expected = expected.to_vec();
    for tool in &mut expected {
        for field in dropped {
            tool.as_object_mut().map(|t| t.remove(*field));
        }
    }
    expected.sort_by_key(|t| t["name"].as_str().unwrap_or_default().to_owned());
    assert_eq!(
        Value::Array(listed),
        Value::Array(expected),
        "{who}: not the operator's view"
    );
}

/// The calls every SDK client makes: the shown names, then every hidden name.
fn sdk_calls() -> Vec<(String, Value)> {
    let mut calls = vec![
        ("say".to_owned(), json!({"message": "hello"})),
        ("add".to_owned(), json!({"a": 2, "b": 3})),
    ];
    calls.extend(HIDDEN.map(|t| (t.to_owned(), json!({ "message": MARK }))));
    calls
}

/// One SDK client's summary: the view, `say` and `add` answered by the backend, every hidden
/// name `Unknown tool` (the TypeScript SDK's message may carry a prefix).
fn assert_sdk_client(who: &str, client: &Value, expected: &[Value], dropped: &[&str]) {
    assert_view(who, &client["tools"], expected, dropped);
    let calls = client["calls"].as_array().expect("calls");
    assert_eq!(calls.len(), 2 + HIDDEN.len(), "{who}: {client}");
    assert_eq!(calls[0]["ok"], true, "{who}: {}", calls[0]);
    assert_eq!(calls[0]["texts"], json!(["Echo: hello"]), "{who}");
    assert_eq!(calls[1]["ok"], true, "{who}: {}", calls[1]);
    assert_eq!(
        calls[1]["texts"],
        json!(["The sum of 2 and 3 is 5."]),
        "{who}"
    );
    for (call, tool) in calls[2..].iter().zip(HIDDEN) {
        assert_eq!(call["ok"], false, "{who}: {tool}: {call}");
        assert_eq!(call["code"], -32602, "{who}: {tool}: {call}");
        let message = call["message"].as_str().unwrap_or_default();
        assert!(
            message.ends_with(&format!("Unknown tool: {tool}")),
            "{who}: {tool}: {call}"
        );
    }
}

/// The Python SDK 2.x in both eras (legacy `/sse`, a 2025 Streamable session, `auto`, pinned
/// 2026-07-28) and the TypeScript SDK 2.x (pinned 2026-07-28, a 2025 session) list exactly
/// the shown tools, each the backend's own with only its name and description changed, call
/// `say` and `add` by those names, and get `Unknown tool` for every other name, none of which
/// reaches the backend.
fn sdk_clients_see_and_call_the_shown_names(target: Target) {
    let Some(node) = everything_node("SPEC 16 with the SDK clients") else {
        return;
    };
    let Some(python) = python() else { return };
    let _turn = one_at_a_time();
    let expected = expected_view(&backend_tools(target, &node));
    let e = Everything::shown(target, &node, &[], &[]);
    let p = &e.proxy;

    let calls = sdk_calls();
    let modes = ["sse", "legacy", "auto", MODERN];
    let mut args = vec![
        format!("http://{}", p.addr),
        serde_json::to_string(&calls).expect("JSON"),
    ];
    args.extend(modes.map(str::to_owned));
    let out = run_script(&python, p, "tools_client.py", &args);
    let clients = out["clients"].as_array().expect("clients");
    assert_eq!(clients.len(), modes.len(), "{out}");
    for (client, mode) in clients.iter().zip(modes) {
        let protocol = client["protocol"].as_str().unwrap_or_default();
        match mode {
            "sse" | "legacy" => assert!(protocol.starts_with("2025-"), "{mode}: {client}"),
            _ => assert_eq!(protocol, MODERN, "{mode}: {client}"),
        }
        assert_sdk_client(&format!("Python {mode}"), client, &expected, &[]);
    }

    let spec = json!({
        "modes": [MODERN, "legacy"],
        "calls": calls.iter().map(|(t, a)| json!({"tool": t, "arguments": a})).collect::<Vec<_>>(),
    });
    let url = format!("http://{}/mcp", p.addr);
    let run = node.spawn(
        "node",
        [
            node.file("tools-client.mjs").display().to_string(),
            url,
            spec.to_string(),
        ],
        e.scratch.path(),
        "tools-client",
    );
    let done = run.wait(Duration::from_secs(90));
    assert!(done.status.success(), "{}", done.transcript());
    let out: Value = serde_json::from_str(done.stdout.trim())
        .unwrap_or_else(|err| panic!("not JSON ({err}): {}", done.transcript()));
    let clients = out["clients"].as_array().expect("clients");
    assert_eq!(clients[0]["protocolVersion"], MODERN, "{}", clients[0]);
    let legacy = clients[1]["protocolVersion"].as_str().unwrap_or_default();
    assert!(legacy.starts_with("2025-"), "{}", clients[1]);
    for (client, mode) in clients.iter().zip([MODERN, "legacy"]) {
        // In the 2026-07-28 era the TypeScript SDK's tool schema has no `execution` and strips
        // it (the proxy's raw 2026-07-28 list keeps it: hidden_names_never_reach_the_backend).
        let dropped: &[&str] = if mode == MODERN { &["execution"] } else { &[] };
        assert_sdk_client(&format!("TypeScript {mode}"), client, &expected, dropped);
    }

    // The backend saw each say and add under its own name, and nothing else.
    let backend_calls: Vec<String> = (e.recorded_calls().iter())
        .map(|m| tool_of(m).to_owned())
        .collect();
    let sdk_clients = modes.len() + 2;
    let mut want = vec!["echo".to_owned(); sdk_clients];
    want.extend(vec!["get-sum".to_owned(); sdk_clients]);
    let mut got = backend_calls.clone();
    got.sort();
    assert_eq!(got, want, "the backend's tools/call lines");
    e.assert_nothing_hidden_forwarded();
    assert_eq!(
        e.unknown_tool_rejections(),
        (sdk_clients * HIDDEN.len()) as f64
    );
}

/// On the wire, on `/sse`, `/mcp` and 2026-07-28: `tools/list` shows exactly the view; every
/// hidden name is -32602 `Unknown tool: <name>` from the proxy (200 or the session's stream in
/// a 2025 session, 400 for a 2026-07-28 request), counted, never forwarded; `say` reaches the
/// backend as `echo`; a 2026-07-28 `Mcp-Name` that is not the shown name is refused.
fn hidden_names_never_reach_the_backend(target: Target) {
    let Some(node) = everything_node("SPEC 16 on the wire") else {
        return;
    };
    let _turn = one_at_a_time();
    let e = Everything::shown(target, &node, &[], &[]);
    let mut callers = Caller::all(&e.proxy, None);
    for c in &mut callers {
        let listed = c.list();
        let mut names: Vec<&str> = (listed.iter())
            .map(|t| t["name"].as_str().unwrap_or_default())
            .collect();
        names.sort();
        assert_eq!(names, ["add", "get-tiny-image", "say"], "{}", c.name);
        // Renamed and redescribed, every other field of echo's kept.
        let say = listed.iter().find(|t| t["name"] == "say").expect("say");
        assert_eq!(say["description"], "Says it back.", "{}: {say}", c.name);
        assert_eq!(say["title"], "Echo Tool", "{}: {say}", c.name);
        assert_eq!(say["execution"], json!({"taskSupport": "forbidden"}));
        assert_eq!(say["annotations"]["readOnlyHint"], true, "{say}");
        let schema = &say["inputSchema"];
        assert_eq!(schema["properties"]["message"]["type"], "string", "{say}");
        assert_eq!(schema["required"], json!(["message"]), "{say}");
        for tool in HIDDEN {
            let answer = c.call(tool, json!({ "message": MARK }));
            c.assert_unknown(tool, answer);
        }
        c.says(&format!("shown via {}", c.name));
        let (status, m) = c.call("add", json!({"a": 40, "b": 2}));
        assert_eq!(status, c.ok_status(), "{}: {m}", c.name);
        assert_eq!(
            m["result"]["content"][0]["text"],
            "The sum of 40 and 2 is 42."
        );
    }
    // A 2026-07-28 call whose Mcp-Name is not its shown name: refused before any rewrite.
    let modern = &mut callers[2];
    for (header, name) in [("echo", "say"), ("say", "echo")] {
        let params = json!({"name": name, "arguments": {"message": MARK}});
        let (status, m) = modern.request_named("tools/call", params, Some(header));
        assert_eq!(status, 400, "Mcp-Name {header} for {name}: {m}");
        assert!(m["error"].is_object(), "Mcp-Name {header} for {name}: {m}");
    }
    let shown: Vec<String> = (e.recorded_calls().iter())
        .map(|m| format!("{} {}", tool_of(m), m["params"]["arguments"]))
        .collect();
    assert_eq!(
        shown,
        [
            r#"echo {"message":"shown via sse"}"#,
            r#"get-sum {"a":40,"b":2}"#,
            r#"echo {"message":"shown via mcp"}"#,
            r#"get-sum {"a":40,"b":2}"#,
            r#"echo {"message":"shown via 2026-07-28"}"#,
            r#"get-sum {"a":40,"b":2}"#,
        ],
        "the backend's tools/call lines"
    );
    e.assert_nothing_hidden_forwarded();
    assert_eq!(e.unknown_tool_rejections(), (3 * HIDDEN.len()) as f64);
}

/// A Cedar policy (ToolHive's JSON) written for the backend's names: alice may call `echo`,
/// everyone `get-sum`, nobody `get-tiny-image`. Alice lists and calls `say`; bob does not see
/// it and gets -32003 calling it; `get-tiny-image` is shown to neither; `echo` itself is an
/// unknown tool to both although the policy permits alice to call it.
fn a_policy_on_backend_names_still_decides(target: Target) {
    let Some(node) = everything_node("SPEC 16 with a policy") else {
        return;
    };
    let _turn = one_at_a_time();
    let policy = json!({
        "version": "1.0",
        "type": "cedarv1",
        "cedar": {
            "policies": [
                r#"permit(principal == Client::"alice", action == Action::"call_tool", resource == Tool::"echo");"#,
                r#"permit(principal, action == Action::"call_tool", resource == Tool::"get-sum");"#,
                r#"permit(principal, action == Action::"list_tools", resource);"#,
            ],
            "entities_json": "[]",
        },
    });
    let e = Everything::start(
        target,
        &node,
        &[ALICE, BOB],
        &[
            ("override.json", OVERRIDE),
            ("policy.json", &policy.to_string()),
        ],
        &[
            "--tools-override",
            "{dir}/override.json",
            "--tools",
            "say",
            "--tools",
            "add",
            "--tools",
            "get-tiny-image",
            "--authz-config",
            "{dir}/policy.json",
        ],
    );
    let p = &e.proxy;
    for (mut alice, mut bob) in Caller::all(p, Some(ALICE.1))
        .into_iter()
        .zip(Caller::all(p, Some(BOB.1)))
    {
        assert_eq!(alice.names(), ["add", "say"], "alice on {}", alice.name);
        assert_eq!(bob.names(), ["add"], "bob on {}", bob.name);
        alice.says("alice may");
        let (status, m) = bob.call("say", json!({ "message": MARK }));
        assert_eq!(
            m["error"],
            json!({"code": -32003, "message": "forbidden by policy"}),
            "bob on {} ({status}): {m}",
            bob.name
        );
        let (status, m) = bob.call("add", json!({"a": 1, "b": 1}));
        assert_eq!(status, bob.ok_status(), "bob on {}: {m}", bob.name);
        assert_eq!(
            m["result"]["content"][0]["text"],
            "The sum of 1 and 1 is 2."
        );
        for c in [&mut alice, &mut bob] {
            let answer = c.call("echo", json!({ "message": MARK }));
            c.assert_unknown("echo", answer);
        }
    }
    e.assert_nothing_hidden_forwarded();
    assert_eq!(p.metric("switchboard_policy_denied_total"), Some(3.0));
    assert_eq!(e.unknown_tool_rejections(), 6.0);
}

/// Sends SIGHUP and waits until `/metrics` shows `series` at `value`.
fn reload(p: &Proxy, series: &str, value: f64) {
    p.signal(libc::SIGHUP);
    p.wait_metric(series, |v| v == value);
}

/// `tools` and `tools-override` from a `--config` file, reloaded: a change of either sends
/// `tools/list_changed` to a legacy session and a Streamable GET stream and the new view is in
/// force; a bad override file keeps the old view and sends nothing; nor does a reload that
/// changes no tool.
fn a_reload_changes_the_view_and_tells_every_session(target: Target) {
    let Some(node) = everything_node("SPEC 16 reload") else {
        return;
    };
    let _turn = one_at_a_time();
    let config = |tools: &[&str], extra: &str| {
        let tools: Vec<String> = tools.iter().map(|t| format!("{t:?}")).collect();
        format!(
            "tools-override = \"override.json\"\ntools = [{}]\n{extra}",
            tools.join(", ")
        )
    };
    let e = Everything::start(
        target,
        &node,
        &[],
        &[
            ("override.json", OVERRIDE),
            ("switchboard.toml", &config(&SHOWN, "")),
        ],
        &["--config", "{dir}/switchboard.toml"],
    );
    let (p, dir) = (&e.proxy, &e.scratch);
    let [mut legacy, streamable, mut modern] = Caller::all(p, None);
    let Via::Streamable(session) = &streamable.via else {
        unreachable!()
    };
    let mut get = session.get_stream();
    assert_eq!(legacy.names(), ["add", "get-tiny-image", "say"]);

    // `tools` changes: both hear of it, and the new view is in force at once.
    write(&dir.file("switchboard.toml"), &config(&["say", "add"], ""));
    reload(p, "switchboard_reloads_total", 1.0);
    legacy.expect_list_changed(None);
    let mut streamable = streamable;
    streamable.expect_list_changed(Some(&mut get));
    for c in [&mut legacy, &mut streamable, &mut modern] {
        assert_eq!(c.names(), ["add", "say"], "{}", c.name);
        let answer = c.call("get-tiny-image", json!({ "message": MARK }));
        c.assert_unknown("get-tiny-image", answer);
    }

    // A bad override file: the old view stays, nobody is told anything. The legacy stream
    // carries notifications and answers in order, so the answer coming next proves it.
    write(
        &dir.file("override.json"),
        r#"{"toolsOverride": {"echo": {}}}"#,
    );
    reload(p, "switchboard_reload_failures_total", 1.0);
    assert!(p.log().contains("override.json"), "{}", p.log());
    legacy.says("still here");
    streamable.says("still here");
    assert_eq!(modern.names(), ["add", "say"]);
    // A reload that changes no tool tells nobody either.
    write(&dir.file("override.json"), OVERRIDE);
    write(
        &dir.file("switchboard.toml"),
        &config(&["say", "add"], "# no tool changed\n"),
    );
    reload(p, "switchboard_reloads_total", 2.0);
    legacy.says("nothing changed");

    // The override file changes (a new description): both hear of it again.
    let described = OVERRIDE.replace("Says it back.", "Says it again.");
    write(&dir.file("override.json"), &described);
    reload(p, "switchboard_reloads_total", 3.0);
    legacy.expect_list_changed(None);
    streamable.expect_list_changed(Some(&mut get));
    let listed = modern.list();
    let say = listed.iter().find(|t| t["name"] == "say").expect("say");
    assert_eq!(say["description"], "Says it again.", "{say}");
    legacy.says("again");
    // The GET stream got nothing else (its next event would be the one above otherwise).
    match get.next_frame(Duration::from_millis(300)) {
        Frame::Event { data, .. } if !data.is_empty() => panic!("GET stream: {data}"),
        _ => {}
    }
    e.assert_nothing_hidden_forwarded();
}

/// Runs the binary with `args` to completion (it must exit on its own within `WAIT`).
fn run_to_exit(target: Target, args: &[&str]) -> Output {
    let mut child = Command::new(target.binary())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the binary");
    let deadline = Instant::now() + WAIT;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{args:?} did not exit within {WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// An override file with an entry that names nothing, two tools given one shown name, or no
/// file at all stops the proxy before it listens, naming the flag, the file and the reason;
/// the same from a `--config` file's `tools-override`.
fn bad_override_files_stop_the_proxy(target: Target) {
    let dir = TempDir::new("tools-refusals");
    let file = |name: &str, text: &str| {
        let path = dir.file(name);
        write(&path, text);
        path.display().to_string()
    };
    let cases = [
        (
            file("empty-entry.json", r#"{"toolsOverride": {"echo": {}}}"#),
            r#"tool "echo": an override needs a "name" or a "description""#,
        ),
        (
            file(
                "one-name.json",
                r#"{"toolsOverride": {"echo": {"name": "say"}, "get-sum": {"name": "say"}}}"#,
            ),
            r#"tools "echo" and "get-sum" are both shown as "say""#,
        ),
        (
            dir.file("missing.json").display().to_string(),
            "cannot read",
        ),
    ];
    for (path, why) in &cases {
        let out = run_to_exit(target, &["--port", "0", "--tools-override", path]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{path}: {stderr}");
        assert!(stderr.contains("--tools-override"), "{path}: {stderr}");
        assert!(stderr.contains(path.as_str()), "{path}: {stderr}");
        assert!(stderr.contains(why), "{path} ({why}): {stderr}");
    }
    let config = file(
        "switchboard.toml",
        "tools-override = \"one-name.json\"\ntools = [\"say\"]\n",
    );
    let out = run_to_exit(target, &["--config", &config]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("both shown as \"say\""), "{stderr}");
    assert!(stderr.contains("one-name.json"), "{stderr}");
}

/// With only an override file (no `--tools`), the shown set is the backend's own tools
/// renamed (SPEC 16): a name the backend does not list, or a case variant of a shown name
/// that is not renamed, is no shown name either, so it is the proxy's `Unknown tool` and
/// never reaches the backend; the unrenamed tools stay callable.
fn without_tools_only_the_backends_tools_are_callable(target: Target) {
    let Some(node) = everything_node("SPEC 16 without --tools") else {
        return;
    };
    let _turn = one_at_a_time();
    let e = Everything::start(
        target,
        &node,
        &[],
        &[("override.json", OVERRIDE)],
        &["--tools-override", "{dir}/override.json"],
    );
    let mut callers = Caller::all(&e.proxy, None);
    let mut wrong = Vec::new();
    for c in &mut callers {
        let names = c.names();
        assert!(
            names.contains(&"get-env".to_owned()),
            "{}: {names:?}",
            c.name
        );
        assert!(!names.iter().any(|n| n == "echo" || n == "get-sum"));
        let (status, m) = c.call("get-tiny-image", json!({}));
        assert_eq!(status, c.ok_status(), "{}: {m}", c.name);
        assert!(m["result"].is_object(), "{}: {m}", c.name);
        for tool in ["echo", "Say", "no-such-tool", "Get-Env"] {
            let (status, m) = c.call(tool, json!({ "message": MARK }));
            let want = json!({"code": -32602, "message": format!("Unknown tool: {tool}")});
            if m["error"] != want {
                wrong.push(format!("{}: {tool:?} answered {status} {m}", c.name));
            }
        }
    }
    let forwarded: Vec<String> = (e.recorded_calls().iter())
        .filter(|m| m.to_string().contains(MARK))
        .map(|m| tool_of(m).to_owned())
        .collect();
    assert!(
        wrong.is_empty() && forwarded.is_empty(),
        "not the proxy's Unknown tool:\n{}\nforwarded to the backend: {forwarded:?}",
        wrong.join("\n")
    );
}

suite!(
    sdk_clients_see_and_call_the_shown_names,
    hidden_names_never_reach_the_backend,
    a_policy_on_backend_names_still_decides,
    a_reload_changes_the_view_and_tells_every_session,
    bad_override_files_stop_the_proxy,
    without_tools_only_the_backends_tools_are_callable,
);
