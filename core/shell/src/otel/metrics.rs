//! SPEC section 14's three histograms over OTLP: the hub measures (its
//! [`Measurement`]s, the same values `/metrics` counts), the SDK aggregates them and its
//! periodic reader, on a thread of its own, exports every `OTEL_METRIC_EXPORT_INTERVAL`.
//!
//! Each series (a histogram and its label set, numbered by the hub) is bound once, when its
//! first value brings its attributes: a value then costs the SDK no attribute lookup, which
//! was two thirds of what exporting metrics added to a request.

use opentelemetry::metrics::{BoundHistogram, Histogram as Instrument, MeterProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::Resource;
use switchboard_core::{Histogram, Measurement, DURATION_BUCKETS};

/// The three instruments, each series bound, and the provider that exports them.
pub(super) struct Meters {
    provider: SdkMeterProvider,
    server_operation: Instrument<f64>,
    server_session: Instrument<f64>,
    client_operation: Instrument<f64>,
    /// By [`Measurement::series`].
    bound: Vec<Option<BoundHistogram<f64>>>,
}

impl Meters {
    pub(super) fn start(exporter: impl PushMetricExporter, resource: Resource) -> Meters {
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter).build())
            .with_resource(resource)
            .build();
        let meter = provider.meter("switchboard");
        let histogram = |which: Histogram| {
            meter
                .f64_histogram(which.name())
                .with_unit("s")
                .with_boundaries(DURATION_BUCKETS.to_vec())
                .build()
        };
        Meters {
            server_operation: histogram(Histogram::ServerOperation),
            server_session: histogram(Histogram::ServerSession),
            client_operation: histogram(Histogram::ClientOperation),
            provider,
            bound: Vec::new(),
        }
    }

    pub(super) fn record(&mut self, measured: Measurement) {
        if let Some(attributes) = measured.attributes {
            let instrument = match measured.histogram {
                Histogram::ServerOperation => &self.server_operation,
                Histogram::ServerSession => &self.server_session,
                Histogram::ClientOperation => &self.client_operation,
            };
            let attributes: Vec<KeyValue> = (attributes.into_iter())
                .map(|(key, value)| KeyValue::new(key, value))
                .collect();
            if self.bound.len() <= measured.series {
                self.bound.resize(measured.series + 1, None);
            }
            self.bound[measured.series] = Some(instrument.bind(&attributes));
        }
        match self.bound.get(measured.series) {
            Some(Some(bound)) => bound.record(measured.seconds),
            // The hub announces every series with its first exported value.
            _ => debug_assert!(false, "series {} was never announced", measured.series),
        }
    }

    /// What the provider needs to export what was measured last (at exit).
    pub(super) fn provider(&self) -> SdkMeterProvider {
        self.provider.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
    use opentelemetry_sdk::metrics::Temporality;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// (name, unit, bounds, count, attributes) of each histogram point exported.
    type Point = (String, String, Vec<f64>, u64, Vec<KeyValue>);

    #[derive(Debug, Clone, Default)]
    struct Collector(Arc<Mutex<Vec<Point>>>);

    impl PushMetricExporter for Collector {
        async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
            let mut points = self.0.lock().unwrap();
            for metric in metrics.scope_metrics().flat_map(|s| s.metrics()) {
                if let AggregatedMetrics::F64(MetricData::Histogram(h)) = metric.data() {
                    for p in h.data_points() {
                        points.push((
                            metric.name().to_owned(),
                            metric.unit().to_owned(),
                            p.bounds().collect(),
                            p.count(),
                            p.attributes().cloned().collect(),
                        ));
                    }
                }
            }
            Ok(())
        }
        fn force_flush(&self) -> OTelSdkResult {
            Ok(())
        }
        fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
            Ok(())
        }
        fn temporality(&self) -> Temporality {
            Temporality::Cumulative
        }
    }

    #[test]
    fn a_measurement_lands_in_its_histogram_with_the_conventions_buckets() {
        let collector = Collector::default();
        let mut meters = Meters::start(collector.clone(), Resource::builder_empty().build());
        let call = |attributes| Measurement {
            histogram: Histogram::ClientOperation,
            series: 3,
            seconds: 0.03,
            attributes,
        };
        meters.record(call(Some(vec![("mcp.method.name", "tools/call".into())])));
        meters.record(call(None));
        meters.provider().force_flush().unwrap();
        let points = collector.0.lock().unwrap().clone();
        assert_eq!(points.len(), 1, "{points:?}");
        let (name, unit, bounds, count, attributes) = &points[0];
        assert_eq!(name, "mcp.client.operation.duration");
        assert_eq!(unit, "s");
        assert_eq!(bounds, &DURATION_BUCKETS.to_vec());
        assert_eq!(*count, 2);
        assert_eq!(
            attributes,
            &[KeyValue::new("mcp.method.name", "tools/call")]
        );
    }
}
