//! Admission (SPEC sections 7, 9, 10 and 12): whether a request goes ahead, decided by pure
//! steps over the facts the hub gathers, and the refusal each verdict owes its client, built
//! here for both transports. A request is judged in two moments, in SPEC's order: its sender
//! when it arrives (required scope, tool scope, rate limits, policy), then the room it takes
//! when it goes ahead (fair share, sessions, in flight), which for a POST that waits for a
//! restarted backend is later.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use crate::http::{Grant, Rejection, Response};
use crate::limits::{retry_after, Buckets};
use crate::message::{Checked, Kind};
use crate::principal::Principal;
use crate::routed_id::SessionId;
use crate::settings::{tool_matches, Settings};

/// A request as it arrives: who sends it, and the message it carries (`None` for a GET of
/// a stream or a DELETE, which only the required scopes judge).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arrival<'a> {
    pub(crate) principal: &'a Principal,
    pub(crate) grant: &'a Grant,
    pub(crate) msg: Option<&'a Checked>,
}

impl<'a> Arrival<'a> {
    pub(crate) fn without_message(principal: &'a Principal, grant: &'a Grant) -> Self {
        Arrival {
            principal,
            grant,
            msg: None,
        }
    }
}

/// What admission says of a request on arrival.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    /// It goes ahead. `denied`: the policy denies it, so the proxy answers it -32003 under
    /// its id (a legacy POST still gets 202) and the backend never sees it.
    Admit { denied: bool },
    /// It is refused at once.
    Refuse(Refused),
}

/// Why a request is refused, with what its answer needs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Refused {
    /// 403: the token lacks a scope; the challenge names every scope to ask for.
    InsufficientScope { challenge: String },
    /// 429: past a rate limit, a token is there again after `wait`.
    RateLimited { wait: Duration },
    /// 403: a notification the policy denies (no id to answer under).
    Denied,
    /// 503: no backend; a restart is due in `restart_in`, if one is scheduled.
    BackendDown { restart_in: Option<Duration> },
    /// 503: its session is at its fair share of the backend's stdin queue.
    BackendBusy,
    /// 503: `--max-sessions` are live.
    TooManySessions,
    /// 429: its principal holds `--max-sessions-per-principal` sessions.
    PrincipalSessions,
    /// 409: its id is in flight in its session.
    IdInFlight,
    /// 429: `--max-inflight` requests of its session are in flight.
    TooManyInFlight,
    /// 403: a 2026-07-28 request the policy denies: -32003 under its id (a 2025 session's
    /// is accepted and answered -32003 on its stream instead).
    Forbidden,
    /// 429: `--max-inflight` 2026-07-28 requests of its principal are in flight.
    PrincipalInFlight,
}

/// A refusal as it leaves the hub: what the metrics count, and the answer.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) rejection: Rejection,
    pub(crate) response: Response,
}

impl From<Rejection> for Refusal {
    /// A refusal outside admission: the rejection's own answer.
    fn from(rejection: Rejection) -> Self {
        Refusal {
            rejection,
            response: rejection.response(),
        }
    }
}

/// The room a request takes when it goes ahead, as far as its caller knows it (each part
/// is judged when given, in this order).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Capacity {
    /// Its session is within its fair share of the backend's stdin queue (SPEC section 12).
    pub(crate) within_share: Option<bool>,
    /// It opens a session.
    pub(crate) opening: Option<Opening>,
    /// It is a request awaited in its session's in-flight table.
    pub(crate) in_flight: Option<InFlight>,
}

impl Capacity {
    pub(crate) fn share(within_share: bool) -> Capacity {
        Capacity {
            within_share: Some(within_share),
            ..Capacity::default()
        }
    }

    pub(crate) fn opening(opening: Opening) -> Capacity {
        Capacity {
            opening: Some(opening),
            ..Capacity::default()
        }
    }

    pub(crate) fn in_flight(in_flight: InFlight) -> Capacity {
        Capacity {
            in_flight: Some(in_flight),
            ..Capacity::default()
        }
    }
}

/// What a new session needs: a backend, and room under both session caps.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Opening {
    pub(crate) backend_up: bool,
    /// When the backend is down: how long until its restart, if one is scheduled.
    pub(crate) restart_in: Option<Duration>,
    /// `--max-sessions` are live.
    pub(crate) sessions_full: bool,
    /// Sessions its principal holds, and `--max-sessions-per-principal` (0: no cap).
    pub(crate) of_principal: (usize, usize),
}

/// A session's in-flight table as a new request finds it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InFlight {
    /// The request's id is in it already.
    pub(crate) id_taken: bool,
    /// Requests in it, and `--max-inflight`.
    pub(crate) count: (usize, usize),
}

/// SPEC sections 9 and 10 on arrival: the required scopes and the called tool's, then the
/// rate limits (tokens are taken only from a request that passed the scopes), then the
/// policy (`denies`, asked last: its evaluation is the dearest).
pub(crate) fn admit(
    now: Instant,
    settings: &Settings,
    buckets: &mut Buckets,
    arrival: Arrival<'_>,
    denies: impl FnOnce(&Checked) -> bool,
) -> Verdict {
    let tool = arrival.msg.and_then(|m| m.tool.as_deref());
    if let Some(challenge) = missing_scopes(settings, arrival.grant, tool) {
        return Verdict::Refuse(Refused::InsufficientScope { challenge });
    }
    let Some(msg) = arrival.msg else {
        return Verdict::Admit { denied: false };
    };
    if let Some(wait) = rate_wait(now, settings, buckets, arrival.principal, msg) {
        return Verdict::Refuse(Refused::RateLimited { wait });
    }
    let denied = denies(msg);
    if denied && msg.kind == Kind::Notification {
        return Verdict::Refuse(Refused::Denied);
    }
    Verdict::Admit { denied }
}

/// The challenge for a token without a scope the request needs (`--required-scope`, and
/// `--tool-scope` for a call of `tool`), if it lacks one.
fn missing_scopes(settings: &Settings, grant: &Grant, tool: Option<&str>) -> Option<String> {
    let oauth = settings.oauth.as_ref()?;
    let needed = oauth.needed_scopes(tool);
    if needed.iter().all(|scope| grant.scopes.contains(scope)) {
        return None;
    }
    let url = grant.metadata_url.as_deref().unwrap_or_default();
    Some(oauth.insufficient_scope(url, &needed))
}

/// How long a call of `principal` must wait for a token: of its bucket over every request,
/// then of the called tool's. A request refused by one limit does not count against the
/// other.
fn rate_wait(
    now: Instant,
    settings: &Settings,
    buckets: &mut Buckets,
    principal: &Principal,
    msg: &Checked,
) -> Option<Duration> {
    if !msg.is_call() {
        return None;
    }
    let tool_rate = msg.tool.as_deref().and_then(|tool| {
        let rule =
            (settings.tool_rate_limits.iter()).find(|(pattern, _)| tool_matches(pattern, tool));
        rule.map(|(_, rate)| (tool, *rate))
    });
    let mut wait = None;
    if let Some(rate) = settings.rate_limit {
        wait = buckets.take(now, principal, None, rate).err();
    }
    if let (None, Some((tool, rate))) = (wait, tool_rate) {
        wait = buckets.take(now, principal, Some(tool), rate).err();
        if wait.is_some() && settings.rate_limit.is_some() {
            buckets.refund(principal, None);
        }
    }
    wait
}

/// The room a request takes when it goes ahead (SPEC sections 7, 10 and 12): its session's
/// fair share, a new session's backend and caps, its session's in-flight table.
pub(crate) fn room(capacity: &Capacity) -> Result<(), Refused> {
    if capacity.within_share == Some(false) {
        return Err(Refused::BackendBusy);
    }
    if let Some(opening) = &capacity.opening {
        let (held, cap) = opening.of_principal;
        if !opening.backend_up {
            let restart_in = opening.restart_in;
            return Err(Refused::BackendDown { restart_in });
        } else if opening.sessions_full {
            return Err(Refused::TooManySessions);
        } else if cap > 0 && held >= cap {
            return Err(Refused::PrincipalSessions);
        }
    }
    if let Some(in_flight) = &capacity.in_flight {
        let (count, max) = in_flight.count;
        if in_flight.id_taken {
            return Err(Refused::IdInFlight);
        } else if count >= max {
            return Err(Refused::TooManyInFlight);
        }
    }
    Ok(())
}

impl Refused {
    /// What the metrics count it as.
    pub(crate) fn rejection(&self) -> Rejection {
        match self {
            Refused::InsufficientScope { .. } => Rejection::InsufficientScope,
            Refused::RateLimited { .. } => Rejection::RateLimited,
            Refused::Denied => Rejection::ForbiddenByPolicy,
            Refused::BackendDown { .. } => Rejection::BackendDown,
            Refused::BackendBusy => Rejection::BackendBusy,
            Refused::TooManySessions => Rejection::TooManySessions,
            Refused::PrincipalSessions => Rejection::PrincipalSessions,
            Refused::IdInFlight => Rejection::IdInFlight,
            Refused::TooManyInFlight | Refused::PrincipalInFlight => Rejection::TooManyInFlight,
            Refused::Forbidden => Rejection::ForbiddenByPolicy,
        }
    }

    /// The answer it owes on either transport: its status and a JSON-RPC error, under the
    /// request's id (`id`, as the client wrote it) when the refusal is the request's own
    /// (a scope, a rate limit, a session cap, an id in flight); the challenge or
    /// `Retry-After` it carries; and a 409 on `/mcp` names the session holding the id.
    pub(crate) fn refusal(&self, id: Option<&str>, session: Option<&SessionId>) -> Refusal {
        let rejection = self.rejection();
        let mut response = match (self, id) {
            // A rate-limited call sent without an id is answered under `null`.
            (Refused::RateLimited { .. }, id) => rejection.response_to(id.unwrap_or("null")),
            (
                Refused::InsufficientScope { .. }
                | Refused::PrincipalSessions
                | Refused::IdInFlight
                | Refused::Forbidden
                | Refused::PrincipalInFlight,
                Some(id),
            ) => rejection.response_to(id),
            _ => rejection.response(),
        };
        let headers = &mut response.headers;
        match self {
            Refused::InsufficientScope { challenge } => {
                headers.push(("www-authenticate", Cow::Owned(challenge.clone())));
            }
            Refused::RateLimited { wait } => {
                headers.push(("retry-after", Cow::Owned(retry_after(*wait).to_string())));
            }
            // A retry can expect a backend once the restart is due (SPEC section 12): a
            // retry then waits --restart-wait for it, so that wait is not added.
            Refused::BackendDown {
                restart_in: Some(wait),
            } => {
                let seconds = retry_after(*wait).to_string();
                for (_, value) in headers.iter_mut().filter(|(n, _)| *n == "retry-after") {
                    *value = Cow::Owned(seconds.clone());
                }
            }
            Refused::IdInFlight => {
                if let Some(sid) = session {
                    headers.push(("mcp-session-id", Cow::Owned(sid.as_str().to_owned())));
                }
            }
            _ => {}
        }
        Refusal {
            rejection,
            response,
        }
    }

    /// [`Refused::refusal`] for a 2026-07-28 request (SPEC section 13): the revision
    /// forbids undefined codes in -32020..-32099, so a rate limit and a principal's
    /// requests in flight answer -32000.
    pub(crate) fn modern_refusal(&self, id: Option<&str>) -> Refusal {
        let mut refusal = self.refusal(id, None);
        let text = match self {
            Refused::RateLimited { .. } => "rate limit exceeded",
            Refused::PrincipalInFlight => "too many requests in flight",
            _ => return refusal,
        };
        let body = crate::http::error_message(id.unwrap_or("null"), -32000, text);
        refusal.response.body = body.into();
        refusal
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oauth::ResourceServer;
    use crate::settings::Rate;

    /// Settings with OAuth (`mcp` required, `admin` for `admin_*`), 2 calls per 10 s per
    /// principal and 1 per 10 s of tool `slow`.
    fn settings() -> Settings {
        let oauth = ResourceServer {
            resource: "http://h/".into(),
            issuers: vec!["http://idp".into()],
            scopes: vec!["mcp".into()],
            required: vec!["mcp".into()],
            tool_scopes: vec![("admin_*".into(), "admin".into())],
            name: "Switchboard".into(),
            public_url: None,
            listen_origin: "http://h".into(),
            base_path: String::new(),
        };
        let rate = |tokens| Rate {
            tokens,
            period: Duration::from_secs(10),
        };
        Settings {
            oauth: Some(std::sync::Arc::new(oauth)),
            rate_limit: Some(rate(2)),
            tool_rate_limits: vec![("slow".into(), rate(1))],
            ..Settings::default()
        }
    }

    fn grant(scopes: &[&str]) -> Grant {
        Grant {
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
            metadata_url: Some("http://h/.well-known/oauth-protected-resource".into()),
            ..Grant::default()
        }
    }

    fn call(id: Option<u32>, tool: &str) -> Checked {
        let id = id.map(|id| format!(r#""id":{id},"#)).unwrap_or_default();
        let text = format!(
            r#"{{"jsonrpc":"2.0",{id}"method":"tools/call","params":{{"name":"{tool}"}}}}"#
        );
        Checked::admit(text.into_bytes()).expect("a valid call")
    }

    /// The verdict on arrival for `msg` of a fresh principal with `scopes`, after `before`
    /// earlier calls of it; the policy denies tool `denied`.
    fn arrive(scopes: &[&str], msg: Option<&Checked>, before: &[Checked]) -> Verdict {
        #[allow(clippy::disallowed_methods)] // the test's one origin of time
        let now = Instant::now();
        let (settings, mut buckets) = (settings(), Buckets::default());
        let (alice, grant) = (Principal::new("alice"), grant(scopes));
        let denies = |m: &Checked| m.tool.as_deref() == Some("denied");
        for earlier in before {
            let arrival = Arrival {
                principal: &alice,
                grant: &grant,
                msg: Some(earlier),
            };
            admit(now, &settings, &mut buckets, arrival, denies);
        }
        let arrival = Arrival {
            principal: &alice,
            grant: &grant,
            msg,
        };
        admit(now, &settings, &mut buckets, arrival, denies)
    }

    fn opening(backend_up: bool, sessions_full: bool, held: usize) -> Capacity {
        Capacity::opening(Opening {
            backend_up,
            restart_in: Some(Duration::from_millis(2500)),
            sessions_full,
            of_principal: (held, 3),
        })
    }

    fn in_flight(id_taken: bool, count: usize) -> Capacity {
        Capacity::in_flight(InFlight {
            id_taken,
            count: (count, 4),
        })
    }

    /// A refusal's answer: status, JSON-RPC code and id (`None`: no id member), and the
    /// headers besides `content-type`.
    type Answer = (u16, i64, Option<&'static str>, Vec<(&'static str, String)>);

    fn answer(refusal: &Refusal) -> Answer {
        let body: serde_json::Value = serde_json::from_slice(&refusal.response.body).unwrap();
        let id = body.get("id").map(|id| &*id.to_string().leak());
        let code = body["error"]["code"].as_i64().unwrap();
        let headers = (refusal.response.headers.iter())
            .filter(|(name, _)| *name != "content-type")
            .map(|(name, value)| (*name, value.to_string()))
            .collect();
        assert_eq!(refusal.rejection.status(), refusal.response.status);
        (refusal.response.status, code, id, headers)
    }

    /// (what, the verdict got, the verdict wanted, the answer's id and session, the answer).
    type Row<'a> = (
        &'a str,
        Verdict,
        Verdict,
        (Option<&'a str>, Option<&'a SessionId>),
        Option<Answer>,
    );

    fn check(rows: Vec<Row<'_>>) {
        for (what, got, want, (id, session), wanted) in rows {
            assert_eq!(got, want, "{what}");
            if let Verdict::Refuse(refused) = &got {
                let refusal = refused.refusal(id, session);
                assert_eq!(Some(answer(&refusal)), wanted, "{what}");
            }
        }
    }

    fn challenge(scope: &str) -> String {
        format!("Bearer error=\"insufficient_scope\", scope=\"{scope}\", resource_metadata=\"http://h/.well-known/oauth-protected-resource\"")
    }

    fn headers(name: &'static str, value: &str) -> Vec<(&'static str, String)> {
        vec![(name, value.to_owned())]
    }

    fn refused(refused: Refused) -> Verdict {
        Verdict::Refuse(refused)
    }

    const ADMIT: Verdict = Verdict::Admit { denied: false };

    #[test]
    fn verdicts_on_arrival_and_their_refusals() {
        let www = |scope: &str| headers("www-authenticate", &challenge(scope));
        let retry = |s: &str| headers("retry-after", s);
        let (seven, slow) = (call(Some(7), "t"), call(Some(7), "slow"));
        let scope = |s: &str| {
            refused(Refused::InsufficientScope {
                challenge: challenge(s),
            })
        };
        let limited = |secs| {
            refused(Refused::RateLimited {
                wait: Duration::from_secs(secs),
            })
        };
        let twice = |msg: &Checked| [msg.clone(), msg.clone()];
        #[rustfmt::skip]
        check(vec![
            ("a stream without the required scope",
                arrive(&[], None, &[]), scope("mcp"),
                (None, None), Some((403, -32001, None, www("mcp")))),
            ("a call without its tool's scope",
                arrive(&["mcp"], Some(&call(Some(7), "admin_x")), &[]), scope("mcp admin"),
                (Some("7"), None), Some((403, -32001, Some("7"), www("mcp admin")))),
            ("a stream with its scope", arrive(&["mcp"], None, &[]), ADMIT, (None, None), None),
            ("a call within both rates",
                arrive(&["mcp"], Some(&slow), std::slice::from_ref(&seven)), ADMIT, (None, None), None),
            ("a call past the principal's rate",
                arrive(&["mcp"], Some(&seven), &twice(&seven)), limited(5),
                (Some("7"), None), Some((429, -32029, Some("7"), retry("5")))),
            ("a call past its tool's rate",
                arrive(&["mcp"], Some(&slow), std::slice::from_ref(&slow)), limited(10),
                (Some("7"), None), Some((429, -32029, Some("7"), retry("10")))),
            ("a call refused by its tool's rate takes no token of the principal's",
                arrive(&["mcp"], Some(&seven), &twice(&slow)), ADMIT, (None, None), None),
            ("a call without an id past the rate, answered under null",
                arrive(&["mcp"], Some(&call(None, "t")), &twice(&seven)), limited(5),
                (None, None), Some((429, -32029, Some("null"), retry("5")))),
            ("a request the policy denies, answered -32003 under its id later",
                arrive(&["mcp"], Some(&call(Some(7), "denied")), &[]), Verdict::Admit { denied: true },
                (None, None), None),
            ("a notification the policy denies",
                arrive(&["mcp"], Some(&call(None, "denied")), &[]), refused(Refused::Denied),
                (None, None), Some((403, -32003, None, vec![]))),
        ]);
    }

    #[test]
    fn verdicts_on_room_and_their_refusals() {
        let sid = SessionId::mint(None, [7; 16]);
        let retry = |s: &str| headers("retry-after", s);
        let room_of = |c: Capacity| room(&c).map_or_else(refused, |()| ADMIT);
        let down = |restart_in| refused(Refused::BackendDown { restart_in });
        #[rustfmt::skip]
        check(vec![
            ("a session at its fair share",
                room_of(Capacity::share(false)), refused(Refused::BackendBusy),
                (Some("7"), None), Some((503, -32002, None, retry("1")))),
            ("a new session while the backend restarts",
                room_of(opening(false, true, 3)), down(Some(Duration::from_millis(2500))),
                (None, None), Some((503, -32002, None, retry("3")))),
            ("a POST for a backend that will not restart", down(None), down(None),
                (None, None), Some((503, -32002, None, retry("1")))),
            ("a new session past --max-sessions",
                room_of(opening(true, true, 3)), refused(Refused::TooManySessions),
                (Some("7"), None), Some((503, -32002, None, retry("1")))),
            ("a new Streamable session past the principal's cap",
                room_of(opening(true, false, 3)), refused(Refused::PrincipalSessions),
                (Some("7"), None), Some((429, -32029, Some("7"), retry("1")))),
            ("a legacy GET past the principal's cap",
                room_of(opening(true, false, 3)), refused(Refused::PrincipalSessions),
                (None, None), Some((429, -32029, None, retry("1")))),
            ("a legacy request whose id is in flight",
                room_of(in_flight(true, 4)), refused(Refused::IdInFlight),
                (Some("7"), None), Some((409, -32600, Some("7"), vec![]))),
            ("a Streamable request whose id is in flight",
                room_of(in_flight(true, 0)), refused(Refused::IdInFlight),
                (Some("7"), Some(&sid)), Some((409, -32600, Some("7"), headers("mcp-session-id", sid.as_str())))),
            ("a request past --max-inflight",
                room_of(in_flight(false, 4)), refused(Refused::TooManyInFlight),
                (Some("7"), Some(&sid)), Some((429, -32600, None, retry("1")))),
            ("room for a new session",
                room_of(Capacity { within_share: Some(true), ..opening(true, false, 2) }), ADMIT,
                (None, None), None),
            ("room in flight", room_of(in_flight(false, 3)), ADMIT, (None, None), None),
        ]);
    }
}
