//! Key sets from URLs (SPEC section 9): when to fetch an authorization server's metadata and
//! its key set (at start, before `max-age` runs out, for an unknown `kid` at most once per
//! 30 s per URL, with backoff after failures) and what a fetched document means. The shells
//! only fetch.

use std::time::{Duration, Instant};

use crate::output::{FetchId, Output};
use crate::settings::{KeySet, KeySource};

/// A key set is kept at least this long, whatever its `Cache-Control` says.
const MIN_AGE: Duration = Duration::from_secs(5 * 60);
/// And at most this long.
const MAX_AGE: Duration = Duration::from_secs(24 * 60 * 60);
/// Without a `max-age`.
const DEFAULT_AGE: Duration = Duration::from_secs(60 * 60);
/// An unknown `kid` refetches a URL at most this often (the fetch at start and background
/// refreshes do not count), so forged `kid`s cannot hammer the identity provider.
pub(crate) const UNKNOWN_KID_EVERY: Duration = Duration::from_secs(30);
/// The first retry after a failure; it doubles to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(5 * 60);

/// A fetch as the shell reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The HTTP status.
    pub status: u16,
    /// The `Cache-Control` header, if any.
    pub cache_control: Option<String>,
    /// The body.
    pub body: Vec<u8>,
}

/// What a fetch changed, for the hub to carry out.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Learned {
    /// A key set came (or changed): use every set now.
    Keys { url: String, keys: usize },
    /// An issuer's metadata (at `metadata`) named its key set: fetch it now.
    Discovered { metadata: String, jwks: String },
    /// A fetch failed or its document was refused: the last good keys stay.
    Failed { url: String, why: String },
    /// A fetch nobody waits for any more.
    Nothing,
}

#[derive(Debug)]
struct Source {
    origin: KeySource,
    /// An issuer's metadata locations, in the order MCP gives, and the next to try.
    discovery: Vec<String>,
    next_discovery: usize,
    /// The key set's URL, given or discovered.
    jwks_uri: Option<String>,
    /// The last good key set.
    keys: Option<String>,
    /// When to fetch next (none while a fetch is under way or the source is dead).
    due: Option<Instant>,
    in_flight: Option<(FetchId, String)>,
    failures: u32,
    /// The last refetch an unknown `kid` caused.
    unknown_kid_at: Option<Instant>,
    /// Its metadata named another issuer: never trusted.
    dead: bool,
}

/// The key sets part.
#[derive(Debug, Default)]
pub(crate) struct KeySets {
    sources: Vec<Source>,
}

impl KeySets {
    pub(crate) fn new(origins: &[KeySource], now: Instant) -> KeySets {
        let sources = origins
            .iter()
            .map(|origin| Source {
                discovery: match origin {
                    KeySource::Issuer(issuer) => discovery_urls(issuer),
                    KeySource::Jwks { .. } => Vec::new(),
                },
                jwks_uri: match origin {
                    KeySource::Jwks { url, .. } => Some(url.clone()),
                    KeySource::Issuer(_) => None,
                },
                origin: origin.clone(),
                next_discovery: 0,
                keys: None,
                due: Some(now),
                in_flight: None,
                failures: 0,
                unknown_kid_at: None,
                dead: false,
            })
            .collect();
        KeySets { sources }
    }

    /// A reload's key sources: a source that stays keeps its keys, schedule and backoff;
    /// a new one is fetched now; one that went is forgotten (its fetch under way too).
    pub(crate) fn reconcile(&mut self, origins: &[KeySource], now: Instant) {
        let mut old = std::mem::take(&mut self.sources);
        self.sources = KeySets::new(origins, now)
            .sources
            .into_iter()
            .map(
                |fresh| match old.iter().position(|s| s.origin == fresh.origin) {
                    Some(i) => old.swap_remove(i),
                    None => fresh,
                },
            )
            .collect();
    }

    /// Whether any key set was fetched.
    pub(crate) fn available(&self) -> bool {
        self.sources.iter().any(|s| s.keys.is_some())
    }

    /// Whether keys come from URLs at all.
    pub(crate) fn configured(&self) -> bool {
        !self.sources.is_empty()
    }

    /// Every good key set, with the issuer whose tokens it verifies.
    pub(crate) fn sets(&self) -> Vec<KeySet> {
        let sets = self.sources.iter().filter_map(|s| {
            s.keys.as_ref().map(|jwks| KeySet {
                issuer: s.origin.issuer().map(str::to_owned),
                jwks: jwks.clone(),
            })
        });
        sets.collect()
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.sources.iter().filter_map(|s| s.due).min()
    }

    /// Starts fetching every key set (or metadata) due at `now` ([`Output::Fetch`]), the
    /// fetches numbered from `next_id`.
    pub(crate) fn start_due(
        &mut self,
        now: Instant,
        next_id: &mut u64,
        out: &mut impl Extend<Output>,
    ) {
        let due = |s: &&mut Source| s.due.is_some_and(|at| at <= now);
        for source in self.sources.iter_mut().filter(due) {
            let url = match &source.jwks_uri {
                Some(url) => url.clone(),
                None => source.discovery[source.next_discovery].clone(),
            };
            let fetch = FetchId(*next_id);
            *next_id += 1;
            source.due = None;
            source.in_flight = Some((fetch, url.clone()));
            out.extend([Output::Fetch { fetch, url }]);
        }
    }

    /// A token claiming to be from `issuer` named a `kid` none of that issuer's key sets
    /// has: refetch each of them (its own source, and a key set for any issuer) not fetched
    /// for that reason in the last [`UNKNOWN_KID_EVERY`]; another issuer's source is not
    /// touched. True if any is due now.
    pub(crate) fn unknown_kid(&mut self, now: Instant, issuer: &str) -> bool {
        let mut any = false;
        for s in &mut self.sources {
            let recent = s
                .unknown_kid_at
                .is_some_and(|at| now.saturating_duration_since(at) < UNKNOWN_KID_EVERY);
            let other = s.origin.issuer().is_some_and(|own| own != issuer);
            if other || s.dead || s.jwks_uri.is_none() || s.in_flight.is_some() || recent {
                continue;
            }
            s.unknown_kid_at = Some(now);
            s.due = Some(now);
            any = true;
        }
        any
    }

    /// What fetch `fetch` brought.
    pub(crate) fn fetched(
        &mut self,
        now: Instant,
        fetch: FetchId,
        result: Result<Fetched, String>,
    ) -> Learned {
        let Some(source) = self
            .sources
            .iter_mut()
            .find(|s| s.in_flight.as_ref().is_some_and(|(f, _)| *f == fetch))
        else {
            return Learned::Nothing;
        };
        let (_, url) = source.in_flight.take().expect("found by it");
        match source.jwks_uri.is_some() {
            true => key_set(source, now, url, result),
            false => metadata(source, now, url, result),
        }
    }
}

/// A key set's answer: used when it holds usable keys, else a failure with backoff.
fn key_set(
    source: &mut Source,
    now: Instant,
    url: String,
    result: Result<Fetched, String>,
) -> Learned {
    let checked = result.and_then(|f| match f.status {
        200 => {
            let text = String::from_utf8(f.body).map_err(|_| "not UTF-8".to_owned())?;
            let keys = crate_check_jwks(&text)?;
            Ok((text, keys, max_age(f.cache_control.as_deref())))
        }
        status => Err(format!("status {status}")),
    });
    match checked {
        Ok((text, keys, age)) => {
            source.failures = 0;
            source.keys = Some(text);
            // Refreshed in the background before it expires.
            source.due = Some(now + age - age / 10);
            Learned::Keys { url, keys }
        }
        Err(why) => failed(source, now, url, why),
    }
}

/// An issuer's metadata: its `issuer` must be the configured one exactly, and it names the
/// key set. A location that does not answer with a document sends the next one.
fn metadata(
    source: &mut Source,
    now: Instant,
    url: String,
    result: Result<Fetched, String>,
) -> Learned {
    let KeySource::Issuer(issuer) = &source.origin else {
        return Learned::Nothing;
    };
    let document = result
        .ok()
        .filter(|f| f.status == 200)
        .and_then(|f| serde_json::from_slice::<serde_json::Value>(&f.body).ok());
    let Some(document) = document.filter(|d| d.get("issuer").is_some()) else {
        source.next_discovery += 1;
        if source.next_discovery < source.discovery.len() {
            source.due = Some(now);
            return Learned::Nothing;
        }
        source.next_discovery = 0;
        return failed(source, now, url, "no authorization server metadata".into());
    };
    if document["issuer"].as_str() != Some(issuer.as_str()) {
        source.dead = true;
        source.due = None;
        let why = format!(
            "its metadata names the issuer {} (configured: {issuer}): its tokens are never accepted",
            document["issuer"]
        );
        return Learned::Failed { url, why };
    }
    let jwks = document["jwks_uri"].as_str();
    let jwks = jwks
        .ok_or_else(|| "no jwks_uri".to_owned())
        .and_then(|jwks| {
            crate::oauth::check_fetchable(jwks)
                .map(|()| jwks)
                .map_err(|why| format!("its jwks_uri {jwks} {why}"))
        });
    match jwks {
        Ok(jwks) => {
            source.jwks_uri = Some(jwks.to_owned());
            source.due = Some(now);
            Learned::Discovered {
                metadata: url,
                jwks: jwks.to_owned(),
            }
        }
        Err(why) => failed(source, now, url, why),
    }
}

fn failed(source: &mut Source, now: Instant, url: String, why: String) -> Learned {
    source.failures = source.failures.saturating_add(1);
    let backoff = FIRST_RETRY
        .saturating_mul(1 << source.failures.saturating_sub(1).min(16))
        .min(MAX_RETRY);
    source.due = Some(now + backoff);
    Learned::Failed { url, why }
}

#[cfg(feature = "jwt")]
fn crate_check_jwks(text: &str) -> Result<usize, String> {
    crate::jwt::check_jwks(text)
}

#[cfg(not(feature = "jwt"))]
fn crate_check_jwks(_text: &str) -> Result<usize, String> {
    Err("this build has no JWT support".into())
}

/// How long a key set is kept: its `max-age` clamped to [5 min, 24 h], else 1 h.
fn max_age(cache_control: Option<&str>) -> Duration {
    let age = cache_control
        .into_iter()
        .flat_map(|v| v.split(','))
        .find_map(|d| {
            let (name, value) = d.trim().split_once('=')?;
            name.trim()
                .eq_ignore_ascii_case("max-age")
                .then(|| value.trim().trim_matches('"').parse::<u64>().ok())?
        });
    age.map_or(DEFAULT_AGE, |s| {
        Duration::from_secs(s).clamp(MIN_AGE, MAX_AGE)
    })
}

/// Where an issuer's metadata may be, in the order MCP 2025-11-25 gives.
pub(crate) fn discovery_urls(issuer: &str) -> Vec<String> {
    let issuer = issuer.trim_end_matches('/');
    let after_scheme = issuer.find("://").map_or(0, |i| i + 3);
    let (origin, path) = match issuer[after_scheme..].find('/') {
        Some(i) => issuer.split_at(after_scheme + i),
        None => (issuer, ""),
    };
    let mut urls = vec![
        format!("{origin}/.well-known/oauth-authorization-server{path}"),
        format!("{origin}/.well-known/openid-configuration{path}"),
    ];
    if !path.is_empty() {
        urls.push(format!("{origin}{path}/.well-known/openid-configuration"));
    }
    urls
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_order_ages_and_urls() {
        assert_eq!(
            discovery_urls("https://h/realms/a"),
            [
                "https://h/.well-known/oauth-authorization-server/realms/a",
                "https://h/.well-known/openid-configuration/realms/a",
                "https://h/realms/a/.well-known/openid-configuration",
            ]
        );
        assert_eq!(
            discovery_urls("https://h/"),
            [
                "https://h/.well-known/oauth-authorization-server",
                "https://h/.well-known/openid-configuration",
            ]
        );
        assert_eq!(max_age(Some("public, max-age=60")), MIN_AGE);
        assert_eq!(max_age(Some("max-age=7200")), Duration::from_secs(7200));
        assert_eq!(max_age(Some("max-age=999999")), MAX_AGE);
        assert_eq!(max_age(None), DEFAULT_AGE);
    }
}
