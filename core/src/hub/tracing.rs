//! Traces' inputs (SPEC section 14): what the shell's span exporter could not take.

use super::Hub;

impl Hub {
    /// `lost` spans did not fit the shell's export queue (or its exporter failed): counted
    /// (`switchboard_otel_dropped_total`).
    pub fn handle_spans_dropped(&mut self, lost: u64) {
        self.metrics.otel_dropped += lost;
    }
}
