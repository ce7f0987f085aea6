//! Key set fetches: what one brought, and which are due (SPEC section 9).

use std::time::Instant;

use super::keys::{self, Fetched};
use super::Hub;
use crate::output::{Event, FetchId, Output};

impl Hub {
    /// What an [`Output::Fetch`] brought (its status, `Cache-Control` and body), or why it
    /// failed.
    pub fn handle_fetched(
        &mut self,
        now: Instant,
        fetch: FetchId,
        result: Result<Fetched, String>,
    ) {
        match self.keys.fetched(now, fetch, result) {
            keys::Learned::Keys { url, keys } => {
                self.log(Event::KeysFetched { url, keys });
                let sets = self.keys.sets().into();
                self.outputs.push_back(Output::UseKeys { sets });
            }
            keys::Learned::Discovered { metadata, jwks } => {
                self.log(Event::KeySetDiscovered { metadata, jwks });
                self.key_timeouts(now);
            }
            keys::Learned::Failed { url, why } => self.log(Event::KeysFailed { url, why }),
            keys::Learned::Nothing => self.key_timeouts(now),
        }
    }

    /// Fetches every key set (or metadata) due at `now`.
    pub(super) fn key_timeouts(&mut self, now: Instant) {
        loop {
            let next = &mut self.next_id;
            let due = self.keys.start_due(now, || {
                *next += 1;
                FetchId(*next - 1)
            });
            let Some((fetch, url)) = due else {
                break;
            };
            self.outputs.push_back(Output::Fetch { fetch, url });
        }
    }
}
