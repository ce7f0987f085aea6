//! Switchboard as an OAuth 2.1 resource server (SPEC section 9): the protected resource
//! metadata clients discover the authorization server from (RFC 9728), the challenges of a
//! 401 and a 403 `insufficient_scope`, and the resource URI tokens must be issued for.

use std::fmt::Write;

use crate::principal::AuthFailure;

/// Where clients find this resource's metadata: RFC 9728's well-known path.
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

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
    /// legacy transport), its origin `--public-url` or the request's `Host`.
    pub fn metadata_url(&self, host: Option<&str>, streamable: bool) -> String {
        let origin = match &self.public_url {
            Some(url) => origin_of(url).to_owned(),
            None => format!("http://{}", host.unwrap_or("localhost")),
        };
        let endpoint = if streamable { "/mcp" } else { "/sse" };
        format!("{origin}{METADATA_PATH}{}{endpoint}", self.base_path)
    }

    /// `WWW-Authenticate` for a 401: where the metadata is, the scopes every request needs,
    /// and why a presented token was refused.
    pub fn challenge(&self, metadata_url: &str, failure: AuthFailure) -> String {
        let mut out = format!("Bearer resource_metadata=\"{metadata_url}\"");
        if !self.required.is_empty() {
            let _ = write!(out, ", scope=\"{}\"", self.required.join(" "));
        }
        if failure != AuthFailure::Missing {
            let _ = write!(
                out,
                ", error=\"invalid_token\", error_description=\"{}\"",
                failure.reason()
            );
        }
        out
    }

    /// `WWW-Authenticate` for a 403: the scopes this request needs, so a client can step up.
    pub fn insufficient_scope(&self, metadata_url: &str, needed: &[String]) -> String {
        format!(
            "Bearer error=\"insufficient_scope\", scope=\"{}\", resource_metadata=\"{metadata_url}\"",
            needed.join(" ")
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
        let of_tool = self.tool_scopes.iter().filter(|(pattern, _)| {
            tool.is_some_and(|tool| crate::settings::tool_matches(pattern, tool))
        });
        for (_, scope) in of_tool {
            if !needed.contains(scope) {
                needed.push(scope.clone());
            }
        }
        needed
    }
}

/// Whether a URL may be fetched: https, or http to a loopback host.
pub fn fetchable(url: &str) -> bool {
    if url.starts_with("https://") {
        return true;
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    };
    matches!(host, "localhost" | "[::1]") || host.starts_with("127.")
}

/// `scheme://authority` of a URL.
fn origin_of(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(i) => &url[..after_scheme + i],
        None => url.trim_end_matches('/'),
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
        assert!(fetchable("http://127.0.0.1:9000/jwks"));
        assert!(fetchable("http://localhost/jwks"));
        assert!(!fetchable("http://idp.example/jwks"));
        assert!(fetchable("https://idp.example/jwks"));
    }
}
