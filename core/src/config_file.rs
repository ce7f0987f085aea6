//! `--config FILE` (SPEC section 10): a TOML table whose keys are the long flags without
//! `--`, merged under the command line. The file's keys become command-line tokens for the
//! flags the command line did not give, and [`Config`]'s one clap definition parses the
//! whole again, so the file accepts exactly what the flags accept. A relative path in the
//! file is taken from the file's folder; one on the command line from the working folder.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, CommandFactory, FromArgMatches, ValueHint};

use crate::config::Config;
use crate::load::Loaded;

/// The command line as given, kept to merge the config file under it again on reload.
#[derive(Debug, Clone)]
pub struct CommandLine {
    name: &'static str,
    args: Vec<OsString>,
}

impl CommandLine {
    /// Parses the process arguments for the binary `name` with the `--config` file merged
    /// under them (`read` reads it), exiting with status 2 and a message naming the flag,
    /// or the file and key, when one is missing, malformed or out of range. The command
    /// line is kept: it merges the file again on reload.
    pub fn from_args(
        name: &'static str,
        read: impl FnMut(&Path) -> std::io::Result<String>,
    ) -> (Config, CommandLine) {
        let line = CommandLine::from_env(name);
        match line.config(read) {
            Ok(config) => (config, line),
            Err(e) => Config::command()
                .name(name)
                .bin_name(name)
                .error(clap::error::ErrorKind::ValueValidation, e)
                .exit(),
        }
    }

    /// The process arguments of the binary `name`, exiting with status 2 and clap's
    /// message when they do not parse (so a reload never fails on them).
    pub fn from_env(name: &'static str) -> CommandLine {
        CommandLine::new(name, std::env::args_os()).unwrap_or_else(|e| e.exit())
    }

    /// `args` (the program name first) for the binary `name`, or clap's error.
    pub fn new(
        name: &'static str,
        args: impl IntoIterator<Item = impl Into<OsString>>,
    ) -> Result<CommandLine, clap::Error> {
        let line = CommandLine {
            name,
            args: args.into_iter().map(Into::into).collect(),
        };
        line.command().try_get_matches_from(&line.args)?;
        Ok(line)
    }

    /// The flags: the command line over the config file (read with `read`), validated.
    pub fn config(
        &self,
        mut read: impl FnMut(&Path) -> std::io::Result<String>,
    ) -> Result<Config, String> {
        let command = self.command();
        let given = parse(&command, &self.args)?;
        let Some(file) = given.get_one::<PathBuf>("config").cloned() else {
            let config = Config::from_arg_matches(&given).map_err(|e| first_line(&e))?;
            config.validate().map_err(|e| e.to_string())?;
            return Ok(config);
        };
        let in_file = |problem: String| format!("--config {}: {problem}", file.display());
        let text = read(&file).map_err(|e| in_file(format!("cannot read it: {e}")))?;
        let table: toml::Table = text.parse().map_err(|e| in_file(toml_error(&text, &e)))?;
        let mut args = vec![self.args[0].clone()];
        for (key, value) in &table {
            let tokens = tokens(&command, &given, key, value, file.parent());
            args.extend(tokens.map_err(|e| in_file(format!("key `{key}`: {e}")))?);
        }
        args.extend(self.args[1..].iter().cloned());
        let merged = parse(&command, &args).map_err(in_file)?;
        let config = Config::from_arg_matches(&merged).map_err(|e| in_file(first_line(&e)))?;
        config.validate().map_err(|e| {
            let key = e.flag.trim_start_matches('-');
            match table.contains_key(key) && !from_command_line(&given, &command, key) {
                true => in_file(format!("key `{key}`: {}", e.problem)),
                false => e.to_string(),
            }
        })?;
        Ok(config)
    }

    /// [`CommandLine::config`], then every file the flags name: what the proxy runs with.
    pub fn load(
        &self,
        mut read: impl FnMut(&Path) -> std::io::Result<String>,
    ) -> Result<Loaded, String> {
        self.config(&mut read)?.load(read)
    }

    /// What a SIGHUP loads: as [`CommandLine::load`], but every flag that needs a restart
    /// stays as `running` has it, and is named in [`Loaded::ignored`] if it changed.
    pub fn reload(
        &self,
        mut read: impl FnMut(&Path) -> std::io::Result<String>,
        running: &Config,
    ) -> Result<Loaded, String> {
        let (config, ignored) = self.config(&mut read)?.for_reload(running);
        let mut loaded = config.load(read)?;
        loaded.ignored = ignored;
        Ok(loaded)
    }

    fn command(&self) -> clap::Command {
        Config::command().name(self.name).bin_name(self.name)
    }
}

fn parse(command: &clap::Command, args: &[OsString]) -> Result<ArgMatches, String> {
    command
        .clone()
        .try_get_matches_from(args)
        .map_err(|e| first_line(&e))
}

/// The command-line tokens for one key of the file: none when the command line gave the
/// flag or one that cannot go with it (it wins), else `--key=value` for each value.
fn tokens(
    command: &clap::Command,
    given: &ArgMatches,
    key: &str,
    value: &toml::Value,
    folder: Option<&Path>,
) -> Result<Vec<OsString>, String> {
    let arg = flag(command, key)?;
    if from_command_line(given, command, key) || overruled(command, given, arg) {
        return Ok(Vec::new());
    }
    let token = |value: &toml::Value| {
        let text = scalar(arg, value, folder)?;
        let mut token = OsString::from(format!("--{key}="));
        token.push(text);
        Ok::<_, String>(token)
    };
    let tokens = match (arg.get_action(), value) {
        (ArgAction::SetTrue, toml::Value::Boolean(on)) => {
            on.then(|| format!("--{key}").into()).into_iter().collect()
        }
        (ArgAction::SetTrue, other) => {
            return Err(format!("expected true or false, not {}", kind(other)))
        }
        (ArgAction::Append, toml::Value::Array(items)) => {
            items.iter().map(token).collect::<Result<_, _>>()?
        }
        (_, toml::Value::Array(_)) => return Err("takes one value, not an array".to_owned()),
        (_, one) => vec![token(one)?],
    };
    // Each value is checked by its flag's own parser, so an error names this key.
    let mut alone = vec![OsString::from("switchboard")];
    alone.extend(tokens.iter().cloned());
    parse(command, &alone)?;
    Ok(tokens)
}

/// The flag a key names: a long flag of [`Config`] that is not hidden, not `--config`.
fn flag<'c>(command: &'c clap::Command, key: &str) -> Result<&'c Arg, String> {
    match key {
        "config" => return Err("a config file cannot name another".to_owned()),
        "command" => return Err("the backend command goes after `--` on the command line".into()),
        _ => {}
    }
    command
        .get_arguments()
        .find(|arg| arg.get_long() == Some(key) && !arg.is_hide_set())
        .ok_or_else(|| "unknown key (keys are the long flags without --, see --help)".to_owned())
}

/// Whether the command line gave a flag that conflicts with `arg` (`--listen` with a file's
/// `port`, say), either way round.
fn overruled(command: &clap::Command, given: &ArgMatches, arg: &Arg) -> bool {
    let on_line =
        |a: &Arg| given.value_source(a.get_id().as_str()) == Some(ValueSource::CommandLine);
    let conflicts = |a: &Arg| command.get_arg_conflicts_with(a).into_iter();
    conflicts(arg).any(on_line)
        || (command.get_arguments())
            .filter(|a| on_line(a))
            .any(|a| conflicts(a).any(|c| c.get_id() == arg.get_id()))
}

fn from_command_line(given: &ArgMatches, command: &clap::Command, key: &str) -> bool {
    let id = command
        .get_arguments()
        .find(|arg| arg.get_long() == Some(key))
        .map(|arg| arg.get_id().as_str());
    id.and_then(|id| given.value_source(id)) == Some(ValueSource::CommandLine)
}

/// One value as its flag reads it (a string or an integer); a relative path is joined to
/// the config file's `folder`.
fn scalar(arg: &Arg, value: &toml::Value, folder: Option<&Path>) -> Result<OsString, String> {
    let text = match value {
        toml::Value::String(text) => text.clone(),
        toml::Value::Integer(n) => n.to_string(),
        other => {
            return Err(format!(
                "expected a string or a number, not {}",
                kind(other)
            ))
        }
    };
    let path = matches!(
        arg.get_value_hint(),
        ValueHint::AnyPath | ValueHint::FilePath | ValueHint::DirPath
    );
    Ok(match folder {
        Some(folder) if path && Path::new(&text).is_relative() => folder.join(&text).into(),
        _ => text.into(),
    })
}

fn kind(value: &toml::Value) -> &'static str {
    match value {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a float",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a date",
        toml::Value::Array(_) => "an array",
        toml::Value::Table(_) => "a table",
    }
}

/// A TOML syntax error on one line: what, and where.
fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim().replace('\n', " ");
    match e.span() {
        Some(span) => {
            let line = 1 + text.as_bytes()[..span.start.min(text.len())]
                .iter()
                .filter(|&&b| b == b'\n')
                .count();
            format!("not TOML (line {line}): {message}")
        }
        None => format!("not TOML: {message}"),
    }
}

/// An error's first line without clap's `error: `.
fn first_line(e: &impl std::fmt::Display) -> String {
    let text = e.to_string();
    let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    line.trim_start_matches("error: ").trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flags of `args` over `file` (at /etc/sb/switchboard.toml).
    fn merge(file: &str, args: &[&str]) -> Result<Config, String> {
        let mut argv = vec!["switchboard", "--config", "/etc/sb/switchboard.toml"];
        argv.extend(args);
        let line = CommandLine::new("switchboard", argv).map_err(|e| e.to_string())?;
        line.config(|path| match path.to_str() {
            Some("/etc/sb/switchboard.toml") => Ok(file.to_owned()),
            _ => Err(std::io::ErrorKind::NotFound.into()),
        })
    }

    #[test]
    fn the_command_line_wins() {
        let file = "rate-limit = \"60/min\"\nmax-sessions = 5\nport = 9000\n";
        let config = merge(file, &["--rate-limit", "5/s"]).unwrap();
        assert_eq!(config.rate_limit, Some("5/s".parse().unwrap()));
        assert_eq!(config.max_sessions, 5);
        assert_eq!(config.port, Some(9000));
        let config = merge(file, &[]).unwrap();
        assert_eq!(config.rate_limit, Some("60/min".parse().unwrap()));
        // A flag that cannot go with a file's key wins too, either way round.
        let config = merge(file, &["--listen", "127.0.0.1:1234"]).unwrap();
        assert_eq!((config.port, config.listen_addr().port()), (None, 1234));
        let config = merge("listen = \"127.0.0.1:1\"", &["--port", "2"]).unwrap();
        assert_eq!((config.listen, config.port), (None, Some(2)));
        assert!(merge("listen = \"127.0.0.1:1\"\nport = 2", &[]).is_err());
    }

    #[test]
    fn a_reload_keeps_what_needs_a_restart_and_builds_nothing_from_it() {
        let running = merge("port = 9000\nallow-unauthenticated = true\n", &[]).unwrap();
        // Moving off loopback without auth would be refused at start; on a reload the
        // address is not in force, so the rest loads, the listener's Host check stays on,
        // and the change is named.
        let moved = "listen = \"0.0.0.0:9001\"\nrate-limit = \"5/s\"\ninstance = \"b\"\n";
        let line = CommandLine::new(
            "switchboard",
            ["switchboard", "--config", "/etc/sb/switchboard.toml"],
        )
        .unwrap();
        let loaded = line.reload(|_| Ok(moved.to_owned()), &running).unwrap();
        assert_eq!(loaded.config.listen_addr(), running.listen_addr());
        assert_eq!(loaded.config.instance, None);
        assert_eq!(loaded.config.rate_limit, Some("5/s".parse().unwrap()));
        assert_eq!(loaded.ignored, ["--listen/--host/--port", "--instance"]);
        assert!(loaded.front.gate.origins.loopback_bind);
        assert!(line.load(|_| Ok(moved.to_owned())).is_err());
    }

    #[test]
    fn the_backend_window_is_a_key_and_a_setting() {
        let config = merge("backend-window = 8\n", &[]).unwrap();
        assert_eq!(config.settings().backend_window, 8);
        let config = merge("", &[]).unwrap();
        assert_eq!(config.settings().backend_window, 64, "the default");
        let e = merge("backend-window = 0\n", &[]).unwrap_err();
        assert!(
            e.contains("key `backend-window`") && e.contains("out of range"),
            "{e}"
        );
    }

    #[test]
    fn arrays_and_switches() {
        let file = "allow-origin = [\"https://a\", \"https://b\"]\nmetrics-auth = true\nallow-unauthenticated = false\n";
        let config = merge(file, &[]).unwrap();
        assert_eq!(config.allow_origins, ["https://a", "https://b"]);
        assert!(config.metrics_auth && !config.allow_unauthenticated);
        // A repeatable flag on the command line replaces the file's values.
        let config = merge(file, &["--allow-origin", "https://c"]).unwrap();
        assert_eq!(config.allow_origins, ["https://c"]);
        let config = merge("tool-rate-limit = [\"a=1/s\"]\n", &["--", "cmd", "-x"]).unwrap();
        assert_eq!(config.tool_rate_limits.len(), 1);
        assert_eq!(config.command, ["cmd", "-x"]);
    }

    #[test]
    fn relative_paths_are_the_files_folder() {
        let config = merge(
            "auth-tokens = \"tokens.txt\"\njwt-jwks = \"/k/jwks.json\"",
            &[],
        );
        let config = config.unwrap();
        assert_eq!(
            config.auth_tokens.as_deref(),
            Some(Path::new("/etc/sb/tokens.txt"))
        );
        assert_eq!(config.jwt_jwks.as_deref(), Some(Path::new("/k/jwks.json")));
        let config = merge(
            "auth-tokens = \"tokens.txt\"",
            &["--auth-tokens", "mine.txt"],
        );
        assert_eq!(
            config.unwrap().auth_tokens.as_deref(),
            Some(Path::new("mine.txt"))
        );
    }

    #[test]
    fn errors_name_the_file_and_key() {
        let error = |file: &str| merge(file, &[]).unwrap_err();
        let e = error("no-such-flag = 1");
        assert!(
            e.starts_with("--config /etc/sb/switchboard.toml: key `no-such-flag`: unknown key"),
            "{e}"
        );
        assert!(error("config = \"other.toml\"").contains("key `config`"));
        assert!(error("command = [\"x\"]").contains("after `--`"));
        assert!(error("demo-backend = true").contains("unknown key"));
        assert!(error("metrics-auth = \"yes\"").contains("expected true or false"));
        assert!(error("max-body = 1.5").contains("not a float"));
        assert!(error("port = [1]").contains("not an array"));
        let e = error("rate-limit = \"lots\"");
        assert!(e.contains("key `rate-limit`") && e.contains("lots"), "{e}");
        let e = error("max-inflight = 0");
        assert!(
            e.contains("key `max-inflight`") && e.contains("out of range"),
            "{e}"
        );
        let e = error("port = 1\nport = ");
        assert!(
            e.starts_with("--config /etc/sb/switchboard.toml: not TOML (line 2): "),
            "{e}"
        );
        let missing = CommandLine::new("switchboard", ["sb", "--config", "/none.toml"]);
        let e = missing
            .unwrap()
            .config(|_| Err(std::io::ErrorKind::NotFound.into()))
            .unwrap_err();
        assert!(e.starts_with("--config /none.toml: cannot read it"), "{e}");
    }

    #[test]
    fn load_reads_the_files_the_file_names() {
        let line = CommandLine::new("switchboard", ["sb", "--config", "conf/sb.toml"]).unwrap();
        let loaded = line.load(|path| match path.to_str() {
            Some("conf/sb.toml") => Ok("auth-tokens = \"tokens.txt\"\nrate-limit = 2".into()),
            Some("conf/tokens.txt") => Ok("alice 0123456789abcdef0123\n".into()),
            _ => Err(std::io::ErrorKind::NotFound.into()),
        });
        let loaded = loaded.unwrap_err();
        assert!(loaded.contains("key `rate-limit`"), "{loaded}");
        let line = CommandLine::new("switchboard", ["sb", "--config", "conf/sb.toml"]).unwrap();
        let loaded = line.load(|path| match path.to_str() {
            Some("conf/sb.toml") => Ok("auth-tokens = \"tokens.txt\"".into()),
            Some("conf/tokens.txt") => Ok("alice 0123456789abcdef0123\n".into()),
            _ => Err(std::io::ErrorKind::NotFound.into()),
        });
        let loaded = loaded.unwrap();
        let principals = loaded.front.gate.auth.principals();
        assert!(principals.contains(&crate::Principal::new("alice")));
        assert_eq!(loaded.settings.max_sessions_per_principal, 1000);
    }
}
