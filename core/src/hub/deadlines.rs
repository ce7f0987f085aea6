//! One set of deadlines keyed by what they are for, with cancel-on-remove: setting a key
//! again moves its deadline, removing it cancels it, so a set holds at most one entry per
//! key and is bounded by what is live, never by history.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

/// Deadlines by key, due in (instant, key) order.
#[derive(Debug)]
pub(crate) struct Deadlines<K: Ord + Clone> {
    by_time: BTreeSet<(Instant, K)>,
    by_key: BTreeMap<K, Instant>,
}

impl<K: Ord + Clone> Default for Deadlines<K> {
    fn default() -> Self {
        Deadlines {
            by_time: BTreeSet::new(),
            by_key: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Clone> Deadlines<K> {
    /// Sets (or moves) `key`'s deadline to `at`.
    pub(crate) fn set(&mut self, key: K, at: Instant) {
        if let Some(old) = self.by_key.insert(key.clone(), at) {
            self.by_time.remove(&(old, key.clone()));
        }
        self.by_time.insert((at, key));
    }

    /// Cancels `key`'s deadline, if it has one.
    pub(crate) fn remove(&mut self, key: &K) {
        if let Some(at) = self.by_key.remove(key) {
            self.by_time.remove(&(at, key.clone()));
        }
    }

    /// `key`'s deadline.
    pub(crate) fn get(&self, key: &K) -> Option<Instant> {
        self.by_key.get(key).copied()
    }

    /// The earliest deadline.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.by_time.first().map(|(at, _)| *at)
    }

    /// Takes the earliest entry if it is due at `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<(Instant, K)> {
        let (at, _) = self.by_time.first()?;
        if *at > now {
            return None;
        }
        let (at, key) = self.by_time.pop_first()?;
        self.by_key.remove(&key);
        Some((at, key))
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Cancels everything.
    pub(crate) fn clear(&mut self) {
        self.by_time.clear();
        self.by_key.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn one_entry_per_key_in_time_order() {
        #[allow(clippy::disallowed_methods)] // the test's one origin of time
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let mut d = Deadlines::default();
        d.set("b", at(2));
        d.set("a", at(3));
        d.set("b", at(5));
        assert_eq!((d.len(), d.next()), (2, Some(at(3))));
        d.remove(&"a");
        assert_eq!(d.pop_due(at(4)), None);
        assert_eq!(d.pop_due(at(5)), Some((at(5), "b")));
        assert_eq!(d.len(), 0);
    }
}
