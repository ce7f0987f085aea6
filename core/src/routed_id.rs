//! The routed-id codec: `"<sid>|n:<digits>"` for an integer id, `"<sid>|s:<string>"` for a
//! string id. The route back to a session is derived from the id itself, so no pending
//! table exists to grow, leak or disagree with the backend.

use std::borrow::Cow;
use std::fmt;

use crate::message::RawId;

/// A session id: 128 random bits in canonical lowercase UUID v4 text. Never contains `|`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId([u8; 36]);

impl SessionId {
    /// Builds the id from 16 random bytes supplied by the shell (the core has no randomness);
    /// the version and variant bits are set as UUID v4 requires.
    pub fn from_random(mut bytes: [u8; 16]) -> Self {
        bytes[6] = (bytes[6] & 0x0f) | 0x40;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 36];
        let mut at = 0;
        for (i, b) in bytes.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                out[at] = b'-';
                at += 1;
            }
            out[at] = HEX[usize::from(b >> 4)];
            out[at + 1] = HEX[usize::from(b & 0x0f)];
            at += 2;
        }
        SessionId(out)
    }

    /// Accepts exactly the canonical lowercase UUID text this type produces.
    pub fn parse(text: &str) -> Option<Self> {
        let bytes: [u8; 36] = text.as_bytes().try_into().ok()?;
        let ok = bytes.iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => matches!(b, b'0'..=b'9' | b'a'..=b'f'),
        });
        ok.then_some(SessionId(bytes))
    }

    /// The id's text.
    pub fn as_str(&self) -> &str {
        // The bytes are ASCII hex digits and hyphens by construction.
        std::str::from_utf8(&self.0).expect("session ids are ASCII")
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Appends the routed id for `id` of `session` (a JSON string literal) to `out`.
///
/// The client's string id is kept as written, escapes included, so a backend that echoes
/// the id verbatim gives the client back its exact bytes.
pub fn encode(session: &SessionId, id: RawId<'_>, out: &mut Vec<u8>) {
    out.push(b'"');
    out.extend_from_slice(&session.0);
    match id {
        RawId::Int(digits) => {
            out.extend_from_slice(b"|n:");
            out.extend_from_slice(digits.as_bytes());
        }
        RawId::Str(literal) => {
            out.extend_from_slice(b"|s:");
            out.extend_from_slice(&literal.as_bytes()[1..literal.len() - 1]);
        }
    }
    out.push(b'"');
}

/// The routed id for `id` of `session`, as a JSON string literal.
pub fn encoded(session: &SessionId, id: RawId<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(id.as_str().len() + 42);
    encode(session, id, &mut out);
    out
}

/// A routed id taken apart: the session it names and the original id as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded<'a> {
    /// The session the routed id names.
    pub session: SessionId,
    /// The original id, ready to splice: an integer literal or a JSON string literal.
    pub original: Cow<'a, str>,
    /// Whether the original was an integer.
    pub is_integer: bool,
}

/// Decodes the raw JSON text of an id the backend echoed. `None` when it is not a routed
/// id minted by [`encode`]: not a string, no session prefix, or an integer part that is
/// not an integer literal.
pub fn decode(raw: &str) -> Option<Decoded<'_>> {
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    // Fast path: the sid part before the first literal `|` has no escape, so that `|` is
    // also the first `|` of the value and the rest is valid string-literal text.
    if let Some(bar) = memchr::memchr(b'|', inner.as_bytes()) {
        let (sid, rest) = (&inner[..bar], &inner[bar + 1..]);
        if !sid.contains('\\') {
            let session = SessionId::parse(sid)?;
            return split_kind(session, rest, true);
        }
    }
    if !inner.contains('\\') {
        return None;
    }
    let value: String = serde_json::from_str(raw).ok()?;
    let (sid, rest) = value.split_once('|')?;
    let session = SessionId::parse(sid)?;
    let decoded = split_kind(session, rest, false)?;
    Some(Decoded {
        session,
        original: Cow::Owned(decoded.original.into_owned()),
        is_integer: decoded.is_integer,
    })
}

/// `rest` is what follows `<sid>|`: raw string-literal text when `literal`, else a value.
fn split_kind(session: SessionId, rest: &str, literal: bool) -> Option<Decoded<'_>> {
    if let Some(digits) = rest.strip_prefix("n:") {
        return is_integer_literal(digits).then_some(Decoded {
            session,
            original: Cow::Borrowed(digits),
            is_integer: true,
        });
    }
    let text = rest.strip_prefix("s:")?;
    let original = if literal {
        let mut quoted = String::with_capacity(text.len() + 2);
        quoted.push('"');
        quoted.push_str(text);
        quoted.push('"');
        quoted
    } else {
        // Only reached for a value the backend re-escaped; a `String` always serialises.
        serde_json::to_string(text).expect("strings serialise")
    };
    Some(Decoded {
        session,
        original: Cow::Owned(original),
        is_integer: false,
    })
}

/// `-?(0|[1-9][0-9]*)`: a JSON integer, what the proxy ever writes after `n:`. Anything
/// else (`01`) would be spliced into the client's message as invalid JSON.
fn is_integer_literal(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sid() -> SessionId {
        SessionId::from_random([0x11; 16])
    }

    #[test]
    fn session_ids_are_canonical_v4() {
        let s = sid();
        assert_eq!(s.as_str(), "11111111-1111-4111-9111-111111111111");
        assert_eq!(SessionId::parse(s.as_str()), Some(s));
        assert_eq!(
            SessionId::parse("11111111-1111-4111-9111-11111111111A"),
            None
        );
        assert_eq!(SessionId::parse("x"), None);
    }

    #[test]
    fn integers_round_trip_exactly() {
        for digits in ["0", "-1", "-0", "9007199254740993", &"9".repeat(200)] {
            let routed = encoded(&sid(), RawId::Int(digits));
            let routed = std::str::from_utf8(&routed).unwrap();
            let d = decode(routed).unwrap();
            assert_eq!(
                (d.session, &*d.original, d.is_integer),
                (sid(), digits, true)
            );
        }
    }

    #[test]
    fn strings_round_trip_with_escapes_and_bars() {
        for literal in [r#""a|n:5""#, r#""é\n\"x\"""#, r#""""#, r#""\u00e9|""#] {
            let routed = encoded(&sid(), RawId::Str(literal));
            let routed = String::from_utf8(routed).unwrap();
            let d = decode(&routed).unwrap();
            assert_eq!(
                (d.session, &*d.original, d.is_integer),
                (sid(), literal, false)
            );
            // A backend that re-escapes everything still routes to the same value.
            let value: String = serde_json::from_str(&routed).unwrap();
            let reescaped: String = value
                .chars()
                .map(|c| format!("\\u{:04x}", c as u32))
                .collect::<Vec<_>>()
                .concat();
            let ascii_escaped = format!("\"{reescaped}\"");
            let d2 = decode(&ascii_escaped).unwrap();
            let original: String = serde_json::from_str(literal).unwrap();
            let back: String = serde_json::from_str(&d2.original).unwrap();
            assert_eq!((d2.session, back), (sid(), original));
        }
    }

    #[test]
    fn refuses_foreign_ids() {
        for raw in [
            "1",
            r#""abc""#,
            r#""switchboard|ping:1""#,
            &format!(r#""{}|n:1.5""#, sid()),
            &format!(r#""{}|n:""#, sid()),
            &format!(r#""{}|x:1""#, sid()),
            &format!(r#""{}|n:1,\"a\":2""#, sid()),
            &format!(r#""{}|n:01""#, sid()),
            &format!(r#""{}|n:-00""#, sid()),
        ] {
            assert_eq!(decode(raw), None, "{raw}");
        }
    }
}
