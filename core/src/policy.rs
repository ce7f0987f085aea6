//! SPEC section 10's authorization policy: ToolHive's Cedar file (`--authz-config`, JSON or
//! YAML) and the entities a request becomes, so that a ToolHive policy file runs unchanged.
//!
//! A request is `Client::"<sub>"` (claims as `claim_<name>`) doing `Action::"call_tool"`,
//! `"get_prompt"` or `"read_resource"` to `Tool::"<name>"`, `Prompt::"<name>"` or
//! `Resource::"<uri, sanitised>"` (arguments as `arg_<name>`); claims and arguments are
//! also the context. With a policy the default is deny, and an evaluation error denies.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;

use cedar_policy::{
    Authorizer, Context, Decision, Entities, Entity, EntityId, EntityTypeName, EntityUid, PolicyId,
    PolicySet, Request, RestrictedExpression,
};
use serde::Deserialize;
use serde_json::{Map, Value};

/// Claims and arguments nested deeper than this are left out (as ToolHive does).
const MAX_DEPTH: usize = 10;

/// A request with more arguments than this is denied when a policy reads arguments: its
/// evaluation runs on the hub's thread, and no tool takes so many. So is a request with a
/// number argument Cedar cannot hold (see [`Policy::allows`]).
pub(crate) const MAX_ARGUMENTS: usize = 256;

/// A loaded policy file: its policies and the entities it declares.
pub struct Policy {
    policies: PolicySet,
    entities: Entities,
    authorizer: Authorizer,
    /// Some policy names an argument (`arg_`) or the context: a decision may depend on a
    /// request's arguments.
    reads_arguments: bool,
    /// Some policy names a claim (`claim_`) or the context.
    reads_claims: bool,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("policies", &self.policies.policies().count())
            .finish_non_exhaustive()
    }
}

/// ToolHive's configuration file: `{"version", "type": "cedarv1", "cedar": {...}}`.
#[derive(Deserialize)]
struct File {
    version: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    cedar: Option<CedarSection>,
}

#[derive(Deserialize)]
struct CedarSection {
    #[serde(default)]
    policies: Vec<String>,
    #[serde(default)]
    entities_json: String,
}

/// Who asks: the principal's Cedar id (a JWT's `sub`, a static principal's name,
/// `anonymous`) and a JWT's claims.
#[derive(Debug, Clone, Copy)]
pub struct Caller<'a> {
    /// `Client::"<id>"`.
    pub id: &'a str,
    /// The claims, `claim_<name>` on the principal and in the context.
    pub claims: Option<&'a Map<String, Value>>,
}

/// What a request asks to do, as a policy sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Ask<'a> {
    /// `tools/call` of a tool, with its arguments.
    CallTool(&'a str, Option<&'a Map<String, Value>>),
    /// `prompts/get` of a prompt, with its arguments (and `completion/complete` of one).
    GetPrompt(&'a str, Option<&'a Map<String, Value>>),
    /// `resources/read` of a uri (and subscribing to it, and completing it).
    ReadResource(&'a str),
    /// Any other method: `Action::"<method>"` on `FeatureType::"<method>"`.
    Other(&'a str),
}

impl Policy {
    /// Reads and checks a policy file in full: its syntax (JSON when it starts with `{`,
    /// else YAML), `type`, every policy and `entities_json`.
    pub fn parse(text: &str) -> Result<Policy, String> {
        let file: File = if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| format!("not a valid JSON policy file: {e}"))?
        } else {
            serde_yaml_ng::from_str(text)
                .map_err(|e| format!("not a valid YAML policy file: {e}"))?
        };
        if file.version.as_deref().is_none_or(str::is_empty) {
            return Err("the file names no `version` (ToolHive's is \"1.0\")".into());
        }
        match file.kind.as_deref() {
            Some("cedarv1") => {}
            Some(other) => return Err(format!("unknown type {other:?} (expected \"cedarv1\")")),
            None => return Err("the file names no `type` (expected \"cedarv1\")".into()),
        }
        let cedar = file.cedar.ok_or("a cedarv1 file needs a `cedar` section")?;
        if cedar.policies.is_empty() {
            return Err("`cedar.policies` is empty: nothing would be permitted".into());
        }
        let mut policies = PolicySet::new();
        for (i, text) in cedar.policies.iter().enumerate() {
            let id = PolicyId::new(format!("policy{i}"));
            let policy = cedar_policy::Policy::parse(Some(id), text)
                .map_err(|e| format!("policy {i} ({text:?}): {e}"))?;
            policies
                .add(policy)
                .map_err(|e| format!("policy {i}: {e}"))?;
        }
        let entities = match cedar.entities_json.trim() {
            "" => Entities::empty(),
            json => {
                Entities::from_json_str(json, None).map_err(|e| format!("entities_json: {e}"))?
            }
        };
        // Cedar reads an attribute only by its name, so a policy set whose text never names
        // an argument attribute (nor the context, which holds them all) decides the same
        // whatever the arguments are; likewise for claims. A name may also be spelt in a
        // string (`resource["arg_n"]`, `has "arg_n"`) with escapes (`\u{61}rg_n`): a policy
        // with an escape is taken to read everything.
        let names = |what: &str| cedar.policies.iter().any(|p| p.contains(what));
        let escaped = names("\\");
        Ok(Policy {
            policies,
            entities,
            authorizer: Authorizer::new(),
            reads_arguments: escaped || names("arg_") || names("context"),
            reads_claims: escaped || names("claim_") || names("context"),
        })
    }

    /// Whether a decision may depend on a request's arguments (else they need not be read).
    pub fn reads_arguments(&self) -> bool {
        self.reads_arguments
    }

    /// Whether a decision may depend on the caller's claims.
    pub fn reads_claims(&self) -> bool {
        self.reads_claims
    }

    /// Whether `caller` may do `ask`. Anything that fails to build or evaluate denies, and
    /// so do arguments the policy could not see as the backend will: more than
    /// `MAX_ARGUMENTS`, or a number that is neither a Cedar `Long` nor a `decimal` of four
    /// places (`1e15`, `1001.00001`, `18446744073709551615`), which would otherwise be left
    /// out of the request (it is `arg_<name>_present`).
    pub fn allows(&self, caller: Caller<'_>, ask: Ask<'_>) -> bool {
        self.decide(caller, ask).unwrap_or(false)
    }

    fn decide(&self, caller: Caller<'_>, ask: Ask<'_>) -> Option<bool> {
        let (action, resource) = request_parts(ask);
        let claims = caller.claims.map(|c| prefixed("claim_", c, false));
        let args = match ask {
            Ask::CallTool(_, args) | Ask::GetPrompt(_, args) => args,
            _ => None,
        };
        if args.is_some_and(|a| a.len() > MAX_ARGUMENTS || a.values().any(unrepresentable)) {
            return None;
        }
        let args = args.map(|a| prefixed("arg_", a, true));
        let principal = uid("Client", caller.id)?;
        let action_uid = uid("Action", action)?;
        let resource_uid = uid(resource.kind, resource.id.as_ref())?;
        let operation = [("operation".to_owned(), string(action))];
        // What the policy file says of the principal and the resource (groups, attributes)
        // stays: the request only adds to it. Claims and arguments never replace an
        // attribute the file or the proxy gives.
        let mut resource_attrs = args.clone().unwrap_or_default();
        resource_attrs.extend(resource.attributes);
        let entities = [
            self.merged(principal.clone(), claims.clone().unwrap_or_default()),
            Entity::new(action_uid.clone(), operation.into(), HashSet::new()).ok(),
            self.merged(resource_uid.clone(), resource_attrs),
        ];
        let entities = entities.into_iter().collect::<Option<Vec<_>>>()?;
        let entities = self.entities.clone().upsert_entities(entities, None).ok()?;
        let context = claims
            .into_iter()
            .flatten()
            .chain(args.into_iter().flatten());
        let context = Context::from_pairs(context).ok()?;
        let request = Request::new(principal, action_uid, resource_uid, context, None).ok()?;
        let response = self
            .authorizer
            .is_authorized(&request, &self.policies, &entities);
        // As in ToolHive: an error in any policy denies, whatever the others say.
        let failed = response.diagnostics().errors().next().is_some();
        Some(!failed && response.decision() == Decision::Allow)
    }
}

impl Policy {
    /// Entity `uid` with the request's `attributes` under the parents and attributes the
    /// policy file declares for it (the file's win).
    fn merged(
        &self,
        uid: EntityUid,
        mut attributes: HashMap<String, RestrictedExpression>,
    ) -> Option<Entity> {
        let mut parents = HashSet::new();
        if let Some(declared) = self.entities.get(&uid) {
            let (_, declared_attributes, declared_parents) = declared.clone().into_inner();
            attributes.extend(declared_attributes);
            parents = declared_parents;
        }
        Entity::new(uid, attributes, parents).ok()
    }
}

/// The resource entity a request acts on.
struct Target {
    kind: &'static str,
    id: String,
    attributes: HashMap<String, RestrictedExpression>,
}

/// The action id and the resource entity of `ask`.
fn request_parts(ask: Ask<'_>) -> (&str, Target) {
    let target = |kind, id: &str, name: &str, operation: &str, feature: &str| Target {
        kind,
        id: id.to_owned(),
        attributes: HashMap::from([
            ("name".to_owned(), string(name)),
            ("operation".to_owned(), string(operation)),
            ("feature".to_owned(), string(feature)),
        ]),
    };
    match ask {
        Ask::CallTool(name, _) => ("call_tool", target("Tool", name, name, "call", "tool")),
        Ask::GetPrompt(name, _) => ("get_prompt", target("Prompt", name, name, "get", "prompt")),
        Ask::ReadResource(uri) => {
            let mut t = target("Resource", &resource_id(uri), uri, "read", "resource");
            t.attributes.insert("uri".to_owned(), string(uri));
            ("read_resource", t)
        }
        Ask::Other(method) => (
            method,
            target("FeatureType", method, method, method, method),
        ),
    }
}

/// ToolHive's Cedar id of a resource uri: each of `: / \ ? & = # .` and space becomes `_`.
pub(crate) fn resource_id(uri: &str) -> String {
    uri.chars()
        .map(|c| match c {
            ':' | '/' | '\\' | '?' | '&' | '=' | '#' | '.' | ' ' => '_',
            c => c,
        })
        .collect()
}

fn uid(kind: &str, id: &str) -> Option<EntityUid> {
    let kind = EntityTypeName::from_str(kind).ok()?;
    Some(EntityUid::from_type_name_and_id(kind, EntityId::new(id)))
}

fn string(text: &str) -> RestrictedExpression {
    RestrictedExpression::new_string(text.to_owned())
}

/// `prefix<name>` attributes for each member. Arguments (`flat`) keep strings, booleans and
/// numbers as they are, and note any other value as `prefix<name>_present = true`; claims
/// keep sets and records too.
fn prefixed(
    prefix: &str,
    members: &Map<String, Value>,
    flat: bool,
) -> HashMap<String, RestrictedExpression> {
    let mut out = HashMap::with_capacity(members.len());
    for (name, value) in members {
        let scalar = matches!(value, Value::String(_) | Value::Bool(_))
            || matches!(value, Value::Number(n) if number(n).is_some());
        if flat && !scalar {
            out.insert(
                format!("{prefix}{name}_present"),
                RestrictedExpression::new_bool(true),
            );
        } else if flat && name.ends_with("_present") {
            // A flag is the proxy's word, never a client's: an argument spelt like one is
            // left out, so it can neither set nor unset one.
        } else if let Some(expr) = expression(value, 0) {
            out.insert(format!("{prefix}{name}"), expr);
        }
    }
    out
}

/// A JSON value as Cedar sees it: integers are `Long`, other numbers `decimal` when Cedar's
/// four places hold them exactly; `null`, other numbers and too deep values are left out.
fn expression(value: &Value, depth: usize) -> Option<RestrictedExpression> {
    if depth > MAX_DEPTH {
        return None;
    }
    Some(match value {
        Value::Null => return None,
        Value::Bool(b) => RestrictedExpression::new_bool(*b),
        Value::String(s) => string(s),
        Value::Number(n) => number(n)?,
        Value::Array(items) => RestrictedExpression::new_set(
            items.iter().filter_map(|item| expression(item, depth + 1)),
        ),
        Value::Object(members) => RestrictedExpression::new_record(
            members
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), expression(v, depth + 1)?))),
        )
        .ok()?,
    })
}

/// A number as Cedar holds it: a `Long` when an integer within `i64`, else a `decimal` when
/// four places after the point hold it exactly; `None` for any other.
fn number(n: &serde_json::Number) -> Option<RestrictedExpression> {
    match n.as_i64() {
        Some(i) => Some(RestrictedExpression::new_long(i)),
        None => Some(RestrictedExpression::new_decimal(decimal(n.as_f64()?)?)),
    }
}

/// Whether `value` is a number Cedar cannot hold ([`number`]).
fn unrepresentable(value: &Value) -> bool {
    matches!(value, Value::Number(n) if number(n).is_none())
}

/// `x` as Cedar decimal text, when four places after the point hold it exactly and it is
/// within Cedar's range.
fn decimal(x: f64) -> Option<String> {
    let text = format!("{x:.4}");
    (x.abs() < 9.2e14 && text.parse::<f64>().ok() == Some(x)).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(policies: &[&str]) -> Policy {
        let file = serde_json::json!({
            "version": "1.0", "type": "cedarv1",
            "cedar": {"policies": policies, "entities_json": "[]"}
        });
        Policy::parse(&file.to_string()).unwrap()
    }

    fn claims(json: Value) -> Map<String, Value> {
        json.as_object().unwrap().clone()
    }

    fn anyone(claims: Option<&Map<String, Value>>) -> Caller<'_> {
        Caller {
            id: "user123",
            claims,
        }
    }

    #[test]
    fn toolhive_basic_example_permits_named_features_only() {
        let p = policy(&[
            r#"permit(principal, action == Action::"call_tool", resource == Tool::"weather");"#,
            r#"permit(principal, action == Action::"get_prompt", resource == Prompt::"greeting");"#,
            r#"permit(principal, action == Action::"read_resource", resource == Resource::"data");"#,
        ]);
        assert!(p.allows(anyone(None), Ask::CallTool("weather", None)));
        assert!(!p.allows(anyone(None), Ask::CallTool("calculator", None)));
        assert!(p.allows(anyone(None), Ask::GetPrompt("greeting", None)));
        assert!(p.allows(anyone(None), Ask::ReadResource("data")));
        assert!(!p.allows(anyone(None), Ask::ReadResource("file:///data")));
        assert!(!p.allows(anyone(None), Ask::Other("tasks/list")));
    }

    #[test]
    fn toolhive_role_and_attribute_examples() {
        let p = policy(&[
            r#"permit(principal, action == Action::"call_tool", resource) when { principal.claim_roles.contains("admin") };"#,
            r#"permit(principal, action == Action::"call_tool", resource == Tool::"sensitive_data") when { principal.claim_clearance_level >= 5 && resource.arg_data_level <= principal.claim_clearance_level };"#,
            r#"permit(principal, action == Action::"call_tool", resource == Tool::"calculator") when { resource.arg_operation == "add" || resource.arg_operation == "subtract" };"#,
            r#"permit(principal == Client::"user123", action == Action::"call_tool", resource == Tool::"weather");"#,
        ]);
        let admin = claims(serde_json::json!({"sub": "ann", "roles": ["admin"]}));
        let ann = Caller {
            id: "ann",
            claims: Some(&admin),
        };
        assert!(p.allows(ann, Ask::CallTool("anything", None)));
        // As in ToolHive, a policy that fails to evaluate (a principal without `roles`)
        // denies, whatever the others say.
        let unroled = claims(serde_json::json!({"sub": "bo", "clearance_level": 5}));
        let low = claims(serde_json::json!({"data_level": 3}));
        let bo = Caller {
            id: "bo",
            claims: Some(&unroled),
        };
        assert!(!p.allows(bo, Ask::CallTool("sensitive_data", Some(&low))));
        let cleared = claims(serde_json::json!({"sub": "bo", "clearance_level": 5, "roles": []}));
        let bo = Caller {
            id: "bo",
            claims: Some(&cleared),
        };
        let high = claims(serde_json::json!({"data_level": 7}));
        assert!(p.allows(bo, Ask::CallTool("sensitive_data", Some(&low))));
        assert!(!p.allows(bo, Ask::CallTool("sensitive_data", Some(&high))));
        // No argument: the attribute is missing, an evaluation error, so denied.
        assert!(!p.allows(bo, Ask::CallTool("sensitive_data", None)));
        let add = claims(serde_json::json!({"operation": "add", "a": 1.5, "b": [1]}));
        let mul = claims(serde_json::json!({"operation": "multiply"}));
        assert!(p.allows(bo, Ask::CallTool("calculator", Some(&add))));
        assert!(!p.allows(bo, Ask::CallTool("calculator", Some(&mul))));
        let none = claims(serde_json::json!({"roles": []}));
        assert!(p.allows(anyone(Some(&none)), Ask::CallTool("weather", None)));
        assert!(!p.allows(bo, Ask::CallTool("weather", None)));
    }

    #[test]
    fn context_holds_claims_and_arguments_and_complex_arguments_are_present_flags() {
        let p = policy(&[
            r#"permit(principal, action == Action::"call_tool", resource) when { context.claim_team == "ops" && context.arg_query_present };"#,
            r#"forbid(principal, action, resource) when { context has arg_force && context.arg_force };"#,
        ]);
        let ops = claims(serde_json::json!({"team": "ops"}));
        let who = Caller {
            id: "x",
            claims: Some(&ops),
        };
        let nested = claims(serde_json::json!({"query": {"q": 1}}));
        let forced = claims(serde_json::json!({"query": [1], "force": true}));
        assert!(p.allows(who, Ask::CallTool("search", Some(&nested))));
        assert!(!p.allows(who, Ask::CallTool("search", Some(&forced))));
        assert!(!p.allows(anyone(None), Ask::CallTool("search", Some(&nested))));
    }

    #[test]
    fn resources_are_named_as_toolhive_names_them() {
        assert_eq!(
            resource_id("file:///a b/c.txt?x=1&y#z\\"),
            "file____a_b_c_txt_x_1_y_z_"
        );
        let p = policy(&[
            r#"permit(principal, action == Action::"read_resource", resource == Resource::"file____etc_motd");"#,
            r#"permit(principal, action == Action::"read_resource", resource) when { resource.uri like "docs://*" };"#,
        ]);
        assert!(p.allows(anyone(None), Ask::ReadResource("file:///etc/motd")));
        assert!(p.allows(anyone(None), Ask::ReadResource("docs://guide")));
        assert!(!p.allows(anyone(None), Ask::ReadResource("file:///etc/passwd")));
    }

    #[test]
    fn groups_from_the_file_are_kept() {
        let file = serde_json::json!({
            "version": "1.0", "type": "cedarv1",
            "cedar": {
                "policies": [r#"permit(principal in Group::"admins", action, resource);"#],
                "entities_json": r#"[{"uid": {"type": "Client", "id": "ann"}, "attrs": {}, "parents": [{"type": "Group", "id": "admins"}]}]"#
            }
        });
        let p = Policy::parse(&file.to_string()).unwrap();
        assert!(p.allows(
            Caller {
                id: "ann",
                claims: None
            },
            Ask::Other("tasks/list")
        ));
        assert!(!p.allows(
            Caller {
                id: "bo",
                claims: None
            },
            Ask::Other("tasks/list")
        ));
    }

    #[test]
    fn what_the_file_declares_of_a_request_entity_stays() {
        let entities = serde_json::json!([
            {"uid": {"type": "Tool", "id": "deploy"}, "attrs": {},
             "parents": [{"type": "ToolGroup", "id": "dangerous"}]},
            {"uid": {"type": "Tool", "id": "wipe"}, "attrs": {"risk": "high"}, "parents": []},
            {"uid": {"type": "Client", "id": "ann"}, "attrs": {"claim_team": "ops"}, "parents": []},
        ]);
        let file = serde_json::json!({
            "version": "1.0", "type": "cedarv1",
            "cedar": {
                "policies": [
                    r#"permit(principal, action == Action::"call_tool", resource) when { principal.claim_team == "ops" };"#,
                    r#"forbid(principal, action, resource in ToolGroup::"dangerous");"#,
                    r#"forbid(principal, action, resource) when { resource has risk && resource.risk == "high" };"#,
                ],
                "entities_json": entities.to_string(),
            }
        });
        let p = Policy::parse(&file.to_string()).unwrap();
        // A token's claim does not replace the file's attribute.
        let dev = claims(serde_json::json!({"team": "dev"}));
        let ann = Caller {
            id: "ann",
            claims: Some(&dev),
        };
        assert!(p.allows(ann, Ask::CallTool("status", None)));
        // The tool's group and attributes from the file still apply; an argument named
        // like an attribute changes nothing.
        let ops = claims(serde_json::json!({"team": "ops"}));
        let bo = Caller {
            id: "bo",
            claims: Some(&ops),
        };
        let risk = claims(serde_json::json!({"risk": "low"}));
        assert!(p.allows(bo, Ask::CallTool("status", Some(&risk))));
        assert!(!p.allows(bo, Ask::CallTool("deploy", None)));
        assert!(!p.allows(bo, Ask::CallTool("wipe", None)));
        assert!(!p.allows(bo, Ask::CallTool("wipe", Some(&risk))));
    }

    #[test]
    fn presence_flags_cannot_be_forged_and_argument_floods_are_denied() {
        let p = policy(&[
            r#"permit(principal, action, resource) when { !(resource has arg_q_present) || !resource.arg_q_present };"#,
        ]);
        let unset = claims(serde_json::json!({"q": {"deep": 1}, "q_present": false}));
        let plain = claims(serde_json::json!({"q_present": false}));
        assert!(!p.allows(anyone(None), Ask::CallTool("t", Some(&unset))));
        assert!(p.allows(anyone(None), Ask::CallTool("t", Some(&plain))));
        let set = policy(&[
            r#"permit(principal, action, resource) when { resource has arg_cfg_present };"#,
        ]);
        let forged = claims(serde_json::json!({"cfg_present": true}));
        let real = claims(serde_json::json!({"cfg": [1]}));
        assert!(!set.allows(anyone(None), Ask::CallTool("t", Some(&forged))));
        assert!(set.allows(anyone(None), Ask::CallTool("t", Some(&real))));
        let many: Map<String, Value> = (0..=MAX_ARGUMENTS)
            .map(|i| (format!("a{i}"), Value::from(i)))
            .collect();
        let few: Map<String, Value> = many.clone().into_iter().take(MAX_ARGUMENTS).collect();
        assert!(p.allows(anyone(None), Ask::CallTool("t", Some(&few))));
        assert!(!p.allows(anyone(None), Ask::CallTool("t", Some(&many))));
    }

    #[test]
    fn what_a_policy_reads_is_judged_conservatively() {
        let reads = |text: &str| {
            let p = policy(&[text]);
            (p.reads_arguments(), p.reads_claims())
        };
        assert_eq!(
            reads(r#"permit(principal, action, resource == Tool::"a");"#),
            (false, false)
        );
        assert_eq!(
            reads(r#"permit(principal, action, resource) when { resource.arg_n == 1 };"#),
            (true, false)
        );
        assert_eq!(
            reads(r#"permit(principal, action, resource) when { principal.claim_x == 1 };"#),
            (false, true)
        );
        assert_eq!(
            reads(r#"permit(principal, action, resource) when { context has x };"#),
            (true, true)
        );
        // An attribute spelt with an escape is still read.
        let escaped = r#"permit(principal, action, resource) when { resource has "\u{61}rg_n" && resource["\u{61}rg_n"] == 1 };"#;
        assert_eq!(reads(escaped), (true, true));
        let p = policy(&[escaped]);
        let one = claims(serde_json::json!({"n": 1}));
        let two = claims(serde_json::json!({"n": 2}));
        assert!(p.allows(anyone(None), Ask::CallTool("t", Some(&one))));
        assert!(!p.allows(anyone(None), Ask::CallTool("t", Some(&two))));
    }

    #[test]
    fn yaml_files_read_like_json() {
        let yaml = "version: '1.0'\ntype: cedarv1\ncedar:\n  policies:\n    - 'permit(principal, action == Action::\"call_tool\", resource == Tool::\"weather\");'\n  entities_json: '[]'\n";
        let p = Policy::parse(yaml).unwrap();
        assert!(p.allows(anyone(None), Ask::CallTool("weather", None)));
        assert!(!p.allows(anyone(None), Ask::CallTool("other", None)));
    }

    #[test]
    fn bad_files_say_why() {
        let bad = |text: &str| Policy::parse(text).unwrap_err();
        assert!(bad("{").contains("JSON"));
        assert!(bad(r#"{"version":"1.0","type":"opa","cedar":{"policies":["permit(principal,action,resource);"]}}"#).contains("unknown type"));
        assert!(
            bad(r#"{"version":"1.0","type":"cedarv1","cedar":{"policies":[]}}"#).contains("empty")
        );
        assert!(bad(
            r#"{"version":"1.0","type":"cedarv1","cedar":{"policies":["permit(principal,"]}}"#
        )
        .contains("policy 0"));
        assert!(bad(r#"{"version":"1.0","type":"cedarv1","cedar":{"policies":["permit(principal,action,resource);"],"entities_json":"[{"}}"#).contains("entities_json"));
        assert!(bad("version: [").contains("YAML"));
    }

    #[test]
    fn numbers_cedar_cannot_hold_deny_instead_of_vanishing() {
        let p = policy(&[
            r#"permit(principal, action == Action::"call_tool", resource);"#,
            r#"forbid(principal, action == Action::"call_tool", resource) when { resource has arg_amount && resource.arg_amount > 1000 };"#,
        ]);
        let call = |amount: &str| {
            let args: Map<String, Value> =
                serde_json::from_str(&format!(r#"{{"amount":{amount},"note":"x"}}"#)).unwrap();
            p.allows(anyone(None), Ask::CallTool("pay", Some(&args)))
        };
        // Ordinary integers are evaluated as before, both ways.
        for (amount, allowed) in [
            ("0", true),
            ("-7", true),
            ("1000", true),
            ("1001", false),
            ("1000000000000000", false),
            ("9223372036854775807", false),
        ] {
            assert_eq!(call(amount), allowed, "{amount}");
        }
        // Numbers Cedar cannot hold were left out (`has` was false: allowed); now denied.
        for huge in [
            "1e15",
            "1001.00001",
            "18446744073709551615",
            "-9223372036854775809",
        ] {
            assert!(!call(huge), "{huge}");
        }
        // An exact decimal is still a decimal (compared with a Long: an error, so denied as
        // before), and one that needs no policy on numbers passes.
        assert!(!call("1.5"));
        let lenient = policy(&[
            r#"permit(principal, action, resource) when { resource has arg_amount_present };"#,
        ]);
        let args: Map<String, Value> = serde_json::from_str(r#"{"amount":1e15}"#).unwrap();
        // Denied although the flag would permit: the policy cannot see the number.
        assert!(!lenient.allows(anyone(None), Ask::CallTool("pay", Some(&args))));
        assert!(prefixed("arg_", &args, true).contains_key("arg_amount_present"));
        // A policy that reads no argument is never given them (the hub's `reads_arguments`),
        // and arguments it is not given decide nothing.
        assert!(lenient.reads_arguments());
        assert!(p.allows(anyone(None), Ask::CallTool("pay", None)));
    }

    #[test]
    fn numbers_become_longs_or_exact_decimals() {
        assert_eq!(decimal(1.5).as_deref(), Some("1.5000"));
        assert_eq!(decimal(0.12345), None);
        assert_eq!(decimal(1e300), None);
        let p = policy(&[
            r#"permit(principal, action, resource) when { resource.arg_n == 3 && resource.arg_x.lessThan(decimal("2.0")) };"#,
        ]);
        let ok = claims(serde_json::json!({"n": 3, "x": 1.25}));
        let far = claims(serde_json::json!({"n": 3, "x": 0.123456}));
        assert!(p.allows(anyone(None), Ask::CallTool("t", Some(&ok))));
        assert!(!p.allows(anyone(None), Ask::CallTool("t", Some(&far))));
    }
}
