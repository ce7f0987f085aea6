//! The routed-id codec: `"<sid>|n:<digits>"` for an integer id, `"<sid>|s:<string>"` for a
//! string id. The route back to a session is derived from the id itself, so no pending
//! table exists to grow, leak or disagree with the backend.

use std::borrow::Cow;
use std::fmt;

use crate::message::RawId;

/// Longest `--instance` name.
pub(crate) const INSTANCE_MAX: usize = 32;

/// Length of the canonical UUID text of a session id.
const UUID_LEN: usize = 36;

/// Longest session id text: an instance name, a `.` and the UUID.
pub(crate) const SESSION_ID_MAX: usize = INSTANCE_MAX + 1 + UUID_LEN;

/// The name of one Switchboard instance (`--instance`): 1 to 32 of `a-z`, `0-9`, `-`.
/// Every session id the instance mints starts with it and a `.` (SPEC section 8).
#[derive(Clone, Copy)]
pub struct Instance {
    len: u8,
    bytes: [u8; INSTANCE_MAX],
}

impl Instance {
    /// Accepts `[a-z0-9-]{1,32}`; the error says what is wrong, for a config message.
    pub fn new(name: &str) -> Result<Instance, String> {
        let valid = |b: &u8| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-');
        if name.is_empty() || name.len() > INSTANCE_MAX || !name.bytes().all(|b| valid(&b)) {
            return Err(format!(
                "{name:?} is not an instance name (1 to {INSTANCE_MAX} of a-z, 0-9 and -)"
            ));
        }
        let mut bytes = [0u8; INSTANCE_MAX];
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        // At most INSTANCE_MAX (32) by the check above.
        let len = name.len() as u8;
        Ok(Instance { len, bytes })
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        // ASCII by construction (checked in `new`).
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).expect("names are ASCII")
    }
}

impl PartialEq for Instance {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Instance {}

impl fmt::Debug for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A session id: 128 random bits in canonical lowercase UUID v4 text, prefixed by `NAME.`
/// when its instance has a name (`--instance`). Never contains `|`, `"` or `\`.
///
/// Held inline (at most `SESSION_ID_MAX` bytes, zero-padded) so that it stays `Copy` and
/// costs no allocation; equality, order and hash are those of the text.
#[derive(Clone, Copy)]
pub struct SessionId {
    len: u8,
    bytes: [u8; SESSION_ID_MAX],
}

impl SessionId {
    /// Builds the id from 16 random bytes supplied by the shell (the core has no randomness);
    /// the version and variant bits are set as UUID v4 requires.
    pub fn from_random(bytes: [u8; 16]) -> Self {
        SessionId::mint(None, bytes)
    }

    /// [`SessionId::from_random`] prefixed by `instance` and a `.` when there is one: the
    /// id an instance mints.
    pub fn mint(instance: Option<&Instance>, mut random: [u8; 16]) -> Self {
        random[6] = (random[6] & 0x0f) | 0x40;
        random[8] = (random[8] & 0x3f) | 0x80;
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; SESSION_ID_MAX];
        let mut at = 0;
        if let Some(instance) = instance {
            let name = instance.as_str().as_bytes();
            out[..name.len()].copy_from_slice(name);
            out[name.len()] = b'.';
            at = name.len() + 1;
        }
        for (i, b) in random.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                out[at] = b'-';
                at += 1;
            }
            out[at] = HEX[usize::from(b >> 4)];
            out[at + 1] = HEX[usize::from(b & 0x0f)];
            at += 2;
        }
        // At most SESSION_ID_MAX (69).
        let len = at as u8;
        SessionId { len, bytes: out }
    }

    /// Accepts exactly the text this type produces: the canonical lowercase UUID, optionally
    /// after a valid instance name and a `.`. Which instance it names is not checked here:
    /// an id of another instance is simply not live.
    pub fn parse(text: &str) -> Option<Self> {
        let bytes = text.as_bytes();
        if bytes.len() < UUID_LEN || bytes.len() > SESSION_ID_MAX {
            return None;
        }
        let (prefix, uuid) = bytes.split_at(bytes.len() - UUID_LEN);
        if let Some((dot, name)) = prefix.split_last() {
            let name_ok = !name.is_empty()
                && name
                    .iter()
                    .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-'));
            if *dot != b'.' || !name_ok {
                return None;
            }
        }
        let ok = uuid.iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => matches!(b, b'0'..=b'9' | b'a'..=b'f'),
        });
        if !ok {
            return None;
        }
        let mut out = [0u8; SESSION_ID_MAX];
        out[..bytes.len()].copy_from_slice(bytes);
        // At most SESSION_ID_MAX (69) by the check above.
        let len = bytes.len() as u8;
        Some(SessionId { len, bytes: out })
    }

    /// The id's text.
    pub fn as_str(&self) -> &str {
        // The bytes are ASCII letters, digits, hyphens and a dot by construction.
        std::str::from_utf8(self.as_bytes()).expect("session ids are ASCII")
    }

    /// The id's text as bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// The instance name this id starts with, if any.
    pub fn instance(&self) -> Option<&str> {
        let text = self.as_str();
        text.len()
            .checked_sub(UUID_LEN + 1)
            .filter(|&n| n > 0)
            .map(|n| &text[..n])
    }
}

impl PartialEq for SessionId {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for SessionId {}

impl PartialOrd for SessionId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for SessionId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl std::hash::Hash for SessionId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
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
#[cfg(test)]
pub(crate) fn encode(session: &SessionId, id: RawId<'_>, out: &mut Vec<u8>) {
    encode_marked(session, id, Mark::Plain, out)
}

/// What the proxy does with the result of a routed request on the way back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mark {
    /// Delivered as the backend wrote it.
    #[default]
    Plain,
    /// A list to filter for its caller by the policy and scopes (SPEC section 10):
    /// `<sid>|fn:<digits>` or `<sid>|fs:<string>`.
    Filtered,
    /// A `tasks/list` to filter to its caller's own tasks (SPEC section 15): `<sid>|tn:..`.
    Tasks,
}

/// [`encode`], with the id's [`Mark`] before its kind. The proxy writes the mark and the
/// kind before any byte of the client's id, so no client id can forge or hide the mark.
pub(crate) fn encode_marked(session: &SessionId, id: RawId<'_>, mark: Mark, out: &mut Vec<u8>) {
    out.push(b'"');
    out.extend_from_slice(session.as_bytes());
    out.extend_from_slice(match mark {
        Mark::Plain => b"|",
        Mark::Filtered => b"|f",
        Mark::Tasks => b"|t",
    });
    match id {
        RawId::Int(digits) => {
            out.extend_from_slice(b"n:");
            out.extend_from_slice(digits.as_bytes());
        }
        RawId::Str(literal) => {
            out.extend_from_slice(b"s:");
            out.extend_from_slice(&literal.as_bytes()[1..literal.len() - 1]);
        }
    }
    out.push(b'"');
}

/// The routed id for `id` of `session`, as a JSON string literal.
#[cfg(test)]
fn encoded(session: &SessionId, id: RawId<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(id.as_str().len() + session.as_bytes().len() + 6);
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
    /// What its result needs on the way back ([`encode_marked`]).
    pub mark: Mark,
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
        ..decoded
    })
}

/// `rest` is what follows `<sid>|`: raw string-literal text when `literal`, else a value.
fn split_kind(session: SessionId, rest: &str, literal: bool) -> Option<Decoded<'_>> {
    let (mark, rest) = match rest.as_bytes().first() {
        Some(b'f') => (Mark::Filtered, &rest[1..]),
        Some(b't') => (Mark::Tasks, &rest[1..]),
        _ => (Mark::Plain, rest),
    };
    if let Some(digits) = rest.strip_prefix("n:") {
        return is_integer_literal(digits).then_some(Decoded {
            session,
            original: Cow::Borrowed(digits),
            is_integer: true,
            mark,
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
        mark,
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
    fn marked_ids_round_trip_and_client_ids_cannot_forge_the_mark() {
        let s = sid();
        for (raw, id) in [
            ("7", RawId::Int("7")),
            (r#""fn:1""#, RawId::Str(r#""fn:1""#)),
            (r#""tn:1""#, RawId::Str(r#""tn:1""#)),
        ] {
            for mark in [Mark::Plain, Mark::Filtered, Mark::Tasks] {
                let mut out = Vec::new();
                encode_marked(&s, id, mark, &mut out);
                let text = String::from_utf8(out).unwrap();
                let d = decode(&text).unwrap();
                assert_eq!((d.original.as_ref(), d.mark), (raw, mark), "{text}");
            }
        }
        // Whatever a client's string id holds comes after the proxy's `s:`.
        for id in [
            r#""fs:x""#,
            r#""x|fn:2""#,
            r#""f""#,
            r#""\u0066n:1""#,
            r#""ts:1""#,
        ] {
            let mut out = Vec::new();
            encode(&s, RawId::Str(id), &mut out);
            let d = decode(std::str::from_utf8(&out).unwrap()).unwrap();
            assert_eq!(d.mark, Mark::Plain, "{id}");
            assert_eq!(d.original, id);
        }
        assert!(decode(&format!("\"{s}|f:1\"")).is_none());
        assert!(decode(&format!("\"{s}|ff:1\"")).is_none());
        assert!(decode(&format!("\"{s}|tf:1\"")).is_none());
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

    fn named(name: &str) -> SessionId {
        SessionId::mint(Some(&Instance::new(name).unwrap()), [0x11; 16])
    }

    #[test]
    fn instance_names_are_checked() {
        for ok in ["a", "eu-west-1", &"z".repeat(32), "0", "-"] {
            assert_eq!(Instance::new(ok).map(|i| i.to_string()), Ok(ok.to_owned()));
        }
        for bad in ["", "A", "a.b", "a|b", "a b", "é", &"z".repeat(33), "a_b"] {
            assert!(Instance::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn minted_ids_name_their_instance() {
        let s = named("eu-1");
        assert_eq!(s.as_str(), "eu-1.11111111-1111-4111-9111-111111111111");
        assert_eq!(s.instance(), Some("eu-1"));
        assert_eq!(sid().instance(), None);
        assert_eq!(SessionId::parse(s.as_str()), Some(s));
        let longest = named(&"z".repeat(32));
        assert_eq!(longest.as_str().len(), SESSION_ID_MAX);
        assert_eq!(SessionId::parse(longest.as_str()), Some(longest));
        // The same random bits under another name, or none, are another session.
        assert_ne!(named("a"), named("b"));
        assert_ne!(named("a"), sid());
        assert_eq!(
            SessionId::mint(None, [0x11; 16]),
            SessionId::parse(sid().as_str()).unwrap()
        );
    }

    #[test]
    fn malformed_prefixes_are_refused() {
        let uuid = sid();
        for bad in [
            format!(".{uuid}"),
            format!("A.{uuid}"),
            format!("a..{uuid}"),
            format!("a-{uuid}"),
            format!("a|{uuid}"),
            format!("a\\.{uuid}"),
            format!("{}.{uuid}", "z".repeat(33)),
            format!("a.{uuid}x"),
            format!("a.{}", &uuid.as_str()[1..]),
            "a.".to_owned(),
            format!("a.{uuid}.b"),
        ] {
            assert_eq!(SessionId::parse(&bad), None, "{bad}");
        }
    }

    #[test]
    fn prefixed_ids_round_trip() {
        let s = named("b");
        for id in [
            RawId::Int("-7"),
            RawId::Str(r#""a|n:5""#),
            RawId::Str(r#""x\"y""#),
        ] {
            let routed = String::from_utf8(encoded(&s, id)).unwrap();
            assert!(routed.starts_with("\"b.11111111-"), "{routed}");
            let d = decode(&routed).unwrap();
            assert_eq!((d.session, &*d.original), (s, id.as_str()));
            // Re-escaped by the backend: still the same session and id.
            let value: String = serde_json::from_str(&routed).unwrap();
            let escaped: String = value
                .chars()
                .map(|c| format!("\\u{:04x}", c as u32))
                .collect();
            let escaped = format!("\"{escaped}\"");
            assert_eq!(decode(&escaped).unwrap().session, s);
        }
        for raw in [
            format!(r#""B.{}|n:1""#, sid()),
            format!(r#""b.{}|n:01""#, sid()),
            format!(r#""b.{}n:1""#, sid()),
            format!(r#""b.b.{}|n:1""#, sid()),
        ] {
            assert_eq!(decode(&raw), None, "{raw}");
        }
    }

    #[test]
    fn parse_is_exact_on_arbitrary_text() {
        // Pieces that make near-misses likely: name characters, separators, UUID parts.
        let pieces = [
            "a",
            "z9",
            "-",
            ".",
            "|",
            "\\",
            "\"",
            "A",
            "é",
            "0",
            "eu-1.",
            &sid().to_string(),
            "11111111-1111-4111-9111-",
            "111111111111",
            &"q".repeat(32),
        ];
        let mut rng = fastrand::Rng::with_seed(13);
        let (mut bare, mut named) = (0, 0);
        for _ in 0..20_000 {
            let text: String = (0..rng.usize(0..5))
                .map(|_| pieces[rng.usize(..pieces.len())])
                .collect();
            if let Some(parsed) = SessionId::parse(&text) {
                assert_eq!(parsed.as_str(), text);
                assert!(text.len() == 36 || parsed.instance().is_some(), "{text}");
                if parsed.instance().is_some() {
                    named += 1;
                } else {
                    bare += 1;
                }
                let name = parsed.instance().map(|n| Instance::new(n).unwrap());
                assert_eq!(name.map(|n| n.to_string()).as_deref(), parsed.instance());
            }
            let routed = format!("\"{text}|n:1\"");
            if let Some(d) = decode(&routed) {
                assert_eq!(d.session.as_str(), text);
            }
        }
        assert!(bare > 0 && named > 0, "the pieces never made a valid id");
    }
}
