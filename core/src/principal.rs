//! Who a caller is, and why a credential was refused: what every auth mode answers.

use std::fmt;
use std::sync::Arc;

/// Who the auth layer says the caller is. Sessions are bound to one and checked on every POST.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Principal(Arc<str>);

impl Principal {
    /// The principal called `name` (a token file's first column).
    pub fn new(name: &str) -> Self {
        Principal(Arc::from(name))
    }

    /// Every caller when authentication is off.
    pub fn anonymous() -> Self {
        Principal::new("anonymous")
    }

    /// A JWT caller: issuer and subject together, joined by NUL (which neither may hold),
    /// so that no two (issuer, subject) pairs share a principal.
    pub fn issuer_subject(issuer: &str, subject: &str) -> Self {
        Principal(Arc::from(format!("{issuer}\0{subject}")))
    }

    /// Whether a JWT named it ([`Principal::issuer_subject`]), not a token file or no auth.
    pub fn is_issuer_subject(&self) -> bool {
        self.0.contains('\0')
    }

    /// The name, for logs.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Who the caller is without its issuer: a JWT's `sub`, a static principal's name, or
    /// `anonymous` (a policy's `Client::"<id>"`).
    pub fn user_id(&self) -> &str {
        self.0
            .split_once('\0')
            .map_or(&self.0, |(_, subject)| subject)
    }
}

impl fmt::Debug for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.split_once('\0') {
            Some((issuer, subject)) => write!(f, "{subject} (issuer {issuer})"),
            None => f.write_str(&self.0),
        }
    }
}

/// A JWT's claims, every one as the token wrote it (for policies: `claim_<name>`).
pub(crate) type ClaimSet = Arc<serde_json::Map<String, serde_json::Value>>;

/// What a credential grants besides who: its scopes (a JWT's `scope` or `scp`) and claims
/// (none for static tokens and no auth).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credential {
    /// The scopes granted.
    pub scopes: Vec<String>,
    /// The token's claims, when it is a JWT.
    pub claims: Option<ClaimSet>,
}

/// Why a caller was not authenticated (401).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AuthFailure {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A static token that is not in the table.
    UnknownToken,
    /// Not a JWT, or not one this proxy can read.
    Malformed,
    /// Past its `exp`.
    Expired,
    /// Before its `nbf`.
    NotYetValid,
    /// Not the `--jwt-issuer`.
    WrongIssuer,
    /// No `--jwt-audience` it names.
    WrongAudience,
    /// The signature does not verify with the key named by `kid`.
    BadSignature,
    /// No key with the token's `kid`.
    UnknownKey,
    /// `access_token` in the query string: tokens travel in the header only.
    TokenInQuery,
    /// No key set could be fetched yet: the token is not at fault (503, not 401).
    KeysUnavailable,
}

impl AuthFailure {
    /// The short reason sent in `WWW-Authenticate` and the body; never the token.
    pub fn reason(self) -> &'static str {
        match self {
            AuthFailure::Missing => "a bearer token is required",
            AuthFailure::UnknownToken => "unknown token",
            AuthFailure::Malformed => "malformed token",
            AuthFailure::Expired => "token expired",
            AuthFailure::NotYetValid => "token not yet valid",
            AuthFailure::WrongIssuer => "wrong issuer",
            AuthFailure::WrongAudience => "wrong audience",
            AuthFailure::BadSignature => "bad signature",
            AuthFailure::UnknownKey => "unknown key id",
            AuthFailure::TokenInQuery => "tokens go in the Authorization header, never the URL",
            AuthFailure::KeysUnavailable => "signing keys are not available yet",
        }
    }
}

/// A fetched key set (a JWKS document, checked) and the issuer whose tokens it verifies
/// (`None`: any accepted issuer), as [`Output::UseKeys`](crate::Output::UseKeys) hands it
/// to the gate's key store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySet {
    /// Whose tokens its keys verify.
    pub issuer: Option<String>,
    /// The JWKS document.
    pub jwks: String,
}
