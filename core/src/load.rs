//! What the proxy runs with, loaded the same way at start and on SIGHUP (SPEC section 10):
//! the command line with the `--config` file merged under it
//! ([`CommandLine`](crate::CommandLine), feature `cli`), then every file the flags name,
//! read through the shell's `read` and checked whole ([`Config::load`]) into one
//! [`Loaded`]. A reload replaces the running [`Loaded`] whole or
//! not at all: the shells swap [`Front`], the hub takes [`Reload`]. Anything added to
//! [`Settings`] or [`Front`] is therefore loaded at start and reloaded with no more code.

use std::path::Path;
use std::sync::Arc;

use crate::config::Config;
use crate::framing::Limits;
use crate::http::Gate;
use crate::settings::{Reload, Settings};

/// What every request handler of a shell reads: the gate and the per-request limits.
#[derive(Debug)]
pub struct Front {
    /// Who may ask what.
    pub gate: Gate,
    /// `--max-body`.
    pub max_body: usize,
    /// The HTTP/1.1 framing bounds (`--header-timeout`, `--max-pipelined`).
    pub framing: Limits,
}

/// The flags, the files they name, and what is built of them, checked whole.
#[derive(Debug)]
pub struct Loaded {
    /// The flags, the config file merged in.
    pub config: Config,
    /// For the shells' request handlers.
    pub front: Arc<Front>,
    /// For the hub.
    pub settings: Settings,
    /// Flags a reload found changed that need a restart (kept as the proxy started).
    pub ignored: Vec<&'static str>,
}

impl Config {
    /// Everything the proxy runs with, from these flags and the files they name (`read`
    /// reads one): the one function start and reload both use, so they cannot differ.
    pub fn load(
        self,
        mut read: impl FnMut(&Path) -> std::io::Result<String>,
    ) -> Result<Loaded, String> {
        let front = Front {
            gate: self.gate(&mut read)?,
            max_body: self.max_body,
            framing: self.framing(),
        };
        Ok(Loaded {
            front: Arc::new(front),
            settings: self.settings_with(&mut read)?,
            config: self,
            ignored: Vec::new(),
        })
    }

    /// A reload's flags: these, with every flag a running proxy cannot change (SPEC section
    /// 10) kept as `running` has it (so that nothing is built from a value not in force),
    /// and the names of those that differed. One list, so that what is kept and what is
    /// reported cannot drift apart.
    pub fn for_reload(mut self, running: &Config) -> (Config, Vec<&'static str>) {
        let mut ignored = Vec::new();
        if self.listen_addr() != running.listen_addr() {
            ignored.push("--listen/--host/--port");
        }
        (self.listen, self.host, self.port) = (running.listen, running.host, running.port);
        macro_rules! keep {
            ($name:literal: $($field:ident),+) => {
                if $(self.$field != running.$field)||+ {
                    ignored.push($name);
                }
                $(self.$field.clone_from(&running.$field);)+
            };
        }
        keep!("--instance": instance);
        keep!("--env": env);
        keep!("--max-line": max_line);
        keep!("--workers": workers);
        keep!("--log-level": log_level);
        keep!("--log-format": log_format);
        keep!("--audit-log": audit_log);
        keep!("--audit-buffer": audit_buffer);
        keep!("--otlp-endpoint": otlp_endpoint);
        keep!("the backend command": demo_backend, command);
        (self, ignored)
    }
}

impl Loaded {
    /// What is worth a warning at start: the flags' ([`Config::start_warnings`]), and each
    /// backend tool a renamed one shadows (SPEC section 16: it is hidden).
    pub fn start_warnings(&self) -> Vec<String> {
        let mut warnings = self.config.start_warnings();
        if let Some(view) = &self.settings.tool_view {
            for (renamed, shown) in view.shadowed() {
                warnings.push(format!(
                    "--tools-override shows tool {renamed:?} as {shown:?}: the backend's own {shown:?} is hidden (rename it too to keep it)"
                ));
            }
        }
        warnings
    }

    /// What the hub is told when this (loaded by
    /// [`CommandLine::reload`](crate::CommandLine::reload)) replaces the running
    /// configuration.
    pub fn reload(&self) -> Reload {
        Reload {
            settings: self.settings.clone(),
            principals: self.front.gate.auth.principals(),
            ignored: self.ignored.clone(),
        }
    }
}
