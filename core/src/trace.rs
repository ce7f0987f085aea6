//! Traces (SPEC section 14) as data: W3C Trace Context (`traceparent`, `tracestate`), the
//! OpenTelemetry sampler, span ids from the shell's random bytes, and the finished span the
//! shell hands to its exporter ([`SpanRecord`]). Pure: the hub decides every span from its
//! own times; a shell only maps `Instant`s to wall time and exports.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::ops::Range;
use std::sync::LazyLock;
use std::time::Instant;

use memchr::memmem::Finder;

use crate::message::{span_of, Checked};

/// A span's identity as W3C Trace Context carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanContext {
    /// Never all zeros.
    pub trace_id: [u8; 16],
    /// Never all zeros.
    pub span_id: [u8; 8],
    /// The `sampled` trace flag.
    pub sampled: bool,
}

impl SpanContext {
    /// A `traceparent` value (W3C Trace Context level 1): version 00 exactly, a later
    /// version by its first four fields; `None` for anything invalid, which is then ignored.
    pub fn parse(text: &str) -> Option<SpanContext> {
        let text = text.trim_matches([' ', '\t']);
        let b = text.as_bytes();
        if b.len() < 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let version = hex::<1>(&text[..2])?[0];
        let exact = version == 0 && b.len() == 55;
        let later = version != 0 && version != 0xff && (b.len() == 55 || b[55] == b'-');
        if !(exact || later) {
            return None;
        }
        let trace_id = hex::<16>(&text[3..35])?;
        let span_id = hex::<8>(&text[36..52])?;
        let flags = hex::<1>(&text[53..55])?[0];
        let valid = trace_id != [0; 16] && span_id != [0; 8];
        valid.then_some(SpanContext {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }

    /// The `traceparent` value naming this span as the parent.
    pub fn traceparent(&self) -> String {
        let mut out = String::with_capacity(55);
        out.push_str("00-");
        push_hex(&mut out, &self.trace_id);
        out.push('-');
        push_hex(&mut out, &self.span_id);
        out.push_str(if self.sampled { "-01" } else { "-00" });
        out
    }
}

/// Lowercase hex of exactly `N` bytes (W3C forbids upper case).
fn hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0; N];
    for (byte, pair) in out.iter_mut().zip(digits.chunks(2)) {
        *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
}

/// A `tracestate` value worth passing on: at most 512 characters and 32 members, each
/// `key=value` in printable ASCII. Anything else is dropped, as W3C allows.
pub(crate) fn valid_tracestate(text: &str) -> Option<&str> {
    let text = text.trim_matches([' ', '\t']);
    let members = text.split(',').map(|m| m.trim_matches([' ', '\t']));
    let member_ok = |m: &str| match m.split_once('=') {
        None => m.is_empty(),
        Some((key, value)) => {
            !key.is_empty()
                && !value.is_empty()
                && key.bytes().all(|c| c.is_ascii_graphic())
                && value
                    .bytes()
                    .all(|c| (0x20..0x7f).contains(&c) && c != b',' && c != b'=')
        }
    };
    let ok = !text.is_empty() && text.len() <= 512 && text.split(',').count() <= 32;
    (ok && members.clone().all(member_ok)).then_some(text)
}

/// What a sampler decides when a span has no parent (`OTEL_TRACES_SAMPLER`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Root {
    /// `always_on`.
    AlwaysOn,
    /// `always_off`.
    AlwaysOff,
    /// `traceidratio`: this fraction of trace ids, by the id itself.
    Ratio(f64),
}

/// The OpenTelemetry sampler: a root decision, and whether a parent's `sampled` flag
/// decides instead (the `parentbased_*` samplers).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    /// For a span without a parent (or any span when not parent-based).
    pub root: Root,
    /// A parent's decision wins.
    pub parent_based: bool,
}

impl Default for Sampler {
    /// `parentbased_always_on`, the OpenTelemetry default.
    fn default() -> Self {
        Sampler {
            root: Root::AlwaysOn,
            parent_based: true,
        }
    }
}

impl Sampler {
    /// `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` (a ratio in [0, 1], default 1).
    pub fn parse(name: &str, arg: Option<&str>) -> Result<Sampler, String> {
        let (parent_based, root) = match name.strip_prefix("parentbased_") {
            Some(root) => (true, root),
            None => (false, name),
        };
        let root = match root {
            "always_on" => Root::AlwaysOn,
            "always_off" => Root::AlwaysOff,
            "traceidratio" => {
                let ratio = match arg {
                    None => 1.0,
                    Some(arg) => arg
                        .trim()
                        .parse::<f64>()
                        .map_err(|_| format!("OTEL_TRACES_SAMPLER_ARG {arg:?} is not a number"))?,
                };
                if !(0.0..=1.0).contains(&ratio) {
                    return Err(format!("OTEL_TRACES_SAMPLER_ARG {ratio} is not in [0, 1]"));
                }
                Root::Ratio(ratio)
            }
            _ => {
                return Err(format!(
                    "OTEL_TRACES_SAMPLER {name:?} is not a known sampler"
                ))
            }
        };
        Ok(Sampler { root, parent_based })
    }

    /// Whether a span of `trace_id` under `parent` is recorded and exported.
    pub fn samples(&self, trace_id: &[u8; 16], parent: Option<&SpanContext>) -> bool {
        if let (true, Some(parent)) = (self.parent_based, parent) {
            return parent.sampled;
        }
        match self.root {
            Root::AlwaysOn => true,
            Root::AlwaysOff => false,
            // As the OpenTelemetry SDKs do: the id's last 8 bytes against the ratio.
            Root::Ratio(ratio) => {
                let bound = (ratio * (1u64 << 63) as f64) as u64;
                let draw = u64::from_be_bytes(trace_id[8..].try_into().unwrap_or_default()) >> 1;
                draw < bound
            }
        }
    }
}

impl TraceHeaders {
    /// Ids for the request's spans from its random bytes: a trace id (used when it has no
    /// parent), the SERVER span's id and the CLIENT span's id; none all zeros.
    pub fn ids(&self) -> ([u8; 16], [u8; 8], [u8; 8]) {
        ids(&self.entropy)
    }
}

fn ids(entropy: &[u8; 32]) -> ([u8; 16], [u8; 8], [u8; 8]) {
    let mut trace_id: [u8; 16] = entropy[..16].try_into().unwrap_or_default();
    let mut server: [u8; 8] = entropy[16..24].try_into().unwrap_or_default();
    let mut client: [u8; 8] = entropy[24..].try_into().unwrap_or_default();
    trace_id[15] |= (trace_id == [0; 16]) as u8;
    server[7] |= (server == [0; 8]) as u8;
    client[7] |= (client == [0; 8]) as u8;
    if client == server {
        client[0] ^= 0xff;
    }
    (trace_id, server, client)
}

/// What a request brings for its spans when tracing is on: the HTTP `traceparent` and
/// `tracestate` headers (valid ones) and 32 random bytes for its ids.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceHeaders {
    /// The `traceparent` header, if valid.
    pub parent: Option<SpanContext>,
    /// The `tracestate` header, if valid.
    pub tracestate: Option<String>,
    /// Random bytes from the OS ([`crate::http::Request::seed_trace`]).
    pub entropy: [u8; 32],
}

/// SERVER for the client's request, CLIENT for the hop to the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// A request Switchboard answered (or the backend answered through it).
    Server,
    /// The backend hop.
    Client,
}

/// The span status: the conventions set ERROR only, never a description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanStatus {
    /// Nothing failed (or the caller erred).
    Unset,
    /// The request failed.
    Error,
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A string (most attribute values are names the proxy knows: no allocation).
    Str(Cow<'static, str>),
    /// An integer.
    Int(i64),
}

/// A link to another span (the HTTP header's context when `_meta` named the parent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanLink {
    /// The linked span.
    pub context: SpanContext,
    /// Its `tracestate`.
    pub tracestate: Option<String>,
}

/// One finished, sampled span ([`crate::Output::Span`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SpanRecord {
    /// Its trace id, span id and (always true here) sampled flag.
    pub context: SpanContext,
    /// The parent span's id (in the same trace), if any.
    pub parent_span_id: Option<[u8; 8]>,
    /// SERVER or CLIENT.
    pub kind: SpanKind,
    /// `{mcp.method.name} {target}`, or the method alone.
    pub name: String,
    /// When it started, on the hub's clock.
    pub start: Instant,
    /// When it ended.
    pub end: Instant,
    /// ERROR or unset.
    pub status: SpanStatus,
    /// The conventions' attributes, by their names in SPEC section 14.
    pub attributes: Vec<(&'static str, Value)>,
    /// Links (at most one: the header's context).
    pub links: Vec<SpanLink>,
    /// The `tracestate` to export with it.
    pub tracestate: Option<String>,
}

/// Bytes of each span attribute value and span name taken from a request, by default
/// (SPEC section 14; `OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT` sets another).
pub const VALUE_LIMIT: usize = 256;

/// What the hub needs to decide spans (SPEC section 14); the exporter's settings are the
/// shell's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tracing {
    /// `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`.
    pub sampler: Sampler,
    /// `OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`: bytes of each value and name taken from a
    /// request ([`VALUE_LIMIT`] by default).
    pub value_limit: usize,
}

impl Default for Tracing {
    fn default() -> Self {
        Tracing {
            sampler: Sampler::default(),
            value_limit: VALUE_LIMIT,
        }
    }
}

/// `text` cut to at most `limit` bytes at a character boundary.
pub(crate) fn cut(text: &str, limit: usize) -> &str {
    if text.len() <= limit {
        return text;
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A value cut to `limit` bytes, allocating only what is kept.
fn cut_value(value: Value, limit: usize) -> Value {
    match value {
        Value::Str(text) if text.len() > limit => Value::Str(cut(&text, limit).to_owned().into()),
        value => value,
    }
}

impl SpanRecord {
    /// About how many bytes it holds: what a queue of spans bounded by bytes counts.
    pub fn weight(&self) -> usize {
        let text = |value: &Value| match value {
            Value::Str(text) => text.len(),
            Value::Int(_) => 8,
        };
        let attributes: usize = (self.attributes.iter())
            .map(|(name, value)| name.len() + text(value) + 32)
            .sum();
        let states = (self.links.iter())
            .filter_map(|link| link.tracestate.as_ref())
            .chain(&self.tracestate)
            .map(String::len)
            .sum::<usize>();
        std::mem::size_of::<SpanRecord>() + self.name.len() + attributes + states
    }
}

/// A sampled SERVER span under way, and its CLIENT child's.
#[derive(Debug)]
pub(crate) struct ServerSpan {
    /// Bytes of each value taken from the request.
    limit: usize,
    context: SpanContext,
    parent: Option<[u8; 8]>,
    tracestate: Option<String>,
    link: Option<SpanLink>,
    name: String,
    attributes: Vec<(&'static str, Value)>,
    /// The CLIENT span's id, and when its hop began (the line was queued for the backend).
    client: ([u8; 8], Option<Instant>),
}

/// `params._meta`'s trace context, read only when the text names a `traceparent`.
fn meta_context(text: &str) -> Option<(SpanContext, Option<String>)> {
    if !text.contains("\"traceparent\"") {
        return None;
    }
    #[derive(serde::Deserialize)]
    struct Message<'a> {
        #[serde(borrow)]
        params: Option<Params<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Params<'a> {
        #[serde(borrow, rename = "_meta")]
        meta: Option<Meta<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Meta<'a> {
        #[serde(borrow)]
        traceparent: Option<std::borrow::Cow<'a, str>>,
        #[serde(borrow)]
        tracestate: Option<std::borrow::Cow<'a, str>>,
    }
    let meta = serde_json::from_str::<Message<'_>>(text)
        .ok()?
        .params?
        .meta?;
    let context = SpanContext::parse(meta.traceparent.as_deref()?)?;
    let state = meta.tracestate.as_deref().and_then(valid_tracestate);
    Some((context, state.map(str::to_owned)))
}

impl ServerSpan {
    /// The SERVER span of JSON-RPC request `msg` that arrived with `headers` (and the
    /// `MCP-Protocol-Version` header `protocol`), if `sampler` samples it: its parent from
    /// `params._meta` else the header, the header's context as a link when it names
    /// another span.
    pub(crate) fn begin(
        headers: TraceHeaders,
        protocol: Option<&str>,
        msg: &Checked,
        tracing: &Tracing,
    ) -> Option<Box<ServerSpan>> {
        let (sampler, limit) = (&tracing.sampler, tracing.value_limit);
        msg.id.as_ref()?;
        let (trace_id, server, client) = headers.ids();
        let header = headers.parent.map(|c| (c, headers.tracestate));
        let (parent, link) = match (meta_context(msg.text()), header) {
            // A link only when it names another span: the flags may differ.
            (Some(meta), Some(header))
                if (header.0.trace_id, header.0.span_id) != (meta.0.trace_id, meta.0.span_id) =>
            {
                (Some(meta), Some(header))
            }
            (Some(meta), _) => (Some(meta), None),
            (None, header) => (header, None),
        };
        let trace_id = parent.as_ref().map_or(trace_id, |(p, _)| p.trace_id);
        if !sampler.samples(&trace_id, parent.as_ref().map(|(p, _)| p)) {
            return None;
        }
        let (parent, tracestate) = match parent {
            Some((context, state)) => (Some(context.span_id), state),
            None => (None, None),
        };
        Some(Box::new(ServerSpan {
            context: SpanContext {
                trace_id,
                span_id: server,
                sampled: true,
            },
            parent,
            tracestate,
            link: link.map(|(context, tracestate)| SpanLink {
                context,
                tracestate,
            }),
            limit,
            name: span_name(msg, limit),
            attributes: request_attributes(msg, protocol, limit),
            client: (client, None),
        }))
    }
}

/// How a traced request ended.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ending<'a> {
    /// Its JSON-RPC answer went out (the backend's or the proxy's).
    Answered(&'a [u8]),
    /// It was refused with this HTTP status and body.
    Refused(u16, &'a [u8]),
    /// It is awaited no longer and gets no answer.
    Unanswered,
}

/// The searches each answer's ending takes, built once: a search built for one call
/// costs more than the search itself.
struct Searches {
    error: Finder<'static>,
    escape: Finder<'static>,
    is_error: Finder<'static>,
}

static SEARCHES: LazyLock<Searches> = LazyLock::new(|| Searches {
    error: Finder::new(b"\"error\""),
    escape: Finder::new(b"\\u"),
    is_error: Finder::new(b"isError"),
});

/// Whether every `name` (found by `finder`) in `message` is a member that says `false`
/// (`name": false`, spaces allowed): then no member so named says anything else. True when
/// there is none.
fn says_false(message: &[u8], finder: &Finder<'_>) -> bool {
    let name = finder.needle();
    finder.find_iter(message).all(|at| {
        let rest = &message[at + name.len()..];
        let Some(rest) = rest.strip_prefix(b"\"") else {
            return false;
        };
        let rest = rest.trim_ascii_start();
        let Some(rest) = rest.strip_prefix(b":") else {
            return false;
        };
        rest.trim_ascii_start().starts_with(b"false")
    })
}

/// The JSON-RPC errors that are the caller's: the conventions' server rule records their
/// code, not an error.
const CALLER_ERRORS: [i64; 5] = [-32700, -32600, -32601, -32602, -32002];

/// What a request's ending says, read once for its histograms and its spans:
/// `rpc.response.status_code` and `error.type`.
pub(crate) type EndingRead = (Option<i64>, Option<String>);

impl Ending<'_> {
    /// `rpc.response.status_code` and `error.type`, as SPEC section 14 sets them.
    pub(crate) fn attributes(self) -> EndingRead {
        let message = match self {
            Ending::Answered(message) => message,
            Ending::Refused(_, body) if body.starts_with(b"{\"jsonrpc\"") => body,
            Ending::Refused(status, _) => return (None, Some(status.to_string())),
            Ending::Unanswered => return (None, Some("_OTHER".to_owned())),
        };
        #[derive(serde::Deserialize)]
        struct Error {
            code: i64,
        }
        #[derive(serde::Deserialize)]
        struct Result {
            #[serde(rename = "isError")]
            is_error: Option<bool>,
        }
        // Most answers are plain results: no `error` member, no `isError` but one that says
        // false, and no `\u` escape that could spell either (the other escapes spell no
        // letter, so the text of a tool's output, its quotes and newlines escaped, needs no
        // reading).
        let searches = &*SEARCHES;
        let names = |finder: &Finder<'_>| finder.find(message).is_some();
        if !names(&searches.error)
            && !names(&searches.escape)
            && says_false(message, &searches.is_error)
        {
            return (None, None);
        }
        let text = std::str::from_utf8(message).unwrap_or_default();
        let Ok(parsed) = crate::message::parse_backend(text) else {
            return (None, None);
        };
        if let Some(error) = parsed.error {
            let code = serde_json::from_str::<Error>(error.get())
                .ok()
                .map(|e| e.code);
            let error_type = code
                .filter(|c| !CALLER_ERRORS.contains(c))
                .map(|c| c.to_string());
            return (code, error_type);
        }
        // Only a result that names `isError` (or may, through a `\u` escape) is read as one.
        let tool_error = (parsed.result)
            .filter(|r| r.get().contains("isError") || r.get().contains("\\u"))
            .and_then(|r| serde_json::from_str::<Result>(r.get()).ok())
            .is_some_and(|r| r.is_error == Some(true));
        (None, tool_error.then(|| "tool_error".to_owned()))
    }
}

impl ServerSpan {
    /// The CLIENT span's context (the SERVER span's trace, its own id).
    fn client_context(&self) -> SpanContext {
        SpanContext {
            span_id: self.client.0,
            ..self.context
        }
    }

    /// `msg` as the backend reads it with the CLIENT span's context in `params._meta`
    /// (`None` when the message cannot carry it: the proxy then forwards it unchanged).
    /// The common shapes are edits of its text; only a `_meta` that holds a `tracestate`
    /// or an escape is written again whole.
    pub(crate) fn carried(&self, msg: &Checked) -> Option<Carried> {
        let traceparent = self.client_context().traceparent();
        let tracestate = self.tracestate.as_deref();
        if let Some(edits) = meta_edits(msg, &traceparent, tracestate) {
            return Some(Carried::Edits(edits));
        }
        let text = with_meta(msg.text(), &traceparent, tracestate)?;
        let rewritten = Checked::admit(text.into_bytes()).ok()?;
        Some(Carried::Rewritten(Box::new(rewritten)))
    }

    /// Its line was queued for the backend: the CLIENT span starts.
    pub(crate) fn hop(&mut self, now: Instant) {
        self.client.1.get_or_insert(now);
    }

    /// The spans it ends with: the SERVER span (with `common`: the attributes of where the
    /// request came from) and, if the request went to the backend, the CLIENT span.
    pub(crate) fn finish(
        self,
        (start, end): (Instant, Instant),
        (code, error_type): &EndingRead,
        common: impl IntoIterator<Item = (&'static str, Value)>,
    ) -> (SpanRecord, Option<SpanRecord>) {
        let mut outcome = Vec::new();
        if let Some(code) = code {
            outcome.push((
                "rpc.response.status_code",
                Value::Str(code.to_string().into()),
            ));
        }
        let status = match error_type {
            Some(error_type) => {
                outcome.push(("error.type", Value::Str(error_type.clone().into())));
                SpanStatus::Error
            }
            None => SpanStatus::Unset,
        };
        let client = self.client.1.map(|hop| {
            let mut attributes = self.attributes.clone();
            attributes.extend(outcome.iter().cloned());
            attributes.push(("network.transport", Value::Str("pipe".into())));
            SpanRecord {
                context: self.client_context(),
                parent_span_id: Some(self.context.span_id),
                kind: SpanKind::Client,
                name: self.name.clone(),
                start: hop,
                end,
                status,
                attributes,
                links: Vec::new(),
                tracestate: self.tracestate.clone(),
            }
        });
        let mut attributes = self.attributes;
        attributes.extend(outcome);
        let limit = self.limit;
        attributes.extend(common.into_iter().map(|(k, v)| (k, cut_value(v, limit))));
        let server = SpanRecord {
            context: self.context,
            parent_span_id: self.parent,
            kind: SpanKind::Server,
            name: self.name,
            start,
            end,
            status,
            attributes,
            links: self.link.into_iter().collect(),
            tracestate: self.tracestate,
        };
        (server, client)
    }
}

/// A JSON object's members in order, each value as written.
struct Members<'a>(Vec<(String, &'a serde_json::value::RawValue)>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for Members<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Members<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut map: M,
            ) -> Result<Self::Value, M::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(Visit(std::marker::PhantomData))
    }
}

impl Members<'_> {
    /// The object again, with `key` set to `value` (JSON text) in place or at the end.
    fn with(&self, key: &str, value: &str) -> String {
        let mut out = String::from("{");
        let mut set = false;
        for (name, raw) in &self.0 {
            if !out.ends_with('{') {
                out.push(',');
            }
            let value = match name == key {
                true => {
                    set = true;
                    value
                }
                false => raw.get(),
            };
            let _ = write!(out, "{}:{value}", serde_json::Value::from(name.as_str()));
        }
        if !set {
            if !out.ends_with('{') {
                out.push(',');
            }
            let _ = write!(out, "{}:{value}", serde_json::Value::from(key));
        }
        out.push('}');
        out
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(name, _)| name == key)
            .map(|(_, raw)| raw.get())
    }
}

/// A message as the backend reads it with a CLIENT span's context.
#[derive(Debug)]
pub(crate) enum Carried {
    /// The client's text with these edits (byte range, what replaces it), none inside another.
    Edits(Vec<(Range<usize>, Vec<u8>)>),
    /// The whole message written again.
    Rewritten(Box<Checked>),
}

/// The edits that set `params._meta.traceparent` (and `tracestate`) in `msg` exactly as
/// [`with_meta`] does, for the shapes that need no rewriting: `None` for the others
/// (a `_meta` holding a `tracestate` or an escape, a `params` or `_meta` that is no object).
fn meta_edits(msg: &Checked, traceparent: &str, tracestate: Option<&str>) -> Option<Vec<Edit>> {
    match msg.meta.clone() {
        Some(span) => edits_in_meta(msg.text(), span, traceparent, tracestate),
        None => meta_added(msg.text(), traceparent, tracestate).map(|edit| vec![edit]),
    }
}

/// A `_meta` is there (at `span`): a `traceparent` it holds gets the new value in place,
/// and the members it lacks are appended before its closing brace.
fn edits_in_meta(
    text: &str,
    span: Range<usize>,
    traceparent: &str,
    tracestate: Option<&str>,
) -> Option<Vec<Edit>> {
    let mut edits = Vec::with_capacity(2);
    // The members the proxy adds to `_meta`.
    let mut meta = String::new();
    let inner = object_inside(&text[span.clone()])?;
    if inner.contains('\\') || inner.contains("\"tracestate\"") {
        return None;
    }
    let mut any = !inner.trim().is_empty();
    if inner.contains("\"traceparent\"") {
        let members: Members<'_> = serde_json::from_str(&text[span.clone()]).ok()?;
        let value = span_of(text, members.get("traceparent")?);
        edits.push((value, json_string(traceparent).into_bytes()));
    } else {
        push_member(&mut meta, any, "traceparent", traceparent);
        any = true;
    }
    if let Some(state) = tracestate {
        push_member(&mut meta, any, "tracestate", state);
    }
    if !meta.is_empty() {
        edits.push((span.end - 1..span.end - 1, meta.into_bytes()));
    }
    Some(edits)
}

/// No `_meta` is there: one is added at the end of `params`, or a `params` holding it at
/// the end of the message when it has none.
fn meta_added(text: &str, traceparent: &str, tracestate: Option<&str>) -> Option<Edit> {
    // Present whatever its value: a `"params":null` is no missing `params` (a second
    // `params` would be a duplicate key: the message was admitted), and takes the whole
    // rewrite.
    let members = crate::message::members(text)?;
    let params = (members.into_iter().find(|(key, _)| key == "params")).map(|(_, v)| v);
    let outer = match params {
        Some(params) => span_of(text, params),
        None => 0..text.trim_end().len(),
    };
    let inner = object_inside(&text[outer.clone()])?;
    let mut added = String::with_capacity(96);
    if !inner.trim().is_empty() {
        added.push(',');
    }
    added.push_str(match params {
        Some(_) => r#""_meta":{"#,
        None => r#""params":{"_meta":{"#,
    });
    // The members the proxy adds to `_meta`.
    push_member(&mut added, false, "traceparent", traceparent);
    if let Some(state) = tracestate {
        push_member(&mut added, true, "tracestate", state);
    }
    added.push_str(if params.is_some() { "}" } else { "}}" });
    let at = outer.end - 1;
    Some((at..at, added.into_bytes()))
}

type Edit = (Range<usize>, Vec<u8>);

/// What lies between an object's braces (`None` when `text` is no object).
fn object_inside(text: &str) -> Option<&str> {
    text.strip_prefix('{')?.strip_suffix('}')
}

/// Appends `"key":"value"` to `out`, after a comma when `after` says a member precedes.
fn push_member(out: &mut String, after: bool, key: &str, value: &str) {
    if after {
        out.push(',');
    }
    out.push('"');
    out.push_str(key);
    out.push_str("\":");
    out.push_str(&json_string(value));
}

fn json_string(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_default()
}

/// `text` (a JSON-RPC request) with `params._meta.traceparent` (and `tracestate`, or
/// none) set, `params` and `_meta` added when missing; members keep their order and
/// values their bytes. `None` when `params` or `_meta` is not an object.
fn with_meta(text: &str, traceparent: &str, tracestate: Option<&str>) -> Option<String> {
    let message: Members<'_> = serde_json::from_str(text).ok()?;
    let params: Members<'_> = serde_json::from_str(message.get("params").unwrap_or("{}")).ok()?;
    let meta: Members<'_> = serde_json::from_str(params.get("_meta").unwrap_or("{}")).ok()?;
    let meta = Members(
        meta.0
            .into_iter()
            .filter(|(k, _)| k != "tracestate")
            .collect(),
    );
    let mut meta = meta.with(
        "traceparent",
        &serde_json::Value::from(traceparent).to_string(),
    );
    if let Some(state) = tracestate {
        let meta_members: Members<'_> = serde_json::from_str(&meta).ok()?;
        meta = meta_members.with("tracestate", &serde_json::Value::from(state).to_string());
    }
    Some(message.with("params", &params.with("_meta", &meta)))
}

/// `{mcp.method.name} {target}`: the tool or prompt named, else the method alone; at
/// most `limit` bytes.
fn span_name(msg: &Checked, limit: usize) -> String {
    let method = cut(&msg.method, limit);
    match target(msg) {
        Some(target) => {
            let target = cut(target, limit);
            let mut name = String::with_capacity(method.len() + 1 + target.len());
            name.push_str(method);
            name.push(' ');
            name.push_str(target);
            let kept = cut(&name, limit).len();
            name.truncate(kept);
            name
        }
        None => method.to_owned(),
    }
}

fn target(msg: &Checked) -> Option<&str> {
    match msg.method.as_str() {
        "tools/call" => msg.tool.as_deref(),
        "prompts/get" => msg.name.as_deref(),
        _ => None,
    }
}

/// SPEC section 14's attributes a request's message decides.
/// Every string is cut to `limit` bytes (SPEC section 14).
fn request_attributes(
    msg: &Checked,
    protocol: Option<&str>,
    limit: usize,
) -> Vec<(&'static str, Value)> {
    let raw = msg.raw_id();
    // A number is its own text (no failed string parse, which costs an error's message).
    let id = match raw.starts_with('"') {
        true => serde_json::from_str::<String>(raw).unwrap_or_else(|_| raw.to_owned()),
        false => raw.to_owned(),
    };
    let text = |text: &str| Value::Str(cut(text, limit).to_owned().into());
    let mut attributes = vec![
        ("mcp.method.name", text(&msg.method)),
        ("jsonrpc.request.id", text(&id)),
    ];
    let target = target(msg).map(text);
    match (msg.method.as_str(), target) {
        ("tools/call", Some(tool)) => {
            attributes.push(("gen_ai.tool.name", tool));
            attributes.push(("gen_ai.operation.name", Value::Str("execute_tool".into())));
        }
        ("prompts/get", Some(prompt)) => attributes.push(("gen_ai.prompt.name", prompt)),
        ("resources/read", _) => {
            if let Some(uri) = &msg.uri {
                attributes.push(("mcp.resource.uri", text(uri)));
            }
        }
        _ => {}
    }
    // An `initialize` names the version it asks for (no header names one yet).
    let asked = (protocol.is_none() && msg.method == "initialize")
        .then(|| asked_version(msg))
        .flatten();
    if let Some(version) = protocol.map(str::to_owned).or(asked) {
        attributes.push(("mcp.protocol.version", text(&version)));
    }
    attributes
}

/// The `params.protocolVersion` an `initialize` asks for.
pub(crate) fn asked_version(msg: &Checked) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Init {
        params: Option<Params>,
    }
    #[derive(serde::Deserialize)]
    struct Params {
        #[serde(rename = "protocolVersion")]
        protocol_version: Option<String>,
    }
    let init = serde_json::from_str::<Init>(msg.text()).ok()?;
    init.params?.protocol_version
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A span of `body`, sampled, with values cut to `limit` bytes.
    fn finished(body: &str, limit: usize, principal: &str) -> (SpanRecord, Option<SpanRecord>) {
        let msg = Checked::admit(body.as_bytes().to_vec()).expect("a request");
        let tracing = Tracing {
            value_limit: limit,
            ..Tracing::default()
        };
        let headers = TraceHeaders {
            entropy: [7; 32],
            ..TraceHeaders::default()
        };
        let mut span = ServerSpan::begin(headers, Some("2025-06-18"), &msg, &tracing).unwrap();
        #[allow(clippy::disallowed_methods)] // the test's one origin of time
        let now = Instant::now();
        span.hop(now);
        let common = [("user.id", Value::Str(principal.to_owned().into()))];
        span.finish((now, now), &Ending::Unanswered.attributes(), common)
    }

    #[test]
    fn values_from_the_request_are_cut_at_a_character_boundary() {
        // A 1 MB tool name whose 256th byte is inside a two-byte character.
        let tool = format!("{}é{}", "t".repeat(255), "x".repeat(1 << 20));
        let id = format!("\"{}\"", "i".repeat(250));
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}"}}}}"#
        );
        let (server, client) = finished(&body, VALUE_LIMIT, &"p".repeat(300));
        for span in [&server, &client.expect("the hop")] {
            assert_eq!(span.name, format!("tools/call {}", "t".repeat(245)));
            for (name, value) in &span.attributes {
                let Value::Str(text) = value else { continue };
                assert!(text.len() <= VALUE_LIMIT, "{name}: {} bytes", text.len());
            }
            assert!(span.weight() < 8 << 10, "{} bytes", span.weight());
        }
        let tool_attr = server
            .attributes
            .iter()
            .find(|(n, _)| *n == "gen_ai.tool.name");
        assert_eq!(
            tool_attr.unwrap().1,
            Value::Str("t".repeat(255).into()),
            "é not split"
        );
        let user = server.attributes.iter().find(|(n, _)| *n == "user.id");
        assert_eq!(user.unwrap().1, Value::Str("p".repeat(256).into()));
        // OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT sets another limit.
        let (server, _) = finished(&body, 8, "alice");
        assert_eq!(server.name, "tools/ca");
        let id_attr = server
            .attributes
            .iter()
            .find(|(n, _)| *n == "jsonrpc.request.id");
        assert_eq!(id_attr.unwrap().1, Value::Str("iiiiiiii".into()));
    }

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_round_trips_and_rejects_the_invalid() {
        let context = SpanContext::parse(PARENT).unwrap();
        assert!(context.sampled);
        assert_eq!(
            context.span_id,
            [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        assert_eq!(context.traceparent(), PARENT);
        let unsampled = PARENT.replace("-01", "-00");
        assert!(!SpanContext::parse(&unsampled).unwrap().sampled);
        // A later version may add fields after a dash; version 00 may not.
        assert!(SpanContext::parse(&format!("cc{}-what", &PARENT[2..])).is_some());
        assert!(SpanContext::parse(&format!("{PARENT}-what")).is_none());
        for bad in [
            "",
            &PARENT.to_uppercase(),
            &PARENT.replace("4bf92f3577b34da6a3ce929d0e0e4736", &"0".repeat(32)),
            &PARENT.replace("00f067aa0ba902b7", &"0".repeat(16)),
            &format!("ff{}", &PARENT[2..]),
            &PARENT[..54],
            &PARENT.replace('-', "_"),
        ] {
            assert_eq!(SpanContext::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn tracestate_is_passed_on_only_when_well_formed() {
        assert_eq!(
            valid_tracestate("rojo=00f067aa0ba902b7, congo=t61rcWkgMzE"),
            Some("rojo=00f067aa0ba902b7, congo=t61rcWkgMzE")
        );
        assert_eq!(valid_tracestate(""), None);
        assert_eq!(valid_tracestate("novalue="), None);
        assert_eq!(valid_tracestate(&"a=b,".repeat(40)), None);
        assert_eq!(valid_tracestate(&format!("a={}", "x".repeat(600))), None);
    }

    #[test]
    fn samplers_follow_the_otel_names_and_the_parent() {
        assert_eq!(
            Sampler::parse("parentbased_always_on", None),
            Ok(Sampler::default())
        );
        assert!(Sampler::parse("sometimes", None).is_err());
        assert!(Sampler::parse("traceidratio", Some("1.5")).is_err());
        assert!(Sampler::parse("traceidratio", Some("half")).is_err());
        let off = Sampler::parse("parentbased_always_off", None).unwrap();
        let sampled = SpanContext::parse(PARENT).unwrap();
        let id = [0xab; 16];
        assert!(off.samples(&id, Some(&sampled)));
        assert!(!off.samples(&id, None));
        let on = Sampler::parse("always_on", None).unwrap();
        let unsampled = SpanContext {
            sampled: false,
            ..sampled
        };
        assert!(on.samples(&id, Some(&unsampled)), "not parent-based");
        let none = Sampler::parse("traceidratio", Some("0")).unwrap();
        let all = Sampler::parse("traceidratio", Some("1")).unwrap();
        let half = Sampler::parse("traceidratio", Some("0.5")).unwrap();
        let mut low = [0u8; 16];
        low[8] = 0x3f;
        let mut high = [0u8; 16];
        high[8] = 0xc0;
        assert!(!none.samples(&[0xff; 16], None) && !none.samples(&[1; 16], None));
        assert!(all.samples(&[0xff; 16], None));
        assert!(half.samples(&low, None) && !half.samples(&high, None));
    }

    #[test]
    fn meta_is_set_in_place_keeping_every_other_byte() {
        let tp = "00-0af7651916cd43dd8448eb211c80319c-c2c2c2c2c2c2c2c2-01";
        let added = with_meta(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#, tp, None);
        let expected = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"_meta":{{"traceparent":"{tp}"}}}}}}"#
        );
        assert_eq!(added.as_deref(), Some(expected.as_str()));
        let text = r#"{"id":"a","params":{"_meta":{"tracestate":"x=1","traceparent":"old","progressToken":1.50},"n":[1, 2]},"method":"m"}"#;
        let replaced = with_meta(text, tp, Some("y=2")).unwrap();
        let expected = format!(
            r#"{{"id":"a","params":{{"_meta":{{"traceparent":"{tp}","progressToken":1.50,"tracestate":"y=2"}},"n":[1, 2]}},"method":"m"}}"#
        );
        assert_eq!(replaced, expected);
        assert_eq!(with_meta(r#"{"id":1,"params":[1]}"#, tp, None), None);
        assert_eq!(
            with_meta(r#"{"id":1,"params":{"_meta":"no"}}"#, tp, None),
            None
        );
    }

    #[test]
    fn meta_edits_write_what_the_whole_rewrite_writes() {
        let tp = "00-0af7651916cd43dd8448eb211c80319c-c2c2c2c2c2c2c2c2-01";
        let texts = [
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"name":"echo"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{"progressToken":7}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{"traceparent":"x","a":1}}}"#,
        ];
        for text in texts {
            for state in [None, Some("y=2")] {
                let msg = Checked::admit(text.as_bytes().to_vec()).unwrap();
                let edits = meta_edits(&msg, tp, state).unwrap();
                let mut out = text.to_owned();
                for (span, bytes) in edits.iter().rev() {
                    out.replace_range(span.clone(), std::str::from_utf8(bytes).unwrap());
                }
                assert_eq!(Some(out), with_meta(text, tp, state), "{text}");
            }
        }
        // What only the whole rewrite does right.
        let whole = [
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{"tracestate":"x=1"}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{"trace\u0070arent":"x"}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":[1]}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":null}"#,
        ];
        for text in whole {
            let msg = Checked::admit(text.as_bytes().to_vec()).unwrap();
            assert!(meta_edits(&msg, tp, None).is_none(), "{text}");
        }
    }

    #[test]
    fn caller_errors_record_their_code_only() {
        let answer = |text: &'static str| Ending::Answered(text.as_bytes()).attributes();
        let caller = answer(r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"m"}}"#);
        assert_eq!(caller, (Some(-32602), None));
        let failed = answer(r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"m"}}"#);
        assert_eq!(failed, (Some(-32603), Some("-32603".to_owned())));
        let tool = answer(r#"{"jsonrpc":"2.0","id":1,"result":{"isError":true}}"#);
        assert_eq!(tool, (None, Some("tool_error".to_owned())));
        let escaped = answer(r#"{"jsonrpc":"2.0","id":1,"result":{"is\u0045rror":true}}"#);
        assert_eq!(escaped, (None, Some("tool_error".to_owned())));
        let hidden =
            answer(r#"{"jsonrpc":"2.0","id":1,"\u0065rror":{"code":-32603,"message":"m"}}"#);
        assert_eq!(hidden, (Some(-32603), Some("-32603".to_owned())));
        // Quotes and newlines escaped in a tool's text spell no member: a plain result.
        let text = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"{\"isErr\":1}\n\\"}]}}"#;
        assert_eq!(answer(text), (None, None));
        let quoted = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"\"isError\": true"}]}}"#;
        assert_eq!(answer(quoted), (None, None));
        let spaced = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError" :
 true}}"#;
        assert_eq!(answer(spaced), (None, Some("tool_error".to_owned())));
        let nested = r#"{"jsonrpc":"2.0","id":1,"result":{"structuredContent":{"isError":false},"isError":true}}"#;
        assert_eq!(answer(nested), (None, Some("tool_error".to_owned())));
        let is_error = &SEARCHES.is_error;
        assert!(says_false(
            br#"{"isError": false,"x":{"isError":false}}"#,
            is_error
        ));
        assert!(!says_false(br#"{"isError":false,"y":"isError"}"#, is_error));
        assert_eq!(
            answer(r#"{"jsonrpc":"2.0","id":1,"result":{"isError":false}}"#),
            (None, None)
        );
        assert_eq!(
            Ending::Refused(429, b"Too Many").attributes(),
            (None, Some("429".into()))
        );
        assert_eq!(
            Ending::Unanswered.attributes(),
            (None, Some("_OTHER".into()))
        );
    }

    #[test]
    fn ids_are_never_zero_nor_equal() {
        let (trace, server, client) = ids(&[0; 32]);
        assert_ne!(trace, [0; 16]);
        assert_ne!(server, [0; 8]);
        assert_ne!(client, server);
        let mut entropy = [0u8; 32];
        entropy
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8 + 1);
        let (trace, server, client) = ids(&entropy);
        assert_eq!((trace[0], server[0], client[0]), (1, 17, 25));
    }
}
