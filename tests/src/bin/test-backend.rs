//! A scripted stdio MCP server for the end-to-end suites: newline-delimited JSON-RPC on
//! stdin/stdout, with tools that make it misbehave on purpose (answer late and out of order,
//! emit arbitrary lines, flood, crash, log).
//!
//! Usage: `test-backend [--fail-second-initialize] [--fail-first-initialize] [--slow-restart MARKER]
//! [--protocol-version VERSION]`
//!
//! - `--fail-first-initialize`: the first `initialize` is answered with an error, 300 ms late.
//! - `--slow-restart MARKER`: the first process creates the file MARKER; any process that
//!   finds it (a restart) sleeps 2 s before reading stdin, so an outage is observable.
//! - `--protocol-version VERSION`: `initialize` answers this protocolVersion instead.
//! - `initialize`: protocolVersion `2024-11-05` (unless given), capabilities `{tools:{}, resources:{subscribe:true}}`.
//!   With `--fail-second-initialize` every later `initialize` is answered with an error, as
//!   servers built on the official Go SDK do.
//! - `tools/call` tools: `echo` (content[0] is the arguments as JSON text, content[1] the id
//!   as this process received it), `delay {ms, gate?}` (answers after `ms`, from its own thread, so
//!   answers come out of order; counted from when the `gate` file exists, if given), `emit {lines:[...]}` (writes each value as one raw stdout line
//!   before answering: a string verbatim, anything else as compact JSON), `progress` (one
//!   `notifications/progress` with the request's `_meta.progressToken` as given, then the
//!   result), `flood {bytes}` (one garbage line of that many bytes, then the result),
//!   `exit {code}` (exits at once, no answer), `stderr {text}` (writes the text to stderr),
//!   `env {name}` (the variable's value as text), `responses` (the responses this process has received to its own requests),
//!   `touch {uri}` (a `notifications/resources/updated` for `uri` when this process holds a
//!   subscription to it, then the result: `{"uri", "notified": bool}` as text),
//!   `gated_progress {gate}` (one `notifications/progress` (1 of 2) at once; then, from its
//!   own thread, once the file `gate` exists, a second one (2 of 2) and the result, and then
//!   it removes `gate`, so a test knows both lines were written; after 30 s without the file,
//!   an error instead), `hold {gate}` (reads no more stdin until the file `gate` exists, at
//!   most 30 s, then answers: lines sent meanwhile queue up in front of the backend).
//! - `resources/subscribe`, `resources/unsubscribe` (each process keeps its own set of
//!   subscribed uris, so a restarted process knows only the subscriptions sent to it),
//!   `ping`: `{}`. Unknown methods: -32601.
//! - Responses (to requests it emitted, e.g. `sampling/createMessage`) are recorded.
//! - `TEST_BACKEND_RECORD=path`: every received line is appended verbatim to `path`.
//!
//! It exits 0 when stdin closes.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// How long a restarted process sleeps before reading stdin, with `--slow-restart`.
const SLOW_RESTART_MS: u64 = 2_000;

/// How long `gated_progress` waits for its gate file, at most.
const GATE_WAIT: Duration = Duration::from_secs(30);

/// stdout shared by the main loop and the delayed-reply threads; one line per lock.
#[derive(Clone)]
struct Out(Arc<Mutex<io::Stdout>>);

impl Out {
    fn line(&self, text: &str) {
        let mut out = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // A closed stdout means the proxy is gone; the next stdin read ends the process.
        let _ = out.write_all(text.as_bytes());
        let _ = out.write_all(b"\n");
        let _ = out.flush();
    }

    fn send(&self, message: &Value) {
        self.line(&message.to_string());
    }
}

fn result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn error(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

fn text_result(args: &Value, id: &Value) -> Value {
    json!({
        "content": [
            {"type": "text", "text": args.to_string()},
            {"type": "text", "text": id.to_string()},
        ],
        "isError": false,
    })
}

fn tools() -> Value {
    let tool = |name: &str, description: &str, properties: Value| {
        json!({
            "name": name,
            "description": description,
            "inputSchema": {"type": "object", "properties": properties},
        })
    };
    json!({"tools": [
        tool("echo", "Returns its arguments as text.", json!({})),
        tool("delay", "Answers after `ms` milliseconds.", json!({"ms": {"type": "integer"}})),
        tool("emit", "Writes each of `lines` to stdout, then answers.", json!({"lines": {"type": "array"}})),
        tool("progress", "Sends one progress notification, then answers.", json!({})),
        tool("flood", "Writes one garbage line of `bytes` bytes, then answers.", json!({"bytes": {"type": "integer"}})),
        tool("exit", "Exits with `code` without answering.", json!({"code": {"type": "integer"}})),
        tool("stderr", "Writes `text` to stderr.", json!({"text": {"type": "string"}})),
        tool("env", "Returns the value of the environment variable `name`.", json!({"name": {"type": "string"}})),
        tool("responses", "Lists the responses received to this server's own requests.", json!({})),
        tool("touch", "Notifies `resources/updated` for `uri` if this process holds a subscription to it.", json!({"uri": {"type": "string"}})),
        tool("gated_progress", "Sends progress 1 of 2; once the file `gate` exists, progress 2 of 2 and the result.", json!({"gate": {"type": "string"}})),
        tool("hold", "Reads nothing more until the file `gate` exists, then answers.", json!({"gate": {"type": "string"}})),
    ]})
}

struct Backend {
    out: Out,
    fail_second_initialize: bool,
    fail_first_initialize: bool,
    initializes: u64,
    responses: Vec<Value>,
    /// The uris this process was asked to watch (`resources/subscribe`).
    subscriptions: BTreeSet<String>,
    protocol_version: String,
}

impl Backend {
    fn handle(&mut self, line: &str) {
        let Ok(message) = serde_json::from_str::<Value>(line) else {
            eprintln!("test-backend: not JSON: {line}");
            return;
        };
        let method = message.get("method").and_then(Value::as_str);
        let id = message.get("id");
        match (method, id) {
            (Some(method), Some(id)) => self.request(method, id, &message),
            (Some(_), None) => {} // a notification: recorded only
            (None, Some(_)) => self.responses.push(message),
            (None, None) => eprintln!("test-backend: neither request nor response: {line}"),
        }
    }

    fn request(&mut self, method: &str, id: &Value, message: &Value) {
        let params = message.get("params").cloned().unwrap_or(Value::Null);
        let reply = match method {
            "initialize" => {
                self.initializes += 1;
                if self.fail_first_initialize && self.initializes == 1 {
                    // Late, so that other clients' initialize calls pile up behind it.
                    let out = self.out.clone();
                    let reply = error(id, -32603, "initialize failed on purpose");
                    std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_millis(300));
                        out.send(&reply);
                    });
                    return;
                }
                if self.fail_second_initialize && self.initializes > 1 {
                    error(id, -32600, "server is already initialized")
                } else {
                    result(
                        id,
                        json!({
                            "protocolVersion": self.protocol_version,
                            "capabilities": {"tools": {}, "resources": {"subscribe": true}},
                            "serverInfo": {"name": "test-backend", "version": "0.1.0"},
                        }),
                    )
                }
            }
            "ping" => result(id, json!({})),
            "resources/subscribe" | "resources/unsubscribe" => {
                let uri = params.get("uri").and_then(Value::as_str).unwrap_or("");
                if method == "resources/subscribe" {
                    self.subscriptions.insert(uri.to_owned());
                } else {
                    self.subscriptions.remove(uri);
                }
                result(id, json!({}))
            }
            "tools/list" => result(id, tools()),
            "tools/call" => match self.call(id, &params) {
                Some(reply) => reply,
                None => return,
            },
            _ => error(id, -32601, &format!("Method not found: {method}")),
        };
        self.out.send(&reply);
    }

    /// Runs one tool; `None` when the answer is sent later (or never).
    fn call(&mut self, id: &Value, params: &Value) -> Option<Value> {
        let name = params.get("name").and_then(Value::as_str).unwrap_or("");
        let args = params.get("arguments").cloned().unwrap_or(json!({}));
        match name {
            "echo" => Some(result(id, text_result(&args, id))),
            "delay" => {
                let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(0);
                // With a `gate` file, the delay starts once it exists (bounded): calls sent
                // one by one then answer in the order their delays say, however slowly they
                // were sent.
                let gate = args.get("gate").and_then(Value::as_str).map(PathBuf::from);
                let out = self.out.clone();
                let reply = result(id, text_result(&args, id));
                std::thread::spawn(move || {
                    if let Some(gate) = gate {
                        let deadline = Instant::now() + GATE_WAIT;
                        while !gate.exists() && Instant::now() < deadline {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                    }
                    std::thread::sleep(Duration::from_millis(ms));
                    out.send(&reply);
                });
                None
            }
            "emit" => {
                for line in args
                    .get("lines")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    match line {
                        Value::String(raw) => self.out.line(raw),
                        other => self.out.send(other),
                    }
                }
                Some(result(id, text_result(&args, id)))
            }
            "progress" => {
                let token = params
                    .get("_meta")
                    .and_then(|m| m.get("progressToken"))
                    .cloned()
                    .unwrap_or(Value::Null);
                self.out.send(&json!({
                    "jsonrpc": "2.0",
                    "method": "notifications/progress",
                    "params": {"progressToken": token, "progress": 1, "total": 2, "message": "halfway"},
                }));
                Some(result(id, text_result(&args, id)))
            }
            "gated_progress" => {
                let token = params
                    .get("_meta")
                    .and_then(|m| m.get("progressToken"))
                    .cloned()
                    .unwrap_or(Value::Null);
                let progress = move |n: u64| {
                    json!({
                        "jsonrpc": "2.0",
                        "method": "notifications/progress",
                        "params": {"progressToken": token, "progress": n, "total": 2, "message": format!("step {n}")},
                    })
                };
                self.out.send(&progress(1));
                let gate = args.get("gate").and_then(Value::as_str).map(PathBuf::from);
                let out = self.out.clone();
                let (id, reply) = (id.clone(), result(id, text_result(&args, id)));
                std::thread::spawn(move || {
                    let opened = gate.as_ref().is_some_and(|gate| {
                        let deadline = Instant::now() + GATE_WAIT;
                        while !gate.exists() && Instant::now() < deadline {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        gate.exists()
                    });
                    if !opened {
                        out.send(&error(&id, -32603, "the gate was never opened"));
                        return;
                    }
                    out.send(&progress(2));
                    out.send(&reply);
                    if let Some(gate) = gate {
                        let _ = std::fs::remove_file(gate);
                    }
                });
                None
            }
            "hold" => {
                // On the main thread: nothing more is read from stdin meanwhile.
                let gate = args.get("gate").and_then(Value::as_str).map(PathBuf::from);
                let deadline = Instant::now() + GATE_WAIT;
                while gate.as_ref().is_some_and(|g| !g.exists()) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Some(result(id, text_result(&args, id)))
            }
            "flood" => {
                let bytes = args.get("bytes").and_then(Value::as_u64).unwrap_or(0) as usize;
                self.out.line(&"x".repeat(bytes));
                Some(result(id, text_result(&args, id)))
            }
            "exit" => {
                let code = args.get("code").and_then(Value::as_i64).unwrap_or(1) as i32;
                std::process::exit(code);
            }
            "stderr" => {
                let text = args.get("text").and_then(Value::as_str).unwrap_or("");
                eprintln!("{text}");
                Some(result(id, text_result(&args, id)))
            }
            "env" => {
                let name = args.get("name").and_then(Value::as_str).unwrap_or("");
                let value = std::env::var(name).unwrap_or_default();
                Some(result(
                    id,
                    json!({"content": [{"type": "text", "text": value}], "isError": false}),
                ))
            }
            "responses" => {
                let list = Value::Array(self.responses.clone());
                Some(result(
                    id,
                    json!({"content": [{"type": "text", "text": list.to_string()}], "isError": false}),
                ))
            }
            "touch" => {
                let uri = args.get("uri").and_then(Value::as_str).unwrap_or("");
                let notified = self.subscriptions.contains(uri);
                if notified {
                    self.out.send(&json!({
                        "jsonrpc": "2.0",
                        "method": "notifications/resources/updated",
                        "params": {"uri": uri},
                    }));
                }
                let text = json!({"uri": uri, "notified": notified}).to_string();
                Some(result(
                    id,
                    json!({"content": [{"type": "text", "text": text}], "isError": false}),
                ))
            }
            _ => Some(error(id, -32602, &format!("Unknown tool: {name}"))),
        }
    }
}

fn main() {
    let mut fail_second_initialize = false;
    let mut fail_first_initialize = false;
    let mut slow_restart: Option<String> = None;
    let mut protocol_version = "2024-11-05".to_owned();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--fail-second-initialize" => fail_second_initialize = true,
            "--fail-first-initialize" => fail_first_initialize = true,
            "--slow-restart" => slow_restart = args.next(),
            "--protocol-version" => match args.next() {
                Some(version) => protocol_version = version,
                None => {
                    eprintln!("test-backend: --protocol-version needs a value");
                    std::process::exit(2);
                }
            },
            other => {
                eprintln!("test-backend: unknown argument {other:?}");
                std::process::exit(2);
            }
        }
    }
    let mut record: Option<File> = std::env::var_os("TEST_BACKEND_RECORD").map(|path| {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("cannot open TEST_BACKEND_RECORD {path:?}: {e}"))
    });
    if let Some(marker) = slow_restart {
        // The first process leaves a mark; every later one (a restart) is slow to start.
        if std::path::Path::new(&marker).exists() {
            std::thread::sleep(Duration::from_millis(SLOW_RESTART_MS));
        } else {
            let _ = File::create(&marker);
        }
    }
    let mut backend = Backend {
        out: Out(Arc::new(Mutex::new(io::stdout()))),
        fail_second_initialize,
        fail_first_initialize,
        initializes: 0,
        responses: Vec::new(),
        subscriptions: BTreeSet::new(),
        protocol_version,
    };
    let stdin = io::stdin();
    let mut input = stdin.lock();
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match input.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if let Some(file) = record.as_mut() {
            let _ = file.write_all(&buf);
            if !buf.ends_with(b"\n") {
                let _ = file.write_all(b"\n");
            }
            let _ = file.flush();
        }
        let line = String::from_utf8_lossy(&buf);
        let line = line.trim_end_matches(['\n', '\r']);
        if !line.is_empty() {
            backend.handle(line);
        }
    }
}
