//! MCP 2026-07-28 ("modern") requests on `/mcp` (SPEC section 13), as pure functions: which
//! era a POST is in, the revision's checks of its headers against its body, and what the
//! proxy changes in the backend's 2025-era answers on the way back.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Range;

use crate::http::{McpHeaders, Response};
use crate::message::{members, push_key, push_member, Checked};
use crate::tools::{Call, ToolView};

pub(crate) use crate::http::MODERN_VERSION as VERSION;

/// Every protocol version the proxy speaks, newest first (`server/discover`, -32022).
pub(crate) const SUPPORTED: [&str; 5] = [
    VERSION,
    "2025-11-25",
    "2025-06-18",
    "2025-03-26",
    "2024-11-05",
];

/// Where a result names the server.
const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

/// The methods whose complete result a client may cache (`ttlMs`, `cacheScope`).
const CACHEABLE: [&str; 5] = [
    "tools/list",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
];

/// The methods the revision removed: 404 with -32601.
const REMOVED: [&str; 5] = [
    "ping",
    "logging/setLevel",
    "resources/subscribe",
    "resources/unsubscribe",
    "initialize",
];

/// The server capabilities the 2026-07-28 schema defines, `logging` left out (nothing the
/// backend logs can be attributed to one client).
const CAPABILITIES: [&str; 5] = [
    "completions",
    "experimental",
    "prompts",
    "resources",
    "tools",
];

/// Why the revision refuses a modern request before it is forwarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `_meta` lacks the revision's required fields: 400, -32602.
    MissingMeta,
    /// A header disagrees with the body (missing, malformed, different, repeated): 400,
    /// -32020.
    Mismatch(&'static str),
    /// A protocol version the proxy does not speak: 400, -32022.
    Unsupported(String),
    /// A method the revision removed: 404, -32601.
    Removed(String),
}

impl Refusal {
    /// The refusal as an answer under the request's id `raw_id`.
    pub(crate) fn response(&self, raw_id: &str) -> Response {
        let (status, code, text, data) = match self {
            Refusal::MissingMeta => (
                400,
                -32602,
                Cow::Borrowed("Missing required _meta fields: io.modelcontextprotocol/protocolVersion and io.modelcontextprotocol/clientCapabilities"),
                None,
            ),
            Refusal::Mismatch(header) => (
                400,
                -32020,
                Cow::Owned(format!("Header mismatch: {header}")),
                None,
            ),
            Refusal::Unsupported(requested) => {
                let data = serde_json::json!({"supported": SUPPORTED, "requested": requested});
                (400, -32022, Cow::Borrowed("Unsupported protocol version"), Some(data))
            }
            Refusal::Removed(method) => (
                404,
                -32601,
                Cow::Owned(format!("Method not found: {method}")),
                None,
            ),
        };
        let mut error = serde_json::json!({"code": code, "message": text});
        if let Some(data) = data {
            error["data"] = data;
        }
        let body = format!(r#"{{"jsonrpc":"2.0","id":{raw_id},"error":{error}}}"#);
        Response::json(status, body.into_bytes())
    }
}

/// The `Mcp-Param-{Name}` headers each tool's arguments must be mirrored in
/// (`x-mcp-header` on a property of its `inputSchema`), by the backend's name of the tool,
/// from the backend's own `tools/list` pages: never from a list as one caller was shown it
/// (filtered by its policy, renamed), so that no caller's list changes how another's calls
/// are checked. A page adds to what earlier pages said; an error says nothing; the table
/// goes when the backend says its list changed, or exits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ToolHeaders {
    /// Backend tool name → (header suffix, lowercase; the argument it mirrors).
    tools: BTreeMap<String, Vec<(String, String)>>,
}

/// Tools whose headers are known at once, at most (a list of more keeps the first).
const MAX_ANNOTATED_TOOLS: usize = 4096;

impl ToolHeaders {
    /// Learns what a page of the backend's `tools/list` (its result's JSON text; `None`: an
    /// error, which says nothing) annotates: each tool it lists replaces what was known of
    /// that tool.
    pub(crate) fn learn(&mut self, result: Option<&str>) {
        if let Some(result) = result {
            self.learn_value(&serde_json::from_str(result).unwrap_or_default());
        }
    }

    /// [`ToolHeaders::learn`] from a result already read.
    pub(crate) fn learn_value(&mut self, value: &serde_json::Value) {
        for tool in value["tools"].as_array().into_iter().flatten() {
            let Some(name) = tool["name"].as_str() else {
                continue;
            };
            let properties = tool["inputSchema"]["properties"].as_object();
            let headers: Vec<(String, String)> = (properties.into_iter().flatten())
                .filter_map(|(param, schema)| {
                    let header = schema.get("x-mcp-header")?.as_str()?;
                    Some((header.to_ascii_lowercase(), param.clone()))
                })
                .collect();
            if headers.is_empty() {
                self.tools.remove(name);
            } else if self.tools.len() < MAX_ANNOTATED_TOOLS || self.tools.contains_key(name) {
                self.tools.insert(name.to_owned(), headers);
            }
        }
    }

    /// The backend's list changed, or it exited: nothing is known.
    pub(crate) fn forget(&mut self) {
        self.tools.clear();
    }

    /// The annotations of the tool a call of `called` reaches: through the operator's
    /// `view`, the backend tool shown under that name (SPEC section 16).
    fn of(&self, called: &str, view: Option<&ToolView>) -> Option<&[(String, String)]> {
        let backend = match view.map(|view| view.call(called)) {
            Some(Call::Shown(backend)) => backend,
            Some(Call::Unknown) => return None,
            None => called,
        };
        self.tools.get(backend).map(Vec::as_slice)
    }
}

/// SPEC section 13's checks of a modern request, after admission's, in order: the
/// required `_meta` fields, the headers against the body, the version, the method.
pub(crate) fn check(
    msg: &Checked,
    headers: &McpHeaders,
    (tools, view): (&ToolHeaders, Option<&ToolView>),
) -> Result<(), Refusal> {
    let meta = msg.modern.as_deref();
    let version = meta.filter(|meta| meta.capabilities);
    let Some(version) = version.and_then(|meta| meta.version.as_deref()) else {
        return Err(Refusal::MissingMeta);
    };
    let fields = Fields(&headers.fields);
    match headers.protocol_version.as_deref().map(str::trim) {
        Some(header) if header == version => {}
        _ => return Err(Refusal::Mismatch("MCP-Protocol-Version")),
    }
    if fields.one("mcp-method")?.as_deref() != Some(msg.method.as_str()) {
        return Err(Refusal::Mismatch("Mcp-Method"));
    }
    // The name a method that names something carries: `None` when its `params.name` /
    // `params.uri` is missing, not a string or not Unicode, which no `Mcp-Name` matches.
    let named = match msg.method.as_str() {
        "tools/call" | "prompts/get" => Some(msg.name.as_deref()),
        "resources/read" => Some(msg.uri.as_deref()),
        _ => None,
    };
    if let Some(named) = named {
        let header = fields.one("mcp-name")?;
        if (named.is_some() || header.is_some()) && header.as_deref() != named {
            return Err(Refusal::Mismatch("Mcp-Name"));
        }
    }
    if let Some(annotated) = msg.tool.as_ref().and_then(|tool| tools.of(tool, view)) {
        check_params(msg, &fields, annotated)?;
    }
    if version != VERSION {
        return Err(Refusal::Unsupported(version.to_owned()));
    }
    if REMOVED.contains(&msg.method.as_str()) {
        return Err(Refusal::Removed(msg.method.clone()));
    }
    Ok(())
}

/// Each annotated argument against its `Mcp-Param-{Name}` header: both absent, or equal.
fn check_params(
    msg: &Checked,
    fields: &Fields<'_>,
    annotated: &[(String, String)],
) -> Result<(), Refusal> {
    let arguments: serde_json::Value = msg
        .arguments()
        .and_then(|a| serde_json::from_str(a).ok())
        .unwrap_or_default();
    for (header, param) in annotated {
        let expected = arguments.get(param).map(|value| match value {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        });
        if fields.one(&format!("mcp-param-{header}"))?.as_deref() != expected.as_deref() {
            return Err(Refusal::Mismatch("Mcp-Param"));
        }
    }
    Ok(())
}

/// The modern header fields of a request (names compared without case).
struct Fields<'a>(&'a [(String, String)]);

impl Fields<'_> {
    /// The decoded value of header `name`: `None` when absent, a mismatch when repeated
    /// or not decodable.
    fn one(&self, name: &str) -> Result<Option<Cow<'_, str>>, Refusal> {
        let mut values = self.0.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name));
        let Some((_, value)) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(Refusal::Mismatch("repeated header"));
        }
        decode(value)
            .map(Some)
            .ok_or(Refusal::Mismatch("undecodable header"))
    }
}

/// A header value, decoded when written `=?base64?...?=`.
fn decode(value: &str) -> Option<Cow<'_, str>> {
    let value = value.trim();
    let Some(encoded) = value
        .strip_prefix("=?base64?")
        .and_then(|v| v.strip_suffix("?="))
    else {
        return Some(Cow::Borrowed(value));
    };
    String::from_utf8(base64(encoded)?).ok().map(Cow::Owned)
}

/// Standard base64 (padding optional).
fn base64(text: &str) -> Option<Vec<u8>> {
    let sextet = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let text = text.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for chunk in text.chunks(4) {
        let bits = chunk
            .iter()
            .try_fold(0u32, |acc, &c| Some(acc << 6 | u32::from(sextet(c)?)))?;
        let bytes = (bits << (6 * (4 - chunk.len()))).to_be_bytes();
        match chunk.len() {
            4 => out.extend_from_slice(&bytes[1..4]),
            3 => out.extend_from_slice(&bytes[1..3]),
            2 => out.push(bytes[1]),
            _ => return None,
        }
    }
    Some(out)
}

/// The backend's answer to a modern request of `method`, changed as the revision requires
/// (its id already restored): a result gets `resultType`, cache hints for the cacheable
/// methods (`private` forced when the list was filtered for the caller) and the server's
/// info in `_meta`; error -32002 becomes -32602. Also the HTTP status of the answer as a
/// JSON body. `result` is where the result lies in `message`, when the router knows it: a
/// result that names none of the revision's members then gains them in place, and the
/// rest of the answer is not read again.
pub(crate) fn complete(
    method: &str,
    (message, result): (&[u8], Option<Range<usize>>),
    private: bool,
    server_info: Option<&str>,
) -> (Vec<u8>, u16) {
    let known = result.and_then(|span| {
        let before = std::str::from_utf8(message.get(..span.start)?).ok()?;
        let text = std::str::from_utf8(message.get(span.clone())?).ok()?;
        Some((before, untouched(text)?, &message[span.end..]))
    });
    if let Some((before, open, after)) = known {
        let extra = server_info.map_or(0, str::len);
        let mut out = String::with_capacity(message.len() + 128 + extra);
        out.push_str(before);
        complete_untouched(&mut out, method, open, server_info);
        let mut out = out.into_bytes();
        out.extend_from_slice(after);
        // Read whole, it is the same answer (checked where tests and fuzzing run).
        #[cfg(debug_assertions)]
        {
            let read = |text: &[u8]| serde_json::from_slice::<serde_json::Value>(text).ok();
            let whole = complete(method, (message, None), private, server_info).0;
            assert_eq!(read(&out), read(&whole), "completed in place as whole");
        }
        return (out, 200);
    }
    let Some(members) = std::str::from_utf8(message).ok().and_then(members) else {
        return (message.to_vec(), 200);
    };
    let extra = server_info.map_or(0, str::len);
    let mut out = String::with_capacity(message.len() + 128 + extra);
    let mut status = 200;
    out.push('{');
    for (key, value) in &members {
        let value = match key.as_ref() {
            "result" => {
                push_key(&mut out, key);
                complete_result(&mut out, method, value, private, server_info);
                continue;
            }
            "error" => {
                let (error, code) = renumber(value);
                status = match code {
                    Some(-32601) => 404,
                    Some(-32602) => 400,
                    Some(-32003) => 403,
                    _ => 200,
                };
                error
            }
            _ => Cow::Borrowed(*value),
        };
        push_member(&mut out, key, &value);
    }
    out.push('}');
    (out.into_bytes(), status)
}

/// A result object with the revision's members added where the backend left them out,
/// written to `out`.
fn complete_result(
    out: &mut String,
    method: &str,
    result: &str,
    private: bool,
    server_info: Option<&str>,
) {
    if let Some(open) = untouched(result) {
        return complete_untouched(out, method, open, server_info);
    }
    let Some(members) = members(result) else {
        return out.push_str(result);
    };
    let has = |name: &str| members.iter().any(|(key, _)| key == name);
    out.push('{');
    let mut meta = None;
    for (key, value) in &members {
        match key.as_ref() {
            "_meta" => meta = Some(*value),
            "cacheScope" if private => {}
            _ => push_member(out, key, value),
        }
    }
    if !has("resultType") {
        push_member(out, "resultType", r#""complete""#);
    }
    if CACHEABLE.contains(&method) {
        if !has("ttlMs") {
            push_member(out, "ttlMs", "0");
        }
        if private || !has("cacheScope") {
            push_member(out, "cacheScope", r#""private""#);
        }
    }
    push_key(out, "_meta");
    with_server_info(out, meta, server_info);
    out.push('}');
}

/// A result object that names none of the revision's members, its text up to its closing
/// brace `open` (see [`untouched`]), with those members after its own, written to `out`.
fn complete_untouched(out: &mut String, method: &str, open: &str, server_info: Option<&str>) {
    out.push_str(open);
    push_member(out, "resultType", r#""complete""#);
    if CACHEABLE.contains(&method) {
        push_member(out, "ttlMs", "0");
        push_member(out, "cacheScope", r#""private""#);
    }
    push_key(out, "_meta");
    with_server_info(out, None, server_info);
    out.push('}');
}

/// A result object that names none of the members the revision adds or changes (and holds
/// no `\u` escape that could spell one): its text up to its closing brace (spaces before it
/// left out), to which those members are added as they are to any other result.
fn untouched(result: &str) -> Option<&str> {
    const NAMES: [&str; 5] = ["resultType", "ttlMs", "cacheScope", "_meta", "\\u"];
    if !result.starts_with('{') || NAMES.iter().any(|name| result.contains(name)) {
        return None;
    }
    Some(result.trim_end().strip_suffix('}')?.trim_end())
}

/// A result's `_meta` (or a new one) naming the server, written to `out`.
fn with_server_info(out: &mut String, meta: Option<&str>, server_info: Option<&str>) {
    let kept = meta.and_then(members).unwrap_or_default();
    out.push('{');
    for (key, value) in kept.iter().filter(|(key, _)| key != META_SERVER_INFO) {
        push_member(out, key, value);
    }
    if let Some(info) = server_info {
        push_member(out, META_SERVER_INFO, info);
    }
    out.push('}');
}

/// An error object with -32002 (2025: resource not found) renumbered -32602, and its code.
fn renumber(error: &str) -> (Cow<'_, str>, Option<i64>) {
    let Some(members) = members(error) else {
        return (Cow::Borrowed(error), None);
    };
    let code = (members.iter())
        .find(|(key, _)| key == "code")
        .and_then(|(_, value)| value.parse::<i64>().ok());
    if code != Some(-32002) {
        return (Cow::Borrowed(error), code);
    }
    let mut out = String::from("{");
    for (key, value) in &members {
        let value = if key == "code" { "-32602" } else { *value };
        push_member(&mut out, key, value);
    }
    out.push('}');
    (Cow::Owned(out), Some(-32602))
}

/// `server/discover`'s result, from the backend's cached `initialize` result.
pub(crate) fn discover(initialize: &str) -> String {
    let top = members(initialize).unwrap_or_default();
    let get = |name: &str| {
        (top.iter())
            .find(|(key, _)| key == name)
            .map(|(_, value)| *value)
    };
    let mut capabilities = String::from("{");
    let declared = get("capabilities").and_then(members).unwrap_or_default();
    for (key, value) in declared
        .iter()
        .filter(|(k, _)| CAPABILITIES.contains(&k.as_ref()))
    {
        push_member(&mut capabilities, key, value);
    }
    capabilities.push('}');
    let supported = serde_json::Value::from(SUPPORTED.to_vec());
    let mut out = String::from("{");
    push_member(&mut out, "resultType", r#""complete""#);
    push_member(&mut out, "supportedVersions", &supported.to_string());
    push_member(&mut out, "capabilities", &capabilities);
    if let Some(instructions) = get("instructions") {
        push_member(&mut out, "instructions", instructions);
    }
    push_key(&mut out, "_meta");
    with_server_info(&mut out, None, get("serverInfo"));
    push_member(&mut out, "ttlMs", "60000");
    push_member(&mut out, "cacheScope", r#""public""#);
    out.push('}');
    out
}

/// The backend's `serverInfo` in its cached `initialize` result.
pub(crate) fn server_info(initialize: &str) -> Option<String> {
    let members = members(initialize)?;
    let (_, info) = members.into_iter().find(|(key, _)| key == "serverInfo")?;
    Some(info.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::McpHeaders;

    fn modern(body: &str) -> Checked {
        Checked::admit(body.as_bytes().to_vec())
            .expect("admits")
            .into_modern()
    }

    fn headers(version: &str, fields: &[(&str, &str)]) -> McpHeaders {
        McpHeaders {
            protocol_version: Some(version.to_owned().into()),
            fields: fields
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            ..McpHeaders::default()
        }
    }

    const META: &str = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"progressToken":7,"traceparent":"00-x","io.modelcontextprotocol/logLevel":"debug"}"#;

    fn call(meta: &str) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo","arguments":{{"region":"eu","n":3}},{meta}}}}}"#
        )
    }

    #[test]
    fn the_era_is_the_header_or_a_sessionless_meta_version() {
        assert!(crate::http::is_modern(Some("2026-07-28"), true, false));
        assert!(crate::http::is_modern(None, false, true));
        assert!(!crate::http::is_modern(None, true, true));
        assert!(!crate::http::is_modern(Some("2025-11-25"), true, false));
        assert!(!crate::http::is_modern(None, false, false));
    }

    #[test]
    fn reserved_meta_keys_are_removed_and_read() {
        let msg = modern(&call(META));
        assert_eq!(
            msg.text(),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"region":"eu","n":3},"_meta":{"progressToken":7,"traceparent":"00-x"}}}"#
        );
        let said = msg.modern.as_deref().expect("modern");
        assert_eq!(said.version.as_deref(), Some(VERSION));
        assert!(said.capabilities);
        // The spans were read again: the token is where the new text has it.
        assert_eq!(
            &msg.text()[msg.token.as_ref().expect("token").span.clone()],
            "7"
        );
    }

    #[test]
    fn the_checks_come_in_the_revisions_order() {
        let mut learned = ToolHeaders::default();
        learned.learn(Some(
            r#"{"tools":[{"name":"echo","inputSchema":{"properties":{"region":{"type":"string","x-mcp-header":"Region"}}}}]}"#,
        ));
        let tools = (&learned, None);
        let good = [
            ("mcp-method", "tools/call"),
            ("mcp-name", "echo"),
            ("mcp-param-region", "eu"),
        ];
        let msg = modern(&call(META));
        assert_eq!(check(&msg, &headers(VERSION, &good), tools), Ok(()));
        let without = modern(&call(
            r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}"#,
        ));
        assert_eq!(
            check(&without, &headers(VERSION, &good), tools),
            Err(Refusal::MissingMeta)
        );
        let cases: [&[(&str, &str)]; 5] = [
            &good[1..],
            &[good[0], ("mcp-name", "other"), good[2]],
            &[good[0], good[1], ("mcp-param-region", "us")],
            &[good[0], good[1]],
            &[good[0], good[0], good[1], good[2]],
        ];
        for fields in cases {
            let refused = check(&msg, &headers(VERSION, fields), tools);
            assert!(
                matches!(refused, Err(Refusal::Mismatch(_))),
                "{fields:?}: {refused:?}"
            );
        }
        let encoded = [good[0], ("mcp-name", "=?base64?ZWNobw==?="), good[2]];
        assert_eq!(check(&msg, &headers(VERSION, &encoded), tools), Ok(()));
        assert!(matches!(
            check(&msg, &headers("2025-11-25", &good), tools),
            Err(Refusal::Mismatch("MCP-Protocol-Version"))
        ));
        let future = modern(&call(&META.replace(VERSION, "2027-01-01")));
        let refused = check(&future, &headers("2027-01-01", &good), tools);
        assert_eq!(refused, Err(Refusal::Unsupported("2027-01-01".into())));
        let body = refused.unwrap_err().response("1");
        assert_eq!(body.status, 400);
        let value: serde_json::Value = serde_json::from_slice(&body.body).expect("json");
        assert_eq!(value["error"]["code"], -32022);
        assert_eq!(value["error"]["data"]["supported"][0], VERSION);
        assert_eq!(value["error"]["data"]["requested"], "2027-01-01");
        let ping = modern(&format!(
            r#"{{"jsonrpc":"2.0","id":2,"method":"ping","params":{{{META}}}}}"#
        ));
        let refused = check(&ping, &headers(VERSION, &[("mcp-method", "ping")]), tools);
        assert_eq!(refused.unwrap_err().response("2").status, 404);
    }

    #[test]
    fn an_mcp_name_with_no_name_in_the_body_is_a_mismatch() {
        let none = ToolHeaders::default();
        let tools = (&none, None);
        let bodies = [
            ("tools/call", ""),
            ("tools/call", r#""name":7,"#),
            ("tools/call", r#""name":null,"#),
            ("tools/call", r#""name":"\ud800","#),
            ("prompts/get", r#""name":["a"],"#),
            ("resources/read", ""),
            ("resources/read", r#""uri":{"a":1},"#),
            ("resources/read", r#""uri":"\udfff","#),
        ];
        for (method, params) in bodies {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{{{params}{META}}}}}"#
            );
            let msg = modern(&body);
            let fields = [("mcp-method", method), ("mcp-name", "a")];
            let refused = check(&msg, &headers(VERSION, &fields), tools);
            assert_eq!(refused, Err(Refusal::Mismatch("Mcp-Name")), "{body}");
            let response = refused.unwrap_err().response("1");
            assert_eq!(response.status, 400);
            let value: serde_json::Value = serde_json::from_slice(&response.body).expect("json");
            assert_eq!(value["error"]["code"], -32020, "{body}");
            // Without the header, the body's own checks are the backend's.
            let fields = [("mcp-method", method)];
            assert_eq!(check(&msg, &headers(VERSION, &fields), tools), Ok(()));
        }
    }

    #[test]
    fn results_gain_the_revisions_members() {
        let answer = br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[],"_meta":{"a":1}}}"#;
        let (changed, status) =
            complete("tools/list", (answer, None), false, Some(r#"{"name":"s"}"#));
        assert_eq!(status, 200);
        assert_eq!(
            String::from_utf8(changed).expect("utf-8"),
            r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[],"resultType":"complete","ttlMs":0,"cacheScope":"private","_meta":{"a":1,"io.modelcontextprotocol/serverInfo":{"name":"s"}}}}"#
        );
        let public =
            br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[],"ttlMs":5,"cacheScope":"public"}}"#;
        let (kept, _) = complete("tools/list", (public, None), false, None);
        assert!(String::from_utf8_lossy(&kept).contains(r#""ttlMs":5,"cacheScope":"public""#));
        let (forced, _) = complete("tools/list", (public, None), true, None);
        assert!(String::from_utf8_lossy(&forced)
            .contains(r#""ttlMs":5,"resultType":"complete","cacheScope":"private""#));
        let call = br#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#;
        let (called, _) = complete("tools/call", (call, None), false, None);
        assert!(!String::from_utf8_lossy(&called).contains("ttlMs"));
        let missing = br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32002,"message":"no"}}"#;
        let (renumbered, status) = complete("resources/read", (missing, None), false, None);
        assert_eq!(status, 400);
        assert!(String::from_utf8_lossy(&renumbered).contains(r#""code":-32602"#));
        let denied = br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32003,"message":"no"}}"#;
        assert_eq!(complete("tools/call", (denied, None), false, None).1, 403);
    }

    #[test]
    fn a_result_kept_as_written_gains_the_same_members() {
        let info = Some(r#"{"name":"s"}"#);
        let cases: [(&str, &str); 5] = [
            (
                "tools/call",
                r#"{"content":[{"type":"text","text":"a \"b\"\n"}],"isError":false}"#,
            ),
            ("tools/call", "{ }"),
            ("tools/call", "{}"),
            ("tools/list", r#"{ "tools" : [ ] , "nextCursor":"c" }"#),
            (
                "tools/call",
                r#"{"content":[],"structuredContent":{"x":{"y":[1,2]}}}"#,
            ),
        ];
        for (method, result) in cases {
            let answer = format!(r#"{{"jsonrpc":"2.0","id":1,"result":{result}}}"#);
            let (fast, _) = complete(method, (answer.as_bytes(), None), false, info);
            // Where the router found the result: completed in place, the same answer.
            let at = answer.find(result).expect("written in");
            let known = (answer.as_bytes(), Some(at..at + result.len()));
            let (in_place, _) = complete(method, known, false, info);
            assert_eq!(in_place, fast, "{result}");
            let mut slow = String::from("{");
            push_member(&mut slow, "jsonrpc", r#""2.0""#);
            push_member(&mut slow, "id", "1");
            push_key(&mut slow, "result");
            // The members read one by one, as a result that names one of them is.
            let members = members(result).expect("an object");
            slow.push('{');
            for (key, value) in &members {
                push_member(&mut slow, key, value);
            }
            push_member(&mut slow, "resultType", r#""complete""#);
            if CACHEABLE.contains(&method) {
                push_member(&mut slow, "ttlMs", "0");
                push_member(&mut slow, "cacheScope", r#""private""#);
            }
            push_key(&mut slow, "_meta");
            with_server_info(&mut slow, None, info);
            slow.push_str("}}");
            let fast: serde_json::Value = serde_json::from_slice(&fast).expect("json");
            let slow: serde_json::Value = serde_json::from_str(&slow).expect("json");
            assert_eq!(fast, slow, "{result}");
        }
        // Spelled with an escape, a member the revision changes is read, not kept.
        let escaped = br#"{"jsonrpc":"2.0","id":1,"result":{"_m\u0065ta":{"a":1}}}"#;
        let (changed, _) = complete("tools/call", (escaped, None), false, info);
        let value: serde_json::Value = serde_json::from_slice(&changed).expect("json");
        assert_eq!(value["result"]["_meta"]["a"], 1, "{value}");
        let span = Some(33..escaped.len() - 1);
        assert_eq!(
            complete("tools/call", (escaped, span), false, info).0,
            changed
        );
    }

    #[test]
    fn discover_is_the_cached_handshake_in_the_new_shape() {
        let init = r#"{"protocolVersion":"2025-11-25","capabilities":{"tools":{"listChanged":true},"logging":{},"weird":{}},"serverInfo":{"name":"s","version":"1"},"instructions":"hi"}"#;
        let value: serde_json::Value = serde_json::from_str(&discover(init)).expect("json");
        assert_eq!(value["resultType"], "complete");
        assert_eq!(value["supportedVersions"][0], VERSION);
        assert_eq!(
            value["capabilities"],
            serde_json::json!({"tools":{"listChanged":true}})
        );
        assert_eq!(value["instructions"], "hi");
        assert_eq!(value["_meta"][META_SERVER_INFO]["name"], "s");
        assert_eq!(
            (value["ttlMs"].as_u64(), value["cacheScope"].as_str()),
            (Some(60000), Some("public"))
        );
        assert_eq!(
            server_info(init).as_deref(),
            Some(r#"{"name":"s","version":"1"}"#)
        );
    }

    #[test]
    fn base64_decodes_with_or_without_padding() {
        assert_eq!(base64("aGk=").as_deref(), Some(&b"hi"[..]));
        assert_eq!(base64("aGk").as_deref(), Some(&b"hi"[..]));
        assert_eq!(
            base64("aGVsbG8gd29ybGQ=").as_deref(),
            Some(&b"hello world"[..])
        );
        assert_eq!(base64("a"), None);
        assert_eq!(base64("a*=="), None);
    }
}
