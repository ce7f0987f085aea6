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
                self.outputs
                    .push_back(Output::Log(Event::KeysFetched { url, keys }));
                let sets = self.keys.sets().into();
                self.outputs.push_back(Output::UseKeys { sets });
            }
            keys::Learned::Discovered { metadata, jwks } => {
                self.outputs
                    .push_back(Output::Log(Event::KeySetDiscovered { metadata, jwks }));
                self.keys
                    .start_due(now, &mut self.next_id, &mut self.outputs);
            }
            keys::Learned::Failed { url, why } => self
                .outputs
                .push_back(Output::Log(Event::KeysFailed { url, why })),
            keys::Learned::Nothing => {
                self.keys
                    .start_due(now, &mut self.next_id, &mut self.outputs);
            }
        }
    }
}
