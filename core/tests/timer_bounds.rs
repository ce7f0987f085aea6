//! SPEC section 6 item 6 for Streamable sessions: the hub's timer tables hold what is live
//! (requests in flight, sessions, streams), never the history of the requests answered.
//! A session answering thousands of JSON requests one after the other, and with several in
//! flight, keeps a handful of entries; so does a progress notification moving a request's
//! clock; a DELETE leaves none of its own behind.

use switchboard_core::http::{Admitted, Endpoint, McpHeaders};
use switchboard_core::hub::{Payload, MAX_FINISHED_KEPT};
use switchboard_core::Principal;
use switchboard_core::RequestId;
use switchboard_testkit::driver::{Answer, Driver};
use switchboard_testkit::scenario::scenario_settings;

const ACCEPT: &str = "application/json, text/event-stream";

fn mcp(d: &mut Driver, endpoint: Endpoint, session: Option<&str>, body: &str) -> RequestId {
    let admitted = Admitted {
        mcp: McpHeaders {
            session: session.map(str::to_owned),
            content_type: Some("application/json".into()),
            accept: Some(ACCEPT.into()),
            protocol_version: None,
            last_event_id: None,
            fields: Vec::new(),
        },
        ..Admitted::new(endpoint, Principal::new("alice"), "")
    };
    d.send(admitted.into_request(Payload::Bytes(body.as_bytes().to_vec()), || [7; 16]))
}

fn status(d: &Driver, request: RequestId) -> u16 {
    match d.answer(request) {
        Some(Answer::Response(r)) => r.status,
        other => panic!("request {request:?}: not a JSON answer: {other:?}"),
    }
}

fn call(id: u64, meta: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo"{meta}}}}}"#
    )
}

#[test]
fn timer_tables_hold_what_is_live_not_history() {
    let mut d = Driver::new(scenario_settings());
    let init = mcp(
        &mut d,
        Endpoint::McpPost,
        None,
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}"#,
    );
    d.backend_line(Some(
        br#"{"jsonrpc":"2.0","id":"switchboard|initialize:1","result":{"protocolVersion":"2025-06-18","capabilities":{},"serverInfo":{"name":"s","version":"1"}}}"#,
    ));
    let sid = match d.answer(init) {
        Some(Answer::Response(r)) => r
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("mcp-session-id"))
            .map(|(_, v)| v.to_string())
            .expect("initialize names the session"),
        other => panic!("initialize: {other:?}"),
    };
    let baseline = d.hub().inspect().pending_timers();

    // One at a time, then four in flight at once: answered as JSON.
    let mut id = 1;
    for round in 0..1_000 {
        let width = if round % 2 == 0 { 1 } else { 4 };
        let posts: Vec<(u64, RequestId)> = (0..width)
            .map(|i| {
                let n = id + i;
                (n, mcp(&mut d, Endpoint::McpPost, Some(&sid), &call(n, "")))
            })
            .collect();
        assert!(d.hub().inspect().pending_timers() <= baseline + 1 + width as usize);
        for (n, post) in posts {
            let line = format!(r#"{{"jsonrpc":"2.0","id":"{sid}|n:{n}","result":{{}}}}"#);
            d.backend_line(Some(line.as_bytes()));
            assert_eq!(status(&d, post), 200);
        }
        id += width;
        d.take_records();
        assert!(
            d.hub().inspect().pending_timers() <= baseline + 1,
            "after {id} requests: {} timer entries (baseline {baseline})",
            d.hub().inspect().pending_timers()
        );
    }

    // A thousand requests answered as streams (a progress token asks for one): each
    // stream's keep-alive leaves with it; the answered streams kept for resumption (each
    // with its window's timer) are at most MAX_FINISHED_KEPT per session.
    for _ in 0..1_000 {
        let post = mcp(
            &mut d,
            Endpoint::McpPost,
            Some(&sid),
            &call(id, r#","_meta":{"progressToken":"s"}"#),
        );
        let line = format!(r#"{{"jsonrpc":"2.0","id":"{sid}|n:{id}","result":{{}}}}"#);
        d.backend_line(Some(line.as_bytes()));
        assert!(d.stream_of(post).is_some());
        id += 1;
        d.take_records();
    }
    assert!(
        d.hub().inspect().pending_timers() <= baseline + 1 + MAX_FINISHED_KEPT,
        "after {id} stream answers: {} timer entries (baseline {baseline})",
        d.hub().inspect().pending_timers()
    );

    // Progress moves a request's clock (on a stream answer): its old entry goes.
    let with_token = call(id, r#","_meta":{"progressToken":"t"}"#);
    let post = mcp(&mut d, Endpoint::McpPost, Some(&sid), &with_token);
    let before = d.hub().inspect().pending_timers();
    for _ in 0..100 {
        let progress = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":"{sid}|s:t","progress":1}}}}"#
        );
        d.backend_line(Some(progress.as_bytes()));
    }
    assert_eq!(d.hub().inspect().pending_timers(), before);
    let line = format!(r#"{{"jsonrpc":"2.0","id":"{sid}|n:{id}","result":{{}}}}"#);
    d.backend_line(Some(line.as_bytes()));
    assert!(d.stream_of(post).is_some());

    // A request left in flight, then DELETE: nothing of the session's own is left.
    mcp(&mut d, Endpoint::McpPost, Some(&sid), &call(id + 1, ""));
    let delete = mcp(&mut d, Endpoint::McpDelete, Some(&sid), "");
    assert_eq!(status(&d, delete), 204);
    assert!(
        d.hub().inspect().pending_timers() <= baseline,
        "{} timer entries after DELETE (baseline {baseline})",
        d.hub().inspect().pending_timers()
    );
}
