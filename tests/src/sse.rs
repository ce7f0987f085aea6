//! The SSE side of a session: `GET /sse`, the `endpoint` event, then frames read
//! incrementally (chunked transfer decoding included) with a timeout on every wait.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::http::{self, Body, Conn, Response, Wire};
use crate::{Proxy, WAIT};

/// One thing read from an event stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// An event: its `event:` name (`message` when absent), its `data:` lines joined by `\n`,
    /// and its `id:` field if the server sent one (it must not).
    Event {
        event: String,
        data: String,
        id: Option<String>,
    },
    /// A block of comment lines only (`: keep-alive`), without the colon.
    Comment(String),
    /// Nothing complete arrived before the timeout.
    Timeout,
    /// The server ended the stream (or the connection broke).
    Closed,
}

/// How to open a stream.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// Extra request headers (`Origin`, `Host`, ...).
    pub headers: Vec<(String, String)>,
    /// Shrink the client socket's receive buffer before connecting (slow-consumer tests).
    pub recv_buffer: Option<usize>,
    /// Path to GET instead of `/sse` (for `--base-path`).
    pub path: Option<String>,
}

/// A live SSE session.
pub struct Session {
    /// The session id from the endpoint URL.
    pub sid: String,
    /// The endpoint event's data exactly as sent.
    pub endpoint: String,
    /// Path and query to POST to (the endpoint made relative).
    pub post_target: String,
    pub token: Option<String>,
    /// Status line and headers of the `GET /sse` answer (body empty).
    pub head: Response,
    addr: SocketAddr,
    stream: EventStream,
    conn: Option<Conn>,
    next_id: u64,
}

/// Incremental decoding: transport framing (chunked or not) into SSE frames.
struct EventStream {
    wire: Wire,
    chunked: bool,
    /// Bytes left in the current HTTP chunk; `None` when a size line comes next.
    chunk_left: Option<usize>,
    /// After a chunk's data its CRLF must be skipped.
    skip_crlf: bool,
    decoded: Vec<u8>,
    eof: bool,
    /// Streamable streams number every event (SPEC section 12); legacy ones never do.
    ids: bool,
    /// The id of the last event read, for resuming.
    pub(crate) last_id: Option<String>,
}

impl EventStream {
    /// The stream after its head, with what already arrived decoded.
    fn start(wire: Wire, chunked: bool, ids: bool) -> EventStream {
        let mut stream = EventStream {
            wire,
            chunked,
            chunk_left: None,
            skip_crlf: false,
            decoded: Vec::new(),
            eof: false,
            ids,
            last_id: None,
        };
        stream
            .decode()
            .unwrap_or_else(|e| panic!("malformed stream: {e}"));
        stream
    }

    /// The data of the next `message` event before `deadline` (comments and priming events
    /// skipped); `None` on timeout or close. Panics on any other event type, and on an event
    /// id on a legacy stream or a missing one on a Streamable stream.
    fn next_message_data(&mut self, deadline: Instant, stream: &str) -> Option<String> {
        loop {
            match self.next_frame(deadline) {
                Frame::Event { event, data, id } => {
                    assert_eq!(
                        event, "message",
                        "unexpected event type on stream {stream}: {data}"
                    );
                    assert_eq!(
                        id.is_some(),
                        self.ids,
                        "stream {stream}: legacy events carry no id, Streamable ones one: {id:?}"
                    );
                    self.last_id = id;
                    if data.is_empty() {
                        continue; // a priming event
                    }
                    return Some(data);
                }
                Frame::Comment(_) => continue,
                Frame::Timeout | Frame::Closed => return None,
            }
        }
    }

    /// Moves whatever transport bytes are complete into `decoded`.
    fn decode(&mut self) -> io::Result<()> {
        if !self.chunked {
            let n = self.wire.available().len();
            self.decoded.extend_from_slice(self.wire.available());
            self.wire.consume(n);
            return Ok(());
        }
        loop {
            if self.eof {
                return Ok(());
            }
            if self.skip_crlf {
                let avail = self.wire.available();
                if avail.len() < 2 {
                    return Ok(());
                }
                if &avail[..2] != b"\r\n" {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "chunk data not followed by CRLF",
                    ));
                }
                self.wire.consume(2);
                self.skip_crlf = false;
            }
            match self.chunk_left {
                Some(left) => {
                    let avail = self.wire.available();
                    if avail.is_empty() {
                        return Ok(());
                    }
                    let n = left.min(avail.len());
                    self.decoded.extend_from_slice(&avail[..n]);
                    self.wire.consume(n);
                    if n == left {
                        self.chunk_left = None;
                        self.skip_crlf = true;
                    } else {
                        self.chunk_left = Some(left - n);
                    }
                }
                None => {
                    let avail = self.wire.available();
                    let Some(end) = avail.iter().position(|&b| b == b'\n') else {
                        return Ok(());
                    };
                    let line = String::from_utf8_lossy(&avail[..end]).into_owned();
                    self.wire.consume(end + 1);
                    let size_text = line.trim_end_matches('\r');
                    let size_text = size_text.split(';').next().unwrap_or_default().trim();
                    let size = usize::from_str_radix(size_text, 16).map_err(|_| {
                        io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("bad chunk size line {line:?}"),
                        )
                    })?;
                    if size == 0 {
                        self.eof = true;
                        return Ok(());
                    }
                    self.chunk_left = Some(size);
                }
            }
        }
    }

    /// The next complete SSE block (without its blank-line terminator), if one is buffered.
    fn take_block(&mut self) -> Option<Vec<u8>> {
        let d = &self.decoded;
        let lf = find(d, b"\n\n").map(|i| (i, 2));
        let crlf = find(d, b"\r\n\r\n").map(|i| (i, 4));
        let (i, n) = match (lf, crlf) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        let block = d[..i].to_vec();
        self.decoded.drain(..i + n);
        Some(block)
    }

    fn next_frame(&mut self, deadline: Instant) -> Frame {
        loop {
            if let Some(block) = self.take_block() {
                if let Some(frame) = parse_block(&block) {
                    return frame;
                }
                continue;
            }
            if self.eof {
                return Frame::Closed;
            }
            match self.wire.fill(deadline) {
                Ok(0) => {
                    self.eof = true;
                }
                Ok(_) => {
                    if let Err(e) = self.decode() {
                        panic!("the event stream is malformed: {e}");
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut => return Frame::Timeout,
                Err(_) => self.eof = true,
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn parse_block(block: &[u8]) -> Option<Frame> {
    let text = String::from_utf8_lossy(block);
    let mut event = None;
    let mut data: Option<String> = None;
    let mut id = None;
    let mut comments = Vec::new();
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if let Some(c) = line.strip_prefix(':') {
            comments.push(c.trim_start().to_owned());
            continue;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => event = Some(value.to_owned()),
            "data" => match data.as_mut() {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => data = Some(value.to_owned()),
            },
            "id" => id = Some(value.to_owned()),
            _ => {}
        }
    }
    if event.is_none() && data.is_none() && id.is_none() {
        if comments.is_empty() {
            return None;
        }
        return Some(Frame::Comment(comments.join("\n")));
    }
    Some(Frame::Event {
        event: event.unwrap_or_else(|| "message".to_owned()),
        data: data.unwrap_or_default(),
        id,
    })
}

/// Opens a session on `proxy` (as `token`'s principal when given) and reads its endpoint
/// event; panics when the stream is refused or malformed.
pub fn open_session(proxy: &Proxy, token: Option<&str>) -> Session {
    let options = OpenOptions {
        token: token.map(str::to_owned),
        ..OpenOptions::default()
    };
    match try_open_session(proxy.addr, &options) {
        Ok(s) => s,
        Err(r) => panic!(
            "GET /sse was refused: {} {:?} body {:?}",
            r.status,
            r.headers,
            r.text()
        ),
    }
}

/// Opens a stream; `Err` carries a refusal (any status but 200) with its body.
pub fn try_open_session(addr: SocketAddr, options: &OpenOptions) -> Result<Session, Response> {
    let deadline = Instant::now() + WAIT;
    let stream = match options.recv_buffer {
        None => http::connect(addr, WAIT),
        Some(size) => connect_small_buffer(addr, size),
    }
    .unwrap_or_else(|e| panic!("cannot connect to {addr}: {e}"));
    let path = options.path.as_deref().unwrap_or("/sse");
    let mut req = format!("GET {path} HTTP/1.1\r\n");
    if !options
        .headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("host"))
    {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    req.push_str("Accept: text/event-stream\r\n");
    if let Some(t) = &options.token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    for (k, v) in &options.headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    io::Write::write_all(&mut &stream, req.as_bytes())
        .unwrap_or_else(|e| panic!("cannot send GET {path}: {e}"));
    let mut wire = Wire::new(stream);
    let (status, reason, headers) = http::read_head(&mut wire, deadline)
        .unwrap_or_else(|e| panic!("no answer to GET {path}: {e}"));
    let chunked = http::is_chunked(&headers);
    let head = Response {
        status,
        reason,
        headers,
        body: Vec::new(),
    };
    if status != 200 {
        // The refusal's body, on the same connection.
        let body =
            http::read_body(&mut wire, status, &head.headers, false, deadline).unwrap_or_default();
        return Err(Response { body, ..head });
    }
    let mut stream = EventStream::start(wire, chunked, false);
    let endpoint = match stream.next_frame(deadline) {
        Frame::Event { event, data, id } => {
            assert_eq!(event, "endpoint", "the first event must be `endpoint`");
            assert_eq!(id, None, "events must carry no id field");
            data
        }
        other => panic!("expected the endpoint event first, got {other:?}"),
    };
    let post_target = relative_target(&endpoint);
    let sid = post_target
        .split_once('?')
        .and_then(|(_, q)| {
            q.split('&')
                .find_map(|kv| kv.strip_prefix("session_id="))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| panic!("endpoint {endpoint:?} has no session_id"));
    Ok(Session {
        sid,
        endpoint,
        post_target,
        token: options.token.clone(),
        head,
        addr,
        stream,
        conn: None,
        next_id: 1_000_000,
    })
}

/// `http://host:port/x?y` → `/x?y`; a relative target is returned as is.
fn relative_target(endpoint: &str) -> String {
    match endpoint.split_once("://") {
        Some((_, rest)) => match rest.find('/') {
            Some(i) => rest[i..].to_owned(),
            None => "/".to_owned(),
        },
        None => endpoint.to_owned(),
    }
}

fn connect_small_buffer(addr: SocketAddr, size: usize) -> io::Result<std::net::TcpStream> {
    use socket2::{Domain, Socket, Type};
    assert!(addr.ip().is_loopback());
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_recv_buffer_size(size)?;
    socket.connect_timeout(&addr.into(), WAIT)?;
    socket.set_tcp_nodelay(true)?;
    socket.set_write_timeout(Some(WAIT))?;
    Ok(socket.into())
}

/// The raw JSON text of `key` at the top level of `data` (e.g. an id exactly as sent).
pub fn raw_member(data: &str, key: &str) -> Option<String> {
    let map: BTreeMap<String, Box<RawValue>> = serde_json::from_str(data).ok()?;
    map.get(key).map(|v| v.get().to_owned())
}

impl Session {
    /// The next frame of any kind, waiting at most `timeout`.
    pub fn next_frame(&mut self, timeout: Duration) -> Frame {
        self.stream.next_frame(Instant::now() + timeout)
    }

    /// The data of the next `message` event (comments skipped); `None` on timeout or close.
    /// Panics on any other event type.
    pub fn next_raw(&mut self, timeout: Duration) -> Option<String> {
        self.stream
            .next_message_data(Instant::now() + timeout, &self.sid)
    }

    /// The next message as JSON; `None` on timeout or close.
    pub fn next_message(&mut self, timeout: Duration) -> Option<Value> {
        let data = self.next_raw(timeout)?;
        Some(serde_json::from_str(&data).unwrap_or_else(|e| {
            panic!("message on session {} is not JSON ({e}): {data}", self.sid)
        }))
    }

    /// The next message, or a panic naming `what` was expected.
    pub fn expect_message(&mut self, what: &str) -> Value {
        self.next_message(WAIT).unwrap_or_else(|| {
            panic!(
                "session {}: no message within {WAIT:?}: expected {what}",
                self.sid
            )
        })
    }

    /// The next message's raw data, or a panic naming `what` was expected.
    pub fn expect_raw(&mut self, what: &str) -> String {
        self.next_raw(WAIT).unwrap_or_else(|| {
            panic!(
                "session {}: no message within {WAIT:?}: expected {what}",
                self.sid
            )
        })
    }

    /// Panics if a message arrives within `window`.
    pub fn expect_silence(&mut self, window: Duration) {
        if let Some(m) = self.next_raw(window) {
            panic!("session {} received an unexpected message: {m}", self.sid);
        }
    }

    /// Reads (and discards) until the server ends the stream; false if it is still open
    /// after `timeout`.
    pub fn wait_closed(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            match self.stream.next_frame(deadline) {
                Frame::Closed => return true,
                Frame::Timeout => return false,
                _ => continue,
            }
        }
    }

    /// POSTs `body` to this session's endpoint on a fresh connection, with this session's
    /// token unless `headers` carry an Authorization.
    pub fn post(&self, body: &str) -> Response {
        self.post_with(Body::json(body), &[])
    }

    pub fn post_with(&self, body: Body, headers: &[(&str, &str)]) -> Response {
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let mut all: Vec<(&str, &str)> = Vec::new();
        if let Some(a) = &auth {
            if !headers
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case("authorization"))
            {
                all.push(("Authorization", a));
            }
        }
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            all.push(("Content-Type", "application/json"));
        }
        all.extend_from_slice(headers);
        http::request(self.addr, "POST", &self.post_target, &all, body, WAIT)
            .unwrap_or_else(|e| panic!("POST {} failed: {e}", self.post_target))
    }

    /// POSTs on a keep-alive connection kept by the session (fast loops).
    pub fn post_fast(&mut self, body: &str) -> Response {
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let mut headers: Vec<(&str, &str)> = vec![("Content-Type", "application/json")];
        if let Some(a) = &auth {
            headers.push(("Authorization", a));
        }
        let conn = self.conn.get_or_insert_with(|| Conn::new(self.addr, WAIT));
        conn.request("POST", &self.post_target, &headers, body.as_bytes())
            .unwrap_or_else(|e| panic!("POST {} failed: {e}", self.post_target))
    }

    /// POSTs and asserts 202.
    pub fn send(&self, body: &Value) {
        let r = self.post(&body.to_string());
        assert_eq!(
            r.status,
            202,
            "POST {body} answered {} {:?}",
            r.status,
            r.text()
        );
    }

    /// Sends a request and waits for the response with the same id, panicking on any other
    /// message in between.
    pub fn request(&mut self, id: Value, method: &str, params: Value) -> Value {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let m = self.expect_message(&format!("the answer to {method} id {id}"));
        assert_eq!(
            m.get("id"),
            Some(&id),
            "session {} expected the answer to {method} id {id}, got {m}",
            self.sid
        );
        m
    }

    /// `initialize` then `notifications/initialized`, as an SDK client does; returns the result.
    pub fn initialize(&mut self) -> Value {
        let id = self.fresh_id();
        let m = self.request(
            json!(id),
            "initialize",
            json!({
                "protocolVersion": "2024-11-05",
                "capabilities": {"sampling": {}, "roots": {"listChanged": true}},
                "clientInfo": {"name": "switchboard-tests", "version": "0"},
            }),
        );
        let result = m
            .get("result")
            .unwrap_or_else(|| panic!("initialize failed: {m}"))
            .clone();
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        result
    }

    /// Calls a tool of the test backend and returns the whole response message.
    pub fn call(&mut self, tool: &str, args: Value) -> Value {
        let id = self.fresh_id();
        self.request(
            json!(id),
            "tools/call",
            json!({"name": tool, "arguments": args}),
        )
    }

    /// Proves the stream is in step: an echo whose answer must be the very next message, so
    /// nothing the backend wrote before it was queued for this session.
    pub fn sync(&mut self) {
        let marker = format!("sync-{}", self.fresh_id());
        let m = self.call("echo", json!({"sync": marker}));
        let text = m["result"]["content"][0]["text"].as_str().unwrap_or("");
        assert!(text.contains(&marker), "sync echo came back wrong: {m}");
    }

    pub fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// The underlying socket (e.g. to close it abruptly).
    pub fn shutdown(&self) {
        let _ = self.stream.wire.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// An event stream answered to any request (`GET /mcp`, or a `POST /mcp` answered as a
/// stream), read incrementally like a session's.
pub struct Events {
    /// Status line and headers (body empty).
    pub head: Response,
    stream: EventStream,
}

/// Sends `method target` with `headers` and `body` on a fresh connection. An answer of
/// `text/event-stream` comes back as [`Events`]; any other, whole, as `Err`.
pub fn request_events(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Events, Response> {
    let deadline = Instant::now() + WAIT;
    let stream =
        http::connect(addr, WAIT).unwrap_or_else(|e| panic!("cannot connect to {addr}: {e}"));
    let mut req = format!("{method} {target} HTTP/1.1\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    io::Write::write_all(&mut &stream, &bytes)
        .unwrap_or_else(|e| panic!("cannot send {method} {target}: {e}"));
    let mut wire = Wire::new(stream);
    let (status, reason, headers) = http::read_head(&mut wire, deadline)
        .unwrap_or_else(|e| panic!("no answer to {method} {target}: {e}"));
    let head = Response {
        status,
        reason,
        headers,
        body: Vec::new(),
    };
    let is_stream = head
        .header("content-type")
        .is_some_and(|ct| ct.starts_with("text/event-stream"));
    if !is_stream {
        let body = http::read_body(&mut wire, status, &head.headers, method == "HEAD", deadline)
            .unwrap_or_default();
        return Err(Response { body, ..head });
    }
    let chunked = http::is_chunked(&head.headers);
    let stream = EventStream::start(wire, chunked, true);
    Ok(Events { head, stream })
}

impl Events {
    /// The next frame of any kind, waiting at most `timeout`.
    pub fn next_frame(&mut self, timeout: Duration) -> Frame {
        self.stream.next_frame(Instant::now() + timeout)
    }

    /// The next `message` event as JSON (comments skipped); `None` on timeout or close.
    pub fn next_message(&mut self, timeout: Duration) -> Option<Value> {
        let data = self
            .stream
            .next_message_data(Instant::now() + timeout, "of the answer")?;
        Some(serde_json::from_str(&data).unwrap_or_else(|e| panic!("not JSON ({e}): {data}")))
    }

    /// Whether the stream ends within `timeout` (messages meanwhile are returned in order).
    pub fn rest_until_closed(&mut self, timeout: Duration) -> Option<Vec<Value>> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        loop {
            match self.stream.next_frame(deadline) {
                Frame::Event { data, .. } if data.is_empty() => continue, // priming
                Frame::Event { data, .. } => {
                    seen.push(serde_json::from_str(&data).expect("JSON event"))
                }
                Frame::Comment(_) => continue,
                Frame::Closed => return Some(seen),
                Frame::Timeout => return None,
            }
        }
    }

    /// The id of the last event read (a priming event included).
    pub fn last_event_id(&self) -> Option<&str> {
        self.stream.last_id.as_deref()
    }

    /// Reads the priming event a 2025-11-25 stream opens with; its id.
    pub fn priming_id(&mut self, timeout: Duration) -> String {
        match self.stream.next_frame(Instant::now() + timeout) {
            Frame::Event { data, id, .. } if data.is_empty() => {
                id.expect("a priming event has an id")
            }
            other => panic!("expected a priming event, got {other:?}"),
        }
    }

    /// Hangs up.
    pub fn shutdown(&self) {
        let _ = self.stream.wire.stream.shutdown(std::net::Shutdown::Both);
    }
}
