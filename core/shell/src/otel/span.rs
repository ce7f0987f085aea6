//! The hub's finished span in the SDK's form, on the exporter thread (the loop only moves a
//! box). Nothing is decided here: ids, parent, name, times, status, attributes and links are
//! the hub's; only the clock changes.

use std::borrow::Cow;

use opentelemetry::trace::{self as api, SpanId, TraceFlags, TraceId, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use switchboard_core::{SpanContext, SpanKind, SpanRecord, SpanStatus, Value};

use super::Anchor;

/// `record` as the OTLP exporter takes it.
pub(super) fn data(record: SpanRecord, anchor: &Anchor, scope: &InstrumentationScope) -> SpanData {
    let attributes = record
        .attributes
        .into_iter()
        .map(|(key, value)| match value {
            Value::Str(Cow::Borrowed(text)) => KeyValue::new(key, text),
            Value::Str(Cow::Owned(text)) => KeyValue::new(key, text),
            Value::Int(n) => KeyValue::new(key, n),
        })
        .collect();
    let mut links = SpanLinks::default();
    links.links = record
        .links
        .into_iter()
        .map(|link| api::Link::with_context(context(&link.context, link.tracestate.as_deref())))
        .collect();
    SpanData {
        span_context: context(&record.context, record.tracestate.as_deref()),
        parent_span_id: record
            .parent_span_id
            .map_or(SpanId::INVALID, SpanId::from_bytes),
        // The SERVER span's parent is the client's (remote); the CLIENT span's is ours.
        parent_span_is_remote: record.parent_span_id.is_some() && record.kind == SpanKind::Server,
        span_kind: match record.kind {
            SpanKind::Server => api::SpanKind::Server,
            SpanKind::Client => api::SpanKind::Client,
        },
        name: record.name.into(),
        start_time: anchor.wall(record.start),
        end_time: anchor.wall(record.end),
        attributes,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links,
        status: match record.status {
            SpanStatus::Unset => api::Status::Unset,
            SpanStatus::Error => api::Status::error(""),
        },
        instrumentation_scope: scope.clone(),
    }
}

fn context(context: &SpanContext, tracestate: Option<&str>) -> api::SpanContext {
    let flags = match context.sampled {
        true => TraceFlags::SAMPLED,
        false => TraceFlags::default(),
    };
    // The hub passes on only a well-formed `tracestate`; one the SDK still refuses is left
    // out rather than failing the span.
    let state = tracestate
        .and_then(|text| text.parse::<TraceState>().ok())
        .unwrap_or_default();
    api::SpanContext::new(
        TraceId::from_bytes(context.trace_id),
        SpanId::from_bytes(context.span_id),
        flags,
        false,
        state,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use switchboard_core::SpanLink;

    #[test]
    fn a_record_keeps_its_ids_times_and_attributes() {
        let anchor = Anchor::now();
        let start = anchor.instant + Duration::from_millis(10);
        let client = SpanContext {
            trace_id: [7; 16],
            span_id: [9; 8],
            sampled: true,
        };
        let record = SpanRecord {
            context: SpanContext {
                span_id: [3; 8],
                ..client
            },
            parent_span_id: Some([2; 8]),
            kind: SpanKind::Server,
            name: "tools/call get_time".into(),
            start,
            end: start + Duration::from_millis(25),
            status: SpanStatus::Error,
            attributes: vec![
                ("mcp.method.name", Value::Str("tools/call".into())),
                ("client.port", Value::Int(50_000)),
            ],
            links: vec![SpanLink {
                context: client,
                tracestate: Some("vendor=x".into()),
            }],
            tracestate: Some("vendor=y".into()),
        };
        let scope = InstrumentationScope::builder("switchboard").build();
        let span = data(record, &anchor, &scope);
        assert_eq!(span.span_context.trace_id(), TraceId::from_bytes([7; 16]));
        assert_eq!(span.span_context.span_id(), SpanId::from_bytes([3; 8]));
        assert!(span.span_context.is_sampled());
        assert_eq!(span.span_context.trace_state().get("vendor"), Some("y"));
        assert_eq!(span.parent_span_id, SpanId::from_bytes([2; 8]));
        assert!(span.parent_span_is_remote);
        assert_eq!(span.span_kind, api::SpanKind::Server);
        assert_eq!(
            span.end_time.duration_since(span.start_time).unwrap(),
            Duration::from_millis(25)
        );
        assert_eq!(span.start_time, anchor.wall(start));
        assert_eq!(span.status, api::Status::error(""));
        assert_eq!(
            span.attributes,
            vec![
                KeyValue::new("mcp.method.name", "tools/call"),
                KeyValue::new("client.port", 50_000i64)
            ]
        );
        let link = &span.links.links[0];
        assert_eq!(link.span_context.span_id(), SpanId::from_bytes([9; 8]));
        assert_eq!(link.span_context.trace_state().get("vendor"), Some("x"));
    }
}
