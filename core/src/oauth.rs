//! Switchboard as an OAuth 2.1 resource server (SPEC section 9): the protected resource
//! metadata clients discover the authorization server from (RFC 9728), the challenges of a
//! 401 and a 403 `insufficient_scope`, and the resource URI tokens must be issued for.

use std::fmt::Write;

use crate::principal::AuthFailure;

/// Where clients find this resource's metadata: RFC 9728's well-known path.
pub(crate) const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// What the resource server says about itself, from the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceServer {
    /// The canonical resource URI (`--resource`, or the proxy's own URL).
    pub resource: String,
    /// Trusted authorization servers (`--oauth-issuer`), verbatim.
    pub issuers: Vec<String>,
    /// Scopes offered (`--oauth-scopes`).
    pub scopes: Vec<String>,
    /// Scopes every request needs (`--required-scope`).
    pub required: Vec<String>,
    /// Scopes a call of a tool needs (`--tool-scope`): tool pattern, scope.
    pub tool_scopes: Vec<(String, String)>,
    /// `resource_name` (`--resource-name`).
    pub name: String,
    /// `--public-url` without a trailing slash, if given: the origin of metadata URLs.
    pub public_url: Option<String>,
    /// `http://<listen address>`: the origin of metadata URLs without `--public-url` when a
    /// request's `Host` is missing or not a valid `host[:port]`.
    pub listen_origin: String,
    /// `--base-path`, without a trailing slash.
    pub base_path: String,
}

impl ResourceServer {
    /// The metadata document (RFC 9728 section 2), the same at every location.
    pub fn document(&self) -> String {
        serde_json::json!({
            "resource": self.resource,
            "authorization_servers": self.issuers,
            "bearer_methods_supported": ["header"],
            "scopes_supported": self.scopes,
            "resource_name": self.name,
        })
        .to_string()
    }

    /// Whether `path` (the whole request path) is a location of the document: the root,
    /// or the path-inserted location of the `/mcp` or `/sse` endpoint.
    pub fn is_metadata_path(&self, path: &str) -> bool {
        let Some(rest) = path.strip_prefix(METADATA_PATH) else {
            return false;
        };
        let rest = rest.trim_end_matches('/');
        rest.is_empty()
            || rest
                .strip_prefix(self.base_path.as_str())
                .is_some_and(|endpoint| endpoint == "/mcp" || endpoint == "/sse")
    }

    /// The absolute URL of the document for the endpoint asked (`/mcp`, or `/sse` for the
    /// legacy transport), its origin `--public-url`, else the request's `Host` when it is a
    /// valid `host[:port]` (anything else could break out of the challenge's quotes), else
    /// the listen address.
    pub fn metadata_url(&self, host: Option<&str>, streamable: bool) -> String {
        let origin = match (&self.public_url, host.filter(|h| valid_host(h))) {
            (Some(url), _) => origin_of(url).to_owned(),
            (None, Some(host)) => format!("http://{host}"),
            (None, None) => self.listen_origin.clone(),
        };
        let endpoint = if streamable { "/mcp" } else { "/sse" };
        format!("{origin}{METADATA_PATH}{}{endpoint}", self.base_path)
    }

    /// `WWW-Authenticate` for a 401: where the metadata is, the scopes every request needs,
    /// and why a presented token was refused.
    pub fn challenge(&self, metadata_url: &str, failure: AuthFailure) -> String {
        let mut out = format!("Bearer resource_metadata={}", quoted(metadata_url));
        if !self.required.is_empty() {
            let _ = write!(out, ", scope={}", quoted(&self.required.join(" ")));
        }
        if failure != AuthFailure::Missing {
            let _ = write!(
                out,
                ", error=\"invalid_token\", error_description={}",
                quoted(failure.reason())
            );
        }
        out
    }

    /// `WWW-Authenticate` for a 403: the scopes this request needs, so a client can step up.
    pub fn insufficient_scope(&self, metadata_url: &str, needed: &[String]) -> String {
        format!(
            "Bearer error=\"insufficient_scope\", scope={}, resource_metadata={}",
            quoted(&needed.join(" ")),
            quoted(metadata_url)
        )
    }

    /// The audiences a token must name one of: the resource, with and without a trailing
    /// slash on an empty path (clients normalise `https://h` to `https://h/`).
    pub fn audiences(&self) -> Vec<String> {
        let r = self.resource.trim_end_matches('/');
        let mut out = vec![self.resource.clone()];
        if origin_of(&self.resource).len() >= r.len() {
            for form in [r.to_owned(), format!("{r}/")] {
                if !out.contains(&form) {
                    out.push(form);
                }
            }
        }
        out
    }

    /// Every scope a request needs: the required ones, and those of the tool it calls.
    pub fn needed_scopes(&self, tool: Option<&str>) -> Vec<String> {
        let mut needed = self.required.clone();
        let of_tool = self
            .tool_scopes
            .iter()
            .filter(|(pattern, _)| tool.is_some_and(|tool| tool_matches(pattern, tool)));
        for (_, scope) in of_tool {
            if !needed.contains(scope) {
                needed.push(scope.clone());
            }
        }
        needed
    }
}

/// Why a key set or metadata URL may not be fetched, if it may not: it must be https, or
/// http to a loopback host, that is an IP literal in 127.0.0.0/8, `[::1]`, or `localhost`
/// (not `127.example`, nor `127.0.0.1@example`, whose host is `example`). A URL with user
/// information (`user@`) is refused, whatever its scheme.
pub fn check_fetchable(url: &str) -> Result<(), &'static str> {
    let (scheme, rest) = url.split_once("://").ok_or("is not an absolute URL")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return Err("has user information (`...@`): refused, the host after `@` would be asked");
    }
    let host = host_of(authority).ok_or("has no valid host[:port]")?;
    match scheme {
        "https" => Ok(()),
        "http" if is_loopback(host) => Ok(()),
        "http" => {
            Err("must be https: plain http only to a loopback host (127.0.0.0/8, [::1], localhost)")
        }
        _ => Err("must be https (or http to a loopback host)"),
    }
}

/// The host of a `host[:port]` authority (an IPv6 literal with its brackets), if the port
/// is a number and the host a name, an IPv4 or a bracketed IPv6 literal.
fn host_of(authority: &str) -> Option<&str> {
    let (host, port) = match authority.rfind(':') {
        Some(i) if !authority[i..].contains(']') => (&authority[..i], Some(&authority[i + 1..])),
        _ => (authority, None),
    };
    let digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit()); // `+80` parses as a u16
    if port.is_some_and(|p| p.is_empty() || !digits(p) || p.parse::<u16>().is_err()) {
        return None;
    }
    let valid = match host.strip_prefix('[') {
        Some(v6) => v6
            .strip_suffix(']')
            .is_some_and(|v6| v6.parse::<std::net::Ipv6Addr>().is_ok()),
        None => {
            (1..=253).contains(&host.len())
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
        }
    };
    valid.then_some(host)
}

/// Whether a `Host` header is a syntactically valid `host[:port]`.
pub(crate) fn valid_host(host: &str) -> bool {
    host_of(host).is_some()
}

/// Whether a host (as [`host_of`] gives it) is loopback: `localhost`, or an IP literal in
/// 127.0.0.0/8 or `::1`.
fn is_loopback(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let ip = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().map(std::net::IpAddr::from),
        None => host
            .parse::<std::net::Ipv4Addr>()
            .map(std::net::IpAddr::from),
    };
    ip.is_ok_and(|ip| ip.is_loopback())
}

/// `value` as an RFC 9110 quoted-string: `"` and `\` escaped.
fn quoted(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        if matches!(c, '"' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// `scheme://authority` of a URL.
fn origin_of(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(i) => &url[..after_scheme + i],
        None => url.trim_end_matches('/'),
    }
}

/// Whether a tool pattern of `--tool-scope` or `--tool-rate-limit` names `tool`: the
/// name, or a prefix ending in `*`.
pub(crate) fn tool_matches(pattern: &str, tool: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => tool.starts_with(prefix),
        None => tool == pattern,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> ResourceServer {
        ResourceServer {
            resource: "https://mcp.example".into(),
            issuers: vec!["https://idp.example/realms/a".into()],
            scopes: vec!["mcp:tools".into(), "mcp:read".into()],
            required: vec!["mcp:tools".into()],
            tool_scopes: vec![
                ("get_time".into(), "time:read".into()),
                ("admin_*".into(), "admin".into()),
            ],
            name: "Switchboard".into(),
            public_url: None,
            listen_origin: "http://127.0.0.1:8000".into(),
            base_path: "/p".into(),
        }
    }

    #[test]
    fn metadata_locations_and_challenges() {
        let s = server();
        assert!(s.is_metadata_path("/.well-known/oauth-protected-resource"));
        assert!(s.is_metadata_path("/.well-known/oauth-protected-resource/p/mcp"));
        assert!(s.is_metadata_path("/.well-known/oauth-protected-resource/p/sse/"));
        assert!(!s.is_metadata_path("/.well-known/oauth-protected-resource/mcp"));
        let url = s.metadata_url(Some("127.0.0.1:8000"), true);
        assert_eq!(
            url,
            "http://127.0.0.1:8000/.well-known/oauth-protected-resource/p/mcp"
        );
        assert_eq!(
            s.challenge(&url, AuthFailure::Missing),
            format!("Bearer resource_metadata=\"{url}\", scope=\"mcp:tools\"")
        );
        assert!(s
            .challenge(&url, AuthFailure::Expired)
            .contains("error=\"invalid_token\""));
        let doc: serde_json::Value = serde_json::from_str(&s.document()).unwrap();
        assert_eq!(doc["resource"], "https://mcp.example");
        assert_eq!(doc["bearer_methods_supported"][0], "header");
        assert_eq!(
            s.audiences(),
            ["https://mcp.example", "https://mcp.example/"]
        );
        assert_eq!(s.needed_scopes(None), ["mcp:tools"]);
        assert_eq!(
            s.needed_scopes(Some("get_time")),
            ["mcp:tools", "time:read"]
        );
        assert_eq!(s.needed_scopes(Some("get_times")), ["mcp:tools"]);
        assert_eq!(s.needed_scopes(Some("admin_reset")), ["mcp:tools", "admin"]);
        assert!(check_fetchable("http://127.0.0.1:9000/jwks").is_ok());
        assert!(check_fetchable("http://localhost/jwks").is_ok());
        assert!(check_fetchable("http://idp.example/jwks").is_err());
        assert!(check_fetchable("https://idp.example/jwks").is_ok());
    }

    #[test]
    fn only_a_loopback_ip_literal_or_localhost_is_loopback() {
        for url in [
            "http://127.0.0.1:9000/jwks",
            "http://127.8.9.10/jwks",
            "http://localhost/jwks",
            "http://LOCALHOST:1/jwks",
            "http://[::1]:9000/jwks",
            "http://[::1]",
            "https://idp.example/jwks",
            "https://idp.example:8443",
        ] {
            assert_eq!(check_fetchable(url), Ok(()), "{url}");
        }
        for url in [
            // The host is what follows the user information (issue 30.9).
            "http://127.0.0.1@idp.example/jwks",
            "http://127.0.0.1:9000@idp.example/jwks",
            "http://localhost@idp.example/",
            "https://user:pass@idp.example/jwks",
            // A name that starts like a loopback address is a name.
            "http://127.idp.example/jwks",
            "http://127.0.0.1.idp.example/jwks",
            "http://localhost.idp.example/jwks",
            "http://0x7f.1/jwks",
            "http://[::ffff:127.0.0.1]/jwks",
            "http://[127.0.0.1]/jwks",
            "http://idp.example/jwks",
            "http://127.0.0.1:99999/jwks",
            "http://127.0.0.1:/jwks",
            "http:///jwks",
            "ftp://127.0.0.1/jwks",
            "127.0.0.1/jwks",
        ] {
            assert!(check_fetchable(url).is_err(), "{url}");
        }
    }

    #[test]
    fn challenges_use_only_a_valid_host_and_quote_what_they_carry() {
        let s = server();
        let injected = "a\", error=\"injected";
        for host in [
            Some(injected),
            Some("a b"),
            Some("a,b"),
            Some("a\\"),
            Some("a:+80"),
            Some("a:99999"),
            Some(""),
            None,
        ] {
            let url = s.metadata_url(host, true);
            assert_eq!(
                url, "http://127.0.0.1:8000/.well-known/oauth-protected-resource/p/mcp",
                "{host:?}"
            );
        }
        for host in ["mcp.example", "mcp.example:8443", "[::1]:80", "10.0.0.1"] {
            assert_eq!(
                s.metadata_url(Some(host), false),
                format!("http://{host}/.well-known/oauth-protected-resource/p/sse")
            );
        }
        // A configured value with a quote stays inside its quotes.
        let odd = ResourceServer {
            required: vec!["a\"b".into()],
            ..server()
        };
        let challenge = odd.challenge("http://h/x\"y", AuthFailure::Expired);
        assert_eq!(
            challenge,
            "Bearer resource_metadata=\"http://h/x\\\"y\", scope=\"a\\\"b\", error=\"invalid_token\", error_description=\"token expired\""
        );
        assert_eq!(
            odd.insufficient_scope("http://h/", &["s".into()]),
            "Bearer error=\"insufficient_scope\", scope=\"s\", resource_metadata=\"http://h/\""
        );
    }
}
