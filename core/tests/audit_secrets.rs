//! SPEC section 11's property: no bearer token ever appears in an audit event, a log line or
//! the metrics. Random tokens open sessions and make requests of every kind, valid and
//! refused (a token one character off, another principal's session, a token in the query
//! string), through the real gate and hub, auditing on with the messages included; every
//! output is rendered as the shells render it and searched for any 12-byte piece of any
//! token.

// `core/clippy.toml` keeps clocks out of the core library; its tests keep time themselves.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use switchboard_core::http::{Gate, OriginPolicy, Payload, RequestHead};
use switchboard_core::hub::Settings;
use switchboard_core::{Audit, Auth, Hub, Output, TokenTable};

const ROUNDS: usize = 40;

fn token(rng: &mut fastrand::Rng) -> String {
    (0..32).map(|_| rng.alphanumeric()).collect()
}

#[test]
fn no_token_byte_run_reaches_an_audit_event_a_log_line_or_a_metric() {
    let mut rng = fastrand::Rng::with_seed(11);
    for _ in 0..ROUNDS {
        let tokens: Vec<String> = (0..3).map(|_| token(&mut rng)).collect();
        let table: String = (tokens.iter().enumerate())
            .map(|(i, t)| format!("user{i} {t}\n"))
            .collect();
        let gate = Gate {
            auth: Auth::Tokens(TokenTable::parse(&table).unwrap()),
            origins: OriginPolicy {
                loopback_bind: true,
                ..Default::default()
            },
            base_path: String::new(),
            metrics_auth: false,
            oauth: None,
            trusted_proxies: Vec::new(),
            tracing: false,
        };
        let settings = Settings {
            audit: Some(Audit {
                include_data: true,
                max_data: 1 << 20,
                base_path: Arc::from(""),
            }),
            ..Settings::default()
        };
        let mut now = Instant::now();
        let mut hub = Hub::new(settings, now);
        let mut text = String::new();
        let render = |hub: &mut Hub, text: &mut String| {
            while let Some(output) = hub.poll_output() {
                match output {
                    Output::Audit(r) => text.push_str(&r.to_json("id", "t", "switchboard")),
                    Output::Log(event) => text.push_str(&event.to_string()),
                    Output::SpawnBackend { backend } => hub.handle_backend_spawned(now, backend, 7),
                    _ => {}
                }
                text.push('\n');
            }
        };
        render(&mut hub, &mut text);
        let mut sessions = Vec::new();
        for step in 0..60 {
            let presented = match rng.u8(0..4) {
                0 => {
                    // One character off.
                    let mut t = tokens[rng.usize(0..tokens.len())].clone().into_bytes();
                    let i = rng.usize(0..t.len());
                    t[i] = if t[i] == b'a' { b'b' } else { b'a' };
                    String::from_utf8(t).unwrap()
                }
                _ => tokens[rng.usize(0..tokens.len())].clone(),
            };
            let auth = format!("Bearer {presented}");
            let in_query = rng.u8(0..8) == 0;
            let target = match (sessions.is_empty(), rng.bool(), in_query) {
                (_, _, true) => format!("/sse?access_token={presented}"),
                (true, _, _) | (_, true, _) => "/sse".to_owned(),
                (false, false, _) => {
                    let sid: &String = &sessions[rng.usize(0..sessions.len())];
                    format!("/messages?session_id={sid}")
                }
            };
            let head = RequestHead {
                method: if target.starts_with("/messages") {
                    "POST"
                } else {
                    "GET"
                },
                target: &target,
                authorization: Some(auth.as_bytes()),
                host: Some("127.0.0.1:8000"),
                content_type: Some("application/json"),
                peer: Some("127.0.0.1:50000".parse().unwrap()),
                user_agent: Some("prop/1"),
                ..Default::default()
            };
            now += Duration::from_millis(3);
            match gate.admit(&head, 0) {
                Err(refused) => {
                    let (_, turned_away) = switchboard_core::hub::TurnedAway::by_gate(*refused);
                    hub.handle_refused(now, turned_away)
                }
                Ok(admitted) => {
                    let body = format!(
                        r#"{{"jsonrpc":"2.0","id":{step},"method":"tools/call","params":{{"name":"echo"}}}}"#
                    );
                    let request = admitted
                        .into_request(Payload::Bytes(body.into_bytes()), || [rng.u8(..); 16]);
                    hub.handle_request(now, request);
                }
            }
            while let Some(output) = hub.poll_output() {
                if let Output::StartStream { stream, .. } = &output {
                    if let Some(sid) = hub.inspect().stream_session(*stream) {
                        sessions.push(sid.as_str().to_owned());
                    }
                }
                match output {
                    Output::Audit(r) => text.push_str(&r.to_json("id", "t", "switchboard")),
                    Output::Log(event) => text.push_str(&event.to_string()),
                    _ => {}
                }
                text.push('\n');
            }
        }
        text.push_str(&hub.inspect().metrics_text());
        assert!(text.contains("auth_failure"), "refusals were audited");
        for t in &tokens {
            for piece in t.as_bytes().windows(12) {
                let piece = std::str::from_utf8(piece).unwrap();
                assert!(
                    !text.contains(piece),
                    "a piece of a token ({piece}) in:\n{text}"
                );
            }
        }
    }
}
