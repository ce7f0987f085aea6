//! SPEC section 10's authorization on the way in and out: a request the policy denies is
//! answered -32003 by the proxy and never reaches the backend; a list result is filtered
//! for the session that asked, its routed id marked so that the way back needs no table.

use std::collections::HashMap;
use std::ops::Range;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::auth::Principal;
use crate::http::Grant;
use crate::message::Checked;
use crate::message::{self, Kind};
use crate::policy::{Ask, Caller, Policy};
use crate::router::{self, RESPONSE_ID_AT};
use crate::settings::Settings;

/// The list methods whose results are filtered, never authorized (as in ToolHive).
const LISTS: [&str; 4] = [
    "tools/list",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
];

/// The result members that hold a list's entries.
const ENTRIES: [&str; 4] = ["tools", "prompts", "resources", "resourceTemplates"];

/// Decisions remembered, at most this many, with keys of at most this many bytes in all
/// (then forgotten all at once).
const MAX_DECISIONS: usize = 16_384;
const MAX_DECISION_BYTES: usize = 8 << 20;

/// A decision on arguments longer than this (as JSON text) is made every time, never
/// remembered, so that the cache stays small in bytes.
const MAX_REMEMBERED_ARGUMENTS: usize = 1024;

/// The policy's decisions by everything they can depend on: the principal, the claims and
/// the arguments (each only when some policy names them), the action and its target. A
/// policy evaluation costs far more than a lookup, and a client asks the same thing again
/// and again (every `tools/list` entry, every call of a tool).
#[derive(Debug, Default)]
pub(crate) struct Decisions {
    /// The policy they were made by (a reload brings another).
    policy: Option<std::sync::Arc<Policy>>,
    made: HashMap<DecisionKey, bool>,
    /// The bytes of the texts in `made`'s keys.
    bytes: usize,
}

/// (principal, claims as JSON text, what is asked, its target, arguments as JSON text).
type DecisionKey = (Principal, String, &'static str, String, String);

impl Decisions {
    /// The decision for `key` under `policy`, made by `decide` when not known yet.
    fn get(
        &mut self,
        policy: &std::sync::Arc<Policy>,
        key: DecisionKey,
        decide: impl FnOnce() -> bool,
    ) -> bool {
        if !self
            .policy
            .as_ref()
            .is_some_and(|p| std::sync::Arc::ptr_eq(p, policy))
        {
            self.policy = Some(policy.clone());
            self.made.clear();
            self.bytes = 0;
        }
        if let Some(allowed) = self.made.get(&key) {
            return *allowed;
        }
        let bytes = key.0.as_str().len() + key.1.len() + key.3.len() + key.4.len();
        if bytes > MAX_DECISION_BYTES / 64 {
            return decide();
        }
        if self.made.len() >= MAX_DECISIONS || self.bytes + bytes > MAX_DECISION_BYTES {
            self.made.clear();
            self.bytes = 0;
        }
        let allowed = decide();
        self.made.insert(key, allowed);
        self.bytes += bytes;
        allowed
    }
}

/// A request's question to the policy, owning what it parsed.
enum Question {
    CallTool(String, Option<Arguments>),
    GetPrompt(String, Option<Arguments>),
    ReadResource(String),
    Other(String),
}

/// Arguments as the policy reads them, and the text they were read from: what the
/// decision is remembered by, so that it is exactly what was evaluated.
struct Arguments {
    text: String,
    members: Map<String, Value>,
}

impl Question {
    /// What the policy is asked about `msg`; `None` for what always passes: responses,
    /// `notifications/*`, `initialize`, `ping`, `logging/setLevel`, the lists and, of the
    /// 2026-07-28 revision, `server/discover` and `subscriptions/listen` (SPEC 13). A method
    /// sent without an id (`tools/call` as a notification) is asked like its request.
    /// Arguments are read only `with_arguments`.
    fn of(msg: &Checked, with_arguments: bool) -> Option<Question> {
        let method = msg.method.as_str();
        let passes = matches!(
            method,
            "initialize" | "ping" | "logging/setLevel" | "server/discover" | "subscriptions/listen"
        );
        if !msg.is_call() || passes || LISTS.contains(&method) {
            return None;
        }
        let name = || msg.name.clone().unwrap_or_default();
        let arguments = || {
            let text = msg.arguments().filter(|_| with_arguments)?;
            let members = serde_json::from_str(text).ok()?;
            Some(Arguments {
                text: text.to_owned(),
                members,
            })
        };
        Some(match method {
            "tools/call" => Question::CallTool(name(), arguments()),
            "prompts/get" => Question::GetPrompt(name(), arguments()),
            "resources/read" | "resources/subscribe" | "resources/unsubscribe" => {
                Question::ReadResource(msg.uri.clone().unwrap_or_default())
            }
            "completion/complete" => {
                completion(msg.reference()).unwrap_or_else(|| Question::Other(method.to_owned()))
            }
            _ => Question::Other(method.to_owned()),
        })
    }

    /// What is asked and of what, for the decision's key.
    fn target(&self) -> (&'static str, &str) {
        match self {
            Question::CallTool(name, _) => ("call_tool", name),
            Question::GetPrompt(name, _) => ("get_prompt", name),
            Question::ReadResource(uri) => ("read_resource", uri),
            Question::Other(method) => ("other", method),
        }
    }

    /// The text of the arguments it carries ("" for none).
    fn arguments(&self) -> &str {
        match self {
            Question::CallTool(_, Some(args)) | Question::GetPrompt(_, Some(args)) => &args.text,
            _ => "",
        }
    }

    fn ask(&self) -> Ask<'_> {
        match self {
            Question::CallTool(name, args) => {
                Ask::CallTool(name, args.as_ref().map(|a| &a.members))
            }
            Question::GetPrompt(name, args) => {
                Ask::GetPrompt(name, args.as_ref().map(|a| &a.members))
            }
            Question::ReadResource(uri) => Ask::ReadResource(uri),
            Question::Other(method) => Ask::Other(method),
        }
    }
}

/// `completion/complete` asks for what its `ref` names: a prompt or a resource.
fn completion(reference: Option<&str>) -> Option<Question> {
    #[derive(Deserialize)]
    struct Ref {
        #[serde(rename = "type")]
        kind: String,
        name: Option<String>,
        uri: Option<String>,
    }
    let r: Ref = serde_json::from_str(reference?).ok()?;
    match r.kind.as_str() {
        "ref/prompt" => Some(Question::GetPrompt(r.name?, None)),
        "ref/resource" => Some(Question::ReadResource(r.uri?)),
        _ => None,
    }
}

/// What a list entry is checked by.
#[derive(Deserialize)]
struct Entry {
    name: Option<String>,
    uri: Option<String>,
    #[serde(rename = "uriTemplate")]
    uri_template: Option<String>,
}

fn caller<'a>(principal: &'a Principal, grant: &'a Grant) -> Caller<'a> {
    Caller {
        id: principal.user_id(),
        claims: grant.claims.as_deref(),
    }
}

impl Decisions {
    /// Whether `policy` denies `msg` of `principal` (SPEC section 10).
    pub(super) fn denies(
        &mut self,
        policy: Option<&std::sync::Arc<Policy>>,
        (principal, grant): (&Principal, &Grant),
        msg: &Checked,
    ) -> bool {
        let Some(policy) = policy else {
            return false;
        };
        let Some(question) = Question::of(msg, policy.reads_arguments()) else {
            return false;
        };
        !self.allowed(policy, (principal, grant), &question)
    }

    /// The policy's decision on `question` of `principal` (remembered, unless its
    /// arguments are long).
    fn allowed(
        &mut self,
        policy: &std::sync::Arc<Policy>,
        (principal, grant): (&Principal, &Grant),
        question: &Question,
    ) -> bool {
        let decide = || policy.allows(caller(principal, grant), question.ask());
        let arguments = question.arguments();
        if arguments.len() > MAX_REMEMBERED_ARGUMENTS {
            return decide();
        }
        let claims = match (&grant.claims, policy.reads_claims()) {
            (Some(claims), true) => serde_json::to_string(claims).unwrap_or_default(),
            _ => String::new(),
        };
        let (action, target) = question.target();
        let key = (
            principal.clone(),
            claims,
            action,
            target.to_owned(),
            arguments.to_owned(),
        );
        self.get(policy, key, decide)
    }
}

/// Whether `msg` is a list whose result is filtered for its session: with a policy, every
/// list; with `--tool-scope`, `tools/list`.
pub(super) fn filters(settings: &Settings, msg: &Checked) -> bool {
    if msg.kind != Kind::Request || !LISTS.contains(&msg.method.as_str()) {
        return false;
    }
    let scoped = (settings.oauth.as_ref()).is_some_and(|o| !o.tool_scopes.is_empty());
    settings.policy.is_some() || (scoped && msg.method == "tools/list")
}

impl Decisions {
    /// A marked list result for `caller` (`None`: its session is gone), keeping only the
    /// entries its principal may use, each checked as the matching call without arguments
    /// (and a tool also by its scopes); everything else, `nextCursor` included, is kept
    /// byte for byte. Returns the message, where its id now is, and how many entries it
    /// hides.
    pub(super) fn filter_list(
        &mut self,
        settings: &Settings,
        caller: Option<(&Principal, &Grant)>,
        message: Vec<u8>,
        id: Range<usize>,
    ) -> (Vec<u8>, Range<usize>, u64) {
        let Some((principal, grant)) = caller else {
            return (message, id, 0);
        };
        let (policy, oauth) = (&settings.policy, &settings.oauth);
        let mut keep = |member: &str, entry: &Entry| -> bool {
            let question = match (member, entry) {
                ("tools", Entry { name: Some(n), .. }) => {
                    let scoped = oauth.as_ref().is_none_or(|o| {
                        (o.needed_scopes(Some(n)).iter()).all(|s| grant.scopes.contains(s))
                    });
                    if !scoped {
                        return false;
                    }
                    Question::CallTool(n.clone(), None)
                }
                ("prompts", Entry { name: Some(n), .. }) => Question::GetPrompt(n.clone(), None),
                ("resources", Entry { uri: Some(u), .. }) => Question::ReadResource(u.clone()),
                (
                    "resourceTemplates",
                    Entry {
                        uri_template: Some(u),
                        ..
                    },
                ) => Question::ReadResource(u.clone()),
                _ => return false,
            };
            let Some(policy) = policy else {
                return true;
            };
            // Checked as the matching call with no arguments.
            self.allowed(policy, (principal, grant), &question)
        };
        let filtered = filtered_result(&message, &mut keep);
        let raw_id = String::from_utf8_lossy(&message[id.clone()]).into_owned();
        let (result, hidden) = match filtered {
            Ok(Some((result, hidden))) => {
                (router::response_line(&raw_id, "result", &result), hidden)
            }
            // An error answer has no entries to hide.
            Ok(None) => return (message, id, 0),
            // Whatever cannot be filtered is not passed on.
            Err(()) => {
                let error = r#"{"code":-32603,"message":"list result could not be filtered"}"#;
                (router::response_line(&raw_id, "error", error), 0)
            }
        };
        (
            result,
            RESPONSE_ID_AT..RESPONSE_ID_AT + raw_id.len(),
            hidden,
        )
    }
}

/// A list result with each entries member filtered, and how many entries were left out;
/// `Ok(None)` for an error answer. A result that is not an object, entries that are not
/// an array, or a member given twice is `Err`.
fn filtered_result(
    message: &[u8],
    mut keep: impl FnMut(&str, &Entry) -> bool,
) -> Result<Option<(String, u64)>, ()> {
    let text = std::str::from_utf8(message).map_err(|_| ())?;
    let Some(result) = message::parse_backend(text).map_err(|_| ())?.result else {
        return Ok(None);
    };
    let Members(members) = serde_json::from_str(result.get()).map_err(|_| ())?;
    let mut out = String::with_capacity(result.get().len());
    let (mut hidden, mut seen) = (0, std::collections::HashSet::new());
    out.push('{');
    for (i, (name, value)) in members.iter().enumerate() {
        if !seen.insert(name) {
            return Err(());
        }
        if i > 0 {
            out.push(',');
        }
        out.push_str(&serde_json::to_string(name).map_err(|_| ())?);
        out.push(':');
        if !ENTRIES.contains(&name.as_ref()) {
            out.push_str(value.get());
            continue;
        }
        let entries: Vec<&RawValue> = serde_json::from_str(value.get()).map_err(|_| ())?;
        out.push('[');
        let mut first = true;
        for entry in entries {
            let parsed: Option<Entry> = serde_json::from_str(entry.get()).ok();
            if !parsed.is_some_and(|p| keep(name, &p)) {
                hidden += 1;
                continue;
            }
            if !first {
                out.push(',');
            }
            first = false;
            out.push_str(entry.get());
        }
        out.push(']');
    }
    out.push('}');
    Ok(Some((out, hidden)))
}

/// An object's members in order, values as raw text.
struct Members<'a>(Vec<(std::borrow::Cow<'a, str>, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    out.push((key, map.next_value::<&'de RawValue>()?));
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(Visit)
    }
}
