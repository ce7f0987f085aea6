//! The scenario language: scripts of inputs to a [`Driver`] and the readable transcript of
//! what came out. One parser ([`parse`]) serves the snapshot tests and the fuzz corpus tools.
//!
//! One command per line; lines starting with `#` are comments (copied into the transcript),
//! blank lines separate paragraphs. Sessions are named by labels (`A`, `B`, `C1`: an
//! uppercase letter then uppercase letters or digits); each label gets a fixed session id
//! (`SessionId::from_random([n; 16])`, `n` counting labels in order of first use) and is
//! printed `<A>` wherever that id's text appears. In arguments, `<A>` is replaced by A's
//! session id and `${300*a}` by 300 `a`s.
//!
//! | command | input |
//! |---|---|
//! | `open A alice` | `GET /sse` as principal `alice`; the stream is A's |
//! | `hangup A` | A's client hangs up its stream |
//! | `leave 12` | the client of the request on line 12 hangs up before its answer |
//! | `stall A`, `resume A` | A's client stops reading (its queue fills up to the budget), or reads again |
//! | `post A {...}` | `POST /messages?session_id=<A>` as A's principal |
//! | `post-as bob A {...}` | the same as principal `bob` |
//! | `post-raw A bytes` | the body with `\xHH`, `\r`, `\n`, `\t`, `\\` decoded (any other `\` is kept) |
//! | `post-too-large A` | a body over `--max-body` |
//! | `post-sid "text" [as bob] {...}` | the raw session text (a JSON string) as `anonymous` or `bob` |
//! | `backend {...}`, `backend-raw bytes` | a line on the backend's stdout |
//! | `backend-too-long` | a stdout line over `--max-line` |
//! | `backend-exit [STATUS\|signal]` | the backend exits (default status 1) |
//! | `spawn-fails N` | the next N backend starts fail |
//! | `stdin-stall`, `stdin-drain` | the backend stops reading its stdin, or reads everything |
//! | `stubborn-backend` | the backend ignores its stdin closing and SIGTERM |
//! | `at +DURATION` | virtual time moves on (`500ms`, `30s`, `2m`); timers fire at their own times |
//! | `health` | `GET /health` |
//! | `metrics [PREFIX]` | `GET /metrics`, showing the sample lines that start with PREFIX |
//! | `sigterm` | SIGTERM for the proxy |
//! | `unserved` | the shell could not start a thread for a new connection (its request unread) |
//! | `fetched URL STATUS [max-age=N] BODY`, `fetch-fails URL WHY` | the fetch of URL under way answers, or fails |
//! | `unknown-kid [ISSUER]` | the gate refused a token of ISSUER (default `http://127.0.0.1:9000`) naming a key none of that issuer's key sets has |
//! | `reload [principals=a,b] [FLAG=VALUE ...]` | SIGHUP: the settings now, each FLAG as `with` sets it (a list flag it names starts empty; `jwks-url` and `oauth-issuer` share the key sources); the token file names only these principals (default: every session's) |
//! | `reload-fails WHY` | SIGHUP, and a file failed |
//! | `mcp-init A alice {...}` | `POST /mcp` without a session as `alice` (an `initialize`): the new session is A |
//! | `mcp-post A {...}` | `POST /mcp` with A's `Mcp-Session-Id`, accepting JSON and SSE; an answer stream is `A@LINE` |
//! | `mcp-get A`, `mcp-delete A` | `GET /mcp` (the stream `A/get`), `DELETE /mcp` for A |
//! | `mcp-raw METHOD [A] [key=value ...] [{...}]` | any `/mcp` request: `as=bob`, `session=none\|B\|text`, `accept=json\|sse\|both\|any\|none\|TYPE`, `type=json\|none\|TYPE`, `version=V`, `last-event-id=ID`, `origin=O`, `scopes=a,b` and `claims={...}` (the token's; JSON without spaces), `body=too-large`, `mcp-method=M`, `mcp-name=N`, `mcp-param-X=V` (repeatable) |
//! | `hangup S`, `stall S` with a stream name | `A`, `A/get`, `A@12`, `A/resume@12` |
//! | `trace-headers TRACEPARENT [TRACESTATE]` | the next POST carries these `traceparent` and `tracestate` headers (with `with trace`) |
//! | `with FLAG VALUE` | before any other command: `restart never`, `keepalive 10s`, `ping-interval 5s`, `ping-timeout 2s`, `grace 1s`, `session-buffer 8192`, `max-sessions 2`, `stdin-queue 2`, `stdin-window 2` (lines the shell holds), `backend-window 3` (client requests written and unanswered), `restart-wait 1s`, `restart-buffer 1KiB`, `on-backend-exit close-sessions`, `resume-window 0s` (no resumption), `resume-buffer 1KiB`, `resume-global 8KiB` (the cap over every session), `oauth-issuer URL`, `jwks-url URL` (key sources), `required-scope S`, `tool-scope T=S` (an OAuth resource server at `http://127.0.0.1:8000/`), `rate-limit 2/min`, `tool-rate-limit T=1/min`, `max-sessions-per-principal 2`, `authz {...}` (a policy file, on one line), `audit on` or `audit data=64` (with the messages, cut to 64 bytes), `modern off` (2026-07-28 requests refused as under `--modern off`), `trace on` or `trace SAMPLER[:ARG]` (spans made, as with `--otlp-endpoint`; `trace traceidratio:0`), `instance a` (ids are minted as `a.<uuid>`, `<A>` still expands to the whole id and transcripts show it as `a.<A>`); `spawn-fails N` makes the first N starts fail |
//!
//! The transcript shows each command, then what followed, indented:
//!
//! | output | transcript |
//! |---|---|
//! | answer to this line's request | `= 202 Accepted`, `= 404 {...} (retry-after: 1)`, `= 200 stream A (content-type: text/event-stream, ...)` |
//! | answer to an earlier line's request | `= (line 12) 503 {...}` |
//! | a frame on a stream | `-> A: {...}`, `-> A: endpoint /messages?...`, `-> A: keep-alive` |
//! | the end of a stream | `-> end A` |
//! | a line for the backend | `-> backend: {...}` |
//! | backend process control | `-> spawn backend`, `-> close backend stdin`, `-> signal Terminate` |
//! | `Log` | `-> drop reason method=m level=warn`, `-> log: text` |
//! | the shell and the scripted world | `.. text` |
//! | outputs of a timer | preceded by `@12.5s` (virtual time since the start) |

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use switchboard_core::http::{Admitted, Endpoint, McpHeaders};
use switchboard_core::hub::{Payload, Settings};
use switchboard_core::routed_id::Instance;
use switchboard_core::Exit;
use switchboard_core::{Event, LogLevel, Output, Principal, RequestId, SessionId, StreamId};

use crate::driver::{Driver, Record, Seen};

/// One command of a script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `open A alice`.
    Open {
        /// Session label.
        label: String,
        /// Principal name.
        principal: String,
    },
    /// `hangup A`.
    HangUp(String),
    /// `leave 12`: the client of the request on that line hangs up before its answer.
    Leave(usize),
    /// `stall A` (`true`) or `resume A` (`false`).
    Stall(String, bool),
    /// A POST to a labelled session.
    Post {
        /// Session label.
        label: String,
        /// Who posts instead of the owner (`post-as`).
        principal: Option<String>,
        /// The body, unexpanded.
        body: PostBody,
    },
    /// `post-sid "text" [as bob] {...}`.
    PostSid {
        /// The session text (a decoded JSON string), unexpanded.
        session: String,
        /// `bob`, else anonymous.
        principal: Option<String>,
        /// The body, unexpanded.
        body: String,
    },
    /// `backend {...}` (`raw`: `backend-raw`), unexpanded.
    Backend {
        /// The line.
        line: String,
        /// Decode `\xHH` escapes.
        raw: bool,
    },
    /// `backend-too-long`.
    BackendTooLong,
    /// `backend-exit [STATUS|signal]`.
    BackendExit(Exit),
    /// `spawn-fails N`.
    SpawnFails(usize),
    /// `stdin-stall` (`true`), `stdin-drain` (`false`).
    StdinStall(bool),
    /// `stubborn-backend`.
    StubbornBackend,
    /// `at +DURATION`.
    At(Duration),
    /// `health`.
    Health,
    /// `metrics [PREFIX]`.
    Metrics(String),
    /// `sigterm`.
    Sigterm,
    /// `unserved`: the shell could not start a thread for a new connection.
    Unserved,
    /// `fetched URL STATUS [max-age=N] BODY`: the fetch of URL under way answers.
    Fetched {
        url: String,
        status: u16,
        cache_control: Option<String>,
        body: String,
    },
    /// `fetch-fails URL WHY`: the fetch of URL under way fails.
    FetchFails { url: String, why: String },
    /// `unknown-kid [ISSUER]`: the gate refused a token of ISSUER naming a key none of its
    /// key sets has.
    UnknownKid(String),
    /// `reload [principals=a,b] [FLAG=VALUE ...]`: the configuration read again.
    Reload {
        /// The principals the token file names now; `None`: every session's owner.
        principals: Option<Vec<String>>,
        /// Settings changed, as `with FLAG VALUE` would set them.
        settings: Vec<(String, String)>,
    },
    /// `reload-fails WHY`: a reload was refused.
    ReloadFails(String),
    /// `with FLAG VALUE`, before any other command: a setting of the hub.
    With(String, String),
    /// `trace-headers TRACEPARENT [TRACESTATE]`: the next POST's trace headers.
    TraceHeaders(String, Option<String>),
    /// A request on `/mcp`.
    Mcp(Box<McpCommand>),
}

/// A request on `/mcp` (`mcp-init`, `mcp-post`, `mcp-get`, `mcp-delete`, `mcp-raw`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpCommand {
    /// `POST`, `GET` or `DELETE`.
    pub method: &'static str,
    /// The session: its label names it (and, with `creates`, gets the new session).
    pub label: Option<String>,
    /// An `initialize` without a session header that starts the labelled session.
    pub creates: bool,
    /// Who asks; default the labelled session's owner.
    pub principal: Option<String>,
    /// The headers.
    pub headers: McpHeaderOptions,
    /// The body, unexpanded.
    pub body: Option<String>,
}

/// Where a scripted request's OAuth challenge points.
const METADATA_URL: &str = "http://127.0.0.1:8000/.well-known/oauth-protected-resource/mcp";
/// The same for the legacy transport's endpoints (a POST to `/messages` included).
const LEGACY_METADATA_URL: &str = "http://127.0.0.1:8000/.well-known/oauth-protected-resource/sse";

/// The headers of a scripted `/mcp` request; `session` (a label, or `"text"` in quotes)
/// overrides the labelled session's id.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct McpHeaderOptions {
    /// `Mcp-Session-Id`: `None` to send the labelled session's (or none for `creates`).
    pub session: Option<Option<String>>,
    /// `Accept`.
    pub accept: Option<String>,
    /// `Content-Type`.
    pub content_type: Option<String>,
    /// `MCP-Protocol-Version`.
    pub version: Option<String>,
    /// `Last-Event-ID`.
    pub last_event_id: Option<String>,
    /// `Origin`, for CORS.
    pub origin: Option<String>,
    /// The scopes the caller's token grants (`scopes=a,b`).
    pub scopes: Option<Vec<String>>,
    /// The claims of the caller's token (`claims={...}`, JSON without spaces).
    pub claims: Option<String>,
    /// `Mcp-Method`, `Mcp-Name` and `Mcp-Param-*` (a 2026-07-28 request), in order.
    pub fields: Vec<(String, String)>,
}

impl McpHeaderOptions {
    /// What an SDK client sends: both media types accepted, a JSON body.
    pub fn standard() -> McpHeaderOptions {
        McpHeaderOptions {
            session: None,
            accept: Some("application/json, text/event-stream".to_owned()),
            content_type: Some("application/json".to_owned()),
            version: None,
            last_event_id: None,
            origin: None,
            scopes: None,
            claims: None,
            fields: Vec::new(),
        }
    }
}

/// `mcp-raw METHOD [LABEL] [key=value ...] [{body}]`: keys `as`, `session` (`none`, a label,
/// or any text), `accept` (`json`, `sse`, `both`, `any`, `none`, or a media range without
/// spaces), `type` (`json`, `none`, or a media type), `version`, `origin`.
fn parse_mcp_raw(rest: &str) -> Option<Command> {
    let (method, mut rest) = rest.split_once(' ').unwrap_or((rest, ""));
    let method = match method {
        "POST" => "POST",
        "GET" => "GET",
        "DELETE" => "DELETE",
        "OPTIONS" => "OPTIONS",
        _ => return None,
    };
    let mut command = McpCommand {
        method,
        label: None,
        creates: false,
        principal: None,
        headers: McpHeaderOptions::standard(),
        body: None,
    };
    if method == "GET" {
        command.headers.accept = Some("text/event-stream".to_owned());
    }
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        if rest.starts_with('{') || rest.starts_with('[') {
            command.body = Some(rest.to_owned());
            break;
        }
        let (word, more) = rest.split_once(' ').unwrap_or((rest, ""));
        rest = more;
        if is_label(word) {
            command.label = Some(word.to_owned());
            continue;
        }
        let (key, value) = word.split_once('=')?;
        let none = value == "none";
        match key {
            "as" => command.principal = Some(value.to_owned()),
            "session" => {
                let value = value.trim_matches('"');
                command.headers.session = Some((!none).then(|| value.to_owned()))
            }
            "accept" => {
                command.headers.accept = match value {
                    "json" => Some("application/json".to_owned()),
                    "sse" => Some("text/event-stream".to_owned()),
                    "both" => Some("application/json, text/event-stream".to_owned()),
                    "any" => Some("*/*".to_owned()),
                    "none" => None,
                    other => Some(other.to_owned()),
                }
            }
            "type" => {
                command.headers.content_type = match value {
                    "json" => Some("application/json".to_owned()),
                    "none" => None,
                    other => Some(other.to_owned()),
                }
            }
            "version" => command.headers.version = Some(value.to_owned()),
            "last-event-id" => command.headers.last_event_id = Some(value.to_owned()),
            "origin" => command.headers.origin = Some(value.to_owned()),
            "scopes" => {
                let scopes = value
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned);
                command.headers.scopes = Some(scopes.collect());
            }
            "claims" => {
                serde_json::from_str::<serde_json::Value>(value).ok()?;
                command.headers.claims = Some(value.to_owned());
            }
            "body" if value == "too-large" => command.body = Some(TOO_LARGE.to_owned()),
            _ if switchboard_core::http::is_modern_field(key) => {
                command
                    .headers
                    .fields
                    .push((key.to_owned(), value.to_owned()));
            }
            _ => return None,
        }
    }
    // A label with no session header: the request starts that session.
    command.creates = command.label.is_some() && command.headers.session == Some(None);
    if command.creates {
        command
            .principal
            .get_or_insert_with(|| "anonymous".to_owned());
    }
    Some(Command::Mcp(Box::new(command)))
}

/// The body text of `mcp-raw ... body=too-large`: a body over `--max-body`.
const TOO_LARGE: &str = "\0too-large";

/// A stream's name in a script: `A` (a legacy session's stream), `A/get` (a Streamable
/// session's GET stream), `A@12` (the answer stream of the request on line 12) or
/// `A/resume@12` (the stream of the GET with `Last-Event-ID` on line 12).
fn stream_name(text: &str) -> Option<String> {
    let label = text.split(['/', '@']).next()?;
    let rest = &text[label.len()..];
    let line = |n: &str| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
    let ok = is_label(label)
        && (rest.is_empty()
            || rest == "/get"
            || rest.strip_prefix('@').is_some_and(line)
            || rest.strip_prefix("/resume@").is_some_and(line));
    ok.then(|| text.to_owned())
}

/// A POST body in a script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostBody {
    /// JSON text (`post`, `post-as`).
    Text(String),
    /// Escaped bytes (`post-raw`).
    Raw(String),
    /// Over the limit (`post-too-large`).
    TooLarge,
}

/// One line of a script.
#[derive(Debug, Clone)]
pub struct Line {
    /// 1-based line number.
    pub number: usize,
    /// The text, trailing space removed.
    pub text: String,
    /// The command, or `None` for comments and blank lines.
    pub command: Option<Command>,
}

/// Parses a script; panics naming the line on anything it cannot read.
pub fn parse(script: &str) -> Vec<Line> {
    script
        .lines()
        .enumerate()
        .map(|(n, text)| {
            let text = text.trim_end();
            let command = (!text.is_empty() && !text.starts_with('#')).then(|| {
                parse_command(text)
                    .unwrap_or_else(|| panic!("line {}: cannot read {text:?}", n + 1))
            });
            Line {
                number: n + 1,
                text: text.to_owned(),
                command,
            }
        })
        .collect()
}

fn parse_command(line: &str) -> Option<Command> {
    let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
    let label = |text: &str| is_label(text).then(|| text.to_owned());
    Some(match word {
        "open" => {
            let (l, principal) = rest.split_once(' ')?;
            Command::Open {
                label: label(l)?,
                principal: principal.to_owned(),
            }
        }
        "hangup" => Command::HangUp(stream_name(rest)?),
        "leave" => Command::Leave(rest.parse().ok()?),
        "stall" => Command::Stall(stream_name(rest)?, true),
        "resume" => Command::Stall(stream_name(rest)?, false),
        "mcp-init" => {
            let (l, rest) = rest.split_once(' ')?;
            let (principal, body) = rest.split_once(' ')?;
            Command::Mcp(Box::new(McpCommand {
                method: "POST",
                label: Some(label(l)?),
                creates: true,
                principal: Some(principal.to_owned()),
                headers: McpHeaderOptions::standard(),
                body: Some(body.to_owned()),
            }))
        }
        "mcp-post" => {
            let (l, body) = rest.split_once(' ')?;
            Command::Mcp(Box::new(McpCommand {
                method: "POST",
                label: Some(label(l)?),
                creates: false,
                principal: None,
                headers: McpHeaderOptions::standard(),
                body: Some(body.to_owned()),
            }))
        }
        "mcp-get" | "mcp-delete" => Command::Mcp(Box::new(McpCommand {
            method: if word == "mcp-get" { "GET" } else { "DELETE" },
            label: Some(label(rest)?),
            creates: false,
            principal: None,
            headers: McpHeaderOptions {
                accept: Some(
                    if word == "mcp-get" {
                        "text/event-stream"
                    } else {
                        "application/json, text/event-stream"
                    }
                    .to_owned(),
                ),
                ..McpHeaderOptions::standard()
            },
            body: None,
        })),
        "mcp-raw" => parse_mcp_raw(rest)?,
        "post" | "post-raw" | "post-too-large" => {
            let (l, body) = rest.split_once(' ').unwrap_or((rest, ""));
            let body = match word {
                "post" => PostBody::Text(body.to_owned()),
                "post-raw" => PostBody::Raw(body.to_owned()),
                _ => PostBody::TooLarge,
            };
            Command::Post {
                label: label(l)?,
                principal: None,
                body,
            }
        }
        "post-as" => {
            let (principal, rest) = rest.split_once(' ')?;
            let (l, body) = rest.split_once(' ')?;
            Command::Post {
                label: label(l)?,
                principal: Some(principal.to_owned()),
                body: PostBody::Text(body.to_owned()),
            }
        }
        "post-sid" => {
            let mut values = serde_json::Deserializer::from_str(rest).into_iter::<String>();
            let session = values.next()?.ok()?;
            let rest = rest[values.byte_offset()..].trim_start();
            let (principal, body) = match rest.strip_prefix("as ") {
                Some(rest) => {
                    let (p, body) = rest.split_once(' ')?;
                    (Some(p.to_owned()), body)
                }
                None => (None, rest),
            };
            Command::PostSid {
                session,
                principal,
                body: body.to_owned(),
            }
        }
        "backend" | "backend-raw" => Command::Backend {
            line: rest.to_owned(),
            raw: word == "backend-raw",
        },
        "backend-too-long" => Command::BackendTooLong,
        "backend-exit" => Command::BackendExit(match rest {
            "" => Exit::Code(1),
            "signal" => Exit::Signal,
            code => Exit::Code(code.parse().ok()?),
        }),
        "spawn-fails" => Command::SpawnFails(rest.parse().ok()?),
        "stdin-stall" => Command::StdinStall(true),
        "stdin-drain" => Command::StdinStall(false),
        "stubborn-backend" => Command::StubbornBackend,
        "at" => Command::At(parse_duration(rest.strip_prefix('+')?)?),
        "health" => Command::Health,
        "trace-headers" => match rest.split_once(' ') {
            Some((parent, state)) => Command::TraceHeaders(parent.into(), Some(state.into())),
            None => Command::TraceHeaders(rest.to_owned(), None),
        },
        "metrics" => Command::Metrics(rest.to_owned()),
        "sigterm" => Command::Sigterm,
        "unserved" => Command::Unserved,
        "unknown-kid" => Command::UnknownKid(match rest {
            "" => DEFAULT_ISSUER.to_owned(),
            issuer => issuer.to_owned(),
        }),
        "reload" => parse_reload(rest)?,
        "reload-fails" => Command::ReloadFails(rest.to_owned()),
        "fetch-fails" => {
            let (url, why) = rest.split_once(' ')?;
            Command::FetchFails {
                url: url.to_owned(),
                why: why.to_owned(),
            }
        }
        "fetched" => {
            let (url, rest) = rest.split_once(' ')?;
            let (status, rest) = rest.split_once(' ').unwrap_or((rest, ""));
            let (cache_control, body) = match rest.strip_prefix("max-age=") {
                Some(r) => {
                    let (age, body) = r.split_once(' ').unwrap_or((r, ""));
                    (Some(format!("max-age={age}")), body)
                }
                None => (None, rest),
            };
            Command::Fetched {
                url: url.to_owned(),
                status: status.parse().ok()?,
                cache_control,
                body: body.to_owned(),
            }
        }
        "with" => {
            let (flag, value) = rest.split_once(' ')?;
            Command::With(flag.to_owned(), value.to_owned())
        }
        _ => return None,
    })
}

/// `reload [principals=a,b] [FLAG=VALUE ...]`.
fn parse_reload(rest: &str) -> Option<Command> {
    let mut principals = None;
    let mut settings = Vec::new();
    for word in rest.split_whitespace() {
        let (key, value) = word.split_once('=')?;
        match key {
            "principals" => principals = Some(value.split(',').map(str::to_owned).collect()),
            _ => settings.push((key.to_owned(), value.to_owned())),
        }
    }
    Some(Command::Reload {
        principals,
        settings,
    })
}

/// `500ms`, `1.5s`, `30s`, `2m`.
fn parse_duration(text: &str) -> Option<Duration> {
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60.0)
    } else {
        return None;
    };
    let value: f64 = number.parse().ok()?;
    Some(Duration::from_secs_f64(value * scale))
}

/// Whether `text` is a session label.
pub fn is_label(text: &str) -> bool {
    let mut chars = text.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase())
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
}

/// Labels numbered in order of first use, and the text expansion of scripts.
#[derive(Debug, Default, Clone)]
pub struct Labels {
    labels: Vec<(String, SessionId)>,
    instance: Option<Instance>,
}

impl Labels {
    /// Labels for a hub that mints its ids under `instance` (`with instance NAME`).
    pub fn for_instance(instance: Option<Instance>) -> Labels {
        Labels {
            labels: Vec::new(),
            instance,
        }
    }

    /// The session id of `label` (`from_random([n; 16])` for the n-th label first used,
    /// under the instance name if there is one).
    pub fn sid(&mut self, label: &str) -> SessionId {
        if let Some((_, sid)) = self.labels.iter().find(|(l, _)| l == label) {
            return *sid;
        }
        let n = u8::try_from(self.labels.len() + 1).expect("fewer than 256 labels");
        let sid = SessionId::mint(self.instance.as_ref(), [n; 16]);
        self.labels.push((label.to_owned(), sid));
        sid
    }

    /// The entropy that makes the hub mint `label`'s session id.
    pub fn entropy(&mut self, label: &str) -> [u8; 16] {
        self.sid(label);
        let n = self
            .labels
            .iter()
            .position(|(l, _)| l == label)
            .expect("just added")
            + 1;
        [u8::try_from(n).expect("fewer than 256 labels"); 16]
    }

    /// Replaces `<LABEL>` with the label's session id and `${N*text}` with `text` N times.
    pub fn expand(&mut self, text: &str) -> String {
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

    /// `text` with every labelled session id shown as `<LABEL>`, or `NAME.<LABEL>` under
    /// `with instance NAME` so that transcripts show the prefix.
    pub fn redact(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for (label, sid) in &self.labels {
            let shown = match sid.instance() {
                Some(name) => format!("{name}.<{label}>"),
                None => format!("<{label}>"),
            };
            text = text.replace(sid.as_str(), &shown);
        }
        text
    }
}

/// Decodes `\xHH`, `\r`, `\n`, `\t` and `\\`; any other backslash is kept as written, so
/// JSON escapes such as `\"` and `\u00e9` pass through.
pub fn unescape(text: &str) -> Vec<u8> {
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

/// The settings scenarios run with: the defaults, with a small session buffer so that a
/// stalled stream overflows after a few messages.
pub fn scenario_settings() -> Settings {
    Settings {
        session_buffer: 4096,
        ..Settings::default()
    }
}

/// Runs `script` and returns its transcript.
pub fn run(script: &str) -> String {
    let mut settings = scenario_settings();
    let mut failing_spawns = 0;
    let mut runner: Option<Runner> = None;
    let mut head = String::new();
    for line in parse(script) {
        if let Some(Command::With(flag, value)) = &line.command {
            assert!(
                runner.is_none(),
                "line {}: `with` comes before every other command",
                line.number
            );
            let applied = if flag == "spawn-fails" {
                value.parse().ok().map(|n| failing_spawns = n)
            } else {
                apply_setting(&mut settings, flag, value)
            };
            applied.unwrap_or_else(|| panic!("line {}: cannot apply {flag} {value}", line.number));
            writeln!(head, "{}", line.text).unwrap();
            continue;
        }
        if runner.is_none() && line.command.is_none() {
            writeln!(head, "{}", line.text).unwrap();
            continue;
        }
        let runner = runner.get_or_insert_with(|| {
            let mut r = Runner::new(settings.clone(), failing_spawns);
            r.out.insert_str(0, &std::mem::take(&mut head));
            r
        });
        runner.line(&line);
    }
    runner.map(|r| r.out).unwrap_or(head)
}

fn apply_setting(settings: &mut Settings, flag: &str, value: &str) -> Option<()> {
    use switchboard_core::config::{
        parse_duration as duration, parse_size as size, OnBackendExit, Restart,
    };
    match flag {
        "restart" => {
            settings.restart = match value {
                "never" => Restart::Never,
                "always" => Restart::Always,
                "on-failure" => Restart::OnFailure,
                _ => return None,
            }
        }
        "keepalive" => settings.keepalive = duration(value).ok()?,
        "ping-interval" => settings.ping_interval = duration(value).ok()?,
        "ping-timeout" => settings.ping_timeout = duration(value).ok()?,
        "grace" => settings.grace = duration(value).ok()?,
        "session-buffer" => settings.session_buffer = size(value).ok()?,
        "max-sessions" => settings.max_sessions = value.parse().ok()?,
        "max-inflight" => settings.max_inflight = value.parse().ok()?,
        "max-tasks-per-owner" => settings.max_tasks_per_owner = value.parse().ok()?,
        "pass-method" => drop(settings.pass_methods.insert(value.to_owned())),
        "list-cache" => match value {
            "off" => settings.list_cache = None,
            "on" => settings.list_cache = Some(8 << 20),
            _ => return None,
        },
        "list-cache-bytes" => settings.list_cache = Some(size(value).ok()?),
        // SPEC 16: `with tools NAME` (repeatable) and `with tools-override {JSON}`; the
        // view is built again from both each time.
        "tools" | "tools-override" => {
            let view = settings.tool_view.take();
            let mut tools: Vec<String> = view.as_ref().map(|v| v.allowed()).unwrap_or_default();
            let mut overrides = view.as_ref().and_then(|v| v.override_text());
            match flag {
                "tools" => tools.push(value.to_owned()),
                _ => overrides = Some(value.to_owned()),
            }
            let view = switchboard_core::ToolView::new(&tools, overrides.as_deref()).ok()??;
            settings.tool_view = Some(std::sync::Arc::new(view));
        }
        "session-idle" => settings.session_idle = duration(value).ok()?,
        "request-timeout" => {
            settings.request_timeout = Some(duration(value).ok()?).filter(|d| !d.is_zero())
        }
        "stdin-queue" => settings.stdin_queue = value.parse().ok()?,
        "stdin-window" => settings.stdin_window = value.parse().ok()?,
        "backend-window" => settings.backend_window = value.parse().ok()?,
        "restart-buffer" => settings.restart_buffer = size(value).ok()?,
        "oauth-issuer" => settings
            .key_sources
            .push(switchboard_core::KeySource::Issuer(value.to_owned())),
        "jwks-url" => settings
            .key_sources
            .push(switchboard_core::KeySource::Jwks {
                url: value.to_owned(),
                issuer: None,
            }),
        "restart-wait" => settings.restart_wait = duration(value).ok()?,
        "rate-limit" => settings.rate_limit = Some(value.parse().ok()?),
        "tool-rate-limit" => {
            let (tool, rate) = value.split_once('=')?;
            settings
                .tool_rate_limits
                .push((tool.to_owned(), rate.parse().ok()?));
        }
        "max-sessions-per-principal" => settings.max_sessions_per_principal = value.parse().ok()?,
        "required-scope" => oauth(settings).required.push(value.to_owned()),
        "tool-scope" => {
            let (tool, scope) = value.split_once('=')?;
            oauth(settings)
                .tool_scopes
                .push((tool.to_owned(), scope.to_owned()));
        }
        "resume-window" => {
            settings.resume_window = Some(duration(value).ok()?).filter(|d| !d.is_zero())
        }
        "resume-buffer" => settings.resume_buffer = size(value).ok()?,
        "resume-global" => settings.resume_global = size(value).ok()?,
        "on-backend-exit" => {
            settings.on_backend_exit = match value {
                "keep-sessions" => OnBackendExit::KeepSessions,
                "close-sessions" => OnBackendExit::CloseSessions,
                _ => return None,
            }
        }
        "instance" => settings.instance = Some(Instance::new(value).ok()?),
        "modern" => {
            settings.modern = match value {
                "on" => switchboard_core::config::Modern::On,
                "off" => switchboard_core::config::Modern::Off,
                _ => return None,
            }
        }
        "trace" => {
            let (name, arg) = match value.split_once(':') {
                Some((name, arg)) => (name, Some(arg)),
                None if value == "on" => ("parentbased_always_on", None),
                None => (value, None),
            };
            let sampler = switchboard_core::Sampler::parse(name, arg).ok()?;
            settings.tracing = Some(switchboard_core::Tracing {
                sampler,
                ..switchboard_core::Tracing::default()
            });
        }
        "audit" => {
            let max_data = match value {
                "on" => None,
                data => Some(size(data.strip_prefix("data=")?).ok()?),
            };
            settings.audit = Some(switchboard_core::Audit {
                include_data: max_data.is_some(),
                max_data: max_data.unwrap_or(4096),
                base_path: std::sync::Arc::from(""),
            });
        }
        "authz" => {
            let policy = switchboard_core::Policy::parse(value).ok()?;
            settings.policy = Some(std::sync::Arc::new(policy));
        }
        _ => return None,
    }
    Some(())
}

struct Runner {
    driver: Driver,
    /// The settings in force, which a `reload` changes.
    settings: Settings,
    labels: Labels,
    owners: BTreeMap<String, Principal>,
    streams: BTreeMap<StreamId, String>,
    label_streams: BTreeMap<String, StreamId>,
    requests: BTreeMap<RequestId, usize>,
    /// The stream name a request's answer stream gets (`A/get`, `A@12`).
    request_names: BTreeMap<RequestId, String>,
    /// The line being run.
    line_number: usize,
    /// The request of the line being run, answered inline.
    current: Option<RequestId>,
    metrics_prefix: Option<String>,
    /// The next POST's trace headers (`trace-headers`).
    trace_headers: Option<switchboard_core::TraceHeaders>,
    /// POSTs traced so far: the next one's ids are made of this number.
    traced: u8,
    out: String,
}

impl Runner {
    fn new(settings: Settings, failing_spawns: usize) -> Runner {
        let instance = settings.instance;
        let mut driver = Driver::start(settings.clone(), failing_spawns);
        let start = driver.take_records();
        assert!(
            start
                .iter()
                .any(|r| matches!(r.seen, Seen::Output(Output::SpawnBackend { .. }))),
            "the hub starts its backend"
        );
        let usual = start.iter().all(|r| {
            matches!(
                r.seen,
                Seen::Output(
                    Output::SpawnBackend { .. } | Output::Log(Event::BackendStarted { .. })
                )
            )
        });
        let mut runner = Runner {
            driver,
            settings,
            labels: Labels::for_instance(instance),
            owners: BTreeMap::new(),
            streams: BTreeMap::new(),
            label_streams: BTreeMap::new(),
            requests: BTreeMap::new(),
            request_names: BTreeMap::new(),
            line_number: 0,
            current: None,
            metrics_prefix: None,
            trace_headers: None,
            traced: 0,
            out: String::new(),
        };
        if !usual {
            // Only a start that went wrong is worth showing.
            runner.out.push_str("(start)\n");
            runner.render(Duration::ZERO, &start);
        }
        runner
    }

    fn line(&mut self, line: &Line) {
        let Some(command) = &line.command else {
            self.out.push_str(&line.text);
            self.out.push('\n');
            return;
        };
        writeln!(self.out, "{}", line.text).unwrap();
        let started = self.driver.elapsed();
        self.line_number = line.number;
        self.current = None;
        self.metrics_prefix = None;
        let request = self.run(command);
        if let Some(request) = request {
            self.requests.insert(request, line.number);
            self.current = Some(request);
        }
        let records = self.driver.take_records();
        self.render(started, &records);
    }

    /// `reload`: the running settings with `changes`; the token file names `principals`
    /// (default: every session's owner and `anonymous`, so no session ends).
    fn reload(&mut self, principals: Option<&[String]>, changes: &[(String, String)]) {
        for (flag, _) in changes {
            match flag.as_str() {
                "jwks-url" | "oauth-issuer" => self.settings.key_sources.clear(),
                "tool-rate-limit" => self.settings.tool_rate_limits.clear(),
                _ => {}
            }
        }
        for (flag, value) in changes {
            apply_setting(&mut self.settings, flag, value).unwrap_or_else(|| {
                panic!("line {}: cannot apply {flag}={value}", self.line_number)
            });
        }
        let names: std::collections::BTreeSet<Principal> = match principals {
            Some(names) => names.iter().map(|n| Principal::new(n)).collect(),
            None => (self.owners.values().cloned())
                .chain([Principal::anonymous()])
                .collect(),
        };
        self.driver.reload(switchboard_core::hub::Reload {
            settings: self.settings.clone(),
            principals: switchboard_core::Principals::Listed(names),
            ignored: Vec::new(),
        });
    }

    fn mcp(&mut self, command: &McpCommand) -> RequestId {
        let endpoint = match command.method {
            "POST" => Endpoint::McpPost,
            "GET" => Endpoint::McpGet,
            "OPTIONS" => Endpoint::Preflight,
            _ => Endpoint::McpDelete,
        };
        if command.creates {
            let label = command
                .label
                .as_deref()
                .expect("mcp-init names its session");
            assert!(
                !self.owners.contains_key(label),
                "session ids are never reused; use a new label for {label}"
            );
            let principal = Principal::new(command.principal.as_deref().unwrap_or("anonymous"));
            self.owners.insert(label.to_owned(), principal);
        }
        let principal = match (&command.principal, &command.label) {
            (Some(p), _) => Principal::new(p),
            (None, Some(label)) => self
                .owners
                .get(label)
                .cloned()
                .unwrap_or_else(Principal::anonymous),
            (None, None) => Principal::anonymous(),
        };
        let session = match (&command.headers.session, &command.label) {
            (Some(explicit), _) => explicit.as_ref().map(|text| {
                if is_label(text) {
                    self.labels.sid(text).to_string()
                } else {
                    self.labels.expand(text)
                }
            }),
            (None, Some(label)) if !command.creates => Some(self.labels.sid(label).to_string()),
            _ => None,
        };
        // A 2026-07-28 request is routed under a key of its own even when it names a session.
        let modern = command.headers.version.as_deref() == Some("2026-07-28");
        let entropy = match &command.label {
            Some(label) if command.creates || modern => self.labels.entropy(label),
            _ => [0xee; 16],
        };
        let body = match command.body.as_deref() {
            Some(TOO_LARGE) => Payload::TooLarge,
            Some(b) => Payload::Bytes(self.labels.expand(b).into_bytes()),
            None => Payload::Bytes(Vec::new()),
        };
        let admitted = Admitted {
            mcp: McpHeaders {
                session,
                content_type: command.headers.content_type.clone().map(Into::into),
                accept: command.headers.accept.clone().map(Into::into),
                protocol_version: command.headers.version.clone().map(Into::into),
                last_event_id: command.headers.last_event_id.clone(),
                fields: command.headers.fields.clone(),
            },
            cors: command.headers.origin.clone(),
            grant: switchboard_core::http::Grant {
                scopes: command.headers.scopes.clone().unwrap_or_default(),
                claims: (command.headers.claims.as_deref())
                    .map(|c| std::sync::Arc::new(serde_json::from_str(c).expect("checked"))),
                metadata_url: Some(METADATA_URL.to_owned()),
            },
            ..Admitted::new(endpoint, principal, "")
        };
        let request = self.send(admitted, body, entropy);
        if let Some(label) = &command.label {
            let name = match command.method {
                "GET" if command.headers.last_event_id.is_some() => {
                    format!("{label}/resume@{}", self.line_number)
                }
                "GET" => format!("{label}/get"),
                _ => format!("{label}@{}", self.line_number),
            };
            self.request_names.insert(request, name);
        }
        request
    }

    /// Sends a request the shell admitted; with tracing on, a POST gets the trace headers
    /// of `trace-headers` and ids of the number of POSTs traced before it (trace id bytes
    /// `n`, SERVER span `0x50 + n`, CLIENT span `0xc0 + n`).
    fn send(&mut self, mut admitted: Admitted, body: Payload, entropy: [u8; 16]) -> RequestId {
        let post = matches!(admitted.endpoint, Endpoint::Messages | Endpoint::McpPost);
        if self.settings.tracing.is_some() && post {
            let headers = self.trace_headers.take().unwrap_or_default();
            admitted.trace = Some(Box::new(headers));
        }
        let mut request = admitted.into_request(body, || entropy);
        request.seed_trace(|| {
            self.traced += 1;
            let n = self.traced;
            let mut bytes = [n; 32];
            bytes[16..24].fill(0x50 + n);
            bytes[24..].fill(0xc0 + n);
            bytes
        });
        self.driver.send(request)
    }

    fn stream(&self, label: &str) -> StreamId {
        *self
            .label_streams
            .get(label)
            .unwrap_or_else(|| panic!("session {label} has no stream"))
    }

    fn run(&mut self, command: &Command) -> Option<RequestId> {
        let d = &mut self.driver;
        match command {
            Command::Open { label, principal } => {
                assert!(
                    !self.owners.contains_key(label),
                    "session ids are never reused; use a new label for {label}"
                );
                let principal = Principal::new(principal);
                self.owners.insert(label.clone(), principal.clone());
                let entropy = self.labels.entropy(label);
                let request = d.request(
                    Endpoint::Stream,
                    principal,
                    "",
                    Payload::Bytes(Vec::new()),
                    entropy,
                );
                if let Some(stream) = d.stream_of(request) {
                    self.streams.insert(stream, label.clone());
                    self.label_streams.insert(label.clone(), stream);
                }
                Some(request)
            }
            Command::HangUp(label) => {
                let stream = self.stream(label);
                self.driver.hang_up(stream);
                None
            }
            Command::Leave(line) => {
                let request = (self.requests.iter())
                    .find(|(_, l)| *l == line)
                    .map(|(r, _)| *r)
                    .unwrap_or_else(|| panic!("no request on line {line}"));
                self.driver.client_left(request);
                None
            }
            Command::Stall(label, stalled) => {
                let stream = self.stream(label);
                self.driver.stall(stream, *stalled);
                None
            }
            Command::Post {
                label,
                principal,
                body,
            } => {
                let sid = self.labels.sid(label);
                let principal = match principal {
                    Some(p) => Principal::new(p),
                    None => self
                        .owners
                        .get(label)
                        .cloned()
                        .unwrap_or_else(|| panic!("session {label} was never opened")),
                };
                let body = match body {
                    PostBody::Text(text) => Payload::Bytes(self.labels.expand(text).into_bytes()),
                    PostBody::Raw(text) => Payload::Bytes(unescape(&self.labels.expand(text))),
                    PostBody::TooLarge => Payload::TooLarge,
                };
                let admitted = Admitted {
                    grant: switchboard_core::http::Grant {
                        scopes: Vec::new(),
                        claims: None,
                        metadata_url: Some(LEGACY_METADATA_URL.to_owned()),
                    },
                    ..Admitted::new(Endpoint::Messages, principal, sid.as_str())
                };
                Some(self.send(admitted, body, [0; 16]))
            }
            Command::PostSid {
                session,
                principal,
                body,
            } => {
                let session = self.labels.expand(session);
                let body = self.labels.expand(body).into_bytes();
                let principal = principal
                    .as_deref()
                    .map_or_else(Principal::anonymous, Principal::new);
                let admitted = Admitted::new(Endpoint::Messages, principal, &session);
                Some(self.send(admitted, Payload::Bytes(body), [0; 16]))
            }
            Command::Backend { line, raw } => {
                let text = self.labels.expand(line);
                let bytes = if *raw {
                    unescape(&text)
                } else {
                    text.into_bytes()
                };
                self.driver.backend_line(Some(&bytes));
                None
            }
            Command::BackendTooLong => {
                d.backend_line(None);
                None
            }
            Command::BackendExit(exit) => {
                d.backend_exit(*exit);
                None
            }
            Command::SpawnFails(n) => {
                d.fail_spawns(*n);
                None
            }
            Command::StdinStall(stalled) => {
                d.stall_stdin(*stalled);
                None
            }
            Command::StubbornBackend => {
                d.script.stubborn = true;
                None
            }
            Command::At(by) => {
                d.advance(*by);
                None
            }
            Command::Health => Some(d.request(
                Endpoint::Health,
                Principal::anonymous(),
                "",
                Payload::Bytes(Vec::new()),
                [0; 16],
            )),
            Command::Metrics(prefix) => {
                self.metrics_prefix = Some(prefix.clone());
                Some(d.request(
                    Endpoint::Metrics,
                    Principal::anonymous(),
                    "",
                    Payload::Bytes(Vec::new()),
                    [0; 16],
                ))
            }
            Command::Sigterm => {
                d.shutdown();
                None
            }
            Command::Unserved => Some(d.unserved()),
            Command::Fetched {
                url,
                status,
                cache_control,
                body,
            } => {
                let fetched = switchboard_core::hub::Fetched {
                    status: *status,
                    cache_control: cache_control.clone(),
                    body: body.clone().into_bytes(),
                };
                assert!(
                    d.answer_fetch(url, Ok(fetched)),
                    "no fetch of {url} under way"
                );
                None
            }
            Command::FetchFails { url, why } => {
                assert!(
                    d.answer_fetch(url, Err(why.clone())),
                    "no fetch of {url} under way"
                );
                None
            }
            Command::UnknownKid(issuer) => {
                let failure = switchboard_core::AuthFailure::UnknownKey;
                d.refused(
                    switchboard_core::Rejection::Unauthorized(failure),
                    Some(issuer),
                );
                None
            }
            Command::Reload {
                principals,
                settings,
            } => {
                self.reload(principals.as_deref(), settings);
                None
            }
            Command::ReloadFails(why) => {
                self.driver.reload_failed(why);
                None
            }
            Command::With(..) => unreachable!("handled before the hub starts"),
            Command::TraceHeaders(parent, state) => {
                self.trace_headers = Some(switchboard_core::TraceHeaders {
                    parent: switchboard_core::SpanContext::parse(parent),
                    tracestate: state.clone(),
                    entropy: [0; 32],
                });
                None
            }
            Command::Mcp(command) => Some(self.mcp(command)),
        }
    }

    fn render(&mut self, started: Duration, records: &[Record]) {
        let mut shown_at = started;
        for record in records {
            if record.at != shown_at {
                writeln!(self.out, "  @{}", show_time(record.at)).unwrap();
                shown_at = record.at;
            }
            let text = match &record.seen {
                Seen::Note(note) => format!(".. {}", self.name_streams(note)),
                Seen::Output(output) => match self.render_output(output) {
                    Some(text) => text,
                    None => continue,
                },
            };
            writeln!(self.out, "  {}", self.labels.redact(&text)).unwrap();
        }
    }

    fn name_streams(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for (stream, label) in &self.streams {
            text = text.replace(&format!("{stream:?}'s"), &format!("{label}'s"));
        }
        text
    }

    fn stream_label(&self, stream: StreamId) -> String {
        self.streams
            .get(&stream)
            .cloned()
            .unwrap_or_else(|| format!("{stream:?}"))
    }

    fn answer_prefix(&self, request: RequestId) -> String {
        if Some(request) == self.current {
            "= ".to_owned()
        } else {
            match self.requests.get(&request) {
                Some(line) => format!("= (line {line}) "),
                None => format!("= ({request:?}) "),
            }
        }
    }

    fn render_output(&mut self, output: &Output) -> Option<String> {
        Some(match output {
            Output::Fetch { url, .. } => format!("-> fetch {url}"),
            Output::UseKeys { sets } => format!("-> use {} fetched key set(s)", sets.len()),
            Output::Respond { request, response } => {
                let mut text = self.answer_prefix(*request);
                write!(text, "{}", response.status).unwrap();
                let body = String::from_utf8_lossy(&response.body);
                match &self.metrics_prefix {
                    Some(prefix) if response.status == 200 && Some(*request) == self.current => {
                        for l in body
                            .lines()
                            .filter(|l| !l.starts_with('#') && l.starts_with(prefix.as_str()))
                        {
                            write!(text, "\n    {l}").unwrap();
                        }
                    }
                    _ => {
                        if !response.body.is_empty() {
                            write!(text, " {}", render_bytes(&response.body)).unwrap();
                        }
                        for (name, value) in &response.headers {
                            if *name != "content-type" {
                                write!(text, " ({name}: {value})").unwrap();
                            }
                        }
                    }
                }
                text
            }
            Output::StartStream {
                request,
                stream,
                head,
                ..
            } => {
                if let Some(name) = self.request_names.get(request) {
                    self.streams.insert(*stream, name.clone());
                    self.label_streams.insert(name.clone(), *stream);
                }
                let headers: Vec<String> = head
                    .headers
                    .iter()
                    .map(|(n, v)| format!("{n}: {v}"))
                    .collect();
                format!(
                    "{}{} stream {} ({})",
                    self.answer_prefix(*request),
                    head.status,
                    self.stream_label(*stream),
                    headers.join(", ")
                )
            }
            Output::ToStream { stream, frame } => {
                let bytes = frame.as_ref();
                let shown = if bytes == switchboard_core::sse::KEEPALIVE {
                    "keep-alive".to_owned()
                } else if let Some(url) = bytes
                    .strip_prefix(b"event: endpoint\ndata: ")
                    .and_then(|r| r.strip_suffix(b"\n\n"))
                {
                    format!("endpoint {}", String::from_utf8_lossy(url))
                } else {
                    render_event(bytes)
                };
                format!("-> {}: {shown}", self.stream_label(*stream))
            }
            Output::EndStream { stream } => format!("-> end {}", self.stream_label(*stream)),
            Output::SpawnBackend { .. } => "-> spawn backend".to_owned(),
            Output::ToBackend { line, .. } => {
                format!("-> backend: {}", render_bytes(&line[..line.len() - 1]))
            }
            Output::CloseBackendStdin { .. } => "-> close backend stdin".to_owned(),
            Output::SignalBackend { signal, .. } => format!("-> signal {signal:?}"),
            Output::StopAccepting => "-> stop accepting".to_owned(),
            Output::Exit { status, drain } => {
                format!("-> exit {status} (answers under way get {drain:?})")
            }
            Output::Log(Event::Dropped {
                reason,
                method,
                level,
            }) => {
                let level = match level {
                    LogLevel::Warn => "warn",
                    LogLevel::Debug => "debug",
                };
                let method = method.as_deref().unwrap_or("-");
                format!("-> drop {reason} method={method} level={level}")
            }
            Output::Log(Event::SessionOpened { .. }) => return None,
            Output::Audit(record) => render_audit(record),
            Output::Span(span) => render_span(span),
            Output::Measured(m) => {
                // A series' attributes come with its first value only.
                let attributes = m.attributes.iter().flatten();
                let attributes: String = attributes.map(|(k, v)| format!(" {k}={v}")).collect();
                format!(
                    "-> measured {} {}s series={}{attributes}",
                    m.histogram.name(),
                    m.seconds,
                    m.series
                )
            }
            Output::Log(event) => {
                let who = event.session().map(|s| format!("{s} ")).unwrap_or_default();
                format!("-> log: {who}{event}")
            }
        })
    }
}

/// `-> span SERVER "tools/call get_time" trace=4bf92f35 id=0102030405060708
/// parent=00f067aa0ba902b7 5ms [mcp.method.name=tools/call ...]`: what a span says; a
/// trace id by its first 4 bytes.
fn render_span(s: &switchboard_core::SpanRecord) -> String {
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let kind = match s.kind {
        switchboard_core::SpanKind::Server => "SERVER",
        switchboard_core::SpanKind::Client => "CLIENT",
    };
    let mut text = format!(
        "-> span {kind} {:?} trace={} id={}",
        s.name,
        hex(&s.context.trace_id[..4]),
        hex(&s.context.span_id)
    );
    if let Some(parent) = s.parent_span_id {
        write!(text, " parent={}", hex(&parent)).unwrap();
    }
    write!(text, " {}ms", (s.end - s.start).as_millis()).unwrap();
    if s.status == switchboard_core::SpanStatus::Error {
        text.push_str(" ERROR");
    }
    for (key, value) in &s.attributes {
        match value {
            switchboard_core::Value::Str(v) => write!(text, " {key}={v:?}").unwrap(),
            switchboard_core::Value::Int(v) => write!(text, " {key}={v}").unwrap(),
        }
    }
    for link in &s.links {
        let id = (hex(&link.context.trace_id[..4]), hex(&link.context.span_id));
        write!(text, " link={}/{}", id.0, id.1).unwrap();
    }
    if let Some(state) = &s.tracestate {
        write!(text, " tracestate={state:?}").unwrap();
    }
    text
}

/// `-> audit mcp_tool_call success method=tools/call name=get_time id=1 session=<A>
/// user=alice 5ms 57B`: the fields of an audit event a scenario decides.
fn render_audit(r: &switchboard_core::AuditRecord) -> String {
    let mut text = format!("-> audit {} {}", r.kind.as_str(), r.outcome.as_str());
    let fields = [
        ("method", r.method.clone()),
        ("name", r.target_name.clone()),
        ("backend_tool", r.backend_tool.clone()),
        ("id", r.request_id.clone()),
        ("session", r.session.map(|s| s.as_str().to_owned())),
        ("user", r.user.as_ref().map(|u| u.to_string())),
        ("client", (r.client.as_ref()).and_then(|c| c.name.clone())),
        ("ip", r.source.ip.map(|ip| ip.to_string())),
        ("path", r.path.clone()),
    ];
    for (name, value) in fields {
        if let Some(value) = value {
            write!(text, " {name}={value}").unwrap();
        }
    }
    if r.transport.is_some() {
        write!(text, " {}ms", r.duration_ms).unwrap();
    }
    if let Some(size) = r.response_size {
        write!(text, " {size}B").unwrap();
    }
    if let Some((request, response, truncated)) = &r.data {
        let cut = if *truncated { " (truncated)" } else { "" };
        write!(text, " data={request} => {response}{cut}").unwrap();
    }
    text
}

/// `12.5s`.
fn show_time(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        let text = format!("{}.{:03}", ms / 1000, ms % 1000);
        format!("{}s", text.trim_end_matches('0'))
    }
}

/// Bytes as readable text: control characters and invalid UTF-8 escaped, and a run of
/// more than 16 of one character written as the scripts write it, `${1500*a}`.
pub fn render_bytes(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        let mut chars = chunk.valid().chars().peekable();
        while let Some(c) = chars.next() {
            let mut run = 1;
            while chars.peek() == Some(&c) {
                chars.next();
                run += 1;
            }
            if run > 16 && !c.is_control() && c != '}' && c != '{' {
                write!(text, "${{{run}*{c}}}").unwrap();
                continue;
            }
            for _ in 0..run {
                match c {
                    '\n' => text.push_str("\\n"),
                    '\r' => text.push_str("\\r"),
                    '\t' => text.push_str("\\t"),
                    c if c.is_control() => write!(text, "\\x{:02x}", u32::from(c)).unwrap(),
                    c => text.push(c),
                }
            }
        }
        for b in chunk.invalid() {
            write!(text, "\\x{b:02x}").unwrap();
        }
    }
    text
}

/// A stream's event as a transcript shows it: `[id] data`, `(priming)` for a priming event.
fn render_event(bytes: &[u8]) -> String {
    let event = crate::driver::without_id(bytes);
    let id = (event.len() < bytes.len())
        .then(|| String::from_utf8_lossy(&bytes[4..bytes.len() - event.len() - 1]));
    let data = match event {
        b"data: \n\n" => "(priming)".to_owned(),
        event => render_bytes(
            event
                .strip_prefix(b"event: message\ndata: ")
                .and_then(|r| r.strip_suffix(b"\n\n"))
                .unwrap_or(event),
        ),
    };
    match id {
        Some(id) => format!("[{id}] {data}"),
        None => data,
    }
}

/// The issuer of the scenario's resource server, and of `unknown-kid`'s token by default.
const DEFAULT_ISSUER: &str = "http://127.0.0.1:9000";

/// The scenario's resource server, made on first use: scopes need one.
fn oauth(settings: &mut Settings) -> &mut switchboard_core::ResourceServer {
    let oauth = settings.oauth.get_or_insert_with(|| {
        std::sync::Arc::new(switchboard_core::ResourceServer {
            resource: "http://127.0.0.1:8000/".into(),
            issuers: vec![DEFAULT_ISSUER.into()],
            scopes: Vec::new(),
            required: Vec::new(),
            tool_scopes: Vec::new(),
            name: "Switchboard".into(),
            public_url: None,
            listen_origin: "http://127.0.0.1:8000".into(),
            base_path: String::new(),
        })
    });
    std::sync::Arc::make_mut(oauth)
}
