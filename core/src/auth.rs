//! Who a caller is: principals, the bearer-token table (`--auth-tokens FILE`) and, with
//! the `jwt` feature, JWT bearer tokens.

use std::fmt;

use subtle::ConstantTimeEq;

use crate::principal::Credential;

pub(crate) use crate::principal::{AuthFailure, Principal};

/// A line of a token file that could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenFileError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl fmt::Display for TokenFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.reason)
    }
}

impl std::error::Error for TokenFileError {}

/// Static bearer tokens, one `principal token` pair per line (`#` comments and blank lines
/// allowed).
#[derive(Clone, Default)]
pub struct TokenTable {
    entries: Vec<(Principal, Vec<u8>)>,
}

impl fmt::Debug for TokenTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print tokens.
        write!(f, "TokenTable({} entries)", self.entries.len())
    }
}

impl TokenTable {
    /// Reads `principal token` lines (`#` comments and blank lines ignored).
    pub fn parse(text: &str) -> Result<Self, TokenFileError> {
        let mut entries: Vec<(Principal, Vec<u8>)> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let err = |reason| TokenFileError {
                line: i + 1,
                reason,
            };
            let mut parts = line.split_whitespace();
            let (Some(principal), Some(token), None) = (parts.next(), parts.next(), parts.next())
            else {
                return Err(err("expected `principal token`"));
            };
            if token.len() < 16 {
                return Err(err("token shorter than 16 characters"));
            }
            if entries.iter().any(|(_, t)| t == token.as_bytes()) {
                return Err(err("token used twice"));
            }
            entries.push((Principal::new(principal), token.as_bytes().to_vec()));
        }
        if entries.is_empty() {
            return Err(TokenFileError {
                line: 0,
                reason: "no tokens in file",
            });
        }
        Ok(TokenTable { entries })
    }

    /// The principals the table names.
    pub fn principals(&self) -> std::collections::BTreeSet<Principal> {
        self.entries.iter().map(|(p, _)| p.clone()).collect()
    }

    /// The principal whose token is `presented`, comparing every entry in constant time so
    /// timing reveals neither which token nor how much of it matched.
    pub fn principal_for(&self, presented: &[u8]) -> Option<Principal> {
        let mut found = None;
        for (principal, token) in &self.entries {
            if bool::from(token.as_slice().ct_eq(presented)) {
                found = Some(principal.clone());
            }
        }
        found
    }
}

/// The token of an `Authorization: Bearer <token>` header value.
pub(crate) fn bearer_token(header: &[u8]) -> Option<&[u8]> {
    let scheme = header.get(..7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = header[7..].trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// How callers are identified.
#[derive(Debug, Clone, Default)]
pub enum Auth {
    /// Everyone is [`Principal::anonymous`].
    #[default]
    None,
    /// Static bearer tokens (`--auth-tokens`).
    Tokens(TokenTable),
    /// JWT bearer tokens (`--jwt-*`).
    #[cfg(feature = "jwt")]
    Jwt(std::sync::Arc<crate::jwt::KeyStore>),
}

/// Which principals an auth mode can name: after a reload, sessions of any other end (a
/// static token removed from its file, or an auth mode left).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principals {
    /// Every caller is [`Principal::anonymous`] (no auth).
    Anonymous,
    /// The principals of a token file.
    Listed(std::collections::BTreeSet<Principal>),
    /// JWT callers: any issuer and subject (a token's own checks decide each request).
    IssuerSubject,
}

impl Principals {
    /// Whether `principal` may still hold sessions.
    pub fn contains(&self, principal: &Principal) -> bool {
        match self {
            Principals::Anonymous => *principal == Principal::anonymous(),
            Principals::Listed(names) => names.contains(principal),
            Principals::IssuerSubject => principal.is_issuer_subject(),
        }
    }
}

impl Auth {
    /// The principals this mode can name.
    pub fn principals(&self) -> Principals {
        match self {
            Auth::None => Principals::Anonymous,
            Auth::Tokens(table) => Principals::Listed(table.principals()),
            #[cfg(feature = "jwt")]
            Auth::Jwt(_) => Principals::IssuerSubject,
        }
    }

    /// The caller's principal from its `Authorization` header at `now` (seconds since the
    /// Unix epoch, for JWT expiry), or why it gets 401.
    pub fn authenticate(
        &self,
        authorization: Option<&[u8]>,
        now: u64,
    ) -> Result<Principal, AuthFailure> {
        self.identify(authorization, now)
            .map(|(principal, _)| principal)
    }

    /// [`Auth::authenticate`], with what the credential grants (a JWT's scopes and claims;
    /// nothing for static tokens and no auth).
    pub fn identify(
        &self,
        authorization: Option<&[u8]>,
        now: u64,
    ) -> Result<(Principal, Credential), AuthFailure> {
        let _ = now;
        if let Auth::None = self {
            return Ok((Principal::anonymous(), Credential::default()));
        }
        let token = authorization
            .and_then(bearer_token)
            .ok_or(AuthFailure::Missing)?;
        match self {
            Auth::None => Ok((Principal::anonymous(), Credential::default())),
            Auth::Tokens(table) => table
                .principal_for(token)
                .map(|p| (p, Credential::default()))
                .ok_or(AuthFailure::UnknownToken),
            #[cfg(feature = "jwt")]
            Auth::Jwt(keys) => keys.current().identify(token, now),
        }
    }
}

impl Auth {
    /// The issuer a bearer JWT in `authorization` claims, read without verifying it (to
    /// choose which key sets an unknown `kid` refetches); `None` for other modes.
    pub fn claimed_issuer(&self, authorization: Option<&[u8]>) -> Option<std::sync::Arc<str>> {
        let _token = authorization.and_then(bearer_token)?;
        match self {
            #[cfg(feature = "jwt")]
            Auth::Jwt(_) => crate::jwt::claimed_issuer(_token).map(std::sync::Arc::from),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_map_to_principals() {
        let table =
            TokenTable::parse("# c\nalice aaaaaaaaaaaaaaaaaaaa\n\nbob bbbbbbbbbbbbbbbbbbbb\n")
                .unwrap();
        let auth = Auth::Tokens(table);
        assert_eq!(
            auth.authenticate(Some(b"Bearer bbbbbbbbbbbbbbbbbbbb"), 0),
            Ok(Principal::new("bob"))
        );
        assert_eq!(
            auth.authenticate(Some(b"bearer aaaaaaaaaaaaaaaaaaaa "), 0),
            Ok(Principal::new("alice"))
        );
        assert_eq!(
            auth.authenticate(Some(b"Bearer aaaaaaaaaaaaaaaaaaa"), 0),
            Err(AuthFailure::UnknownToken)
        );
        assert_eq!(
            auth.authenticate(Some(b"Basic aaaaaaaaaaaaaaaaaaaa"), 0),
            Err(AuthFailure::Missing)
        );
        assert_eq!(auth.authenticate(None, 0), Err(AuthFailure::Missing));
        assert!(TokenTable::parse("alice short").is_err());
        assert!(TokenTable::parse("").is_err());
        assert!(TokenTable::parse("a xxxxxxxxxxxxxxxxxxxx\nb xxxxxxxxxxxxxxxxxxxx").is_err());
    }
}
