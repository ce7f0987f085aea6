//! One-pass admission of a single JSON-RPC message from raw bytes.
//!
//! Ids, tokens and other values are kept as borrowed raw JSON text so that integers of
//! any length survive exactly (never through `f64`) and everything the proxy does not
//! rewrite passes through byte for byte.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// Longest id (as raw JSON text, quotes included) a client may send.
pub(crate) const MAX_ID_LEN: usize = 256;

/// Why a client body was refused: each maps to HTTP 400 with a JSON-RPC error body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Invalid {
    /// Not UTF-8.
    NotUtf8,
    /// Not JSON.
    NotJson,
    /// A batch array.
    Batch,
    /// JSON, but not one object.
    NotAnObject,
    /// A key twice in one object.
    DuplicateKey,
    /// `jsonrpc` is not `"2.0"`.
    BadVersion,
    /// `method` is not a string.
    MethodNotString,
    /// Both `method` and `result` or `error`.
    MethodWithResult,
    /// Neither a method nor a result.
    NoMethod,
    /// An id that is not a string or an integer.
    InvalidId,
    /// An id over [`MAX_ID_LEN`].
    IdTooLong,
    /// A response (clients may not answer the proxy).
    ClientResponse,
    /// An id, progress token or cancelled request id with a lone surrogate escape
    /// (`"\ud800"`): not Unicode text, so no backend can echo it back exactly.
    LoneSurrogate,
    /// Nested deeper than the parser follows.
    TooDeep,
    /// A number past what a 64-bit float holds (`1e400`): JSON the proxy cannot read.
    NumberOutOfRange,
}

impl Invalid {
    /// The JSON-RPC error code: -32700 when the bytes are not JSON at all, else -32600.
    pub fn code(self) -> i32 {
        match self {
            Invalid::NotUtf8 | Invalid::NotJson | Invalid::NumberOutOfRange => -32700,
            _ => -32600,
        }
    }

    /// A short reason a client developer can act on.
    pub fn reason(self) -> &'static str {
        match self {
            Invalid::NotUtf8 => "Parse error: body is not UTF-8",
            Invalid::NotJson => "Parse error: body is not valid JSON",
            Invalid::Batch => "Invalid Request: batch arrays are not supported",
            Invalid::NotAnObject => "Invalid Request: body must be one JSON object",
            Invalid::DuplicateKey => "Invalid Request: duplicate key in object",
            Invalid::BadVersion => "Invalid Request: jsonrpc must be \"2.0\"",
            Invalid::MethodNotString => "Invalid Request: method must be a string",
            Invalid::MethodWithResult => {
                "Invalid Request: a message cannot have both method and result or error"
            }
            Invalid::NoMethod => "Invalid Request: message has no method",
            Invalid::InvalidId => "Invalid Request: id must be a string or an integer",
            Invalid::IdTooLong => "Invalid Request: id is longer than 256 bytes",
            Invalid::ClientResponse => "Invalid Request: responses from clients are not accepted",
            Invalid::LoneSurrogate => {
                "Invalid Request: an id, progressToken or requestId must be Unicode text (no lone surrogate escapes)"
            }
            Invalid::TooDeep => "Invalid Request: nested deeper than 128 levels",
            Invalid::NumberOutOfRange => {
                "Parse error: a number is out of range (beyond a 64-bit float)"
            }
        }
    }

    /// Stable snake_case name, used as a metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            Invalid::NotUtf8 => "not_utf8",
            Invalid::NotJson => "not_json",
            Invalid::Batch => "batch",
            Invalid::NotAnObject => "not_an_object",
            Invalid::DuplicateKey => "duplicate_key",
            Invalid::BadVersion => "bad_version",
            Invalid::MethodNotString => "method_not_string",
            Invalid::MethodWithResult => "method_with_result",
            Invalid::NoMethod => "no_method",
            Invalid::InvalidId => "invalid_id",
            Invalid::IdTooLong => "id_too_long",
            Invalid::ClientResponse => "client_response",
            Invalid::LoneSurrogate => "lone_surrogate",
            Invalid::TooDeep => "too_deep",
            Invalid::NumberOutOfRange => "number_out_of_range",
        }
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

/// A JSON-RPC id as the sender wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RawId<'a> {
    /// An integer literal, digits and sign exactly as written (`-0` included).
    Int(&'a str),
    /// A JSON string literal, quotes and escapes exactly as written.
    Str(&'a str),
}

impl<'a> RawId<'a> {
    /// Classifies raw JSON text as an id; `None` for null, bools, fractions, exponents,
    /// objects and arrays.
    pub(crate) fn classify(raw: &'a str) -> Option<RawId<'a>> {
        match raw.as_bytes().first()? {
            b'"' => Some(RawId::Str(raw)),
            b'-' | b'0'..=b'9' if !raw.bytes().any(|b| matches!(b, b'.' | b'e' | b'E')) => {
                Some(RawId::Int(raw))
            }
            _ => None,
        }
    }

    /// The raw JSON text.
    #[cfg(test)]
    pub(crate) fn as_str(&self) -> &'a str {
        match self {
            RawId::Int(s) | RawId::Str(s) => s,
        }
    }
}

/// What a message is, by the JSON-RPC 2.0 shape rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `method` and `id`.
    Request,
    /// `method`, no `id`.
    Notification,
    /// `result` or `error`.
    Response,
}

/// A parsed JSON object's top-level members, values kept as raw text.
#[derive(Debug)]
pub(crate) struct Message<'a> {
    /// The whole message text.
    pub(crate) text: &'a str,
    /// Its shape.
    pub(crate) kind: Kind,
    /// The `method` value.
    pub(crate) method: Option<Cow<'a, str>>,
    /// The raw `id` member value, if present (any JSON type).
    pub(crate) id: Option<&'a RawValue>,
    /// The members of `params` the proxy reads or rewrites.
    pub(crate) params: Params<'a>,
    /// The raw `result`.
    pub(crate) result: Option<&'a RawValue>,
    /// The raw `error`.
    pub(crate) error: Option<&'a RawValue>,
    /// The raw `jsonrpc`.
    pub(crate) jsonrpc: Option<&'a RawValue>,
}

impl<'a> Message<'a> {
    /// The byte range of a member value (or any sub-slice) inside [`Message::text`].
    pub(crate) fn span(&self, inner: &RawValue) -> Range<usize> {
        span_of(self.text, inner.get())
    }
}

/// Where `inner` (a sub-slice of `outer`) sits in `outer`.
pub(crate) fn span_of(outer: &str, inner: &str) -> Range<usize> {
    let start = (inner.as_ptr() as usize).wrapping_sub(outer.as_ptr() as usize);
    debug_assert!(
        start + inner.len() <= outer.len(),
        "inner is not a sub-slice"
    );
    start..start + inner.len()
}

/// Admits a client POST body: exactly one JSON-RPC request or notification, strictly.
pub(crate) fn admit_client(body: &[u8]) -> Result<Message<'_>, Invalid> {
    let text = std::str::from_utf8(body).map_err(|_| Invalid::NotUtf8)?;
    let msg = parse_object(text, true)?;
    match &msg.jsonrpc {
        Some(v) if v.get() == "\"2.0\"" => {}
        _ => return Err(Invalid::BadVersion),
    }
    match msg.kind {
        Kind::Response => return Err(Invalid::ClientResponse),
        Kind::Request => {
            let id = msg.id.map(|v| v.get()).unwrap_or_default();
            RawId::classify(id).ok_or(Invalid::InvalidId)?;
            if id.len() > MAX_ID_LEN {
                return Err(Invalid::IdTooLong);
            }
        }
        Kind::Notification => {}
    }
    let id_like = [
        msg.id,
        msg.params.meta_progress_token,
        msg.params.request_id,
    ];
    if id_like
        .into_iter()
        .flatten()
        .any(|v| !is_unicode_text(v.get()))
    {
        return Err(Invalid::LoneSurrogate);
    }
    Ok(msg)
}

/// Whether raw JSON text, when it is a string with escapes, decodes to Unicode text.
fn is_unicode_text(raw: &str) -> bool {
    !raw.starts_with('"') || !raw.contains('\\') || serde_json::from_str::<String>(raw).is_ok()
}

/// Parses a backend line leniently: one JSON object whose top-level keys are unique.
pub(crate) fn parse_backend(line: &str) -> Result<Message<'_>, Invalid> {
    parse_object(line, false)
}

/// Parses one JSON object, checking top-level keys are unique (and, when `deep`, every
/// nested object's keys too: a proxy and a backend must never disagree on which duplicate
/// wins), and classifies it.
fn parse_object(text: &str, deep: bool) -> Result<Message<'_>, Invalid> {
    let first = text
        .bytes()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
    match first {
        Some(b'[') => {
            // Still tell "not JSON" from "a batch" so the error code is right.
            return match serde_json::from_str::<IgnoredAny>(text) {
                Ok(_) => Err(Invalid::Batch),
                Err(_) => Err(Invalid::NotJson),
            };
        }
        Some(b'{') => {}
        _ => {
            return match serde_json::from_str::<IgnoredAny>(text) {
                Ok(_) => Err(Invalid::NotAnObject),
                Err(_) => Err(Invalid::NotJson),
            };
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let members = de
        .deserialize_map(MembersVisitor { deep })
        .and_then(|m| de.end().map(|()| m))
        .map_err(|e| refusal(&e))?;
    let method = match members.method {
        None => None,
        Some(raw) => Some(string_value(raw).ok_or(Invalid::MethodNotString)?),
    };
    let has_result_or_error = members.result.is_some() || members.error.is_some();
    let kind = match (&method, has_result_or_error, &members.id) {
        (Some(_), true, _) => return Err(Invalid::MethodWithResult),
        (Some(_), false, Some(_)) => Kind::Request,
        (Some(_), false, None) => Kind::Notification,
        (None, true, _) => Kind::Response,
        (None, false, _) => return Err(Invalid::NoMethod),
    };
    Ok(Message {
        text,
        kind,
        method,
        id: members.id,
        params: members.params,
        result: members.result,
        error: members.error,
        jsonrpc: members.jsonrpc,
    })
}

/// The value of a raw JSON string, borrowed when it has no escapes.
pub(crate) fn string_value(raw: &RawValue) -> Option<Cow<'_, str>> {
    let s = raw.get();
    let inner = s.strip_prefix('"')?.strip_suffix('"')?;
    if !inner.contains('\\') {
        return Some(Cow::Borrowed(inner));
    }
    serde_json::from_str::<String>(s).ok().map(Cow::Owned)
}

const DUPLICATE: &str = "duplicate key";
/// serde_json's message when nesting passes its recursion limit.
const TOO_DEEP: &str = "recursion limit exceeded";
/// serde_json's message for a number past `f64` (`1e400`).
const OUT_OF_RANGE: &str = "number out of range";

/// Why the parse of an object failed, by the error's message (ours, or serde_json's).
fn refusal(e: &serde_json::Error) -> Invalid {
    let text = e.to_string();
    if text.starts_with(DUPLICATE) {
        Invalid::DuplicateKey
    } else if text.starts_with(TOO_DEEP) {
        Invalid::TooDeep
    } else if text.starts_with(OUT_OF_RANGE) {
        Invalid::NumberOutOfRange
    } else {
        Invalid::NotJson
    }
}

/// The members of `params` the proxy reads or rewrites, found in the same single pass
/// that checks the message, as raw text.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Params<'a> {
    /// `params._meta.progressToken` (a request asking for progress).
    pub(crate) meta_progress_token: Option<&'a RawValue>,
    /// `params.progressToken` (a `notifications/progress`).
    pub(crate) progress_token: Option<&'a RawValue>,
    /// `params.requestId` (a `notifications/cancelled`).
    pub(crate) request_id: Option<&'a RawValue>,
    /// `params.taskId` (a `tasks/*` request, `notifications/tasks/status`).
    pub(crate) task_id: Option<&'a RawValue>,
    /// `params.capabilities` (an `initialize`).
    pub(crate) capabilities: Option<&'a RawValue>,
    /// `params.uri` (subscriptions and `notifications/resources/updated`).
    pub(crate) uri: Option<&'a RawValue>,
    /// `params.name` (the tool of a `tools/call`, the prompt of a `prompts/get`).
    pub(crate) name: Option<&'a RawValue>,
    /// `params.arguments` (of a `tools/call` or `prompts/get`), for policies.
    pub(crate) arguments: Option<&'a RawValue>,
    /// `params.ref` (of a `completion/complete`), for policies.
    pub(crate) reference: Option<&'a RawValue>,
    /// `params._meta` names a protocol version (`io.modelcontextprotocol/protocolVersion`):
    /// a client of the 2026 revision that sends no session.
    pub(crate) meta_protocol_version: bool,
    /// `params._meta` (a modern request's reserved keys are removed from it).
    pub(crate) meta: Option<&'a RawValue>,
}

struct Members<'a> {
    id: Option<&'a RawValue>,
    method: Option<&'a RawValue>,
    params: Params<'a>,
    result: Option<&'a RawValue>,
    error: Option<&'a RawValue>,
    jsonrpc: Option<&'a RawValue>,
}

/// A key, borrowed from the input unless it had escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// Remembers the keys of one object; a small object is scanned, a large one hashed, so a
/// hostile object with many keys costs linear time.
#[derive(Default)]
struct SeenKeys<'a> {
    few: [Cow<'a, str>; SCAN_LIMIT],
    len: usize,
    many: HashSet<Cow<'a, str>>,
}

/// Objects with up to this many keys are checked without allocating.
const SCAN_LIMIT: usize = 16;

impl<'a> SeenKeys<'a> {
    /// Records `key`; false if it was seen before.
    fn insert(&mut self, key: Cow<'a, str>) -> bool {
        if self.len < SCAN_LIMIT {
            if self.few[..self.len].contains(&key) {
                return false;
            }
            self.few[self.len] = key;
            self.len += 1;
            return true;
        }
        if self.many.is_empty() {
            self.many.extend(self.few.iter_mut().map(std::mem::take));
        }
        self.many.insert(key)
    }
}

struct MembersVisitor {
    deep: bool,
}

impl<'de> Visitor<'de> for MembersVisitor {
    type Value = Members<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON-RPC object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Members {
            id: None,
            method: None,
            params: Params::default(),
            result: None,
            error: None,
            jsonrpc: None,
        };
        let mut seen = SeenKeys::default();
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            match &*key {
                "id" => out.id = Some(raw_value(&mut map, self.deep)?),
                "method" => out.method = Some(map.next_value()?),
                "jsonrpc" => out.jsonrpc = Some(map.next_value()?),
                "params" => out.params = map.next_value_seed(ParamsSeed { deep: self.deep })?,
                "result" => out.result = Some(raw_value(&mut map, self.deep)?),
                "error" => out.error = Some(raw_value(&mut map, self.deep)?),
                _ if self.deep => map.next_value_seed(UniqueKeys)?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            if !seen.insert(key) {
                return Err(de::Error::custom(DUPLICATE));
            }
        }
        Ok(out)
    }
}

/// The next map value as raw text, checked for repeated keys inside when `deep`.
fn raw_value<'de, A: MapAccess<'de>>(map: &mut A, deep: bool) -> Result<&'de RawValue, A::Error> {
    let value: &'de RawValue = map.next_value()?;
    if deep && matches!(value.get().as_bytes().first(), Some(b'{' | b'[')) {
        check_unique_keys(value).map_err(de::Error::custom)?;
    }
    Ok(value)
}

/// Visitor methods for values that hold nothing the proxy reads: scalars give the
/// default, arrays are walked (checking objects inside).
macro_rules! skip_non_objects {
    () => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element_seed(UniqueKeys)?.is_some() {}
            Ok(Default::default())
        }
    };
}

/// Skips (or, when `deep`, checks) the next map value.
fn skip_value<'de, A: MapAccess<'de>>(map: &mut A, deep: bool) -> Result<(), A::Error> {
    if deep {
        map.next_value_seed(UniqueKeys)
    } else {
        map.next_value::<IgnoredAny>().map(|_| ())
    }
}

/// Reads `params` in one pass: the members the proxy needs as raw text, everything else
/// only checked (when `deep`) or skipped.
#[derive(Clone, Copy)]
struct ParamsSeed {
    deep: bool,
}

impl<'de> DeserializeSeed<'de> for ParamsSeed {
    type Value = Params<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ParamsSeed {
    type Value = Params<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("params")
    }

    skip_non_objects!();

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Params::default();
        let mut seen = SeenKeys::default();
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            match &*key {
                "_meta" => {
                    // Read as raw text first (its span), then checked as before.
                    let raw: &'de RawValue = map.next_value()?;
                    let mut de = serde_json::Deserializer::from_str(raw.get());
                    let meta = MetaSeed { deep: self.deep }
                        .deserialize(&mut de)
                        .map_err(de::Error::custom)?;
                    out.meta_progress_token = meta.progress_token;
                    out.meta_protocol_version = meta.protocol_version;
                    out.meta = Some(raw);
                }
                "progressToken" => out.progress_token = Some(raw_value(&mut map, self.deep)?),
                "requestId" => out.request_id = Some(raw_value(&mut map, self.deep)?),
                "taskId" => out.task_id = Some(raw_value(&mut map, self.deep)?),
                "capabilities" => out.capabilities = Some(raw_value(&mut map, self.deep)?),
                "uri" => out.uri = Some(raw_value(&mut map, self.deep)?),
                "name" => out.name = Some(raw_value(&mut map, self.deep)?),
                "arguments" => out.arguments = Some(raw_value(&mut map, self.deep)?),
                "ref" => out.reference = Some(raw_value(&mut map, self.deep)?),
                _ => skip_value(&mut map, self.deep)?,
            }
            if !seen.insert(key) {
                return Err(de::Error::custom(DUPLICATE));
            }
        }
        Ok(out)
    }
}

/// Reads `params._meta`, keeping its `progressToken` as raw text.
#[derive(Clone, Copy)]
struct MetaSeed {
    deep: bool,
}

/// What the proxy reads in `params._meta`.
#[derive(Default)]
struct Meta<'a> {
    progress_token: Option<&'a RawValue>,
    protocol_version: bool,
}

/// The `_meta` key with which a 2026-era client names its protocol version instead of
/// opening a session.
const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";

impl<'de> DeserializeSeed<'de> for MetaSeed {
    type Value = Meta<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MetaSeed {
    type Value = Meta<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("_meta")
    }

    skip_non_objects!();

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut meta = Meta::default();
        let mut seen = SeenKeys::default();
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            if &*key == "progressToken" {
                meta.progress_token = Some(raw_value(&mut map, self.deep)?);
            } else {
                meta.protocol_version |= &*key == META_PROTOCOL_VERSION;
                skip_value(&mut map, self.deep)?;
            }
            if !seen.insert(key) {
                return Err(de::Error::custom(DUPLICATE));
            }
        }
        Ok(meta)
    }
}

/// The `result` of a backend response, as JSON text.
pub(crate) fn parse_backend_result(message: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(message).ok()?;
    Some(parse_backend(text).ok()?.result?.get())
}

/// SPEC section 13: what a 2026-07-28 request's reserved `_meta` keys say.
/// The `_meta` prefix the revision reserves; its keys never reach the 2025-era backend.
const RESERVED: &str = "io.modelcontextprotocol/";

/// The client capabilities a modern request carries in `_meta`.
const META_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";

/// What the reserved `_meta` keys of a modern message said; the keys themselves are gone
/// from the text the backend gets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ModernMeta {
    /// `io.modelcontextprotocol/protocolVersion`, when a string (`Some("")` otherwise).
    pub(crate) version: Option<String>,
    /// Whether `io.modelcontextprotocol/clientCapabilities` was there.
    pub(crate) capabilities: bool,
}

/// `_meta` (the JSON object `meta`) without its reserved keys, and what they said; `None`
/// when it has none (nothing to change).
pub(crate) fn strip_reserved(meta: &str) -> Option<(String, ModernMeta)> {
    let members = members(meta)?;
    if !members.iter().any(|(key, _)| key.starts_with(RESERVED)) {
        return None;
    }
    let mut said = ModernMeta::default();
    let mut kept = String::with_capacity(meta.len());
    kept.push('{');
    for (key, value) in &members {
        match key.as_ref() {
            META_PROTOCOL_VERSION => {
                let version = serde_json::from_str::<String>(value).unwrap_or_default();
                said.version = Some(version);
            }
            META_CAPABILITIES => said.capabilities = true,
            _ if key.starts_with(RESERVED) => {}
            _ => push_member(&mut kept, key, value),
        }
    }
    kept.push('}');
    Some((kept, said))
}

/// Appends `"key":value` (a comma first unless right after `{`).
pub(crate) fn push_member(out: &mut String, key: &str, value: &str) {
    push_key(out, key);
    out.push_str(value);
}

/// Appends `"key":` (a comma first unless right after `{`), its value to follow.
pub(crate) fn push_key(out: &mut String, key: &str) {
    if !out.ends_with('{') {
        out.push(',');
    }
    // A key that needs no escaping (all of MCP's) is copied as it is.
    if key
        .bytes()
        .all(|b| b >= 0x20 && b != b'"' && b != b'\\' && b < 0x7f)
    {
        out.push('"');
        out.push_str(key);
        out.push('"');
    } else {
        out.push_str(&serde_json::Value::from(key).to_string());
    }
    out.push(':');
}

/// The members of a JSON object (a result, an error, a `_meta`), in order, values as raw
/// text; `None` for anything else. `object` is JSON the proxy has already read whole (a
/// backend line the router parsed, a span of an admitted message, the proxy's own text):
/// its members are then found by a scan of its bytes, without a second parse; an escaped
/// key, or anything the scan does not expect, is left to `serde_json`.
pub(crate) fn members(object: &str) -> Option<Vec<(Cow<'_, str>, &str)>> {
    let Some(scanned) = scan::members(object) else {
        return parsed_members(object);
    };
    // Read again by `serde_json`, they are the same (checked where tests and fuzzing run).
    #[cfg(debug_assertions)]
    {
        let parsed = parsed_members(object);
        assert_eq!(
            parsed.as_ref(),
            Some(&scanned),
            "the scan reads as serde_json"
        );
    }
    Some(scanned)
}

/// [`members`] by a full parse.
fn parsed_members(object: &str) -> Option<Vec<(Cow<'_, str>, &str)>> {
    struct Members;
    impl<'de> Visitor<'de> for Members {
        type Value = Vec<(Cow<'de, str>, &'de str)>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                let value: &'de RawValue = map.next_value()?;
                out.push((key, value.get()));
            }
            Ok(out)
        }
    }
    let mut de = serde_json::Deserializer::from_str(object);
    let members = (&mut de).deserialize_map(Members).ok()?;
    de.end().ok()?;
    Some(members)
}

/// Where the values of JSON text already read lie, found from its bytes alone (strings,
/// nesting, whitespace): nothing is checked that its first reading checked.
mod scan {
    use std::borrow::Cow;

    /// The members of `object`, keys as written; `None` for an escaped key (the scan does
    /// not decode) or text that is not one object.
    pub(super) fn members(object: &str) -> Option<Vec<(Cow<'_, str>, &str)>> {
        let bytes = object.as_bytes();
        let mut at = space(bytes, 0);
        if bytes.get(at) != Some(&b'{') {
            return None;
        }
        at = space(bytes, at + 1);
        let mut out = Vec::with_capacity(8);
        if bytes.get(at) == Some(&b'}') {
            return (space(bytes, at + 1) == bytes.len()).then_some(out);
        }
        loop {
            let key_end = string(bytes, at)?;
            let key = object.get(at + 1..key_end - 1)?;
            if key.contains('\\') {
                return None;
            }
            at = space(bytes, key_end);
            if bytes.get(at) != Some(&b':') {
                return None;
            }
            let start = space(bytes, at + 1);
            let end = value(bytes, start)?;
            out.push((Cow::Borrowed(key), object.get(start..end)?));
            at = space(bytes, end);
            match bytes.get(at) {
                Some(b',') => at = space(bytes, at + 1),
                Some(b'}') => return (space(bytes, at + 1) == bytes.len()).then_some(out),
                _ => return None,
            }
        }
    }

    /// The first byte at or after `at` that is not JSON whitespace.
    fn space(bytes: &[u8], mut at: usize) -> usize {
        while matches!(bytes.get(at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            at += 1;
        }
        at
    }

    /// Just past the string that opens at `at`.
    fn string(bytes: &[u8], at: usize) -> Option<usize> {
        if bytes.get(at) != Some(&b'"') {
            return None;
        }
        let mut at = at + 1;
        loop {
            at += memchr::memchr2(b'"', b'\\', bytes.get(at..)?)?;
            match bytes.get(at)? {
                b'"' => return Some(at + 1),
                _ => at += 2,
            }
        }
    }

    /// Just past the value that starts at `at`.
    fn value(bytes: &[u8], at: usize) -> Option<usize> {
        match bytes.get(at)? {
            b'"' => string(bytes, at),
            b'{' | b'[' => nested(bytes, at),
            _ => {
                let len = (bytes.get(at..)?.iter())
                    .position(|b| matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                    .unwrap_or(bytes.len() - at);
                (len > 0).then_some(at + len)
            }
        }
    }

    /// Just past the object or array that opens at `at`.
    fn nested(bytes: &[u8], mut at: usize) -> Option<usize> {
        let mut depth = 0usize;
        loop {
            match bytes.get(at)? {
                b'"' => {
                    at = string(bytes, at)?;
                    continue;
                }
                b'{' | b'[' => depth += 1,
                b'}' | b']' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(at + 1);
                    }
                }
                _ => {}
            }
            at += 1;
        }
    }
}

/// Walks a whole value and fails on the first object with a repeated key (or what else
/// keeps it from being read: too deep, a number out of range), saying which.
fn check_unique_keys(raw: &RawValue) -> Result<(), &'static str> {
    let mut de = serde_json::Deserializer::from_str(raw.get());
    UniqueKeys
        .deserialize(&mut de)
        .map_err(|e| match refusal(&e) {
            Invalid::TooDeep => TOO_DEEP,
            Invalid::NumberOutOfRange => OUT_OF_RANGE,
            Invalid::DuplicateKey => DUPLICATE,
            // Any other failure (a string that is not Unicode text) keeps the outer parse's
            // generic answer.
            _ => "not JSON",
        })
}

#[derive(Clone, Copy)]
struct UniqueKeys;

impl<'de> DeserializeSeed<'de> for UniqueKeys {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for UniqueKeys {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    skip_non_objects!();

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = SeenKeys::default();
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            if !seen.insert(key) {
                return Err(de::Error::custom(DUPLICATE));
            }
            map.next_value_seed(self)?;
        }
        Ok(())
    }
}

/// An id (or progress token) as a session's in-flight table knows it: its type and its
/// value, so that `"a"` and `"\u0061"` are the same request and `1` and `"1"` are not.
/// (Admission refuses strings that are not Unicode text, so every id has one.) Shared,
/// not copied: the tables that follow one request (in flight, its timer, the backend's
/// window) each hold the key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct IdKey {
    string: bool,
    text: Arc<str>,
}

impl IdKey {
    /// The key of an id given as raw JSON text; `None` for what is not an id.
    pub(crate) fn of(raw: &str) -> Option<IdKey> {
        let text = match RawId::classify(raw)? {
            RawId::Int(digits) => {
                return Some(IdKey {
                    string: false,
                    text: Arc::from(digits),
                })
            }
            RawId::Str(literal) if !literal.contains('\\') => {
                Arc::from(literal.get(1..literal.len().checked_sub(1)?)?)
            }
            RawId::Str(literal) => Arc::from(serde_json::from_str::<String>(literal).ok()?),
        };
        Some(IdKey { string: true, text })
    }
}

/// An id-like value of a client message (id, progress token, cancelled request id): where
/// it is in the text, its type, and the key it is known by.
#[derive(Debug, Clone)]
pub(crate) struct IdAt {
    /// Where it is in the message's text.
    pub(crate) span: Range<usize>,
    int: bool,
    /// The value as a session's in-flight table knows it.
    pub(crate) key: IdKey,
}

impl IdAt {
    pub(crate) fn of(msg: &Message<'_>, value: Option<&RawValue>) -> Option<IdAt> {
        let value = value?;
        let id = RawId::classify(value.get())?;
        Some(IdAt {
            span: msg.span(value),
            int: matches!(id, RawId::Int(_)),
            key: IdKey::of(value.get())?,
        })
    }

    /// The id as raw text of `text` (the message's).
    pub(crate) fn raw<'t>(&self, text: &'t str) -> RawId<'t> {
        let raw = &text[self.span.clone()];
        if self.int {
            RawId::Int(raw)
        } else {
            RawId::Str(raw)
        }
    }
}

/// A client message admitted and read once: its kind, method, and everything the hub
/// inspects (id, progress token, cancel target, uri) or the router rewrites. Admitted where
/// the body arrived (`Admitted::into_request`), it reaches the hub in the request's
/// [`Body`](crate::http::Body); a shell only carries it.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The message as the client sent it.
    pub(crate) text: String,
    /// Request or notification.
    pub(crate) kind: Kind,
    /// Its method.
    pub(crate) method: String,
    /// A request's id.
    pub(crate) id: Option<IdAt>,
    /// `params._meta.progressToken`, when an integer or a string.
    pub(crate) token: Option<IdAt>,
    /// `params.requestId` of a `notifications/cancelled`, when an integer or a string.
    pub(crate) cancels: Option<IdAt>,
    /// `params.capabilities` (an `initialize`'s, replaced by `{}`).
    pub(crate) capabilities: Option<Range<usize>>,
    /// The string value of `params.uri`.
    pub(crate) uri: Option<String>,
    /// The tool of a `tools/call` (`params.name`).
    pub(crate) tool: Option<String>,
    /// `params.name` when a string (a prompt's, a tool's).
    pub(crate) name: Option<String>,
    /// `params.taskId` of a `tasks/*` request, when a string.
    pub(crate) task: Option<String>,
    /// A `tools/call` of a name that is not exactly a shown one (SPEC section 16): the
    /// proxy answers it, before any admission.
    pub(crate) unknown_tool: bool,
    /// Where `params.arguments` is, for policies.
    arguments: Option<Range<usize>>,
    /// Where `params.ref` is (a `completion/complete`'s), for policies.
    reference: Option<Range<usize>>,
    /// Where `params._meta` is.
    pub(crate) meta: Option<Range<usize>>,
    /// `params._meta` names a protocol version (the era decision, SPEC section 13).
    pub(crate) meta_version: bool,
    /// A modern request (SPEC section 13): what its reserved `_meta` keys said, which are
    /// gone from `text`.
    pub(crate) modern: Option<Box<ModernMeta>>,
}

impl Checked {
    /// Admits a POST body (SPEC section 1's checks of the message itself).
    pub(crate) fn admit(body: Vec<u8>) -> Result<Checked, Invalid> {
        let text = String::from_utf8(body).map_err(|_| Invalid::NotUtf8)?;
        let msg = admit_client(text.as_bytes())?;
        let method = msg.method.as_deref().unwrap_or_default().to_owned();
        let cancels = (method == "notifications/cancelled")
            .then(|| IdAt::of(&msg, msg.params.request_id))
            .flatten();
        let checked = Checked {
            kind: msg.kind,
            id: IdAt::of(&msg, msg.id),
            token: IdAt::of(&msg, msg.params.meta_progress_token),
            cancels,
            capabilities: msg.params.capabilities.map(|c| msg.span(c)),
            uri: msg
                .params
                .uri
                .and_then(string_value)
                .map(|s| s.into_owned()),
            tool: (method == "tools/call")
                .then(|| msg.params.name.and_then(string_value))
                .flatten()
                .map(|s| s.into_owned()),
            name: (msg.params.name)
                .and_then(string_value)
                .map(|s| s.into_owned()),
            task: (method.starts_with("tasks/"))
                .then(|| msg.params.task_id.and_then(string_value))
                .flatten()
                .map(|s| s.into_owned()),
            arguments: msg.params.arguments.map(|a| msg.span(a)),
            reference: msg.params.reference.map(|r| msg.span(r)),
            meta: msg.params.meta.map(|m| msg.span(m)),
            meta_version: msg.params.meta_protocol_version,
            unknown_tool: false,
            modern: None,
            method,
            text: String::new(),
        };
        Ok(Checked { text, ..checked })
    }

    /// `text`, an edit of this message's text, admitted in its place; what a modern
    /// request's reserved `_meta` keys said (gone from the text) is kept.
    pub(crate) fn edited(&self, text: String) -> Result<Checked, Invalid> {
        let admitted = Checked::admit(text.into_bytes())?;
        Ok(Checked {
            modern: self.modern.clone(),
            ..admitted
        })
    }

    /// This message as a modern request: its reserved `_meta` keys removed (read again
    /// when there were any, so every span is right) and what they said kept aside.
    pub(crate) fn into_modern(self) -> Checked {
        let stripped = (self.meta.clone())
            .and_then(|span| Some((span.clone(), strip_reserved(&self.text[span])?)));
        let Some((span, (kept, said))) = stripped else {
            let modern = Some(Box::default());
            return Checked { modern, ..self };
        };
        let checked = self.with_meta(span, &kept, said);
        // Read again, it is the same message (checked where tests and fuzzing run).
        #[cfg(debug_assertions)]
        checked.assert_reads_again();
        checked
    }

    /// This message with its `_meta` object (at `span`) replaced by `kept`, the reserved
    /// keys' `said` kept aside. Only `_meta` changed: what lies after it moves back, what
    /// lies before stays, and the progress token (the one span inside `_meta`) is found
    /// again in what was kept.
    fn with_meta(self, span: Range<usize>, kept: &str, said: ModernMeta) -> Checked {
        let text = [&self.text[..span.start], kept, &self.text[span.end..]].concat();
        let removed = span.len() - kept.len();
        let moved = |r: Range<usize>| match r.start >= span.end {
            true => r.start - removed..r.end - removed,
            false => r,
        };
        let token = self.token.and_then(|token| {
            let (_, value) = (members(kept)?.into_iter()).find(|(k, _)| k == "progressToken")?;
            let at = span.start + (value.as_ptr() as usize - kept.as_ptr() as usize);
            Some(IdAt {
                span: at..at + value.len(),
                ..token
            })
        });
        Checked {
            id: self.id.map(|id| IdAt {
                span: moved(id.span.clone()),
                ..id
            }),
            cancels: self.cancels.map(|id| IdAt {
                span: moved(id.span.clone()),
                ..id
            }),
            capabilities: self.capabilities.map(moved),
            arguments: self.arguments.map(moved),
            reference: self.reference.map(moved),
            meta: Some(span.start..span.start + kept.len()),
            // The version it named is gone from the text, kept in `modern`.
            meta_version: false,
            token,
            modern: Some(Box::new(said)),
            text,
            ..self
        }
    }

    /// Panics unless a second reading of the text finds every span where the edit moved
    /// it: the fast path of [`Checked::into_modern`] is the slow one's equal.
    #[cfg(debug_assertions)]
    fn assert_reads_again(&self) {
        let again = Checked::admit(self.text.clone().into_bytes()).expect("admits again");
        let again = format!(
            "{:?}",
            Checked {
                modern: None,
                ..again
            }
        );
        let fast = format!(
            "{:?}",
            Checked {
                modern: None,
                ..self.clone()
            }
        );
        assert_eq!(
            fast, again,
            "the spans moved as a second reading finds them"
        );
    }

    /// Whether it asks something of the server: a request, or a method sent without an id
    /// other than `notifications/*` (a `tools/call` as a notification still runs the tool).
    /// The policy and the rate limits judge these.
    pub(crate) fn is_call(&self) -> bool {
        match self.kind {
            Kind::Request => true,
            Kind::Notification => !self.method.starts_with("notifications/"),
            Kind::Response => false,
        }
    }

    /// A request's id as the client wrote it (`null` for a notification).
    pub(crate) fn raw_id(&self) -> &str {
        self.id
            .as_ref()
            .map_or("null", |id| &self.text[id.span.clone()])
    }

    /// The message as the client sent it.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// `params.arguments` as JSON text.
    pub(crate) fn arguments(&self) -> Option<&str> {
        self.arguments.clone().map(|span| &self.text[span])
    }

    /// `params.ref` as JSON text.
    pub(crate) fn reference(&self) -> Option<&str> {
        self.reference.clone().map(|span| &self.text[span])
    }

    /// Whether it is a request for `method`.
    pub(crate) fn is_request(&self, method: &str) -> bool {
        self.kind == Kind::Request && self.method == method
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_ids() {
        assert_eq!(RawId::classify("-0"), Some(RawId::Int("-0")));
        assert_eq!(RawId::classify("\"a\""), Some(RawId::Str("\"a\"")));
        for bad in ["1.5", "1e3", "1E3", "null", "true", "{}", "[]"] {
            assert_eq!(RawId::classify(bad), None, "{bad}");
        }
    }

    #[test]
    fn refuses_duplicates_at_any_depth() {
        let top = br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"x"}"#;
        assert_eq!(admit_client(top).unwrap_err(), Invalid::DuplicateKey);
        let nested = br#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"_meta":{"a":1,"a":2}}}"#;
        assert_eq!(admit_client(nested).unwrap_err(), Invalid::DuplicateKey);
        let escaped = br#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":1,"\u0061":2}}"#;
        assert_eq!(admit_client(escaped).unwrap_err(), Invalid::DuplicateKey);
        let many: String = (0..100).map(|i| format!("\"k{i}\":0,")).collect();
        let body = format!(r#"{{{many}"k7":1,"jsonrpc":"2.0","method":"x"}}"#);
        assert_eq!(
            admit_client(body.as_bytes()).unwrap_err(),
            Invalid::DuplicateKey
        );
    }

    #[test]
    fn refusals_name_their_reason() {
        let surrogate = br#"{"jsonrpc":"2.0","id":"\ud800","method":"tools/list"}"#;
        assert_eq!(admit_client(surrogate).unwrap_err(), Invalid::LoneSurrogate);
        let token = br#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"_meta":{"progressToken":"a\udc00"}}}"#;
        assert_eq!(admit_client(token).unwrap_err(), Invalid::LoneSurrogate);
        let pair = br#"{"jsonrpc":"2.0","id":"\ud83d\ude00","method":"tools/list"}"#;
        assert!(admit_client(pair).is_ok());
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":{}1{},"method":"tools/list"}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        assert_eq!(admit_client(deep.as_bytes()).unwrap_err(), Invalid::TooDeep);
        let nested_id = br#"{"jsonrpc":"2.0","id":[[1]],"method":"tools/list"}"#;
        assert_eq!(admit_client(nested_id).unwrap_err(), Invalid::InvalidId);
    }

    #[test]
    fn numbers_out_of_range_are_named_wherever_they_are() {
        for body in [
            r#"{"jsonrpc":"2.0","id":[1e400],"method":"x"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"n":1e400}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"arguments":{"n":1e400}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"_meta":{"x":[-1e400]}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"x","other":1e400}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"x","params":[1e400]}"#,
        ] {
            let refused = admit_client(body.as_bytes()).unwrap_err();
            assert_eq!(refused, Invalid::NumberOutOfRange, "{body}");
            assert_eq!(refused.code(), -32700);
            assert!(refused.reason().contains("number is out of range"));
        }
        // As an id it is an exponent, refused as every exponent is.
        let id = br#"{"jsonrpc":"2.0","id":1e400,"method":"x"}"#;
        assert_eq!(admit_client(id).unwrap_err(), Invalid::InvalidId);
        // What a float holds (rounded to zero, or an integer past u64) is not refused.
        let fine = br#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":{"n":1e-400,"m":184467440737095516150}}}"#;
        assert!(admit_client(fine).is_ok());
        // Any other failure inside a value is not called a duplicate key either.
        let surrogate =
            br#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"arguments":{"\ud800":1}}}"#;
        assert_eq!(admit_client(surrogate).unwrap_err(), Invalid::NotJson);
    }

    #[test]
    fn spans_point_into_the_text() {
        let body = br#"{"jsonrpc":"2.0","id":"a\"b","method":"m"}"#;
        let msg = admit_client(body).unwrap();
        let span = msg.span(msg.id.unwrap());
        assert_eq!(&msg.text[span], r#""a\"b""#);
    }

    #[test]
    fn members_are_scanned_as_serde_json_reads_them() {
        let objects = [
            r#"{}"#,
            r#" { } "#,
            "{ \"a\" :\t1 ,\n\"b\":[1,{\"c\":\"}]\\\"\"}] , \"d\":\"x\\\\\",\"e\":-1.5e3,\"f\":null}\r\n",
            r#"{"s":"{[","t":true,"o":{"p":{}},"q":[[],[{}]]}"#,
            r#"{"dup":1,"dup":2}"#,
        ];
        for object in objects {
            let scanned = scan::members(object);
            assert!(scanned.is_some(), "{object}");
            assert_eq!(scanned, parsed_members(object), "{object}");
        }
        // Escaped keys and what is not one object are left to serde_json.
        for other in [
            r#"{"\u0061":1}"#,
            "[1]",
            "1",
            r#"{"a":1}x"#,
            r#"{"a":1"#,
            "",
        ] {
            assert_eq!(scan::members(other), None, "{other}");
        }
        assert_eq!(
            members(r#"{"\u0061":1}"#),
            Some(vec![(Cow::Borrowed("a"), "1")])
        );
    }
}
