//! A Streamable HTTP client for the suites (`/mcp`, SPEC section 7): `initialize` without a
//! session, then POSTs naming it, answered as a JSON body or an event stream; the standalone
//! GET stream; DELETE.

use std::net::SocketAddr;

use serde_json::{json, Value};

use crate::sse::{request_events, Events};
use crate::{Proxy, Response, WAIT};

/// What an SDK client accepts.
pub const ACCEPT_BOTH: &str = "application/json, text/event-stream";

/// A POST's answer.
pub enum Answer {
    /// A whole response (200 JSON, 202, or a refusal).
    Whole(Response),
    /// An event stream.
    Stream(Events),
}

impl Answer {
    /// The status.
    pub fn status(&self) -> u16 {
        match self {
            Answer::Whole(r) => r.status,
            Answer::Stream(e) => e.head.status,
        }
    }

    /// The one response the request gets: the JSON body, or the stream's messages until it
    /// ends (progress first, the response last) as `(progress, response)`.
    pub fn response(self) -> (Vec<Value>, Value) {
        match self {
            Answer::Whole(r) => {
                assert_eq!(
                    r.status,
                    200,
                    "expected a JSON answer: {} {}",
                    r.status,
                    r.text()
                );
                (Vec::new(), r.json())
            }
            Answer::Stream(mut e) => {
                let mut messages = e
                    .rest_until_closed(WAIT)
                    .unwrap_or_else(|| panic!("the answer stream did not end within {WAIT:?}"));
                let last = messages.pop().expect("the stream carried the response");
                assert!(
                    last.get("result").is_some() || last.get("error").is_some(),
                    "the stream's last message is no response: {last}"
                );
                assert!(
                    messages.iter().all(|m| m.get("method").is_some()),
                    "a stream carries one response: {messages:?}"
                );
                (messages, last)
            }
        }
    }
}

/// One Streamable session.
pub struct McpSession {
    /// Where the proxy listens.
    pub addr: SocketAddr,
    /// The `Mcp-Session-Id`.
    pub sid: String,
    /// The bearer token, if any.
    pub token: Option<String>,
    /// The path of the endpoint (`/mcp`, or under `--base-path`).
    pub path: String,
    /// The initialize result.
    pub initialize_result: Value,
}

/// POSTs `body` to `path` with `headers` (Content-Type JSON and both media types accepted
/// unless given).
pub fn post(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let mut all: Vec<(&str, &str)> = Vec::new();
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        all.push(("Content-Type", "application/json"));
    }
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("accept"))
    {
        all.push(("Accept", ACCEPT_BOTH));
    }
    all.extend_from_slice(headers);
    match request_events(addr, "POST", path, &all, body.as_bytes()) {
        Ok(events) => Answer::Stream(events),
        Err(response) => Answer::Whole(response),
    }
}

/// A standard `initialize` request.
pub fn initialize_body(id: u64) -> String {
    json!({
        "jsonrpc": "2.0", "id": id, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "switchboard-tests", "version": "1"}},
    })
    .to_string()
}

impl McpSession {
    /// Starts a session with `initialize` (and `notifications/initialized`).
    pub fn start(proxy: &Proxy, token: Option<&str>) -> McpSession {
        McpSession::start_at(proxy.addr, "/mcp", token)
    }

    /// [`McpSession::start`] at `path`.
    pub fn start_at(addr: SocketAddr, path: &str, token: Option<&str>) -> McpSession {
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut headers = Vec::new();
        if let Some(a) = &auth {
            headers.push(("Authorization", a.as_str()));
        }
        let answer = post(addr, path, &headers, &initialize_body(1));
        let sid = match &answer {
            Answer::Whole(r) => r.header("mcp-session-id").map(str::to_owned),
            Answer::Stream(e) => e.head.header("mcp-session-id").map(str::to_owned),
        }
        .unwrap_or_else(|| {
            panic!(
                "the initialize answer ({}) has no Mcp-Session-Id",
                answer.status()
            )
        });
        let (_, response) = answer.response();
        let initialize_result = response["result"].clone();
        assert!(
            initialize_result.is_object(),
            "initialize failed: {response}"
        );
        let session = McpSession {
            addr,
            sid,
            token: token.map(str::to_owned),
            path: path.to_owned(),
            initialize_result,
        };
        let r = session.post(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        assert_eq!(r.status(), 202);
        session
    }

    fn headers<'a>(
        &'a self,
        auth: &'a Option<String>,
        extra: &[(&'a str, &'a str)],
    ) -> Vec<(&'a str, &'a str)> {
        let mut headers = vec![
            ("Mcp-Session-Id", self.sid.as_str()),
            ("MCP-Protocol-Version", "2025-06-18"),
        ];
        if let Some(a) = auth {
            headers.push(("Authorization", a.as_str()));
        }
        headers.extend_from_slice(extra);
        headers
    }

    /// POSTs `body` naming this session.
    pub fn post(&self, body: &str) -> Answer {
        self.post_with(&[], body)
    }

    /// POSTs `body` naming this session, with extra headers.
    pub fn post_with(&self, extra: &[(&str, &str)], body: &str) -> Answer {
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        post(self.addr, &self.path, &self.headers(&auth, extra), body)
    }

    /// Calls `tool` under `id` and returns its response (asserting it came under `id`).
    pub fn call(&self, id: Value, tool: &str, args: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": args}});
        let (_, response) = self.post(&body.to_string()).response();
        assert_eq!(response["id"], id, "an answer under another id: {response}");
        response
    }

    /// Opens the standalone GET stream.
    pub fn get_stream(&self) -> Events {
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let headers = self.headers(&auth, &[("Accept", "text/event-stream")]);
        match request_events(self.addr, "GET", &self.path, &headers, b"") {
            Ok(events) => events,
            Err(r) => panic!("GET {}: {} {}", self.path, r.status, r.text()),
        }
    }

    /// `DELETE`.
    pub fn delete(&self) -> Response {
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let headers = self.headers(&auth, &[]);
        match request_events(self.addr, "DELETE", &self.path, &headers, b"") {
            Ok(_) => panic!("DELETE answered with a stream"),
            Err(r) => r,
        }
    }
}
