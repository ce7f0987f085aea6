//! The stdio MCP server that the MCP conformance suite's *server* scenarios
//! (`@modelcontextprotocol/conformance`, `conformance server --url ...`) are run against,
//! through Switchboard: newline-delimited JSON-RPC on stdin, one JSON message per line on
//! stdout (flushed after each), diagnostics on stderr only. It exits 0 when stdin closes.
//!
//! It implements what those scenarios ask for, with the names and texts they check:
//!
//! - `initialize`: echoes the client's `protocolVersion` when it is one of
//!   [`SUPPORTED_VERSIONS`], else answers [`LATEST_VERSION`]; capabilities `tools`,
//!   `resources` (with `subscribe`), `prompts`, `logging`, `completions`. `ping`: `{}`.
//! - `tools/list`, `tools/call`: `test_simple_text`, `test_image_content`,
//!   `test_audio_content`, `test_embedded_resource`, `test_multiple_content_types`,
//!   `test_error_handling` (`isError: true`), `test_tool_with_progress` (three
//!   `notifications/progress` 0, 50, 100 of 100, 50 ms apart, carrying the request's
//!   `_meta.progressToken` exactly as received, before the result), `test_tool_with_logging`
//!   (three `notifications/message` at `info`, 50 ms apart), `test_sampling`
//!   (`sampling/createMessage`), `test_elicitation`, `test_elicitation_sep1034_defaults`,
//!   `test_elicitation_sep1330_enums` (`elicitation/create`), `json_schema_2020_12_tool`
//!   (a `$schema`/`$defs`/`additionalProperties` input schema) and `test_reconnection`
//!   (answers after 100 ms: a stdio server cannot close the HTTP stream itself).
//!   Every call runs on its own thread, so a tool waiting for the client's answer to its
//!   own request (sampling, elicitation) never stops stdin from being read; it waits at
//!   most [`CLIENT_REPLY_TIMEOUT`], then answers the call with whatever it got (an error
//!   from a gateway that refuses server-to-client requests, or nothing).
//! - `resources/list`, `resources/templates/list`, `resources/read`: `test://static-text`,
//!   `test://static-binary` (a PNG blob), `test://watched-resource` and the template
//!   `test://template/{id}/data`. `resources/subscribe` records the uri, answers `{}`, then
//!   sends one `notifications/resources/updated` for it; `resources/unsubscribe`: `{}`.
//! - `prompts/list`, `prompts/get`: `test_simple_prompt`, `test_prompt_with_arguments`
//!   (`arg1`, `arg2`), `test_prompt_with_embedded_resource` (`resourceUri`),
//!   `test_prompt_with_image`.
//! - `completion/complete`: prefix matches for `test_prompt_with_arguments`' arguments and
//!   the template's `id`. `logging/setLevel`: `{}`; later log notifications below that
//!   level are not sent.
//! - Unknown methods: -32601. Notifications from the client are read and ignored.
//!
//! Request ids and progress tokens are never interpreted: a gateway in front rewrites them
//! (Switchboard sends strings like `"<sid>|n:5"`) and they are echoed back as received.

use std::collections::{BTreeSet, HashMap};
use std::io::{self, BufRead, Write};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use serde_json::{json, Value};

/// Protocol versions accepted as the client asks for them.
const SUPPORTED_VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
/// The answer to any other requested version.
const LATEST_VERSION: &str = "2025-11-25";

/// How long a tool waits for the client's answer to its `sampling/createMessage` or
/// `elicitation/create` before answering its own call without it.
const CLIENT_REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// The pause between the notifications of the progress and logging tools.
const STEP: Duration = Duration::from_millis(50);

/// A 1x1 red PNG.
const PNG_BASE64: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR42mP4z8AAAAMBAQD3A0FDAAAAAElFTkSuQmCC";
/// A WAV file: 8 samples of silence, 16-bit mono at 8 kHz.
const WAV_BASE64: &str =
    "UklGRjQAAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YRAAAAAAAAAAAAAAAAAAAAAAAAAA";

/// Log levels in increasing severity (RFC 5424, as MCP's `logging/setLevel` names them).
const LOG_LEVELS: [&str; 8] = [
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];

/// stdout, shared by the main loop and the tool threads; one whole line per lock.
#[derive(Clone)]
struct Out(Arc<Mutex<io::Stdout>>);

impl Out {
    fn send(&self, message: &Value) {
        let mut out = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // A closed stdout means the gateway is gone; the next stdin read ends the process.
        let _ = writeln!(out, "{message}");
        let _ = out.flush();
    }
}

/// What outlives one request.
#[derive(Default)]
struct State {
    /// Index into [`LOG_LEVELS`] of the lowest level still sent.
    min_log_level: usize,
    subscriptions: BTreeSet<String>,
    /// Requests this server sent to the client, by the id (as JSON text) that it gave them.
    pending: HashMap<String, Sender<Value>>,
    next_request: u64,
}

#[derive(Clone)]
struct Server {
    out: Out,
    state: Arc<Mutex<State>>,
}

fn main() {
    let server = Server {
        out: Out(Arc::new(Mutex::new(io::stdout()))),
        state: Arc::new(Mutex::new(State::default())),
    };
    eprintln!("conformance-backend: ready");
    for line in io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(&line) {
            Ok(message) => server.handle(message),
            Err(e) => {
                eprintln!("conformance-backend: unparsable line: {e}");
                server.out.send(&error(&Value::Null, -32700, "Parse error"));
            }
        }
    }
    eprintln!("conformance-backend: stdin closed");
}

impl Server {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One message from stdin: a request, a notification, or a response to our own request.
    fn handle(&self, message: Value) {
        if !message.is_object() {
            self.out.send(&error(
                &Value::Null,
                -32600,
                "Invalid Request: not a JSON-RPC object",
            ));
            return;
        }
        let id = message.get("id").cloned();
        let Some(method) = message.get("method").and_then(Value::as_str) else {
            match id {
                Some(id) => self.deliver_response(&id, message),
                None => eprintln!("conformance-backend: ignored message without method or id"),
            }
            return;
        };
        let Some(id) = id else {
            // notifications/initialized, notifications/cancelled, ...: nothing to do.
            eprintln!("conformance-backend: notification {method}");
            return;
        };
        let params = message.get("params").cloned().unwrap_or_else(|| json!({}));
        let answer = match method {
            "initialize" => Ok(initialize(&params)),
            "ping" => Ok(json!({})),
            "tools/list" => Ok(json!({"tools": tool_list()})),
            "tools/call" => {
                // On its own thread: tools sleep, and some wait for the client's answer,
                // which arrives on this very stdin.
                let server = self.clone();
                thread::spawn(move || {
                    let answer = server.call_tool(&params);
                    server.out.send(&reply(&id, answer));
                });
                return;
            }
            "resources/list" => Ok(json!({"resources": resource_list()})),
            "resources/templates/list" => Ok(json!({"resourceTemplates": template_list()})),
            "resources/read" => read_resource(&params),
            "resources/subscribe" | "resources/unsubscribe" => {
                let answer = self.subscription(method, &params);
                self.out.send(&reply(&id, answer));
                if method == "resources/subscribe" {
                    if let Some(uri) = params.get("uri").and_then(Value::as_str) {
                        self.out.send(&json!({
                            "jsonrpc": "2.0",
                            "method": "notifications/resources/updated",
                            "params": {"uri": uri},
                        }));
                    }
                }
                return;
            }
            "prompts/list" => Ok(json!({"prompts": prompt_list()})),
            "prompts/get" => get_prompt(&params),
            "completion/complete" => complete(&params),
            "logging/setLevel" => self.set_log_level(&params),
            _ => Err((-32601, format!("Method not found: {method}"))),
        };
        self.out.send(&reply(&id, answer));
    }

    /// A response from the client to a request one of our tools sent.
    fn deliver_response(&self, id: &Value, message: Value) {
        match self.lock().pending.remove(&id.to_string()) {
            Some(waiter) => {
                let _ = waiter.send(message);
            }
            None => eprintln!("conformance-backend: response to unknown request {id}"),
        }
    }

    /// Sends a request to the client and waits for its response (the whole JSON-RPC
    /// message), at most [`CLIENT_REPLY_TIMEOUT`].
    fn ask_client(&self, method: &str, params: Value) -> Option<Value> {
        let (tx, rx) = mpsc::channel();
        let id = {
            let mut state = self.lock();
            state.next_request += 1;
            let id = json!(format!("conformance-backend:{}", state.next_request));
            state.pending.insert(id.to_string(), tx);
            id
        };
        self.out
            .send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let response = rx.recv_timeout(CLIENT_REPLY_TIMEOUT).ok();
        if response.is_none() {
            eprintln!("conformance-backend: no answer to {method} {id}");
            self.lock().pending.remove(&id.to_string());
        }
        response
    }

    fn log(&self, level: &str, text: &str) {
        let wanted = LOG_LEVELS.iter().position(|l| *l == level).unwrap_or(0);
        if wanted < self.lock().min_log_level {
            return;
        }
        self.out.send(&json!({
            "jsonrpc": "2.0",
            "method": "notifications/message",
            "params": {"level": level, "logger": "conformance-backend", "data": text},
        }));
    }

    fn progress(&self, token: &Value, progress: u64, total: u64) {
        self.out.send(&json!({
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {
                "progressToken": token,
                "progress": progress,
                "total": total,
                "message": format!("Completed step {progress} of {total}"),
            },
        }));
    }

    fn set_log_level(&self, params: &Value) -> Answer {
        let level = params.get("level").and_then(Value::as_str).unwrap_or("");
        let Some(index) = LOG_LEVELS.iter().position(|l| *l == level) else {
            return Err((-32602, format!("Invalid log level: {level:?}")));
        };
        self.lock().min_log_level = index;
        Ok(json!({}))
    }

    fn subscription(&self, method: &str, params: &Value) -> Answer {
        let Some(uri) = params.get("uri").and_then(Value::as_str) else {
            return Err((-32602, "Missing uri".to_string()));
        };
        let mut state = self.lock();
        if method == "resources/subscribe" {
            state.subscriptions.insert(uri.to_string());
        } else {
            state.subscriptions.remove(uri);
        }
        Ok(json!({}))
    }

    fn call_tool(&self, params: &Value) -> Answer {
        let name = params.get("name").and_then(Value::as_str).unwrap_or("");
        let args = params
            .get("arguments")
            .cloned()
            .unwrap_or_else(|| json!({}));
        let text = |s: &str| json!({"content": [{"type": "text", "text": s}]});
        let result = match name {
            "test_simple_text" => text("This is a simple text response for testing."),
            "test_image_content" => {
                json!({"content": [{"type": "image", "data": PNG_BASE64, "mimeType": "image/png"}]})
            }
            "test_audio_content" => {
                json!({"content": [{"type": "audio", "data": WAV_BASE64, "mimeType": "audio/wav"}]})
            }
            "test_embedded_resource" => json!({"content": [{
                "type": "resource",
                "resource": {
                    "uri": "test://embedded-resource",
                    "mimeType": "text/plain",
                    "text": "This is an embedded resource content.",
                },
            }]}),
            "test_multiple_content_types" => json!({"content": [
                {"type": "text", "text": "Multiple content types test:"},
                {"type": "image", "data": PNG_BASE64, "mimeType": "image/png"},
                {"type": "resource", "resource": {
                    "uri": "test://mixed-content-resource",
                    "mimeType": "application/json",
                    "text": json!({"test": "data", "value": 123}).to_string(),
                }},
            ]}),
            "test_error_handling" => json!({
                "isError": true,
                "content": [{"type": "text", "text": "This tool intentionally returns an error for testing"}],
            }),
            "test_tool_with_logging" => {
                self.log("info", "Tool execution started");
                thread::sleep(STEP);
                self.log("info", "Tool processing data");
                thread::sleep(STEP);
                self.log("info", "Tool execution completed");
                text("Tool with logging executed successfully")
            }
            "test_tool_with_progress" => {
                let token = params.get("_meta").and_then(|m| m.get("progressToken"));
                for (i, step) in [0, 50, 100].into_iter().enumerate() {
                    if i > 0 {
                        thread::sleep(STEP);
                    }
                    if let Some(token) = token {
                        self.progress(token, step, 100);
                    }
                }
                text("Tool with progress executed successfully")
            }
            "test_sampling" => {
                let prompt = args.get("prompt").and_then(Value::as_str).unwrap_or("");
                let response = self.ask_client(
                    "sampling/createMessage",
                    json!({
                        "messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
                        "maxTokens": 100,
                    }),
                );
                match client_result(response) {
                    Ok(result) => {
                        let answer = result["content"]["text"].as_str().unwrap_or("No response");
                        text(&format!("LLM response: {answer}"))
                    }
                    Err(why) => text(&format!("Sampling not supported or error: {why}")),
                }
            }
            "test_elicitation" => {
                let message = args.get("message").and_then(Value::as_str).unwrap_or("");
                self.elicit("User response", message, user_info_schema())
            }
            "test_elicitation_sep1034_defaults" => self.elicit(
                "Elicitation completed",
                "Please review and update the form fields with defaults",
                defaults_schema(),
            ),
            "test_elicitation_sep1330_enums" => self.elicit(
                "Elicitation completed",
                "Please select options from the enum fields",
                enums_schema(),
            ),
            "json_schema_2020_12_tool" => {
                text(&format!("JSON Schema 2020-12 tool called with: {args}"))
            }
            "test_reconnection" => {
                thread::sleep(Duration::from_millis(100));
                text("Reconnection test completed successfully. If you received this, the client properly reconnected after stream closure.")
            }
            _ => return Err((-32602, format!("Unknown tool: {name}"))),
        };
        Ok(result)
    }

    /// `elicitation/create` in form mode, then a text result telling what came back.
    fn elicit(&self, label: &str, message: &str, schema: Value) -> Value {
        let response = self.ask_client(
            "elicitation/create",
            json!({"message": message, "requestedSchema": schema}),
        );
        let text = match client_result(response) {
            Ok(result) => format!(
                "{label}: action={}, content={}",
                result["action"].as_str().unwrap_or("unknown"),
                result.get("content").cloned().unwrap_or_else(|| json!({})),
            ),
            Err(why) => format!("Elicitation not supported or error: {why}"),
        };
        json!({"content": [{"type": "text", "text": text}]})
    }
}

/// A method's outcome: a result, or a JSON-RPC error code and message.
type Answer = Result<Value, (i64, String)>;

fn reply(id: &Value, answer: Answer) -> Value {
    match answer {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err((code, message)) => error(id, code, &message),
    }
}

fn error(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// The `result` of the client's response to our request, or why there is none.
fn client_result(response: Option<Value>) -> Result<Value, String> {
    let Some(mut response) = response else {
        return Err("no answer from the client".to_string());
    };
    if let Some(result) = response.get_mut("result") {
        return Ok(result.take());
    }
    let error = &response["error"];
    Err(format!(
        "{} ({})",
        error["message"].as_str().unwrap_or("unknown error"),
        error["code"]
    ))
}

// ---- initialize ----------------------------------------------------------------------

fn initialize(params: &Value) -> Value {
    let asked = params
        .get("protocolVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let version = if SUPPORTED_VERSIONS.contains(&asked) {
        asked
    } else {
        LATEST_VERSION
    };
    json!({
        "protocolVersion": version,
        "capabilities": {
            "tools": {"listChanged": false},
            "resources": {"subscribe": true, "listChanged": false},
            "prompts": {"listChanged": false},
            "logging": {},
            "completions": {},
        },
        "serverInfo": {"name": "switchboard-conformance-backend", "version": env!("CARGO_PKG_VERSION")},
        "instructions": "Fixture for the MCP conformance suite's server scenarios.",
    })
}

// ---- tools ---------------------------------------------------------------------------

fn tool_list() -> Value {
    let no_args = json!({"type": "object", "properties": {}});
    let one_string = |name: &str, description: &str| {
        json!({
            "type": "object",
            "properties": {name: {"type": "string", "description": description}},
            "required": [name],
        })
    };
    let tool = |name: &str, description: &str, schema: &Value| json!({"name": name, "description": description, "inputSchema": schema});
    json!([
        tool("test_simple_text", "Returns simple text content", &no_args),
        tool("test_image_content", "Returns image content (a 1x1 PNG)", &no_args),
        tool("test_audio_content", "Returns audio content (a short WAV)", &no_args),
        tool("test_embedded_resource", "Returns an embedded text resource", &no_args),
        tool("test_multiple_content_types", "Returns text, image and resource content", &no_args),
        tool("test_tool_with_logging", "Sends three info log notifications while running", &no_args),
        tool("test_error_handling", "Always returns a tool error (isError: true)", &no_args),
        tool("test_tool_with_progress", "Reports progress 0, 50, 100 of 100 while running", &no_args),
        tool(
            "test_sampling",
            "Asks the client for an LLM completion (sampling/createMessage)",
            &one_string("prompt", "The prompt to send to the LLM"),
        ),
        tool(
            "test_elicitation",
            "Asks the client for user input (elicitation/create)",
            &one_string("message", "The message to show the user"),
        ),
        tool(
            "test_elicitation_sep1034_defaults",
            "Elicitation with default values for every primitive type (SEP-1034)",
            &no_args,
        ),
        tool(
            "test_elicitation_sep1330_enums",
            "Elicitation with the five enum schema variants (SEP-1330)",
            &no_args,
        ),
        tool(
            "json_schema_2020_12_tool",
            "Tool with JSON Schema 2020-12 features (SEP-1613)",
            &json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "$defs": {
                    "address": {
                        "type": "object",
                        "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
                    },
                },
                "properties": {
                    "name": {"type": "string"},
                    "address": {"$ref": "#/$defs/address"},
                },
                "additionalProperties": false,
            }),
        ),
        tool(
            "test_reconnection",
            "SSE polling test (SEP-1699): answers after 100 ms; closing the stream is the HTTP layer's part",
            &no_args,
        ),
    ])
}

fn user_info_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "username": {"type": "string", "description": "User's response"},
            "email": {"type": "string", "description": "User's email address"},
        },
        "required": ["username", "email"],
    })
}

fn defaults_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "User name", "default": "John Doe"},
            "age": {"type": "integer", "description": "User age", "default": 30},
            "score": {"type": "number", "description": "User score", "default": 95.5},
            "status": {
                "type": "string",
                "description": "User status",
                "enum": ["active", "inactive", "pending"],
                "default": "active",
            },
            "verified": {"type": "boolean", "description": "Verification status", "default": true},
        },
        "required": [],
    })
}

fn enums_schema() -> Value {
    let titled = |prefix: &str, noun: &str| {
        json!([
            {"const": format!("{prefix}1"), "title": format!("First {noun}")},
            {"const": format!("{prefix}2"), "title": format!("Second {noun}")},
            {"const": format!("{prefix}3"), "title": format!("Third {noun}")},
        ])
    };
    json!({
        "type": "object",
        "properties": {
            "untitledSingle": {
                "type": "string",
                "description": "Select one option",
                "enum": ["option1", "option2", "option3"],
            },
            "titledSingle": {
                "type": "string",
                "description": "Select one option with titles",
                "oneOf": titled("value", "Option"),
            },
            "legacyEnum": {
                "type": "string",
                "description": "Select one option (legacy)",
                "enum": ["opt1", "opt2", "opt3"],
                "enumNames": ["Option One", "Option Two", "Option Three"],
            },
            "untitledMulti": {
                "type": "array",
                "description": "Select multiple options",
                "minItems": 1,
                "maxItems": 3,
                "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
            },
            "titledMulti": {
                "type": "array",
                "description": "Select multiple options with titles",
                "minItems": 1,
                "maxItems": 3,
                "items": {"anyOf": titled("value", "Choice")},
            },
        },
        "required": [],
    })
}

// ---- resources -----------------------------------------------------------------------

const TEMPLATE_PREFIX: &str = "test://template/";
const TEMPLATE_SUFFIX: &str = "/data";

fn resource_list() -> Value {
    json!([
        {
            "uri": "test://static-text",
            "name": "static-text",
            "title": "Static Text Resource",
            "description": "A static text resource for testing",
            "mimeType": "text/plain",
        },
        {
            "uri": "test://static-binary",
            "name": "static-binary",
            "title": "Static Binary Resource",
            "description": "A static binary resource (a PNG image) for testing",
            "mimeType": "image/png",
        },
        {
            "uri": "test://watched-resource",
            "name": "watched-resource",
            "title": "Watched Resource",
            "description": "A resource to subscribe to",
            "mimeType": "text/plain",
        },
    ])
}

fn template_list() -> Value {
    json!([{
        "uriTemplate": format!("{TEMPLATE_PREFIX}{{id}}{TEMPLATE_SUFFIX}"),
        "name": "template",
        "title": "Resource Template",
        "description": "A resource template with parameter substitution",
        "mimeType": "application/json",
    }])
}

fn read_resource(params: &Value) -> Answer {
    let Some(uri) = params.get("uri").and_then(Value::as_str) else {
        return Err((-32602, "Missing uri".to_string()));
    };
    let content = match uri {
        "test://static-text" => json!({
            "uri": uri,
            "mimeType": "text/plain",
            "text": "This is the content of the static text resource.",
        }),
        "test://static-binary" => json!({"uri": uri, "mimeType": "image/png", "blob": PNG_BASE64}),
        "test://watched-resource" => {
            json!({"uri": uri, "mimeType": "text/plain", "text": "Watched resource content"})
        }
        _ => match template_id(uri) {
            Some(id) => json!({
                "uri": uri,
                "mimeType": "application/json",
                "text": json!({"id": id, "templateTest": true, "data": format!("Data for ID: {id}")})
                    .to_string(),
            }),
            None => {
                return Err((-32002, format!("Resource not found: {uri}")));
            }
        },
    };
    Ok(json!({"contents": [content]}))
}

/// The `{id}` of a uri matching `test://template/{id}/data`.
fn template_id(uri: &str) -> Option<&str> {
    let id = uri
        .strip_prefix(TEMPLATE_PREFIX)?
        .strip_suffix(TEMPLATE_SUFFIX)?;
    (!id.is_empty() && !id.contains('/')).then_some(id)
}

// ---- prompts -------------------------------------------------------------------------

fn prompt_list() -> Value {
    let argument = |name: &str, description: &str| json!({"name": name, "description": description, "required": true});
    json!([
        {
            "name": "test_simple_prompt",
            "title": "Simple Test Prompt",
            "description": "A simple prompt without arguments",
        },
        {
            "name": "test_prompt_with_arguments",
            "title": "Prompt With Arguments",
            "description": "A prompt with required arguments",
            "arguments": [
                argument("arg1", "First test argument"),
                argument("arg2", "Second test argument"),
            ],
        },
        {
            "name": "test_prompt_with_embedded_resource",
            "title": "Prompt With Embedded Resource",
            "description": "A prompt that includes an embedded resource",
            "arguments": [argument("resourceUri", "URI of the resource to embed")],
        },
        {
            "name": "test_prompt_with_image",
            "title": "Prompt With Image",
            "description": "A prompt that includes image content",
        },
    ])
}

fn get_prompt(params: &Value) -> Answer {
    let name = params.get("name").and_then(Value::as_str).unwrap_or("");
    let args = params
        .get("arguments")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let arg = |key: &str| -> Result<String, (i64, String)> {
        args.get(key)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or((-32602, format!("Missing required argument: {key}")))
    };
    let user = |content: Value| json!({"role": "user", "content": content});
    let text = |s: &str| json!({"type": "text", "text": s});
    let messages = match name {
        "test_simple_prompt" => json!([user(text("This is a simple prompt for testing."))]),
        "test_prompt_with_arguments" => {
            let (arg1, arg2) = (arg("arg1")?, arg("arg2")?);
            json!([user(text(&format!(
                "Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"
            )))])
        }
        "test_prompt_with_embedded_resource" => json!([
            user(json!({
                "type": "resource",
                "resource": {
                    "uri": arg("resourceUri")?,
                    "mimeType": "text/plain",
                    "text": "Embedded resource content for testing.",
                },
            })),
            user(text("Please process the embedded resource above.")),
        ]),
        "test_prompt_with_image" => json!([
            user(json!({"type": "image", "data": PNG_BASE64, "mimeType": "image/png"})),
            user(text("Please analyze the image above.")),
        ]),
        _ => return Err((-32602, format!("Unknown prompt: {name}"))),
    };
    Ok(json!({"messages": messages}))
}

// ---- completion ----------------------------------------------------------------------

fn complete(params: &Value) -> Answer {
    let reference = &params["ref"];
    let argument = params["argument"]["name"].as_str().unwrap_or("");
    let prefix = params["argument"]["value"].as_str().unwrap_or("");
    let candidates: &[&str] = match (reference["type"].as_str(), argument) {
        (Some("ref/prompt"), "arg1" | "arg2")
            if reference["name"] == "test_prompt_with_arguments" =>
        {
            &["paris", "park", "party", "test", "testValue1", "testValue2"]
        }
        (Some("ref/resource"), "id") => &["1", "2", "3", "123"],
        (Some("ref/prompt" | "ref/resource"), _) => &[],
        _ => return Err((-32602, "Invalid ref".to_string())),
    };
    let values: Vec<&str> = candidates
        .iter()
        .copied()
        .filter(|c| c.starts_with(prefix))
        .collect();
    Ok(json!({"completion": {"values": values, "total": values.len(), "hasMore": false}}))
}
