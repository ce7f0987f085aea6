//! The reference model's 2026-07-28 part (SPEC section 13 with section 6): modern
//! requests with no session, their hang-ups (the cancel), and `subscriptions/listen`
//! streams, beside the sessions of both transports. A modern request is routed under a key
//! minted for it alone; what the hub places for it must be its own answer or progress, on
//! its own stream or JSON body, and a listen stream only ever gets notifications stamped
//! with its own subscription id.

use std::collections::BTreeSet;
use std::time::Duration;

use switchboard_core::http::{Admitted, Endpoint, McpHeaders};
use switchboard_core::hub::Payload;
use switchboard_core::routed_id::SessionId;
use switchboard_core::{Principal, RequestId, StreamId};

use super::{key_of, Accept, Answered, Id, Key, Model, Place, Placed, Role, StepOut};
use super::{MAX_INFLIGHT, MAX_SESSIONS, PRINCIPALS, REQUEST_TIMEOUT};
use crate::driver::Answer;
use crate::fuzz::{at, members, one_line_object, string_of};
use crate::routing::Action;

/// Each list_changed a listen may ask for: its filter key, its method.
const LISTS: [(&str, &str); 3] = [
    ("toolsListChanged", "notifications/tools/list_changed"),
    ("promptsListChanged", "notifications/prompts/list_changed"),
    (
        "resourcesListChanged",
        "notifications/resources/list_changed",
    ),
];

/// The revision's version, in headers and `_meta`.
const MODERN: &str = "2026-07-28";

/// A modern request in flight, under its routing key.
#[derive(Debug, Clone)]
pub(super) struct ModernPending {
    pub(super) principal: Principal,
    request: RequestId,
    /// Its answer stream, or `None` for a JSON answer.
    pub(super) stream: Option<StreamId>,
    raw_id: String,
    key: Key,
    pub(super) token: Option<Key>,
    /// Virtual time it times out at.
    pub(super) deadline: Duration,
}

/// An open listen stream.
#[derive(Debug, Clone)]
pub(super) struct Listening {
    /// It counts as a session of its principal.
    pub(super) principal: Principal,
    /// Its subscription id: the listen request's id as JSON text.
    raw_id: String,
    /// The list_changed methods its acknowledgement promised.
    lists: BTreeSet<String>,
}

/// The `_meta` every modern request must carry.
pub(super) fn meta(extra: &str) -> String {
    format!(
        r#""_meta":{{"io.modelcontextprotocol/protocolVersion":"{MODERN}","io.modelcontextprotocol/clientCapabilities":{{}}{extra}}}"#
    )
}

impl Model {
    fn modern_send(
        &mut self,
        principal: Principal,
        accept: Accept,
        (method, name): (&str, Option<&str>),
        body: &[u8],
    ) -> (RequestId, SessionId) {
        let entropy = self.next_entropy();
        let principal_name = principal.as_str().to_owned();
        let mut fields = vec![("mcp-method".to_owned(), method.to_owned())];
        fields.extend(name.map(|n| ("mcp-name".to_owned(), n.to_owned())));
        let admitted = Admitted {
            mcp: McpHeaders {
                session: None,
                content_type: Some("application/json".into()),
                accept: Some(accept.header().into()),
                protocol_version: Some(MODERN.into()),
                last_event_id: None,
                fields,
            },
            ..Admitted::new(Endpoint::McpPost, principal, "")
        };
        let request =
            (self.driver).send(admitted.into_request(Payload::Bytes(body.to_vec()), || entropy));
        let caller = super::tasks::Owner::Principal(principal_name);
        self.tasks.sender(request, caller);
        (request, SessionId::mint(None, entropy))
    }

    /// A modern `tools/call` (its id and token colliding with the sessions'): 400 for an id
    /// that is none, 429 past `--max-inflight` of its principal, else forwarded once under
    /// its own routing key (nothing reserved in `_meta` reaches the backend), answered as
    /// a stream exactly when it asks for progress or takes no JSON.
    pub(super) fn modern(
        &mut self,
        principal: u8,
        id: &Id,
        accept: Accept,
        progress: Option<&Id>,
    ) -> String {
        if !(self.backend_up && self.ready) {
            // Held until the backend's handshake (the modern_* scenarios cover that).
            return "modern:not-ready".into();
        }
        let principal = Principal::new(PRINCIPALS[usize::from(principal) % PRINCIPALS.len()]);
        let raw_id = self.render_id(id);
        let token_raw = progress.map(|p| self.render_id(p));
        let extra = token_raw
            .as_ref()
            .map(|t| format!(r#","progressToken":{t}"#))
            .unwrap_or_default();
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{raw_id},"method":"tools/call","params":{{"name":"slow",{}}}}}"#,
            meta(&extra)
        );
        self.modern_request(
            principal,
            (raw_id, token_raw),
            accept,
            ("tools/call", Some("slow")),
            body,
            None,
        )
        .0
    }

    /// Sends modern request `body` (its raw id and token as given) as `principal`, and
    /// checks it as [`Model::modern`] says: `refused` is the status the proxy must answer
    /// it with itself (SPEC section 15: 400 for a task not the caller's), unless past
    /// `--max-inflight` (429). Returns the label and the body of a refusal.
    pub(super) fn modern_request(
        &mut self,
        principal: Principal,
        (raw_id, token_raw): (String, Option<String>),
        accept: Accept,
        (method, name): (&str, Option<&str>),
        body: String,
        refused: Option<u16>,
    ) -> (String, Option<Vec<u8>>) {
        let held = (self.modern.values())
            .filter(|p| p.principal == principal)
            .count();
        let (request, key) =
            self.modern_send(principal.clone(), accept, (method, name), body.as_bytes());
        let answer = self.driver.answer(request).cloned();
        let status = match &answer {
            Some(Answer::Response(r)) => Some(r.status),
            _ => None,
        };
        let valid = (key_of(&raw_id).is_some() && raw_id.len() <= 200)
            && token_raw.as_deref().is_none_or(|t| {
                crate::model::utf16_of(t).is_none_or(|u| String::from_utf16(&u).is_ok())
            });
        if let Some(status) = status {
            let out = self.collect(true);
            let counted = (out.actions.iter()).all(|a| matches!(a, Action::Drop { .. }));
            assert!(
                (out.actions.is_empty() || refused.is_some() && counted)
                    && out.placed.is_empty()
                    && out.ends.is_empty(),
                "a refused modern request changed something: {out:?}"
            );
            let busy = held >= MAX_INFLIGHT;
            assert!(
                !valid || (status == 429 && busy) || (!busy && Some(status) == refused),
                "a valid modern request got {status} with {held} in flight"
            );
            let body = match answer {
                Some(Answer::Response(r)) => Some(r.body.to_vec()),
                _ => None,
            };
            return (format!("modern:{status}"), body);
        }
        assert!(valid, "a modern request with id {raw_id} was accepted");
        assert!(
            refused.is_none(),
            "a modern {method} the proxy answers was accepted"
        );
        assert!(held < MAX_INFLIGHT, "past --max-inflight, accepted");
        let key_id = key_of(&raw_id).expect("valid");
        let token = token_raw.as_deref().and_then(key_of);
        let stream = match answer {
            Some(Answer::Stream(stream)) => Some(stream),
            _ => None,
        };
        assert_eq!(
            stream.is_some(),
            accept.sse() && (token.is_some() || !accept.json()),
            "a modern request is a stream exactly when it asks for progress or takes no JSON"
        );
        let now = self.driver.elapsed();
        self.modern.insert(
            key,
            ModernPending {
                principal,
                request,
                stream,
                raw_id,
                key: key_id,
                token,
                deadline: now + REQUEST_TIMEOUT,
            },
        );
        if let Some(stream) = stream {
            self.add_stream(stream, key, Role::Modern);
        }
        let mut out = self.collect(true);
        let answered = self.settle(&mut out);
        assert!(answered.is_empty(), "a forwarded request answered at once");
        assert!(out.ends.is_empty(), "a modern request ended {:?}", out.ends);
        let rewrites = self.check_rewrites(&key, &out.actions, "a modern request");
        assert_eq!(rewrites, 1, "a modern request is forwarded once");
        let line = out.lines.last().expect("forwarded");
        assert!(
            !String::from_utf8_lossy(line).contains("io.modelcontextprotocol/"),
            "a reserved _meta key reached the backend"
        );
        let form = if stream.is_some() { "stream" } else { "json" };
        (format!("modern:{form}"), None)
    }

    /// The client of a modern request hangs up (its stream, or its wait for JSON): the
    /// backend gets `notifications/cancelled` with the routed id, nothing reaches anyone.
    pub(super) fn modern_hang_up(&mut self, pick: u8) -> String {
        let Some(key) = (self.modern.keys())
            .nth(usize::from(pick) % self.modern.len().max(1))
            .copied()
        else {
            return "modern-hangup:none".into();
        };
        let pending = self.modern.remove(&key).expect("picked");
        match pending.stream {
            Some(stream) => {
                self.driver.hang_up(stream);
                self.end_stream(stream);
            }
            None => self.driver.client_left(pending.request),
        }
        let out = self.collect(false);
        assert!(
            out.placed.is_empty() && out.ends.is_empty(),
            "a modern hang-up reached someone: {out:?}"
        );
        assert!(
            (out.actions.iter()).all(|a| matches!(a, Action::Drop { .. })),
            "a modern hang-up: {:?}",
            out.actions
        );
        self.check_cancels(&out.lines, &[(key, pending.raw_id)], "client disconnected");
        let form = if pending.stream.is_some() {
            "stream"
        } else {
            "json"
        };
        format!("modern-hangup:{form}")
    }

    /// `subscriptions/listen` for the list changes: a stream (within the room sessions
    /// take) whose first frame is its acknowledgement under its own subscription id.
    pub(super) fn listen(&mut self, principal: u8, id: &Id) -> String {
        if !(self.backend_up && self.ready) {
            // Held until the backend's handshake, like any modern request.
            return "listen:not-ready".into();
        }
        let principal = Principal::new(PRINCIPALS[usize::from(principal) % PRINCIPALS.len()]);
        let raw_id = self.render_id(id);
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{raw_id},"method":"subscriptions/listen","params":{{"notifications":{{"toolsListChanged":true,"promptsListChanged":true,"resourcesListChanged":true}},{}}}}}"#,
            meta("")
        );
        let room = self.live.len() + self.listens.len() < MAX_SESSIONS;
        let (request, _) = self.modern_send(
            principal.clone(),
            Accept::Sse,
            ("subscriptions/listen", None),
            body.as_bytes(),
        );
        let Some(Answer::Stream(stream)) = self.driver.answer(request).cloned() else {
            let out = self.collect(false);
            assert!(
                out.placed.is_empty() && out.ends.is_empty() && out.lines.is_empty(),
                "a refused listen: {out:?}"
            );
            let valid = key_of(&raw_id).is_some() && raw_id.len() <= 200;
            assert!(!(valid && room && self.backend_up), "a listen refused");
            return "listen:refused".into();
        };
        assert!(room, "a listen past --max-sessions");
        self.listens.insert(
            stream,
            Listening {
                principal: principal.clone(),
                raw_id: raw_id.clone(),
                lists: BTreeSet::new(),
            },
        );
        self.add_stream(stream, SessionId::mint(None, [0; 16]), Role::Listen);
        let mut out = self.collect(false);
        let answered = self.settle(&mut out);
        assert!(answered.is_empty() && out.ends.is_empty(), "{out:?}");
        let acks: Vec<&Placed> = out.placed.iter().collect();
        assert_eq!(acks.len(), 1, "a listen is acknowledged once: {acks:?}");
        let m = one_line_object(&acks[0].message);
        assert_eq!(
            m.get("method").and_then(|v| string_of(v)).as_deref(),
            Some("notifications/subscriptions/acknowledged")
        );
        let honoured = at(&m, &["params", "notifications"])
            .and_then(|v| members(v.get()))
            .expect("an acknowledgement names what it honours");
        let lists = (honoured.iter())
            .filter(|(_, v)| v.get() == "true")
            .filter_map(|(name, _)| LISTS.iter().find(|(n, _)| n == name))
            .map(|(_, method)| (*method).to_owned())
            .collect();
        self.listens.get_mut(&stream).expect("inserted").lists = lists;
        "listen:acknowledged".into()
    }

    /// The client closes a listen stream: nothing more reaches it, nothing else changes.
    pub(super) fn listen_close(&mut self, pick: u8) -> String {
        let Some(stream) = (self.listens.keys())
            .nth(usize::from(pick) % self.listens.len().max(1))
            .copied()
        else {
            return "listen-close:none".into();
        };
        self.listens.remove(&stream);
        self.driver.hang_up(stream);
        self.end_stream(stream);
        let out = self.collect(false);
        assert!(
            out.placed.is_empty() && out.ends.is_empty() && out.lines.is_empty(),
            "closing a listen: {out:?}"
        );
        "listen-close".into()
    }

    /// The modern request waiting for a JSON answer to `request`, by routing key.
    pub(super) fn modern_waiter(&self, request: RequestId) -> Option<SessionId> {
        (self.modern.iter())
            .find(|(_, p)| p.request == request && p.stream.is_none())
            .map(|(key, _)| *key)
    }

    /// SPEC sections 13 and 6 for one message placed on a modern request's stream or JSON
    /// body, or on a listen stream: only its own request's progress (its token restored)
    /// and then its own answer (its id restored; the stream then ends); on a listen
    /// stream only notifications stamped with its own subscription id. `Some` when it
    /// answered its request.
    pub(super) fn settle_modern(&mut self, p: &Placed, out: &mut StepOut) -> Option<Answered> {
        let m = one_line_object(&p.message);
        let method = m.get("method").and_then(|v| string_of(v));
        if let Place::Stream(stream, Role::Listen) = &p.place {
            let listen = self.listens.get(stream).expect("an open listen");
            let Some(method) = method else {
                // Its last frame, as the proxy ends it: a complete result under its id.
                let raw = &listen.raw_id;
                let last = format!(
                    r#"{{"jsonrpc":"2.0","id":{raw},"result":{{"resultType":"complete","_meta":{{"io.modelcontextprotocol/subscriptionId":{raw}}}}}}}"#
                );
                assert_eq!(
                    p.message,
                    last.as_bytes(),
                    "a response on listen {stream:?}"
                );
                self.listens.remove(stream);
                self.expect_end(out, *stream, "the proxy ended its listen");
                return None;
            };
            assert!(
                method == "notifications/subscriptions/acknowledged"
                    || listen.lists.contains(&method),
                "{method} on listen {stream:?}, which was not promised it"
            );
            let id = at(
                &m,
                &["params", "_meta", "io.modelcontextprotocol/subscriptionId"],
            );
            assert_eq!(
                id.map(|v| v.get()),
                Some(listen.raw_id.as_str()),
                "a listen frame under another subscription id"
            );
            return None;
        }
        let pending = self
            .modern
            .get(&p.sid)
            .unwrap_or_else(|| panic!("{:?} for modern request {}, not in flight", p.place, p.sid));
        let stream = match p.place {
            Place::Stream(stream, _) => Some(stream),
            Place::Json(_) => None,
        };
        assert_eq!(stream, pending.stream, "on another modern request's answer");
        if let Some(method) = method {
            assert_eq!(
                method, "notifications/progress",
                "a modern stream's {method}"
            );
            let token = at(&m, &["params", "progressToken"]).and_then(|v| key_of(v.get()));
            assert!(
                stream.is_some() && token.is_some() && token == pending.token,
                "progress under another token on a modern request's answer"
            );
            return None;
        }
        let id = m.get("id").and_then(|v| key_of(v.get()));
        assert_eq!(id.as_ref(), Some(&pending.key), "a modern answer's id");
        let pending = self.modern.remove(&p.sid).expect("found above");
        if let Some(stream) = stream {
            self.expect_end(out, stream, "its modern request was answered");
        }
        Some(Answered {
            sid: p.sid,
            raw_id: pending.raw_id,
            message: p.message.clone(),
        })
    }

    /// The modern request in flight that routed id `id` names (its key `sid`, its id).
    pub(super) fn modern_named(&self, sid: &SessionId, id: &str) -> Option<&ModernPending> {
        let (_, key) = super::routed_key(id)?;
        self.modern.get(sid).filter(|p| p.key == key)
    }

    /// Modern requests whose deadline is at or before `target`.
    pub(super) fn modern_due(&self, target: Duration) -> Vec<(SessionId, String)> {
        (self.modern.iter())
            .filter(|(_, p)| p.deadline <= target)
            .map(|(key, p)| (*key, p.raw_id.clone()))
            .collect()
    }

    /// The listen streams and modern request streams (none is a session's).
    pub(super) fn sessionless(&self) -> BTreeSet<StreamId> {
        (self.streams.iter())
            .filter(|(_, (_, role))| matches!(role, Role::Listen | Role::Modern))
            .map(|(stream, _)| *stream)
            .collect()
    }
}

impl Model {
    /// A backend line reached modern requests only as it should: the one its routed id
    /// names is answered (on its stream or JSON body), the one its routed token names gets
    /// the progress on its stream (which restarts its clock), no other. A label suffix.
    pub(super) fn check_modern_line(
        &mut self,
        line: &str,
        (due, progress): (Option<SessionId>, Option<(SessionId, Option<StreamId>)>),
        places: &[(SessionId, Option<StreamId>)],
        answered: &[Answered],
    ) -> &'static str {
        for (sid, stream) in places {
            let named =
                due == Some(*sid) || (stream.is_some() && progress == Some((*sid, *stream)));
            assert!(
                named,
                "{line} reached modern request {sid}, which it does not name"
            );
        }
        if let Some(sid) = due {
            assert!(
                answered.iter().any(|a| a.sid == sid),
                "{line} did not answer modern request {sid}"
            );
            return ":modern-answer";
        }
        match progress {
            Some((sid, Some(stream))) => {
                assert!(
                    places.contains(&(sid, Some(stream))),
                    "{line}: progress missed modern request {sid}'s stream"
                );
                let now = self.driver.elapsed();
                if let Some(p) = self.modern.get_mut(&sid) {
                    p.deadline = now + REQUEST_TIMEOUT;
                }
                ":modern-progress"
            }
            // Dropped (a JSON answer has no stream), yet progress for the request: its
            // clock restarts all the same (SPEC section 7, Waiting).
            Some((sid, None)) => {
                let now = self.driver.elapsed();
                if let Some(p) = self.modern.get_mut(&sid) {
                    p.deadline = now + REQUEST_TIMEOUT;
                }
                ""
            }
            None => "",
        }
    }
}
