//! Traces (SPEC section 14) as data: W3C Trace Context (`traceparent`, `tracestate`), the
//! OpenTelemetry sampler, span ids from the shell's random bytes, and the finished span the
//! shell hands to its exporter ([`SpanRecord`]). Pure: the hub decides every span from its
//! own times; a shell only maps `Instant`s to wall time and exports.

use std::fmt::Write as _;
use std::time::Instant;

/// A span's identity as W3C Trace Context carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanContext {
    /// Never all zeros.
    pub trace_id: [u8; 16],
    /// Never all zeros.
    pub span_id: [u8; 8],
    /// The `sampled` trace flag.
    pub sampled: bool,
}

impl SpanContext {
    /// A `traceparent` value (W3C Trace Context level 1): version 00 exactly, a later
    /// version by its first four fields; `None` for anything invalid, which is then ignored.
    pub fn parse(text: &str) -> Option<SpanContext> {
        let text = text.trim_matches([' ', '\t']);
        let b = text.as_bytes();
        if b.len() < 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let version = hex::<1>(&text[..2])?[0];
        let exact = version == 0 && b.len() == 55;
        let later = version != 0 && version != 0xff && (b.len() == 55 || b[55] == b'-');
        if !(exact || later) {
            return None;
        }
        let trace_id = hex::<16>(&text[3..35])?;
        let span_id = hex::<8>(&text[36..52])?;
        let flags = hex::<1>(&text[53..55])?[0];
        let valid = trace_id != [0; 16] && span_id != [0; 8];
        valid.then_some(SpanContext {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }

    /// The `traceparent` value naming this span as the parent.
    pub fn traceparent(&self) -> String {
        let mut out = String::with_capacity(55);
        out.push_str("00-");
        push_hex(&mut out, &self.trace_id);
        out.push('-');
        push_hex(&mut out, &self.span_id);
        out.push_str(if self.sampled { "-01" } else { "-00" });
        out
    }
}

/// Lowercase hex of exactly `N` bytes (W3C forbids upper case).
fn hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0; N];
    for (byte, pair) in out.iter_mut().zip(digits.chunks(2)) {
        *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    for byte in bytes {
        let _ = write!(out, "{byte:02x}");
    }
}

/// A `tracestate` value worth passing on: at most 512 characters and 32 members, each
/// `key=value` in printable ASCII. Anything else is dropped, as W3C allows.
pub(crate) fn valid_tracestate(text: &str) -> Option<&str> {
    let text = text.trim_matches([' ', '\t']);
    let members = text.split(',').map(|m| m.trim_matches([' ', '\t']));
    let member_ok = |m: &str| match m.split_once('=') {
        None => m.is_empty(),
        Some((key, value)) => {
            !key.is_empty()
                && !value.is_empty()
                && key.bytes().all(|c| c.is_ascii_graphic())
                && value
                    .bytes()
                    .all(|c| (0x20..0x7f).contains(&c) && c != b',' && c != b'=')
        }
    };
    let ok = !text.is_empty() && text.len() <= 512 && text.split(',').count() <= 32;
    (ok && members.clone().all(member_ok)).then_some(text)
}

/// What a sampler decides when a span has no parent (`OTEL_TRACES_SAMPLER`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Root {
    /// `always_on`.
    AlwaysOn,
    /// `always_off`.
    AlwaysOff,
    /// `traceidratio`: this fraction of trace ids, by the id itself.
    Ratio(f64),
}

/// The OpenTelemetry sampler: a root decision, and whether a parent's `sampled` flag
/// decides instead (the `parentbased_*` samplers).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    /// For a span without a parent (or any span when not parent-based).
    pub root: Root,
    /// A parent's decision wins.
    pub parent_based: bool,
}

impl Default for Sampler {
    /// `parentbased_always_on`, the OpenTelemetry default.
    fn default() -> Self {
        Sampler {
            root: Root::AlwaysOn,
            parent_based: true,
        }
    }
}

impl Sampler {
    /// `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` (a ratio in [0, 1], default 1).
    pub fn parse(name: &str, arg: Option<&str>) -> Result<Sampler, String> {
        let (parent_based, root) = match name.strip_prefix("parentbased_") {
            Some(root) => (true, root),
            None => (false, name),
        };
        let root = match root {
            "always_on" => Root::AlwaysOn,
            "always_off" => Root::AlwaysOff,
            "traceidratio" => {
                let ratio = match arg {
                    None => 1.0,
                    Some(arg) => arg
                        .trim()
                        .parse::<f64>()
                        .map_err(|_| format!("OTEL_TRACES_SAMPLER_ARG {arg:?} is not a number"))?,
                };
                if !(0.0..=1.0).contains(&ratio) {
                    return Err(format!("OTEL_TRACES_SAMPLER_ARG {ratio} is not in [0, 1]"));
                }
                Root::Ratio(ratio)
            }
            _ => {
                return Err(format!(
                    "OTEL_TRACES_SAMPLER {name:?} is not a known sampler"
                ))
            }
        };
        Ok(Sampler { root, parent_based })
    }

    /// Whether a span of `trace_id` under `parent` is recorded and exported.
    pub fn samples(&self, trace_id: &[u8; 16], parent: Option<&SpanContext>) -> bool {
        if let (true, Some(parent)) = (self.parent_based, parent) {
            return parent.sampled;
        }
        match self.root {
            Root::AlwaysOn => true,
            Root::AlwaysOff => false,
            // As the OpenTelemetry SDKs do: the id's last 8 bytes against the ratio.
            Root::Ratio(ratio) => {
                let bound = (ratio * (1u64 << 63) as f64) as u64;
                let draw = u64::from_be_bytes(trace_id[8..].try_into().unwrap_or_default()) >> 1;
                draw < bound
            }
        }
    }
}

impl TraceHeaders {
    /// Ids for the request's spans from its random bytes: a trace id (used when it has no
    /// parent), the SERVER span's id and the CLIENT span's id; none all zeros.
    pub fn ids(&self) -> ([u8; 16], [u8; 8], [u8; 8]) {
        ids(&self.entropy)
    }
}

fn ids(entropy: &[u8; 32]) -> ([u8; 16], [u8; 8], [u8; 8]) {
    let mut trace_id: [u8; 16] = entropy[..16].try_into().unwrap_or_default();
    let mut server: [u8; 8] = entropy[16..24].try_into().unwrap_or_default();
    let mut client: [u8; 8] = entropy[24..].try_into().unwrap_or_default();
    trace_id[15] |= (trace_id == [0; 16]) as u8;
    server[7] |= (server == [0; 8]) as u8;
    client[7] |= (client == [0; 8]) as u8;
    if client == server {
        client[0] ^= 0xff;
    }
    (trace_id, server, client)
}

/// What a request brings for its spans when tracing is on: the HTTP `traceparent` and
/// `tracestate` headers (valid ones) and 32 random bytes for its ids.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceHeaders {
    /// The `traceparent` header, if valid.
    pub parent: Option<SpanContext>,
    /// The `tracestate` header, if valid.
    pub tracestate: Option<String>,
    /// Random bytes from the OS ([`crate::http::Request::seed_trace`]).
    pub entropy: [u8; 32],
}

/// SERVER for the client's request, CLIENT for the hop to the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// A request Switchboard answered (or the backend answered through it).
    Server,
    /// The backend hop.
    Client,
}

/// The span status: the conventions set ERROR only, never a description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanStatus {
    /// Nothing failed (or the caller erred).
    Unset,
    /// The request failed.
    Error,
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
}

/// A link to another span (the HTTP header's context when `_meta` named the parent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanLink {
    /// The linked span.
    pub context: SpanContext,
    /// Its `tracestate`.
    pub tracestate: Option<String>,
}

/// One finished, sampled span ([`crate::Output::Span`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SpanRecord {
    /// Its trace id, span id and (always true here) sampled flag.
    pub context: SpanContext,
    /// The parent span's id (in the same trace), if any.
    pub parent_span_id: Option<[u8; 8]>,
    /// SERVER or CLIENT.
    pub kind: SpanKind,
    /// `{mcp.method.name} {target}`, or the method alone.
    pub name: String,
    /// When it started, on the hub's clock.
    pub start: Instant,
    /// When it ended.
    pub end: Instant,
    /// ERROR or unset.
    pub status: SpanStatus,
    /// The conventions' attributes, by their names in SPEC section 14.
    pub attributes: Vec<(&'static str, Value)>,
    /// Links (at most one: the header's context).
    pub links: Vec<SpanLink>,
    /// The `tracestate` to export with it.
    pub tracestate: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_round_trips_and_rejects_the_invalid() {
        let context = SpanContext::parse(PARENT).unwrap();
        assert!(context.sampled);
        assert_eq!(
            context.span_id,
            [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        assert_eq!(context.traceparent(), PARENT);
        let unsampled = PARENT.replace("-01", "-00");
        assert!(!SpanContext::parse(&unsampled).unwrap().sampled);
        // A later version may add fields after a dash; version 00 may not.
        assert!(SpanContext::parse(&format!("cc{}-what", &PARENT[2..])).is_some());
        assert!(SpanContext::parse(&format!("{PARENT}-what")).is_none());
        for bad in [
            "",
            &PARENT.to_uppercase(),
            &PARENT.replace("4bf92f3577b34da6a3ce929d0e0e4736", &"0".repeat(32)),
            &PARENT.replace("00f067aa0ba902b7", &"0".repeat(16)),
            &format!("ff{}", &PARENT[2..]),
            &PARENT[..54],
            &PARENT.replace('-', "_"),
        ] {
            assert_eq!(SpanContext::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn tracestate_is_passed_on_only_when_well_formed() {
        assert_eq!(
            valid_tracestate("rojo=00f067aa0ba902b7, congo=t61rcWkgMzE"),
            Some("rojo=00f067aa0ba902b7, congo=t61rcWkgMzE")
        );
        assert_eq!(valid_tracestate(""), None);
        assert_eq!(valid_tracestate("novalue="), None);
        assert_eq!(valid_tracestate(&"a=b,".repeat(40)), None);
        assert_eq!(valid_tracestate(&format!("a={}", "x".repeat(600))), None);
    }

    #[test]
    fn samplers_follow_the_otel_names_and_the_parent() {
        assert_eq!(
            Sampler::parse("parentbased_always_on", None),
            Ok(Sampler::default())
        );
        assert!(Sampler::parse("sometimes", None).is_err());
        assert!(Sampler::parse("traceidratio", Some("1.5")).is_err());
        assert!(Sampler::parse("traceidratio", Some("half")).is_err());
        let off = Sampler::parse("parentbased_always_off", None).unwrap();
        let sampled = SpanContext::parse(PARENT).unwrap();
        let id = [0xab; 16];
        assert!(off.samples(&id, Some(&sampled)));
        assert!(!off.samples(&id, None));
        let on = Sampler::parse("always_on", None).unwrap();
        let unsampled = SpanContext {
            sampled: false,
            ..sampled
        };
        assert!(on.samples(&id, Some(&unsampled)), "not parent-based");
        let none = Sampler::parse("traceidratio", Some("0")).unwrap();
        let all = Sampler::parse("traceidratio", Some("1")).unwrap();
        let half = Sampler::parse("traceidratio", Some("0.5")).unwrap();
        let mut low = [0u8; 16];
        low[8] = 0x3f;
        let mut high = [0u8; 16];
        high[8] = 0xc0;
        assert!(!none.samples(&[0xff; 16], None) && !none.samples(&[1; 16], None));
        assert!(all.samples(&[0xff; 16], None));
        assert!(half.samples(&low, None) && !half.samples(&high, None));
    }

    #[test]
    fn ids_are_never_zero_nor_equal() {
        let (trace, server, client) = ids(&[0; 32]);
        assert_ne!(trace, [0; 16]);
        assert_ne!(server, [0; 8]);
        assert_ne!(client, server);
        let mut entropy = [0u8; 32];
        entropy
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8 + 1);
        let (trace, server, client) = ids(&entropy);
        assert_eq!((trace[0], server[0], client[0]), (1, 17, 25));
    }
}
