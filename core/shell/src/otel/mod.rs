//! OTLP/HTTP protobuf export of the hub's spans and metrics (SPEC section 14), from both
//! binaries alike: the SDK's exporters over ureq on threads of their own, no async runtime.
//! The hub decides every span (its ids, times, attributes, whether it is sampled); this only
//! carries finished ones out. The loop never waits on a collector: spans go through a
//! bounded queue ([`queue`]) and what does not fit is counted lost.

mod http;
mod metrics;
mod queue;
mod span;

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::{InstrumentationScope, Key};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SpanExporter as _;
use opentelemetry_sdk::Resource;
use switchboard_core::{Measurement, SpanRecord};

use self::http::Ureq;
use self::metrics::Meters;
use self::queue::Queue;

/// Where spans and metrics go and how often, from `--otlp-endpoint` and the standard
/// variables.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Plan {
    traces: String,
    metrics: String,
    /// `OTEL_BSP_SCHEDULE_DELAY`: how long a span may wait for its batch.
    delay: Duration,
    /// `OTEL_EXPORTER_OTLP_TIMEOUT`: one request to the collector, in all.
    timeout: Duration,
    /// `OTEL_BSP_MAX_QUEUE_SIZE`: spans that may wait for export.
    queue: usize,
}

impl Plan {
    /// `endpoint` is a base URL (as `OTEL_EXPORTER_OTLP_ENDPOINT`);
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (and `_METRICS_`) are full URLs and win.
    fn new(endpoint: &str, var: impl Fn(&str) -> Option<String>) -> Plan {
        let base = endpoint.trim_end_matches('/');
        let full = |name: &str, path: &str| {
            var(name)
                .filter(|url| !url.is_empty())
                .unwrap_or_else(|| format!("{base}{path}"))
        };
        let millis = |name: &str, default: u64| {
            let parsed = var(name).and_then(|v| v.trim().parse().ok());
            Duration::from_millis(parsed.unwrap_or(default))
        };
        Plan {
            traces: full("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "/v1/traces"),
            metrics: full("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "/v1/metrics"),
            delay: millis("OTEL_BSP_SCHEDULE_DELAY", 5_000),
            timeout: millis("OTEL_EXPORTER_OTLP_TIMEOUT", 10_000),
            queue: (var("OTEL_BSP_MAX_QUEUE_SIZE").and_then(|v| v.trim().parse().ok()))
                .filter(|n| *n > 0)
                .unwrap_or(queue::QUEUE),
        }
    }
}

/// The hub's `Instant`s as wall time: one anchor taken at start, so every span of a run
/// is on one clock (a wall clock stepped later does not reorder them).
#[derive(Debug, Clone, Copy)]
struct Anchor {
    instant: Instant,
    wall: SystemTime,
}

impl Anchor {
    fn now() -> Anchor {
        Anchor {
            instant: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    fn wall(&self, at: Instant) -> SystemTime {
        match at.checked_duration_since(self.instant) {
            Some(after) => self.wall + after,
            None => self.wall - (self.instant - at),
        }
    }
}

/// `OTEL_SERVICE_NAME`, else `service.name` in `OTEL_RESOURCE_ATTRIBUTES`, else
/// `switchboard`; the other resource attributes as the variable gives them.
fn resource() -> Resource {
    let detected = Resource::builder().build();
    let named = detected
        .get(&Key::from_static_str("service.name"))
        .is_some_and(|name| !name.as_str().starts_with("unknown_service"));
    if named {
        detected
    } else {
        Resource::builder().with_service_name("switchboard").build()
    }
}

/// A queued span's weight (the queue holds boxes).
#[allow(clippy::borrowed_box)]
fn weigh_span(record: &Box<SpanRecord>) -> usize {
    record.weight()
}

/// The loop's end of the export.
pub struct Telemetry {
    spans: Queue<Box<SpanRecord>>,
    meters: Meters,
}

/// The exporters' end, to wait for at exit.
pub struct Flush {
    spans: Receiver<()>,
    meters: SdkMeterProvider,
}

impl Telemetry {
    /// Starts exporting to `endpoint` (`--otlp-endpoint`, a base URL).
    pub fn start(endpoint: &str) -> Result<(Telemetry, Flush), String> {
        let plan = Plan::new(endpoint, |name| std::env::var(name).ok());
        let resource = resource();
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(Ureq::new(plan.timeout))
            .with_endpoint(plan.traces.as_str())
            .with_timeout(plan.timeout)
            .build()
            .map_err(|e| format!("--otlp-endpoint {}: {e}", plan.traces))?;
        exporter.set_resource(&resource);
        let anchor = Anchor::now();
        let scope = InstrumentationScope::builder("switchboard")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let convert = move |record: Box<SpanRecord>| span::data(*record, &anchor, &scope);
        let bounds = queue::Bounds {
            count: plan.queue,
            bytes: queue::QUEUE_BYTES,
            weigh: weigh_span,
        };
        let (spans, done) = Queue::start(convert, exporter, (plan.delay, bounds))
            .map_err(|e| format!("cannot start the span exporter: {e}"))?;
        let exporter = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_http_client(Ureq::new(plan.timeout))
            .with_endpoint(plan.metrics.as_str())
            .with_timeout(plan.timeout)
            .build()
            .map_err(|e| format!("--otlp-endpoint {}: {e}", plan.metrics))?;
        let meters = Meters::start(exporter, resource);
        let flush = Flush {
            spans: done,
            meters: meters.provider(),
        };
        Ok((Telemetry { spans, meters }, flush))
    }

    /// Queues a finished span without waiting. Returns how many spans were lost since
    /// the last call (for `switchboard_otel_dropped_total`).
    pub fn export(&self, span: Box<SpanRecord>) -> u64 {
        self.spans.push(span)
    }

    /// Records a value into its histogram (exported every `OTEL_METRIC_EXPORT_INTERVAL`).
    pub fn measure(&mut self, measured: Measurement) {
        self.meters.record(measured);
    }
}

impl Flush {
    /// Waits, at most `within` (`--grace`), for what was queued when the last
    /// [`Telemetry`] was dropped to be sent; a collector that does not take it by then is
    /// given up on.
    pub fn within(self, within: Duration) {
        let deadline = Instant::now() + within;
        if let Err(RecvTimeoutError::Timeout) = self.spans.recv_timeout(within) {
            tracing::warn!(
                "the collector did not take the last spans within {within:?}; exiting without them"
            );
        }
        // The last measurements go out as the provider shuts down, which waits on the
        // collector: off this thread, and waited for only until the deadline.
        let (done, shut) = std::sync::mpsc::channel();
        let meters = self.meters;
        let started = std::thread::Builder::new()
            .name("otlp-metrics-exit".into())
            .spawn(move || {
                let _ = meters.shutdown();
                let _ = done.send(());
            });
        let left = deadline.saturating_duration_since(Instant::now());
        if started.is_ok() && shut.recv_timeout(left).is_err() {
            tracing::warn!("the collector did not take the last metrics within {within:?}; exiting without them");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spans_url_is_the_base_with_its_path_unless_the_full_one_is_given() {
        let plan = Plan::new("http://collector:4318/", |_| None);
        assert_eq!(plan.traces, "http://collector:4318/v1/traces");
        assert_eq!(plan.metrics, "http://collector:4318/v1/metrics");
        assert_eq!(plan.delay, Duration::from_secs(5));
        assert_eq!(plan.queue, 2_048);
        let plan = Plan::new("http://collector:4318", |name| match name {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" => Some("http://other/traces".into()),
            "OTEL_BSP_SCHEDULE_DELAY" => Some("250".into()),
            "OTEL_BSP_MAX_QUEUE_SIZE" => Some("100".into()),
            _ => None,
        });
        assert_eq!(plan.queue, 100);
        assert_eq!(plan.traces, "http://other/traces");
        assert_eq!(plan.metrics, "http://collector:4318/v1/metrics");
        assert_eq!(plan.delay, Duration::from_millis(250));
    }

    #[test]
    fn instants_keep_their_distance_on_the_wall_clock() {
        let anchor = Anchor::now();
        let later = anchor.instant + Duration::from_millis(1500);
        let before = anchor.instant - Duration::from_millis(20);
        assert_eq!(
            anchor.wall(later).duration_since(anchor.wall).unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(
            anchor.wall.duration_since(anchor.wall(before)).unwrap(),
            Duration::from_millis(20)
        );
    }
}
