//! Snapshot tests of routing decisions: every `scenarios/*.txt` file is a script of inputs
//! to the [`Router`], and its snapshot (`snapshots/scenarios@<file>.snap`) is the transcript
//! of what came out. A reviewer reads the snapshots to review behaviour.
//!
//! # Scenario language
//!
//! One command per line; lines starting with `#` are comments (copied into the transcript),
//! blank lines separate paragraphs. Sessions are named by labels (`A`, `B`, `C1`: an
//! uppercase letter then uppercase letters or digits); the harness gives each label a fixed
//! session id (`SessionId::from_random([n; 16])`, `n` counting labels in order of first use)
//! and prints `<A>` wherever that id's text appears in the output. In command arguments,
//! `<A>` is replaced by A's session id text and `${300*a}` by 300 `a`s.
//!
//! | command | input |
//! |---|---|
//! | `open A alice` | `open_session` for label A bound to principal `alice` |
//! | `close A` | `close_session` |
//! | `post A {...}` | `client_message` to A's session as A's principal |
//! | `post-as bob A {...}` | the same as principal `bob` |
//! | `post-raw A bytes` | the body with `\xHH`, `\r`, `\n`, `\t`, `\\` decoded (any other `\` is kept) |
//! | `post-too-large A` | `client_message` with `Body::TooLarge` |
//! | `post-sid "text" [as bob] {...}` | the raw session text (a JSON string) as `anonymous` or `bob` |
//! | `backend {...}` | `backend_line` |
//! | `backend-raw bytes` | `backend_line` with the escapes of `post-raw` |
//! | `backend-too-long` | `backend_line_too_long` |
//! | `backend-exit`, `backend-start` | `backend_exited`, `backend_started` |
//! | `ping` | `health_ping` |
//!
//! The harness calls `backend_started` before the first command. After each command the
//! transcript shows the command, the POST's HTTP answer (`= 202 forwarded`, `= 404 {...}`)
//! and every action drained, in order:
//!
//! | action | transcript |
//! |---|---|
//! | `Rewrite` | `-> backend: {...}` (without its final `\n`) |
//! | `Reply` | `-> backend (proxy): {...}` (without its final `\n`) |
//! | `Deliver` | `-> A: {...}` |
//! | `Broadcast` | `-> all [A, B]: {...}` (the live sessions) |
//! | `Drop` | `-> drop reason method=m level=warn` |
//! | `CloseSession` | `-> close A` |
//! | `Pong` | `-> pong 1` |
//!
//! Invariants checked on every action before the snapshot: a Deliver names a live session
//! and holds one JSON object with no raw CR or LF; a Broadcast is exactly one of the three
//! `list_changed` messages without params; a Rewrite or Reply is one JSON object followed by
//! exactly one `\n` and no other raw CR or LF.

use std::fmt::Write as _;

use serde_json::value::RawValue;
use switchboard_core::{Accepted, Action, Body, LogLevel, Principal, Rejection, Router, SessionId};

/// Asserts a scenario transcript against its snapshot, named after the scenario file.
macro_rules! assert_transcript {
    ($transcript:expr) => {
        insta::with_settings!({
            omit_expression => true,
            prepend_module_to_snapshot => false,
        }, {
            insta::assert_snapshot!($transcript);
        })
    };
}

#[test]
fn scenarios() {
    insta::glob!("scenarios/*.txt", |path| {
        let script = std::fs::read_to_string(path).expect("scenario files are UTF-8 text");
        let mut harness = Harness::new();
        for (n, line) in script.lines().enumerate() {
            harness.run_line(line.trim_end(), n + 1);
        }
        assert_transcript!(harness.out);
    });
}

const LIST_CHANGED: [&str; 3] = [
    "notifications/tools/list_changed",
    "notifications/resources/list_changed",
    "notifications/prompts/list_changed",
];

struct Harness {
    router: Router,
    /// Labels in order of first use, with their session ids.
    labels: Vec<(String, SessionId)>,
    /// The principal each opened label was bound to.
    owners: Vec<(String, Principal)>,
    out: String,
}

impl Harness {
    fn new() -> Self {
        let mut router = Router::new(10_000);
        router.backend_started();
        assert_eq!(
            router.poll_action(),
            None,
            "starting the backend emits nothing"
        );
        Harness {
            router,
            labels: Vec::new(),
            owners: Vec::new(),
            out: String::new(),
        }
    }

    fn sid(&mut self, label: &str) -> SessionId {
        assert!(is_label(label), "not a session label: {label:?}");
        if let Some((_, sid)) = self.labels.iter().find(|(l, _)| l == label) {
            return *sid;
        }
        let n = u8::try_from(self.labels.len() + 1).expect("fewer than 256 labels");
        let sid = SessionId::from_random([n; 16]);
        self.labels.push((label.to_owned(), sid));
        sid
    }

    fn owner(&self, label: &str) -> Principal {
        self.owners
            .iter()
            .find(|(l, _)| l == label)
            .map(|(_, p)| p.clone())
            .unwrap_or_else(|| panic!("session {label} was never opened"))
    }

    fn label_of(&self, sid: &SessionId) -> String {
        self.labels
            .iter()
            .find(|(_, s)| s == sid)
            .map(|(l, _)| l.clone())
            .unwrap_or_else(|| sid.to_string())
    }

    /// Replaces `<LABEL>` with the label's session id and `${N*text}` with `text` N times.
    fn expand(&mut self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find(['<', '$']) {
            out.push_str(&rest[..at]);
            rest = &rest[at..];
            if let Some(inner) = rest.strip_prefix('<') {
                if let Some(end) = inner.find('>').filter(|&end| is_label(&inner[..end])) {
                    let sid = self.sid(&inner[..end]);
                    out.push_str(sid.as_str());
                    rest = &inner[end + 1..];
                    continue;
                }
            } else if let Some(inner) = rest.strip_prefix("${") {
                let end = inner.find('}').expect("`${` is closed by `}`");
                let (count, unit) = inner[..end].split_once('*').expect("`${N*text}`");
                let count: usize = count.parse().expect("`${N*text}` with N a number");
                out.push_str(&unit.repeat(count));
                rest = &inner[end + 1..];
                continue;
            }
            out.push_str(&rest[..1]);
            rest = &rest[1..];
        }
        out.push_str(rest);
        out
    }

    fn run_line(&mut self, line: &str, number: usize) {
        if line.is_empty() {
            self.out.push('\n');
            return;
        }
        writeln!(self.out, "{line}").unwrap();
        if line.starts_with('#') {
            return;
        }
        let (command, rest) = line.split_once(' ').unwrap_or((line, ""));
        let wrong = || -> ! { panic!("line {number}: cannot read {line:?}") };
        match command {
            "open" => {
                let (label, principal) = rest.split_once(' ').unwrap_or_else(|| wrong());
                assert!(
                    !self.owners.iter().any(|(l, _)| l == label),
                    "line {number}: session ids are never reused; use a new label"
                );
                let sid = self.sid(label);
                let principal = Principal::new(principal);
                self.owners.push((label.to_owned(), principal.clone()));
                if let Err(rejection) = self.router.open_session(sid, principal) {
                    self.answer(Err(rejection));
                }
            }
            "close" => {
                let sid = self.sid(rest);
                self.router.close_session(&sid);
            }
            "post" | "post-raw" | "post-too-large" => {
                let (label, body) = rest.split_once(' ').unwrap_or((rest, ""));
                let principal = self.owner(label);
                self.post(label, &principal, command, body);
            }
            "post-as" => {
                let (principal, rest) = rest.split_once(' ').unwrap_or_else(|| wrong());
                let (label, body) = rest.split_once(' ').unwrap_or_else(|| wrong());
                self.post(label, &Principal::new(principal), "post", body);
            }
            "post-sid" => {
                let mut values = serde_json::Deserializer::from_str(rest).into_iter::<String>();
                let session = values
                    .next()
                    .and_then(Result::ok)
                    .unwrap_or_else(|| wrong());
                let rest = rest[values.byte_offset()..].trim_start();
                let (principal, body) = match rest.strip_prefix("as ") {
                    Some(rest) => {
                        let (principal, body) = rest.split_once(' ').unwrap_or_else(|| wrong());
                        (Principal::new(principal), body)
                    }
                    None => (Principal::anonymous(), rest),
                };
                let session = self.expand(&session);
                let body = self.expand(body);
                let result = self.router.client_message(
                    &session,
                    &principal,
                    Body::Complete(body.as_bytes()),
                );
                self.answer(result);
            }
            "backend" => {
                let line = self.expand(rest);
                self.router.backend_line(line.as_bytes());
            }
            "backend-raw" => {
                let line = unescape(&self.expand(rest));
                self.router.backend_line(&line);
            }
            "backend-too-long" => self.router.backend_line_too_long(),
            "backend-exit" => self.router.backend_exited(),
            "backend-start" => self.router.backend_started(),
            "ping" => {
                self.router.health_ping();
            }
            _ => wrong(),
        }
        self.drain();
    }

    fn post(&mut self, label: &str, principal: &Principal, command: &str, body: &str) {
        let sid = self.sid(label);
        let bytes = match command {
            "post-raw" => unescape(&self.expand(body)),
            _ => self.expand(body).into_bytes(),
        };
        let body = match command {
            "post-too-large" => Body::TooLarge,
            _ => Body::Complete(&bytes),
        };
        let result = self.router.client_message(sid.as_str(), principal, body);
        self.answer(result);
    }

    /// Writes the HTTP answer to a POST (or the refusal of a stream).
    fn answer(&mut self, result: Result<Accepted, Rejection>) {
        let text = match result {
            Ok(Accepted::Forwarded) => "202 forwarded".to_owned(),
            Ok(Accepted::Answered) => "202 answered".to_owned(),
            Ok(Accepted::Absorbed) => "202 absorbed".to_owned(),
            Err(rejection) => {
                let response = rejection.response();
                let mut text = format!(
                    "{} {}",
                    response.status,
                    String::from_utf8(response.body).expect("error bodies are UTF-8")
                );
                for (name, value) in response.headers {
                    if name != "content-type" {
                        write!(text, " ({name}: {value})").unwrap();
                    }
                }
                text
            }
        };
        writeln!(self.out, "  = {text}").unwrap();
    }

    /// Drains every action, checking the invariants and writing each to the transcript.
    fn drain(&mut self) {
        while let Some(action) = self.router.poll_action() {
            self.check(&action);
            let text = match &action {
                // `check` made sure the line ends in exactly one `\n`; it is not shown.
                Action::Rewrite { line } => {
                    format!("backend: {}", self.render(&line[..line.len() - 1]))
                }
                Action::Reply { line } => {
                    format!("backend (proxy): {}", self.render(&line[..line.len() - 1]))
                }
                Action::Deliver { session, message } => {
                    format!("{}: {}", self.label_of(session), self.render(message))
                }
                Action::Broadcast { message } => {
                    let live: Vec<String> =
                        self.router.sessions().map(|s| self.label_of(s)).collect();
                    format!("all [{}]: {}", live.join(", "), self.render(message))
                }
                Action::Drop {
                    reason,
                    method,
                    level,
                } => {
                    let level = match level {
                        LogLevel::Warn => "warn",
                        LogLevel::Debug => "debug",
                    };
                    let method = method.as_deref().unwrap_or("-");
                    format!("drop {reason} method={method} level={level}")
                }
                Action::CloseSession { session } => format!("close {}", self.label_of(session)),
                Action::Pong { ping } => format!("pong {ping}"),
            };
            writeln!(self.out, "  -> {text}").unwrap();
        }
    }

    fn check(&self, action: &Action) {
        match action {
            Action::Rewrite { line } | Action::Reply { line } => {
                let body = line
                    .strip_suffix(b"\n")
                    .unwrap_or_else(|| panic!("a backend line ends in \\n: {action:?}"));
                assert!(
                    !body.contains(&b'\n') && !body.contains(&b'\r'),
                    "a backend line holds no other raw newline: {action:?}"
                );
                assert_json_object(body, action);
            }
            Action::Deliver { session, message } => {
                assert!(
                    self.router.is_live(session),
                    "a Deliver names a live session: {action:?}"
                );
                assert!(
                    !message.contains(&b'\n') && !message.contains(&b'\r'),
                    "a delivered message holds no raw newline: {action:?}"
                );
                assert_json_object(message, action);
            }
            Action::Broadcast { message } => {
                assert!(
                    LIST_CHANGED.iter().any(|m| **message
                        == *format!(r#"{{"jsonrpc":"2.0","method":"{m}"}}"#).as_bytes()),
                    "a broadcast is a bare list_changed notification: {action:?}"
                );
            }
            Action::Drop { .. } | Action::CloseSession { .. } | Action::Pong { .. } => {}
        }
    }

    /// Bytes as readable text: control characters and invalid UTF-8 escaped, session ids
    /// replaced by their labels.
    fn render(&self, bytes: &[u8]) -> String {
        let mut text = String::with_capacity(bytes.len());
        for chunk in bytes.utf8_chunks() {
            for c in chunk.valid().chars() {
                match c {
                    '\n' => text.push_str("\\n"),
                    '\r' => text.push_str("\\r"),
                    '\t' => text.push_str("\\t"),
                    c if c.is_control() => write!(text, "\\x{:02x}", u32::from(c)).unwrap(),
                    c => text.push(c),
                }
            }
            for b in chunk.invalid() {
                write!(text, "\\x{b:02x}").unwrap();
            }
        }
        for (label, sid) in &self.labels {
            text = text.replace(sid.as_str(), &format!("<{label}>"));
        }
        text
    }
}

fn is_label(text: &str) -> bool {
    let mut chars = text.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase())
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
}

fn assert_json_object(bytes: &[u8], action: &Action) {
    let text = std::str::from_utf8(bytes).unwrap_or_else(|_| panic!("output is UTF-8: {action:?}"));
    let value: Box<RawValue> = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("output is one JSON value ({e}): {action:?}"));
    assert!(
        value.get().starts_with('{'),
        "output is a JSON object: {action:?}"
    );
}

/// Decodes `\xHH`, `\r`, `\n`, `\t` and `\\`; any other backslash is kept as written, so
/// JSON escapes such as `\"` and `\u00e9` pass through.
fn unescape(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let (decoded, used) = match (bytes[i], bytes.get(i + 1)) {
            (b'\\', Some(b'x')) => {
                let hex = text.get(i + 2..i + 4).expect("`\\x` takes two hex digits");
                let byte = u8::from_str_radix(hex, 16).expect("`\\x` takes two hex digits");
                (byte, 4)
            }
            (b'\\', Some(b'r')) => (b'\r', 2),
            (b'\\', Some(b'n')) => (b'\n', 2),
            (b'\\', Some(b't')) => (b'\t', 2),
            (b'\\', Some(b'\\')) => (b'\\', 2),
            (b, _) => (b, 1),
        };
        out.push(decoded);
        i += used;
    }
    out
}
