//! The exporters' HTTP client: ureq, blocking, on the exporter's own thread. The SDK's
//! `HttpClient` is async only in name here: `send_bytes` completes before it returns, so
//! the exporter thread drives it with a plain `block_on` and no runtime exists.

use std::time::Duration;

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};

/// The largest answer read from a collector (it says only whether it took the batch).
const ANSWER_LIMIT: u64 = 1 << 20;

/// One ureq agent (its connection kept) bounded by `timeout` for a whole exchange: a
/// collector that stalls costs the exporter thread that long, never the loop.
#[derive(Debug, Clone)]
pub(crate) struct Ureq {
    agent: ureq::Agent,
}

impl Ureq {
    pub(crate) fn new(timeout: Duration) -> Ureq {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .max_redirects(0)
            .http_status_as_error(false)
            .build()
            .into();
        Ureq { agent }
    }
}

#[async_trait::async_trait]
impl HttpClient for Ureq {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (head, body) = request.into_parts();
        let mut answer = self.agent.run(Request::from_parts(head, &body[..]))?;
        let body = answer
            .body_mut()
            .with_config()
            .limit(ANSWER_LIMIT)
            .read_to_vec()?;
        let (head, _) = answer.into_parts();
        Ok(Response::from_parts(head, Bytes::from(body)))
    }
}
