//! JWT bearer tokens: the principal is issuer + subject. Signatures are checked with
//! `jsonwebtoken` against keys chosen by `kid` among the keys of the issuer the token
//! claims (SPEC section 9: one trusted issuer's keys never verify another's tokens), each
//! bound to its own algorithms (no `alg: none`, no algorithm confusion); the claims are
//! judged here against a time the shell passes in.

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use crate::principal::KeySet;
use crate::principal::{AuthFailure, Principal};

/// One verification key, the algorithms it may be used with, and whose tokens it verifies.
struct Key {
    kid: Option<String>,
    key: DecodingKey,
    algorithms: Vec<Algorithm>,
    /// The issuer whose tokens it verifies; `None`: any issuer the policy accepts.
    issuer: Option<std::sync::Arc<str>>,
}

/// What a token must say to be accepted.
#[derive(Debug, Clone, Default)]
pub struct ClaimsPolicy {
    /// `--jwt-issuer`: without `issuers` the only accepted `iss`, beside them one more.
    pub issuer: Option<String>,
    /// `iss` must be one of these, when any are set (the `--oauth-issuer`s).
    pub issuers: Vec<String>,
    /// `aud` must name one of these, when any are set.
    pub audiences: Vec<String>,
    /// Seconds of clock skew allowed on `exp` and `nbf`.
    pub leeway: u64,
}

/// Verifies bearer JWTs.
pub struct JwtVerifier {
    keys: Vec<Key>,
    policy: ClaimsPolicy,
    /// Keys are still to come from a URL (none fetched yet): tokens get 503, not 401.
    pending: bool,
}

/// The verifier the gate uses now: the configured keys (a JWKS file, an HS256 secret)
/// and the key sets the hub fetched, rebuilt when it has new ones
/// ([`Output::UseKeys`](crate::Output::UseKeys)); a shell's request handlers share it.
#[derive(Debug)]
pub struct KeyStore {
    /// The `--jwt-jwks` file, for the tokens of the secret's issuer.
    configured: Option<KeySet>,
    secret: Option<Vec<u8>>,
    /// Whose tokens the configured keys verify
    /// ([`Config::configured_issuer`](crate::config::Config::configured_issuer)).
    issuer: Option<String>,
    policy: ClaimsPolicy,
    current: std::sync::RwLock<std::sync::Arc<JwtVerifier>>,
}

impl KeyStore {
    /// A store of the configured keys (a JWKS document, a secret), which verify the tokens
    /// of `issuer` (`None`: of any issuer `policy` accepts); with none, it is pending until
    /// fetched ones come.
    pub fn new(
        configured: Option<String>,
        secret: Option<Vec<u8>>,
        issuer: Option<String>,
        policy: ClaimsPolicy,
    ) -> Result<KeyStore, String> {
        if let Some(text) = &configured {
            // Every key of a configured set must be usable: a mistake is told at start.
            JwtVerifier::new(Some(text), None, policy.clone())?;
        }
        let configured = configured.map(|jwks| KeySet {
            issuer: issuer.clone(),
            jwks,
        });
        let sets: Vec<KeySet> = configured.iter().cloned().collect();
        let verifier =
            JwtVerifier::with_sets(&sets, secret.as_deref(), issuer.as_deref(), policy.clone())?;
        Ok(KeyStore {
            configured,
            secret,
            issuer,
            policy,
            current: std::sync::RwLock::new(std::sync::Arc::new(verifier)),
        })
    }

    /// The verifier now.
    pub fn current(&self) -> std::sync::Arc<JwtVerifier> {
        match self.current.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Uses the configured keys and `fetched` from now on (each set was checked by the
    /// hub; one that fails here keeps the verifier in use).
    pub fn use_fetched(&self, fetched: &[KeySet]) -> Result<(), String> {
        let sets: Vec<KeySet> = self.configured.iter().chain(fetched).cloned().collect();
        let (secret, issuer) = (self.secret.as_deref(), self.issuer.as_deref());
        let verifier = JwtVerifier::with_sets(&sets, secret, issuer, self.policy.clone())?;
        let verifier = std::sync::Arc::new(verifier);
        match self.current.write() {
            Ok(mut guard) => *guard = verifier,
            Err(poisoned) => *poisoned.into_inner() = verifier,
        }
        Ok(())
    }
}

/// How many usable keys a JWKS document holds, or why it is refused.
pub(crate) fn check_jwks(text: &str) -> Result<usize, String> {
    let set: JwkSet =
        serde_json::from_str(text).map_err(|e| format!("not a JWKS document: {e}"))?;
    let keys = set
        .keys
        .iter()
        .filter(|jwk| Key::from_jwk(jwk).is_ok())
        .count();
    if keys == 0 {
        return Err("no usable key (RSA, EC P-256, Ed25519)".into());
    }
    Ok(keys)
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "JwtVerifier({} keys, {:?})",
            self.keys.len(),
            self.policy
        )
    }
}

/// Every claim of a token, as written.
type ClaimSet = serde_json::Map<String, serde_json::Value>;

/// The claims Switchboard reads. `aud` may be a string or an array.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub(crate) struct Claims {
    /// Issuer.
    pub iss: Option<String>,
    /// Subject.
    pub sub: Option<String>,
    /// Expiry, seconds since the epoch.
    pub exp: Option<f64>,
    /// Not before, seconds since the epoch.
    pub nbf: Option<f64>,
    /// Audiences.
    #[serde(default, deserialize_with = "one_or_many")]
    pub aud: Vec<String>,
    /// Granted scopes, space-separated (RFC 9068).
    pub scope: Option<String>,
    /// Granted scopes as an array (or a string), as some providers write them.
    #[serde(default, deserialize_with = "one_or_many")]
    pub scp: Vec<String>,
}

impl Claims {
    /// The scopes the token grants, from `scope` and `scp`.
    pub(crate) fn scopes(&self) -> Vec<String> {
        let spaced = self.scope.iter().flat_map(|s| s.split_ascii_whitespace());
        let mut out: Vec<String> = spaced.map(str::to_owned).collect();
        for s in self.scp.iter().flat_map(|s| s.split_ascii_whitespace()) {
            if !out.iter().any(|o| o == s) {
                out.push(s.to_owned());
            }
        }
        out
    }
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match Option::<OneOrMany>::deserialize(d)? {
        None => Vec::new(),
        Some(OneOrMany::One(s)) => vec![s],
        Some(OneOrMany::Many(v)) => v,
    })
}

impl Key {
    /// One key of a JWKS document with the algorithms it may verify.
    fn from_jwk(jwk: &jsonwebtoken::jwk::Jwk) -> Result<Key, String> {
        let kid = jwk.common.key_id.clone();
        let algorithms = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => {
                vec![Algorithm::RS256, Algorithm::RS384, Algorithm::RS512]
            }
            AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => {
                vec![Algorithm::ES256]
            }
            AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => {
                vec![Algorithm::EdDSA]
            }
            _ => {
                return Err(format!(
                    "key {kid:?}: only RSA, EC P-256 and Ed25519 keys are supported"
                ))
            }
        };
        // A key that names its algorithm is used with that one only.
        let algorithms = match &jwk.common.key_algorithm {
            None => algorithms,
            Some(named) => match named.to_string().parse::<Algorithm>() {
                Ok(alg) if algorithms.contains(&alg) => vec![alg],
                _ => return Err(format!("key {kid:?}: `alg` {named} does not fit the key")),
            },
        };
        let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("key {kid:?}: {e}"))?;
        Ok(Key {
            kid,
            key,
            algorithms,
            issuer: None,
        })
    }

    /// Whether this key may verify a token claiming `iss`.
    fn serves(&self, iss: &str) -> bool {
        self.issuer.as_deref().is_none_or(|own| own == iss)
    }
}

impl JwtVerifier {
    /// Keys from a JWKS document (RSA, EC P-256, Ed25519) and/or an HS256 secret.
    pub fn new(
        jwks: Option<&str>,
        hs256_secret: Option<&[u8]>,
        policy: ClaimsPolicy,
    ) -> Result<Self, String> {
        let mut keys = Vec::new();
        if let Some(text) = jwks {
            let set: JwkSet =
                serde_json::from_str(text).map_err(|e| format!("not a JWKS document: {e}"))?;
            for jwk in &set.keys {
                keys.push(Key::from_jwk(jwk)?);
            }
        }
        if let Some(secret) = hs256_secret {
            let secret = secret.trim_ascii();
            if secret.len() < 32 {
                return Err("the HS256 secret must be at least 32 bytes".into());
            }
            keys.push(Key {
                kid: None,
                key: DecodingKey::from_secret(secret).map_err(|e| e.to_string())?,
                algorithms: vec![Algorithm::HS256],
                issuer: None,
            });
        }
        if keys.is_empty() {
            return Err("no JWT verification keys".into());
        }
        Ok(JwtVerifier {
            keys,
            policy,
            pending: false,
        })
    }

    /// Keys from several JWKS documents (a file's and fetched ones), each verifying the
    /// tokens of its issuer only, and an HS256 secret for those of `secret_issuer` (`None`:
    /// any issuer the policy accepts). With none at all the verifier is pending: tokens get
    /// 503 until keys come.
    pub fn with_sets(
        sets: &[KeySet],
        hs256_secret: Option<&[u8]>,
        secret_issuer: Option<&str>,
        policy: ClaimsPolicy,
    ) -> Result<Self, String> {
        let mut keys = Vec::new();
        for set in sets {
            let jwks: JwkSet =
                serde_json::from_str(&set.jwks).map_err(|e| format!("not a JWKS document: {e}"))?;
            let issuer: Option<std::sync::Arc<str>> = set.issuer.as_deref().map(Into::into);
            // A fetched set may carry keys of kinds this proxy does not verify (an
            // encryption key, say): those are left out. A configured set was checked whole.
            let usable = jwks.keys.iter().filter_map(|jwk| Key::from_jwk(jwk).ok());
            keys.extend(usable.map(|key| Key {
                issuer: issuer.clone(),
                ..key
            }));
        }
        if let Some(secret) = hs256_secret {
            let mut with_secret = JwtVerifier::new(None, Some(secret), policy.clone())?;
            for key in &mut with_secret.keys {
                key.issuer = secret_issuer.map(Into::into);
            }
            with_secret.keys.append(&mut keys);
            return Ok(with_secret);
        }
        let pending = keys.is_empty();
        Ok(JwtVerifier {
            keys,
            policy,
            pending,
        })
    }

    /// How many keys it holds.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// The principal a token names, at `now` (seconds since the Unix epoch).
    pub fn authenticate(&self, token: &[u8], now: u64) -> Result<Principal, AuthFailure> {
        self.identify(token, now).map(|(principal, _)| principal)
    }

    /// The principal a token names, with its scopes and claims, at `now`.
    pub fn identify(
        &self,
        token: &[u8],
        now: u64,
    ) -> Result<(Principal, crate::principal::Credential), AuthFailure> {
        if self.pending {
            return Err(AuthFailure::KeysUnavailable);
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| AuthFailure::Malformed)?;
        // Only the keys of the issuer the token claims may verify it: a key set of another
        // trusted issuer signing for this one is refused here, as an unknown key.
        let iss = claimed_issuer(token).ok_or(AuthFailure::Malformed)?;
        if !self.policy.accepts_issuer(&iss) {
            return Err(AuthFailure::WrongIssuer);
        }
        let key = self.key_for(header.kid.as_deref(), &iss)?;
        if !key.algorithms.contains(&header.alg) {
            // An algorithm this key is not for (HS256 signed with an RSA public key, ...).
            return Err(AuthFailure::BadSignature);
        }
        let mut validation = Validation::new(header.alg);
        validation.algorithms = key.algorithms.clone();
        // Time, issuer and audience are judged by `check_claims` with the shell's clock.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        validation.required_spec_claims.clear();
        let data =
            jsonwebtoken::decode::<ClaimSet>(token, &key.key, &validation).map_err(|e| match e
                .kind()
            {
                jsonwebtoken::errors::ErrorKind::InvalidSignature
                | jsonwebtoken::errors::ErrorKind::InvalidAlgorithm => AuthFailure::BadSignature,
                _ => AuthFailure::Malformed,
            })?;
        let all = data.claims;
        let claims = Claims::deserialize(serde_json::Value::Object(all.clone()))
            .map_err(|_| AuthFailure::Malformed)?;
        let principal = check_claims(&claims, &self.policy, now)?;
        let credential = crate::principal::Credential {
            scopes: claims.scopes(),
            claims: Some(std::sync::Arc::new(all)),
        };
        Ok((principal, credential))
    }
}

impl JwtVerifier {
    /// The key a token claiming `iss` names by `kid`, among that issuer's keys only: the
    /// `kid` must name one, except when that issuer has a single key without an id (a
    /// shared secret), which then serves every token of it.
    fn key_for(&self, kid: Option<&str>, iss: &str) -> Result<&Key, AuthFailure> {
        let own: Vec<&Key> = self.keys.iter().filter(|k| k.serves(iss)).collect();
        let unnamed_single = match own.as_slice() {
            [only] if only.kid.is_none() => Some(*only),
            _ => None,
        };
        match kid {
            Some(kid) => own
                .iter()
                .copied()
                .find(|k| k.kid.as_deref() == Some(kid))
                .or(unnamed_single),
            None if own.len() == 1 => own.first().copied(),
            None => own.iter().copied().find(|k| k.kid.is_none()),
        }
        .ok_or(AuthFailure::UnknownKey)
    }
}

/// The `iss` a JWT claims, read without verifying anything (to choose the keys that may
/// verify it); `None` when it has none or is not a JWT.
pub(crate) fn claimed_issuer(token: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Issuer {
        iss: Option<String>,
    }
    jsonwebtoken::dangerous::insecure_decode_claims::<Issuer>(token)
        .ok()?
        .iss
}

impl ClaimsPolicy {
    /// Whether a token of `iss` may be accepted. Without `--oauth-issuer`, `--jwt-issuer`
    /// (when given) is the one accepted; beside them it is one more: the issuer of the
    /// configured keys, which verify its tokens only, as each issuer's keys verify its own.
    pub fn accepts_issuer(&self, iss: &str) -> bool {
        if self.issuers.is_empty() {
            return self.issuer.as_ref().is_none_or(|want| want == iss);
        }
        self.issuers.iter().chain(&self.issuer).any(|i| i == iss)
    }
}

/// The pure decision: verified claims and the time in, principal or refusal out.
pub(crate) fn check_claims(
    claims: &Claims,
    policy: &ClaimsPolicy,
    now: u64,
) -> Result<Principal, AuthFailure> {
    let now = now as f64;
    let leeway = policy.leeway as f64;
    let exp = claims.exp.ok_or(AuthFailure::Malformed)?;
    if exp + leeway <= now {
        return Err(AuthFailure::Expired);
    }
    if claims.nbf.is_some_and(|nbf| nbf - leeway > now) {
        return Err(AuthFailure::NotYetValid);
    }
    let (Some(iss), Some(sub)) = (&claims.iss, &claims.sub) else {
        return Err(AuthFailure::Malformed);
    };
    if iss.is_empty() || sub.is_empty() || iss.contains('\0') || sub.contains('\0') {
        return Err(AuthFailure::Malformed);
    }
    if !policy.accepts_issuer(iss) {
        return Err(AuthFailure::WrongIssuer);
    }
    if !policy.audiences.is_empty() && !claims.aud.iter().any(|a| policy.audiences.contains(a)) {
        return Err(AuthFailure::WrongAudience);
    }
    Ok(Principal::issuer_subject(iss, sub))
}

#[cfg(test)]
mod tests {
    #[test]
    fn jwt_issuer_beside_oauth_issuers_is_one_more_accepted_issuer() {
        let policy = |issuer: Option<&str>, issuers: &[&str]| ClaimsPolicy {
            issuer: issuer.map(str::to_owned),
            issuers: issuers.iter().map(|i| i.to_string()).collect(),
            audiences: Vec::new(),
            leeway: 0,
        };
        let alone = policy(Some("https://x"), &[]);
        assert!(alone.accepts_issuer("https://x"));
        assert!(!alone.accepts_issuer("https://a"));
        let beside = policy(Some("https://x"), &["https://a", "https://b"]);
        for iss in ["https://x", "https://a", "https://b"] {
            assert!(beside.accepts_issuer(iss), "{iss}");
        }
        assert!(!beside.accepts_issuer("https://c"));
        let oauth_only = policy(None, &["https://a"]);
        assert!(oauth_only.accepts_issuer("https://a"));
        assert!(!oauth_only.accepts_issuer("https://x"));
        assert!(policy(None, &[]).accepts_issuer("https://anyone"));
    }

    use super::*;

    fn claims() -> Claims {
        Claims {
            iss: Some("https://idp".into()),
            sub: Some("alice".into()),
            exp: Some(1000.0),
            nbf: Some(900.0),
            aud: vec!["switchboard".into()],
            ..Claims::default()
        }
    }

    fn policy() -> ClaimsPolicy {
        ClaimsPolicy {
            issuer: Some("https://idp".into()),
            audiences: vec!["switchboard".into()],
            leeway: 60,
            ..ClaimsPolicy::default()
        }
    }

    #[test]
    fn judges_claims() {
        let p = policy();
        assert_eq!(
            check_claims(&claims(), &p, 950),
            Ok(Principal::issuer_subject("https://idp", "alice"))
        );
        assert_eq!(
            check_claims(&claims(), &p, 1059),
            Ok(Principal::issuer_subject("https://idp", "alice"))
        );
        assert_eq!(check_claims(&claims(), &p, 1060), Err(AuthFailure::Expired));
        assert_eq!(
            check_claims(&claims(), &p, 839),
            Err(AuthFailure::NotYetValid)
        );
        let other_iss = Claims {
            iss: Some("https://evil".into()),
            ..claims()
        };
        assert_eq!(
            check_claims(&other_iss, &p, 950),
            Err(AuthFailure::WrongIssuer)
        );
        let other_aud = Claims {
            aud: vec!["x".into()],
            ..claims()
        };
        assert_eq!(
            check_claims(&other_aud, &p, 950),
            Err(AuthFailure::WrongAudience)
        );
        let no_sub = Claims {
            sub: None,
            ..claims()
        };
        assert_eq!(check_claims(&no_sub, &p, 950), Err(AuthFailure::Malformed));
        let nul = Claims {
            sub: Some("a\0b".into()),
            ..claims()
        };
        assert_eq!(check_claims(&nul, &p, 950), Err(AuthFailure::Malformed));
        let no_exp = Claims {
            exp: None,
            ..claims()
        };
        assert_eq!(check_claims(&no_exp, &p, 950), Err(AuthFailure::Malformed));
    }

    #[test]
    fn refuses_none_and_confusion() {
        let secret = [7u8; 32];
        let v = JwtVerifier::new(None, Some(&secret), policy()).unwrap();
        let none = b"eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJhIn0.";
        assert_eq!(v.authenticate(none, 950), Err(AuthFailure::Malformed));
        assert_eq!(v.authenticate(b"garbage", 950), Err(AuthFailure::Malformed));
        let token = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(Algorithm::HS256),
            &serde_json::json!({"iss":"https://idp","sub":"alice","exp":1000,"aud":"switchboard"}),
            &jsonwebtoken::EncodingKey::from_secret(&secret).unwrap(),
        )
        .unwrap();
        assert_eq!(
            v.authenticate(token.as_bytes(), 950),
            Ok(Principal::issuer_subject("https://idp", "alice"))
        );
        let forged = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(Algorithm::HS256),
            &serde_json::json!({"iss":"https://idp","sub":"alice","exp":1000,"aud":"switchboard"}),
            &jsonwebtoken::EncodingKey::from_secret(&[8u8; 32]).unwrap(),
        )
        .unwrap();
        assert_eq!(
            v.authenticate(forged.as_bytes(), 950),
            Err(AuthFailure::BadSignature)
        );
        let hs384 = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(Algorithm::HS384),
            &serde_json::json!({"iss":"https://idp","sub":"alice","exp":1000}),
            &jsonwebtoken::EncodingKey::from_secret(&secret).unwrap(),
        )
        .unwrap();
        assert_eq!(
            v.authenticate(hs384.as_bytes(), 950),
            Err(AuthFailure::BadSignature)
        );
    }

    /// Test-only Ed25519 keys (published here, so never to be trusted anywhere): issuer
    /// A's and B's PKCS#8 seeds and public halves.
    const A_SEED: &str = "7f27f9f7ef160aa5a6dabdf4ccd1c34c9d15b709890c32b481b1d4388de779d6";
    const A_X: &str = "cQd0ehKKILMoZFZOogxLG7NvtQfSdgDePaIhxln8bCQ";
    const B_SEED: &str = "957b4a2eec15d012bd306aa49c4ec3c7ad0553fdd9853ce4f2ee4e04b3a74420";
    const B_X: &str = "BL2VTFia-XUkhpcaMPoflmU3tLaa1exltA_3TgHKT14";
    const A: &str = "https://a.example";
    const B: &str = "https://b.example";

    fn jwks(kid: &str, x: &str) -> String {
        serde_json::json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "alg": "EdDSA",
                                     "kid": kid, "x": x}]})
        .to_string()
    }

    fn set(issuer: Option<&str>, kid: &str, x: &str) -> KeySet {
        KeySet {
            issuer: issuer.map(str::to_owned),
            jwks: jwks(kid, x),
        }
    }

    /// A token of `iss` for alice, signed with the key of `seed` (hex) under `kid`.
    fn signed(seed: &str, kid: Option<&str>, iss: &str) -> String {
        let mut header = jsonwebtoken::Header::new(Algorithm::EdDSA);
        header.kid = kid.map(str::to_owned);
        let claims = serde_json::json!({"iss": iss, "sub": "alice", "exp": 1000});
        let hex = format!("302e020100300506032b657004220420{seed}");
        let der: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let key = jsonwebtoken::EncodingKey::from_ed_der(&der);
        jsonwebtoken::encode(&header, &claims, &key).unwrap()
    }

    fn two_issuers() -> ClaimsPolicy {
        ClaimsPolicy {
            issuers: vec![A.into(), B.into()],
            ..ClaimsPolicy::default()
        }
    }

    #[test]
    fn a_token_is_verified_only_with_its_issuers_keys() {
        let sets = [set(Some(A), "a-1", A_X), set(Some(B), "b-1", B_X)];
        let v = JwtVerifier::with_sets(&sets, None, None, two_issuers()).unwrap();
        let ok = |iss| Ok(Principal::issuer_subject(iss, "alice"));
        assert_eq!(
            v.authenticate(signed(A_SEED, Some("a-1"), A).as_bytes(), 950),
            ok(A)
        );
        assert_eq!(
            v.authenticate(signed(B_SEED, Some("b-1"), B).as_bytes(), 950),
            ok(B)
        );
        // B's key signing for A (issue 30.1): A has no such key.
        let forged = signed(B_SEED, Some("b-1"), A);
        assert_eq!(
            v.authenticate(forged.as_bytes(), 950),
            Err(AuthFailure::UnknownKey)
        );
        // Without a kid: A's one key is tried, and B's signature does not verify with it.
        let forged = signed(B_SEED, None, A);
        assert_eq!(
            v.authenticate(forged.as_bytes(), 950),
            Err(AuthFailure::BadSignature)
        );
        // An issuer that is not trusted is refused before any key is looked for.
        let other = signed(B_SEED, Some("b-1"), "https://c.example");
        assert_eq!(
            v.authenticate(other.as_bytes(), 950),
            Err(AuthFailure::WrongIssuer)
        );
        assert_eq!(claimed_issuer(forged.as_bytes()).as_deref(), Some(A));
        assert_eq!(claimed_issuer(b"not.a.jwt"), None);
    }

    #[test]
    fn a_kid_both_issuers_use_picks_the_claimed_issuers_key() {
        // In either order: the first key named `k` is not simply taken.
        for sets in [
            [set(Some(A), "k", A_X), set(Some(B), "k", B_X)],
            [set(Some(B), "k", B_X), set(Some(A), "k", A_X)],
        ] {
            let v = JwtVerifier::with_sets(&sets, None, None, two_issuers()).unwrap();
            let forged = signed(B_SEED, Some("k"), A);
            assert_eq!(
                v.authenticate(forged.as_bytes(), 950),
                Err(AuthFailure::BadSignature)
            );
            let own = signed(A_SEED, Some("k"), A);
            assert_eq!(
                v.authenticate(own.as_bytes(), 950),
                Ok(Principal::issuer_subject(A, "alice"))
            );
        }
    }

    #[test]
    fn configured_keys_and_secrets_are_bound_too() {
        // A secret for A beside B's fetched set: it does not sign for B.
        let secret = [7u8; 32];
        let sets = [set(Some(B), "b-1", B_X)];
        let v = JwtVerifier::with_sets(&sets, Some(&secret), Some(A), two_issuers()).unwrap();
        let hs = |iss: &str| {
            jsonwebtoken::encode(
                &jsonwebtoken::Header::new(Algorithm::HS256),
                &serde_json::json!({"iss": iss, "sub": "alice", "exp": 1000}),
                &jsonwebtoken::EncodingKey::from_secret(&secret).unwrap(),
            )
            .unwrap()
        };
        assert!(v.authenticate(hs(A).as_bytes(), 950).is_ok());
        assert_eq!(
            v.authenticate(hs(B).as_bytes(), 950),
            Err(AuthFailure::BadSignature)
        );
        // A key set of no named issuer serves every accepted one (one trust domain).
        let any = [set(None, "a-1", A_X)];
        let v = JwtVerifier::with_sets(&any, None, None, ClaimsPolicy::default()).unwrap();
        let elsewhere = signed(A_SEED, Some("a-1"), "https://c.example");
        assert!(v.authenticate(elsewhere.as_bytes(), 950).is_ok());
        // The store binds its file to the issuer it is given.
        let store = KeyStore::new(Some(jwks("a-1", A_X)), None, Some(A.into()), two_issuers());
        let store = store.unwrap();
        store.use_fetched(&[set(Some(B), "b-1", B_X)]).unwrap();
        let v = store.current();
        assert!(v
            .authenticate(signed(A_SEED, Some("a-1"), A).as_bytes(), 950)
            .is_ok());
        let forged = signed(A_SEED, Some("a-1"), B);
        assert_eq!(
            v.authenticate(forged.as_bytes(), 950),
            Err(AuthFailure::UnknownKey)
        );
    }
}
