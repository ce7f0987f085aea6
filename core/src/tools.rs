//! The tools an operator shows (SPEC section 16): ToolHive's `--tools` allowlist and
//! `--tools-override` file, so an operator's existing configuration carries over. Every
//! operator setting that names a tool (the policy, scopes, rate limits) speaks the
//! backend's name; clients see and call the shown names. A call of any name that is not
//! exactly a shown name never reaches the backend.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::message::{self, Checked, Kind};

/// What ToolHive's override file says of one backend tool.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Override {
    /// The name clients see instead of the backend's.
    pub name: Option<String>,
    /// The description clients see instead of the backend's.
    pub description: Option<String>,
}

/// The shown-name map: which backend tools are shown, and under which names.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolView {
    /// `--tools`: the shown names allowed (`None`: every tool).
    allowed: Option<BTreeSet<String>>,
    /// Backend name → its override.
    overrides: BTreeMap<String, Override>,
    /// Shown name → the backend tool renamed to it.
    renamed_to: BTreeMap<String, String>,
}

/// What a `tools/call` names, as the view sees it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Call<'a> {
    /// A shown name: the backend's name for it.
    Shown(&'a str),
    /// No shown name (a renamed tool's backend name, one outside `--tools`, a variant).
    Unknown,
}

impl ToolView {
    /// A view of `--tools` names and ToolHive's override file `overrides` (its text), each
    /// checked: an entry with neither `name` nor `description`, or two backend tools
    /// given one shown name, is refused with the reason. `None` when neither is given.
    pub fn new(tools: &[String], overrides: Option<&str>) -> Result<Option<ToolView>, String> {
        if tools.is_empty() && overrides.is_none() {
            return Ok(None);
        }
        let overrides = match overrides {
            Some(text) => parse_overrides(text)?,
            None => BTreeMap::new(),
        };
        let mut renamed_to = BTreeMap::new();
        for (backend, o) in &overrides {
            let Some(shown) = &o.name else { continue };
            if let Some(other) = renamed_to.insert(shown.clone(), backend.clone()) {
                return Err(format!(
                    "tools {other:?} and {backend:?} are both shown as {shown:?}"
                ));
            }
        }
        let allowed = (!tools.is_empty()).then(|| tools.iter().cloned().collect());
        Ok(Some(ToolView {
            allowed,
            overrides,
            renamed_to,
        }))
    }

    /// The name backend tool `backend` is shown as, if it is shown: its override's name,
    /// else its own unless another tool is renamed to it (the renamed one shadows it),
    /// and only a name `--tools` allows.
    pub(crate) fn shown<'a>(&'a self, backend: &'a str) -> Option<&'a str> {
        let shown = match self.overrides.get(backend).and_then(|o| o.name.as_deref()) {
            Some(name) => name,
            None if self.renamed_to.contains_key(backend) => return None,
            None => backend,
        };
        let allowed = self.allowed.as_ref().is_none_or(|a| a.contains(shown));
        allowed.then_some(shown)
    }

    /// The names in `--tools` and the override file that match no tool of `backend`'s list.
    pub(crate) fn unmatched(&self, backend: &BTreeSet<String>) -> Vec<String> {
        let shown: BTreeSet<&str> = backend.iter().filter_map(|b| self.shown(b)).collect();
        let keys = (self.overrides.keys()).filter(|k| !backend.contains(*k));
        let allowed = (self.allowed.iter().flatten()).filter(|a| !shown.contains(a.as_str()));
        keys.chain(allowed).cloned().collect()
    }

    /// What a call of `name` reaches: the backend tool shown under exactly that name, one
    /// of `backend`'s tools when the backend's own list has been read. Until it is, a
    /// variant of a name the view speaks of is refused: at a backend that ignores case or
    /// spaces it might reach a tool the view hides.
    pub(crate) fn call_of<'a>(
        &'a self,
        name: &'a str,
        backend: Option<&BTreeSet<String>>,
    ) -> Call<'a> {
        match (self.call(name), backend) {
            (Call::Shown(tool), Some(b)) if !b.contains(tool) => Call::Unknown,
            (Call::Shown(_), None) if self.varies_a_named_tool(name) => Call::Unknown,
            (call, _) => call,
        }
    }

    /// Whether `name` is none of the names the view speaks of (shown names, renamed tools'
    /// backend names, shadowed names) but one of them in another case or with spaces
    /// around it.
    fn varies_a_named_tool(&self, name: &str) -> bool {
        let named = || {
            (self.renamed_to.keys())
                .chain(self.overrides.keys())
                .chain(self.allowed.iter().flatten())
        };
        !named().any(|n| n == name) && named().any(|n| same_but_case(n.trim(), name.trim()))
    }

    /// What a call of `name` reaches: the backend tool shown under exactly that name.
    pub(crate) fn call<'a>(&'a self, name: &'a str) -> Call<'a> {
        let backend = match self.renamed_to.get(name) {
            Some(backend) => backend.as_str(),
            // A case variant of a renamed tool's own name (ASCII or not) might reach it at
            // a backend that ignores case: not a shown name.
            None if (self.overrides.iter())
                .any(|(b, o)| o.name.is_some() && same_but_case(b, name)) =>
            {
                return Call::Unknown
            }
            None => name,
        };
        match self.shown(backend) == Some(name) {
            true => Call::Shown(backend),
            false => Call::Unknown,
        }
    }

    /// The `--tools` names (for the test kit, which builds a view flag by flag).
    pub fn allowed(&self) -> Vec<String> {
        self.allowed.iter().flatten().cloned().collect()
    }

    /// The override file this view was read from, written back (for the test kit).
    pub fn override_text(&self) -> Option<String> {
        if self.overrides.is_empty() {
            return None;
        }
        let entries = (self.overrides.iter()).map(|(backend, o)| {
            let mut entry = serde_json::Map::new();
            if let Some(name) = &o.name {
                entry.insert("name".into(), Value::from(name.as_str()));
            }
            if let Some(description) = &o.description {
                entry.insert("description".into(), Value::from(description.as_str()));
            }
            (backend.clone(), Value::Object(entry))
        });
        let entries: serde_json::Map<String, Value> = entries.collect();
        Some(serde_json::json!({ "toolsOverride": entries }).to_string())
    }

    /// The backend tools a shown tool shadows (its shown name is theirs), for the warning.
    pub fn shadowed(&self) -> Vec<(&str, &str)> {
        (self.renamed_to.iter())
            .filter(|(shown, _)| self.overrides.get(*shown).is_none_or(|o| o.name.is_none()))
            .map(|(shown, backend)| (backend.as_str(), shown.as_str()))
            .collect()
    }

    /// A `tools/list` result (its JSON text) as clients see it: each tool renamed (`name`,
    /// `description`) and only shown ones kept, every other field of each tool and of the
    /// result as the backend wrote it. `None` when it holds no `tools` array.
    pub(crate) fn list(&self, result: &str) -> Option<String> {
        let members = message::members(result)?;
        let mut out = String::with_capacity(result.len());
        out.push('{');
        for (key, value) in &members {
            message::push_key(&mut out, key);
            match &**key {
                "tools" => out.push_str(&self.tools(value)?),
                _ => out.push_str(value),
            }
        }
        out.push('}');
        Some(out)
    }

    /// The `tools` array of a list, shown.
    fn tools(&self, array: &str) -> Option<String> {
        let entries: Vec<&serde_json::value::RawValue> = serde_json::from_str(array).ok()?;
        let mut shown = Vec::with_capacity(entries.len());
        for entry in entries {
            let Ok(Value::Object(mut tool)) = serde_json::from_str::<Value>(entry.get()) else {
                continue;
            };
            let Some(backend) = tool.get("name").and_then(Value::as_str) else {
                continue;
            };
            let Some(name) = self.shown(backend) else {
                continue;
            };
            let o = self.overrides.get(backend).cloned().unwrap_or_default();
            if o.name.is_none() && o.description.is_none() {
                shown.push(entry.get().to_owned());
                continue;
            }
            tool.insert("name".into(), Value::from(name));
            if let Some(description) = o.description {
                tool.insert("description".into(), Value::from(description));
            }
            shown.push(Value::Object(tool).to_string());
        }
        Some(format!("[{}]", shown.join(",")))
    }
}

/// The proxy's answer to a call of a tool that is not shown: what a server answers for a
/// tool it does not have (SPEC section 16).
pub(crate) fn unknown_tool(msg: &Checked) -> Vec<u8> {
    let name = msg.tool.as_deref().unwrap_or_default();
    msg.error(-32602, &format!("Unknown tool: {name}"))
}

/// Whether `msg` is a `tools/list` whose result the operator's tool view (if any) changes.
pub(crate) fn shows_list(view: Option<&ToolView>, msg: &Checked) -> bool {
    view.is_some() && msg.kind == Kind::Request && msg.method == "tools/list"
}

/// ToolHive's `--tools-override` JSON: `{"toolsOverride": {"<backend name>": {"name":
/// "<shown name>", "description": "<text>"}}}`.
fn parse_overrides(text: &str) -> Result<BTreeMap<String, Override>, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let Some(entries) = value.get("toolsOverride").and_then(Value::as_object) else {
        return Err("no \"toolsOverride\" object".into());
    };
    let mut overrides = BTreeMap::new();
    for (backend, entry) in entries {
        let text = |key: &str| match entry.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
            Some(_) => Err(format!(
                "tool {backend:?}: {key:?} must be a non-empty string"
            )),
        };
        let (name, description) = (text("name")?, text("description")?);
        if name.is_none() && description.is_none() {
            return Err(format!(
                "tool {backend:?}: an override needs a \"name\" or a \"description\""
            ));
        }
        overrides.insert(backend.clone(), Override { name, description });
    }
    Ok(overrides)
}

/// Whether `a` and `b` differ at most by case, in ASCII or beyond it.
fn same_but_case(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
        || (!a.is_ascii() || !b.is_ascii()) && a.to_lowercase() == b.to_lowercase()
}

/// The backend's own tool names, read by the proxy for the view (SPEC section 16): after
/// each handshake, each `tools/list_changed` of the backend and each new view, page by page.
/// Each reason to read starts a read afresh; a page answering an older read's request is
/// ignored, so that no list from before a change is taken as the backend's.
#[derive(Debug, Default)]
pub(crate) struct BackendTools {
    known: Option<BTreeSet<String>>,
    reading: Option<Reading>,
}

/// A read under way: the names of its pages so far, and the request its next page answers.
#[derive(Debug, Default)]
struct Reading {
    names: BTreeSet<String>,
    pages: usize,
    /// The number of the proxy's request for the next page (`None`: not asked yet).
    awaiting: Option<u64>,
}

/// Pages one read takes at most: a backend that keeps answering with a cursor would
/// otherwise be read for ever. Past it, the names read so far are the backend's.
pub(crate) const MAX_READ_PAGES: usize = 100;

/// What a page of the proxy's read did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Page {
    /// It answers no request of the read under way (one from before a change): ignored.
    Stale,
    /// An error, or no result: the read stops.
    Failed,
    /// Read on, after this cursor.
    Next(String),
    /// The list is whole.
    Whole,
    /// The list was cut at [`MAX_READ_PAGES`]: the names read so far are kept.
    Cut,
}

impl BackendTools {
    /// The backend's tools, once a whole list was read (since the last change).
    pub(crate) fn known(&self) -> Option<&BTreeSet<String>> {
        self.known.as_ref()
    }

    /// The backend's list may have changed: it is read again from its first page, and any
    /// read under way is left (its pages are ignored).
    pub(crate) fn changed(&mut self) {
        self.known = None;
        self.reading = Some(Reading::default());
    }

    /// The request for the read's next page went out, numbered `request`.
    pub(crate) fn asked(&mut self, request: u64) {
        if let Some(reading) = self.reading.as_mut() {
            reading.awaiting = Some(request);
        }
    }

    /// Neither known nor being read: a read's request could not be queued.
    pub(crate) fn unread(&self) -> bool {
        self.known.is_none() && self.reading.is_none()
    }

    /// The read under way stopped before the list was whole (its request was not queued).
    pub(crate) fn abandon(&mut self) {
        self.reading = None;
    }

    /// The backend exited: nothing is known, nothing is being read.
    pub(crate) fn forget(&mut self) {
        (self.known, self.reading) = (None, None);
    }

    /// The answer to the proxy's request `request` for a page, its result as read
    /// (`None`: an error, or not JSON).
    pub(crate) fn page(&mut self, request: u64, result: Option<&Value>) -> Page {
        let Some(reading) = (self.reading.as_mut()).filter(|r| r.awaiting == Some(request)) else {
            return Page::Stale;
        };
        let Some(value) = result else {
            self.reading = None;
            return Page::Failed;
        };
        let tools = value.get("tools").and_then(Value::as_array);
        let names = tools
            .into_iter()
            .flatten()
            .filter_map(|t| t.get("name")?.as_str());
        reading.names.extend(names.map(str::to_owned));
        (reading.pages, reading.awaiting) = (reading.pages + 1, None);
        let page = match value.get("nextCursor").and_then(Value::as_str) {
            Some(cursor) if reading.pages < MAX_READ_PAGES => return Page::Next(cursor.into()),
            Some(_) => Page::Cut,
            None => Page::Whole,
        };
        self.known = self.reading.take().map(|r| r.names);
        page
    }
}

impl Checked {
    /// A `tools/call` through `view` (SPEC section 16), `backend` the backend's own tools
    /// when read: `Ok(None)` when it is no call or names its backend tool already;
    /// `Ok(Some(edited))` with `params.name` rewritten to the backend's name; `Err(())` for
    /// a name that is not exactly a shown name.
    pub(crate) fn shown_call(
        &self,
        view: &ToolView,
        backend: Option<&BTreeSet<String>>,
    ) -> Result<Option<Checked>, ()> {
        if self.method != "tools/call" || self.kind == Kind::Response {
            return Ok(None);
        }
        let Some(name) = self.tool.as_deref() else {
            return Err(());
        };
        let Call::Shown(backend) = view.call_of(name, backend) else {
            return Err(());
        };
        if backend == name {
            return Ok(None);
        }
        let raw = name_in(&self.text).ok_or(())?;
        // `raw` lies inside the text: its place is where it starts in it.
        let at = raw.as_ptr() as usize - self.text.as_ptr() as usize;
        let value = Value::from(backend).to_string();
        let text = [&self.text[..at], &value, &self.text[at + raw.len()..]].concat();
        self.edited(text).map(Some).map_err(|_| ())
    }
}

/// The raw text of `params.name` in message `text`.
fn name_in(text: &str) -> Option<&str> {
    let (_, params) = message::members(text)?
        .into_iter()
        .find(|(k, _)| k == "params")?;
    let (_, name) = message::members(params)?
        .into_iter()
        .find(|(k, _)| k == "name")?;
    Some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(text: &str) -> Value {
        serde_json::from_str(text).expect("JSON")
    }

    fn view(tools: &[&str], overrides: &str) -> ToolView {
        let tools: Vec<String> = tools.iter().map(|t| t.to_string()).collect();
        let overrides = (!overrides.is_empty()).then_some(overrides);
        ToolView::new(&tools, overrides).unwrap().unwrap()
    }

    const ECHO_SLEEP: &str = r#"{"toolsOverride":{"echo":{"name":"sleep","description":"Sleeps."},"sleep":{"name":"nap"}}}"#;

    #[test]
    fn renames_hide_the_backend_names_and_shadow() {
        let v = view(&[], ECHO_SLEEP);
        assert_eq!(v.call("sleep"), Call::Shown("echo"));
        assert_eq!(v.call("nap"), Call::Shown("sleep"));
        assert_eq!(v.call("echo"), Call::Unknown);
        assert_eq!(v.call("other"), Call::Shown("other"));
        assert_eq!(v.call("Sleep"), Call::Unknown);
        // A renamed tool's own name in another case, beyond ASCII too.
        let v = view(&[], r#"{"toolsOverride":{"größe":{"name":"size"}}}"#);
        assert_eq!(v.call("size"), Call::Shown("größe"));
        // (ß as SS is case folding, not lowercase: the backend list's check refuses it.)
        assert_eq!(v.call("GRÖSSE"), Call::Shown("GRÖSSE"));
        assert_eq!(v.call("GRÖßE"), Call::Unknown);
        assert_eq!(v.call("Größe"), Call::Unknown);
        // echo -> sleep alone shadows the backend's own sleep.
        let v = view(&[], r#"{"toolsOverride":{"echo":{"name":"sleep"}}}"#);
        assert_eq!(v.call("sleep"), Call::Shown("echo"));
        assert_eq!(v.shown("sleep"), None);
        assert_eq!(v.shadowed(), [("echo", "sleep")]);
    }

    #[test]
    fn tools_allows_shown_names_only() {
        let v = view(&["sleep", "add"], ECHO_SLEEP);
        assert_eq!(v.call("sleep"), Call::Shown("echo"));
        assert_eq!(v.call("add"), Call::Shown("add"));
        assert_eq!(v.call("nap"), Call::Unknown);
        assert_eq!(v.call("echo"), Call::Unknown);
        assert_eq!(v.call("other"), Call::Unknown);
    }

    #[test]
    fn a_list_is_renamed_then_filtered_every_other_field_kept() {
        let v = view(&["sleep", "add"], ECHO_SLEEP);
        let result = r#"{"tools":[{"name":"echo","description":"Echoes.","inputSchema":{"type":"object"}},{"name":"sleep"},{"name":"add","annotations":{"x":1}},{"name":"secret"}],"nextCursor":"c","_meta":{"k":1}}"#;
        let listed: Value = serde_json::from_str(&v.list(result).unwrap()).unwrap();
        assert_eq!(
            listed,
            serde_json::json!({"tools":[
                {"name":"sleep","description":"Sleeps.","inputSchema":{"type":"object"}},
                {"name":"add","annotations":{"x":1}}],
                "nextCursor":"c","_meta":{"k":1}})
        );
        assert!(v.list(r#"{"tools":3}"#).is_none());
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        let bad = |text: &str| ToolView::new(&[], Some(text)).unwrap_err();
        assert!(bad("{").contains("not JSON"));
        assert!(bad("{}").contains("toolsOverride"));
        assert!(bad(r#"{"toolsOverride":{"a":{}}}"#).contains("\"name\" or a \"description\""));
        let two = r#"{"toolsOverride":{"a":{"name":"x"},"b":{"name":"x"}}}"#;
        assert!(bad(two).contains("both shown as \"x\""));
        assert_eq!(ToolView::new(&[], None), Ok(None));
    }

    #[test]
    fn a_call_is_rewritten_to_the_backend_name() {
        let v = view(&[], ECHO_SLEEP);
        let call = |name: &str| {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":{},"arguments":{{"name":"keep"}}}}}}"#,
                Value::from(name)
            );
            Checked::admit(body.into_bytes()).unwrap()
        };
        let edited = call("sleep").shown_call(&v, None).unwrap().unwrap();
        assert_eq!(edited.tool.as_deref(), Some("echo"));
        assert!(edited.text.contains(r#""arguments":{"name":"keep"}"#));
        assert!(call("other").shown_call(&v, None).unwrap().is_none());
        assert!(call("echo").shown_call(&v, None).is_err());
        // Until the backend's own list is read, variants of the names the view speaks of.
        for variant in ["SLEEP", "sleep ", " Nap", "ECHO"] {
            assert!(call(variant).shown_call(&v, None).is_err(), "{variant}");
        }
        // Once the backend's own list is read, a name it lacks is no shown name.
        let backend: BTreeSet<String> = ["echo", "sleep"].map(String::from).into();
        assert!(call("other").shown_call(&v, Some(&backend)).is_err());
        assert!(call("nap")
            .shown_call(&v, Some(&backend))
            .unwrap()
            .is_some());
        assert_eq!(v.unmatched(&backend), Vec::<String>::new());
        let lonely: BTreeSet<String> = ["sleep"].map(String::from).into();
        assert_eq!(v.unmatched(&lonely), ["echo"]);
        let mut tools = BackendTools::default();
        tools.changed();
        tools.asked(1);
        assert_eq!(
            tools.page(
                1,
                Some(&json(r#"{"tools":[{"name":"a"}],"nextCursor":"c"}"#))
            ),
            Page::Next("c".into())
        );
        tools.asked(2);
        assert_eq!(
            tools.page(2, Some(&json(r#"{"tools":[{"name":"b"}]}"#))),
            Page::Whole
        );
        assert_eq!(tools.known(), Some(&["a", "b"].map(String::from).into()));
    }

    #[test]
    fn a_read_is_bounded_and_a_change_starts_it_afresh() {
        let mut tools = BackendTools::default();
        tools.changed();
        let endless = r#"{"tools":[{"name":"a"}],"nextCursor":"again"}"#;
        for request in 1..MAX_READ_PAGES as u64 {
            tools.asked(request);
            assert_eq!(
                tools.page(request, Some(&json(endless))),
                Page::Next("again".into())
            );
        }
        tools.asked(100);
        assert_eq!(tools.page(100, Some(&json(endless))), Page::Cut);
        assert_eq!(tools.known(), Some(&["a"].map(String::from).into()));
        // A change while page 1 is out: its answer is an older read's, ignored.
        tools.changed();
        tools.asked(101);
        tools.changed();
        tools.asked(102);
        assert_eq!(tools.page(101, Some(&json(r#"{"tools":[]}"#))), Page::Stale);
        assert_eq!(
            tools.page(102, Some(&json(r#"{"tools":[{"name":"b"}]}"#))),
            Page::Whole
        );
        assert_eq!(tools.known(), Some(&["b"].map(String::from).into()));
        assert_eq!(tools.page(102, Some(&json(r#"{"tools":[]}"#))), Page::Stale);
    }
}
