//! A backend line's way out (SPEC section 3, and section 7 for Streamable sessions): the
//! router says where it goes; the hub knows which sessions are live and carries it there.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use super::backend::LineFrom;
use super::delivery::Delivery;
use super::in_flight::{RequestKey, Settlement};
use super::modern::{self, ModernRequests};
use super::resume::StreamKey;
use super::sessions::{Kind, SessionNumber, Sessions};
use super::tasks::{Owner, Tasks};
use super::Hub;
use crate::metrics::DropReason;
use crate::output::{Frame, StreamId};
use crate::routed_id::{Mark, SessionId};
use crate::router::{self, Answer, Routed};
use crate::sse;
use crate::tools::Page;

impl Hub {
    /// Carries out the router's decision on one backend line.
    pub(super) fn dispatch(&mut self, now: Instant, routed: Routed) {
        match routed {
            answer @ Routed::Response { .. } => self.backend_answered(now, answer),
            Routed::TaskStatus { task, message } => {
                let owner = task.and_then(|task| self.tasks.owner_of(now, &task).cloned());
                let delivered = match owner {
                    Some(Owner::Session(sid)) => self.deliver(now, sid, message, Delivery::Update),
                    _ => false,
                };
                if !delivered {
                    let method = "notifications/tasks/status";
                    self.drop_message(DropReason::TaskUnattributed, Some(method));
                }
            }
            Routed::Progress {
                session,
                message,
                token,
            } => {
                if !self.deliver(now, session, message, Delivery::Progress { token }) {
                    self.drop_message(DropReason::SessionGone, Some("notifications/progress"));
                }
            }
            Routed::Updated { uri, message } => self.updated(now, uri.as_deref(), message),
            Routed::ListChanged { method, message } => {
                tools_changed(reader!(self), now, &method);
                self.list_changed(now, &method, &message)
            }
            Routed::ToolsRead { request, result } => {
                tools_page(reader!(self), now, request, result)
            }
            Routed::Answer {
                line,
                reason,
                method,
            } => {
                self.drop_message(reason, Some(&method));
                self.queue_line(now, line, LineFrom::Proxy);
            }
            Routed::Pong { ping } => {
                for request in self.backend.pong(now, ping, &mut self.outputs) {
                    self.respond(now, request, super::exchanges::Answer::Health(true));
                }
            }
            Routed::Initialized {
                answers,
                initialized,
            } => self.initialized(now, answers, initialized),
            Routed::Restored { same, initialized } => self.restored(now, same, initialized),
            Routed::Subscribed {
                subscribe,
                accepted,
            } => (self.listeners).subscribed(now, subscribe, accepted, &mut self.outputs),
            Routed::Consumed => {}
            // A list fetched for the cache: each caller that waited, as if answered alone.
            Routed::Listed { answers } => answers.into_iter().for_each(|a| self.dispatch(now, a)),
            Routed::Dropped { reason, method } => self.drop_message(reason, method.as_deref()),
        }
    }

    /// The backend (or the list cache) answered a client's request: the place the backend
    /// gave it in the backend window is free, a list result is shown only what its caller
    /// may see (SPEC sections 10 and 15), a task it created becomes its creator's, and it is
    /// delivered with its outcome (an error or a success, for the audit log).
    fn backend_answered(&mut self, now: Instant, answer: Routed) {
        let Routed::Response {
            session,
            mut message,
            mut id,
            key,
            mark,
            failed,
            result,
            task,
            cached,
        } = answer
        else {
            return;
        };
        // Answered by the backend: its place in the backend window is free.
        if (key.clone().filter(|_| !cached))
            .is_some_and(|key| self.backend.answered(&(session, key)))
        {
            self.backend.release(now, &mut self.outputs, false);
        }
        // A page of the backend's tool list, as the backend wrote it, before any caller's
        // view of it: the tools' `Mcp-Param-*` headers (SPEC section 13).
        (self.modern).learn_tools(&RequestKey::routed(session), (&message, result.clone()));
        let owner = owner_of((&self.sessions, &self.modern), &session);
        let hidden;
        (message, id, hidden) = match (mark, &owner) {
            (Mark::Filtered, _) => {
                let caller = (self.sessions.caller(&session))
                    .or_else(|| self.modern.caller(&RequestKey::routed(session)));
                (self.decisions).filter_list(&self.settings, caller, message, id)
            }
            (Mark::Tasks, Some(owner)) => tasks_listed(&mut self.tasks, now, owner, message, id),
            _ => (message, id, 0),
        };
        // The operator's tools (SPEC section 16), after the policy judged the backend's names.
        if let (Mark::Filtered, Some(view)) = (mark, &self.settings.tool_view) {
            (message, id) = tools_shown(view, message, id);
        }
        self.metrics.entries_hidden += hidden;
        // A task is its creator's from the moment its result is delivered.
        if let (Some(task), Some(owner)) = (task, owner) {
            self.tasks.created(now, owner, &task);
        }
        let outcome = Some(crate::audit::Outcome::of_failed(failed));
        // A list's result was rewritten for its caller: where it lies is read again.
        let result = result.filter(|_| mark == Mark::Plain);
        let what = Delivery::Response {
            id,
            key,
            outcome,
            result,
        };
        if !self.deliver(now, session, message, what) {
            self.drop_message(DropReason::SessionGone, None);
        }
    }

    /// The backend answered the handshake: each client that waited gets its answer (a
    /// session whose initialize succeeded is initialized), then the proxy's
    /// `notifications/initialized` goes out, if it succeeded.
    fn initialized(&mut self, now: Instant, answers: Vec<Answer>, initialized: Option<Vec<u8>>) {
        for answer in answers {
            if initialized.is_some() {
                self.sessions.initialized(&answer.session);
            }
            let what = Delivery::Response {
                id: answer.id,
                key: answer.key,
                outcome: None,
                result: None,
            };
            self.deliver(now, answer.session, answer.message, what);
        }
        if let Some(line) = initialized {
            self.queue_line(now, line, LineFrom::Proxy);
            read_backend_tools(reader!(self), now);
            // 2026-07-28 requests held for the proxy's own handshake go ahead.
            self.release_waiting(now);
        }
    }

    /// `notifications/resources/updated`: to each live session and listen stream watching
    /// its uri.
    fn updated(&mut self, now: Instant, uri: Option<&str>, message: Vec<u8>) {
        let watchers = uri
            .map(|uri| self.sessions.watchers(uri))
            .unwrap_or_default();
        let listening = uri.map_or(0, |uri| {
            (self.listeners).updated(now, uri, &mut self.outputs)
        });
        if watchers.is_empty() && listening == 0 {
            return self.drop_message(
                DropReason::NoSubscriber,
                Some("notifications/resources/updated"),
            );
        }
        for sid in watchers {
            self.deliver(now, sid, message.clone(), Delivery::Update);
        }
    }

    /// A `list_changed`, to legacy streams and Streamable GET streams in creation order,
    /// then to the listen streams that asked for it; a Streamable session without a GET
    /// stream is not told (never replayed).
    pub(super) fn list_changed(&mut self, now: Instant, method: &str, message: &[u8]) {
        let listening = (self.listeners).list_changed(now, method, &mut self.outputs);
        if self.sessions.len() == 0 {
            if !listening {
                self.drop_message(DropReason::NoLiveSession, Some(method));
            }
            return;
        }
        self.metrics.broadcasts += 1;
        let frame: Arc<[u8]> = Arc::from(sse::message_event(message));
        // Legacy streams share one frame; each GET stream numbers its own event.
        let targets: Vec<Result<StreamId, (SessionNumber, StreamKey)>> = self
            .sessions
            .iter()
            .filter_map(|(number, s)| match &s.kind {
                Kind::Legacy { stream, .. } => Some(Ok(*stream)),
                Kind::Mcp(m) => m.get_stream.map(|key| Err((number, key))),
            })
            .collect();
        for target in targets {
            match target {
                Ok(stream) => self.streams.send(
                    now,
                    (stream, Frame::Shared(frame.clone())),
                    &mut self.outputs,
                ),
                Err((number, key)) => self.send_event(now, number, key, message),
            }
        }
    }

    /// Delivers `message` to live session `sid`: a legacy session's stream, or where SPEC
    /// section 7 says for a Streamable one; else to the 2026-07-28 request routed under
    /// `sid`. False if nobody waits under it (nothing is sent).
    pub(super) fn deliver(
        &mut self,
        now: Instant,
        sid: SessionId,
        message: Vec<u8>,
        what: Delivery,
    ) -> bool {
        let Some(number) = self.sessions.find(&sid) else {
            // A 2026-07-28 request's: its answer, as section 13 completes it, or progress.
            let (modern, in_flight) = (&mut self.modern, &mut self.in_flight);
            let key = RequestKey::routed(sid);
            let (id, outcome, result) = match what {
                Delivery::Response {
                    key,
                    outcome,
                    result,
                    ..
                } => (key, outcome, result),
                Delivery::Progress { token } => {
                    let parts = (&*modern, in_flight, &mut self.streams);
                    let counters = (&mut self.metrics, &mut self.outputs);
                    let clock = (now, self.settings.request_timeout);
                    return modern::progress(parts, counters, clock, key, (&message, token));
                }
                Delivery::Update => return false,
            };
            let init = self.router.initialize_result();
            let answer = (message.as_slice(), result);
            let answered = modern::answered((modern, in_flight), init, key, answer, (id, outcome));
            let Some((record, settlement)) = answered else {
                return false;
            };
            self.settle(now, record, settlement);
            return true;
        };
        self.metrics.delivered += 1;
        let Some(Kind::Legacy { stream }) = self.sessions.get(number).map(|s| &s.kind) else {
            self.mcp_deliver(now, number, message, what);
            return true;
        };
        let stream = *stream;
        if let Delivery::Response { key, outcome, .. } = &what {
            if let Some(entry) = key
                .as_ref()
                .and_then(|key| self.in_flight.take(number, key))
            {
                let answered = Settlement::answered(message, *outcome);
                self.settle(now, (Some(number.into()), entry), answered);
                return true;
            }
        }
        // Routed by its id, it needs no record to reach its stream.
        self.streams.send(
            now,
            (stream, Frame::Owned(sse::message_event(&message))),
            &mut self.outputs,
        );
        true
    }
}

/// Who owns what a response routed under `key` creates: its live 2025 session, or the
/// principal of the 2026-07-28 request waiting under it (`None`: nobody waits).
fn owner_of((sessions, modern): (&Sessions, &ModernRequests), key: &SessionId) -> Option<Owner> {
    if sessions.find(key).is_some() {
        return Some(Owner::Session(*key));
    }
    let (principal, _) = modern.caller(&RequestKey::routed(*key))?;
    Some(Owner::Principal(principal.clone()))
}

/// A `tasks/list` answer for `owner` (SPEC section 15): its result keeps only the owner's
/// tasks and a cursor minted for it; an error keeps only its code (see [`list_error`]); a
/// result that cannot be filtered is not passed on. Returns the message, where its id now
/// is, and how many tasks it hides.
fn tasks_listed(
    tasks: &mut Tasks,
    now: Instant,
    owner: &Owner,
    message: Vec<u8>,
    id: Range<usize>,
) -> (Vec<u8>, Range<usize>, u64) {
    let Some(result) = crate::message::parse_backend_result(&message) else {
        let error = list_error(&message);
        let (line, id) = answered_as(&message, id, ("error", &error));
        return (line, id, 0);
    };
    let (line, hidden) = match tasks.list_for(now, owner, result) {
        Some(listed) => (
            answered_as(&message, id, ("result", &listed.result)),
            listed.hidden,
        ),
        None => {
            let error = r#"{"code":-32603,"message":"task list could not be filtered"}"#;
            (answered_as(&message, id, ("error", error)), 0)
        }
    };
    (line.0, line.1, hidden)
}

/// The proxy's own error for a backend error answering a `tasks/list`: the same code, the
/// protocol's words for it. The backend's message and data are not passed on: the cursor it
/// was sent is the backend's, which may be another caller's task id (server-everything
/// pages by the last id and says `Invalid cursor: <id>` once that task is gone).
fn list_error(message: &[u8]) -> String {
    let code = serde_json::from_slice::<serde_json::Value>(message)
        .ok()
        .and_then(|answer| answer["error"]["code"].as_i64())
        .and_then(|code| i32::try_from(code).ok())
        .unwrap_or(-32603);
    let text = match code {
        -32700 => "Parse error",
        -32600 => "Invalid Request",
        -32601 => "Method not found",
        // A task list's one parameter is its cursor.
        -32602 => "Invalid cursor",
        -32603 => "Internal error",
        _ => "Task list unavailable",
    };
    format!(r#"{{"code":{code},"message":"{text}"}}"#)
}

/// The answer at `message` (its id at `id`) rebuilt with `member` as its result or error:
/// the line and where its id now is.
fn answered_as(
    message: &[u8],
    id: Range<usize>,
    (member, value): (&str, &str),
) -> (Vec<u8>, Range<usize>) {
    let raw_id = String::from_utf8_lossy(&message[id]);
    let at = router::RESPONSE_ID_AT..router::RESPONSE_ID_AT + raw_id.len();
    (router::response_line(&raw_id, member, value), at)
}

/// A `tools/list` answer as the operator shows it (SPEC section 16): renamed and filtered by
/// `view`; an error as it is; a result that cannot be shown (its `tools` no array) is not
/// passed on, as the policy's filter does not pass one on.
fn tools_shown(
    view: &crate::tools::ToolView,
    message: Vec<u8>,
    id: Range<usize>,
) -> (Vec<u8>, Range<usize>) {
    let Some(result) = crate::message::parse_backend_result(&message) else {
        return (message, id);
    };
    match view.list(result) {
        Some(result) => answered_as(&message, id, ("result", &result)),
        None => {
            let error = r#"{"code":-32603,"message":"list result could not be filtered"}"#;
            answered_as(&message, id, ("error", error))
        }
    }
}

/// The parts that read the backend's tool list for the operator's view, borrowed from the
/// hub.
macro_rules! reader {
    ($hub:expr) => {
        (
            &$hub.settings,
            &mut $hub.router,
            &mut $hub.backend,
            (&mut $hub.backend_tools, &mut $hub.modern.tools),
            &mut $hub.outputs,
        )
    };
}
pub(super) use reader;

/// What reads the backend's tool list for the operator's view: the parts it takes.
pub(super) type Reader<'a> = (
    &'a crate::settings::Settings,
    &'a mut crate::router::Router,
    &'a mut super::backend::BackendProcess,
    (
        &'a mut crate::tools::BackendTools,
        &'a mut crate::modern::ToolHeaders,
    ),
    &'a mut std::collections::VecDeque<crate::output::Output>,
);

/// The backend's tool list may have changed: with a tool view configured, the proxy reads
/// it again, under its own id, page by page (SPEC section 16), from its first page even if
/// a read is under way (that one's pages may be from before the change).
pub(super) fn read_backend_tools(
    (settings, router, backend, (tools, _), outputs): Reader<'_>,
    now: Instant,
) {
    if settings.tool_view.is_some() {
        tools.changed();
        read_page((router, backend, tools, outputs), now, None);
    }
}

/// The backend's `method` said a list changed: if its tools, what they annotate is
/// forgotten (SPEC section 13) and, with a view, they are read again.
fn tools_changed(reader: Reader<'_>, now: Instant, method: &str) {
    if method != "notifications/tools/list_changed" {
        return;
    }
    let (settings, router, backend, (tools, headers), outputs) = reader;
    headers.forget();
    read_backend_tools((settings, router, backend, (tools, headers), outputs), now);
}

/// A call through the operator's view found the backend's tool list unread and no read
/// under way (the last one's request could not be queued): it is read now, so that calls
/// are checked against the backend's own names again (SPEC section 16).
pub(super) fn read_unread_tools(reader: Reader<'_>, now: Instant) {
    let (settings, router, _, (tools, _), _) = &reader;
    if settings.tool_view.is_some() && tools.unread() && router.handshake_result().is_some() {
        read_backend_tools(reader, now);
    }
}

/// The proxy's request for a page of the backend's tool list (after `cursor`), queued; a
/// request that cannot be (the backend is down, its queue full) ends the read, so that
/// the next reason to read starts one.
fn read_page(
    (router, backend, tools, outputs): (
        &mut crate::router::Router,
        &mut super::backend::BackendProcess,
        &mut crate::tools::BackendTools,
        &mut std::collections::VecDeque<crate::output::Output>,
    ),
    now: Instant,
    cursor: Option<&str>,
) {
    let (request, line) = router.read_tools(cursor);
    match backend.queue(LineFrom::Proxy, line) {
        true => {
            tools.asked(request);
            backend.release(now, outputs, false)
        }
        false => tools.abandon(),
    }
}

/// A page of the backend's tool list the proxy read (the answer to its request `request`):
/// unless it is an older read's, what it annotates is learned (SPEC section 13's
/// `Mcp-Param-*`), and the next one is read, or the list is whole (its names the view did
/// not find logged once) or cut at its bound of pages (logged).
fn tools_page(
    (settings, router, backend, (tools, headers), outputs): Reader<'_>,
    now: Instant,
    request: u64,
    result: Option<String>,
) {
    // Read once, for the names and the headers alike.
    let value = result.and_then(|r| serde_json::from_str::<serde_json::Value>(&r).ok());
    let page = tools.page(request, value.as_ref());
    if let Some(value) = value.as_ref().filter(|_| page != Page::Stale) {
        headers.learn_value(value);
    }
    match page {
        Page::Next(cursor) => read_page((router, backend, tools, outputs), now, Some(&cursor)),
        Page::Whole => {
            let view = settings.tool_view.as_deref();
            let names = (view.zip(tools.known())).map(|(v, known)| v.unmatched(known));
            if let Some(names) = names.filter(|n| !n.is_empty()) {
                let event = crate::output::Event::ToolsUnmatched { names };
                outputs.push_back(crate::output::Output::Log(event));
            }
        }
        Page::Cut => {
            let event = crate::output::Event::ToolsReadCut {
                pages: crate::tools::MAX_READ_PAGES,
            };
            outputs.push_back(crate::output::Output::Log(event));
        }
        Page::Stale | Page::Failed => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tools_list_that_cannot_be_shown_is_not_passed_on() {
        let view = crate::tools::ToolView::new(&["say".into()], None)
            .unwrap()
            .unwrap();
        let shown = |line: &str| {
            let id = line.find("\"x\"").map(|at| at..at + 3).unwrap();
            String::from_utf8(tools_shown(&view, line.as_bytes().to_vec(), id).0).unwrap()
        };
        let refused = r#"{"jsonrpc":"2.0","id":"x","error":{"code":-32603,"message":"list result could not be filtered"}}"#;
        let not_an_array = r#"{"jsonrpc":"2.0","id":"x","result":{"tools":{"name":"secret"}}}"#;
        assert_eq!(shown(not_an_array), refused);
        let error = r#"{"jsonrpc":"2.0","id":"x","error":{"code":1,"message":"no"}}"#;
        assert_eq!(shown(error), error);
        let listed =
            r#"{"jsonrpc":"2.0","id":"x","result":{"tools":[{"name":"say"},{"name":"secret"}]}}"#;
        assert_eq!(
            shown(listed),
            r#"{"jsonrpc":"2.0","id":"x","result":{"tools":[{"name":"say"}]}}"#
        );
    }
}
