//! Rate limits (SPEC section 10): token buckets per principal over all requests and per
//! principal and tool, driven by `now`, at most [`MAX_BUCKETS`] of them (the least recently
//! used forgotten). A bucket holds N tokens and refills continuously at N per period.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::principal::Principal;
use crate::settings::Rate;

/// Buckets kept at most; past it the least recently used go (so a flood of principals
/// cannot grow memory).
pub(crate) const MAX_BUCKETS: usize = 100_000;

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
    /// Its place in the use order.
    used: u64,
}

/// The buckets part.
#[derive(Debug, Default)]
pub(crate) struct Buckets {
    /// By principal, and tool (`None`: every request).
    buckets: BTreeMap<(Principal, Option<String>), Bucket>,
    /// Use order, oldest first.
    order: BTreeMap<u64, (Principal, Option<String>)>,
    next_use: u64,
}

impl Buckets {
    /// Takes a token from `principal`'s bucket (of `tool`, when given) at `rate`: `Ok`, or
    /// how long until one is there.
    pub(crate) fn take(
        &mut self,
        now: Instant,
        principal: &Principal,
        tool: Option<&str>,
        rate: Rate,
    ) -> Result<(), Duration> {
        let key = (principal.clone(), tool.map(str::to_owned));
        let capacity = f64::from(rate.tokens);
        let per_second = capacity / rate.period.as_secs_f64();
        self.next_use += 1;
        let used = self.next_use;
        let bucket = match self.buckets.get_mut(&key) {
            Some(bucket) => {
                self.order.remove(&bucket.used);
                bucket
            }
            None => {
                if self.buckets.len() >= MAX_BUCKETS {
                    if let Some((_, oldest)) = self.order.pop_first() {
                        self.buckets.remove(&oldest);
                    }
                }
                let fresh = Bucket {
                    tokens: capacity,
                    at: now,
                    used,
                };
                self.buckets.entry(key.clone()).or_insert(fresh)
            }
        };
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * per_second).min(capacity);
        bucket.at = now;
        bucket.used = used;
        self.order.insert(used, key);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        Err(Duration::from_secs_f64((1.0 - bucket.tokens) / per_second))
    }

    /// Gives back the token just taken from `principal`'s bucket of `tool` (the request was
    /// refused by another limit, so it does not count).
    pub(crate) fn refund(&mut self, principal: &Principal, tool: Option<&str>) {
        let key = (principal.clone(), tool.map(str::to_owned));
        if let Some(bucket) = self.buckets.get_mut(&key) {
            bucket.tokens += 1.0;
        }
    }

    /// Buckets held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.buckets.len()
    }
}

/// `Retry-After` for a wait: whole seconds, rounded up, at least 1.
pub(crate) fn retry_after(wait: Duration) -> u64 {
    wait.as_secs_f64().ceil().max(1.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_refill_and_bound() {
        #[allow(clippy::disallowed_methods)] // the test's one origin of time
        let t0 = Instant::now();
        let rate = Rate {
            tokens: 2,
            period: Duration::from_secs(10),
        };
        let alice = Principal::new("alice");
        let mut b = Buckets::default();
        assert!(b.take(t0, &alice, None, rate).is_ok());
        assert!(b.take(t0, &alice, None, rate).is_ok());
        let wait = b.take(t0, &alice, None, rate).unwrap_err();
        assert_eq!(retry_after(wait), 5);
        assert!(b
            .take(t0 + Duration::from_secs(5), &alice, None, rate)
            .is_ok());
        assert!(b.take(t0, &Principal::new("bob"), None, rate).is_ok());
        assert!(b.take(t0, &alice, Some("t"), rate).is_ok());
        assert_eq!(b.len(), 3);
    }
}
