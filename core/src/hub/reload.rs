//! A reload (SIGHUP, SPEC section 10): the settings replaced whole, the parts that keep a
//! copy told, the key sets kept where their sources stayed, and the sessions of principals
//! the new auth no longer names ended.

use std::time::Instant;

use super::Hub;
use crate::output::{CloseReason, Event, Output};
use crate::settings::Reload;

impl Hub {
    /// The configuration was read again and checked whole ([`Reload`]): every setting is
    /// replaced at once (but `instance`, which needs a restart), sessions of principals
    /// the new auth cannot name end, and the key sets fetched so far go to the new gate
    /// ([`Output::UseKeys`]). A shell lets the new gate take requests only after it has
    /// performed these outputs, so it never runs without the fetched keys.
    pub fn handle_reload(&mut self, now: Instant, reload: Reload) {
        let Reload {
            mut settings,
            principals,
            ignored,
        } = reload;
        settings.instance = self.settings.instance;
        let old = std::mem::replace(&mut self.settings, settings);
        self.sessions.set_max(self.settings.max_sessions);
        self.streams.set_keepalive(self.settings.keepalive);
        self.listeners.set_keepalive(self.settings.keepalive);
        self.backend.reconfigure(&self.settings);
        self.tasks.set_max(self.settings.max_tasks_per_owner);
        // Another set of shown tools: every client lists them again (SPEC section 16).
        let list_cache = self.settings.list_cache;
        (self.router.lists).configure(list_cache.is_some(), list_cache.unwrap_or_default());
        if old.tool_view != self.settings.tool_view {
            self.router.lists.clear(false);
            // The new view names the backend's tools: they are read again for it.
            if self.router.handshake_result().is_some() {
                super::dispatch::read_backend_tools(super::dispatch::reader!(self), now);
            }
            let changed = "notifications/tools/list_changed";
            let message = format!(r#"{{"jsonrpc":"2.0","method":"{changed}"}}"#);
            self.list_changed(now, changed, message.as_bytes());
        }
        self.metrics.reloads += 1;
        self.outputs
            .push_back(Output::Log(Event::Reloaded { ignored }));
        // Key sources that stayed keep their keys; the new gate gets every set in hand.
        if old.key_sources != self.settings.key_sources {
            self.keys.reconcile(&self.settings.key_sources, now);
        }
        if self.keys.configured() {
            let sets = self.keys.sets().into();
            self.outputs.push_back(Output::UseKeys { sets });
        }
        self.keys
            .start_due(now, &mut self.next_id, &mut self.outputs);
        let revoked: Vec<_> = self
            .sessions
            .iter()
            .filter(|(_, session)| !principals.contains(&session.principal))
            .map(|(number, _)| number)
            .collect();
        for number in revoked {
            self.end_session(now, number, CloseReason::Revoked);
        }
        // Their listen streams too: each counts as a session (SPEC sections 10 and 13).
        let parts = (&mut self.sessions, &mut self.outputs);
        let released = (self.listeners).end_where(now, parts, |p| !principals.contains(p));
        let upstream = super::listen::upstream!(self);
        super::listen::unsubscribe_unwatched(&self.sessions, upstream, now, released);
    }

    /// A reload was refused (a file missing or invalid): the running configuration stays
    /// whole; counted and logged.
    pub fn handle_reload_failed(&mut self, _now: Instant, why: String) {
        self.metrics.reload_failures += 1;
        self.outputs
            .push_back(Output::Log(Event::ReloadFailed { why }));
    }
}
