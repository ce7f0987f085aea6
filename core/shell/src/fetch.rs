//! Outside reads the hub asks for ([`Output::Fetch`](switchboard_core::Output::Fetch)): an
//! authorization server's metadata or a key set, with one blocking HTTP client (ureq,
//! rustls with the webpki roots). The hub decides what to fetch, when, and what it means.

use std::time::Duration;

use switchboard_core::hub::Fetched;

/// How long one fetch may take in all.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest document read.
const FETCH_LIMIT: u64 = 1 << 20;

/// GETs `url`: its status, `Cache-Control` and body, or why it failed. No redirects (the
/// hub checks every URL it asks for).
pub fn fetch(url: &str) -> Result<Fetched, String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(FETCH_TIMEOUT))
        .max_redirects(0)
        .http_status_as_error(false)
        .build()
        .into();
    let mut response = agent.get(url).call().map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let cache_control = response
        .headers()
        .get("cache-control")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = response
        .body_mut()
        .with_config()
        .limit(FETCH_LIMIT)
        .read_to_vec()
        .map_err(|e| e.to_string())?;
    Ok(Fetched {
        status,
        cache_control,
        body,
    })
}
