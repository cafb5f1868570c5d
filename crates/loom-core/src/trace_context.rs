//! A W3C trace context (`traceparent`) a client gives with a run, so that
//! the run's trace hangs beneath the client's span (docs/telemetry.md).
//!
//! The engine only carries it: it is told in the run's `lifecycle.start`,
//! stored in the run's log with it, told again when the run is resumed by
//! another process, and inherited by the run's sub-agents. Parsed here
//! rather than through OpenTelemetry's propagator so that the engine does
//! not depend on OpenTelemetry; the format is fixed and short
//! (<https://www.w3.org/TR/trace-context/#traceparent-header>).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `00-<trace id>-<parent span id>-<flags>`, lowercase hexadecimal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    /// The trace the run joins.
    pub trace_id: [u8; 16],
    /// The client's span: the run's span is its child.
    pub parent_id: [u8; 8],
    /// The trace flags; bit 0 is "sampled".
    pub flags: u8,
}

/// A `traceparent` that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("traceparent must be 00-<32 hex digits>-<16 hex digits>-<2 hex digits>, with ids not all zero: {0}")]
pub struct InvalidTraceParent(String);

impl TraceParent {
    /// Whether the client's side sampled the trace (flag bit 0): a trace
    /// it did not sample is not exported either.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

/// `text` as bytes, from exactly `2 * N` lowercase hexadecimal digits.
fn hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N || !text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    let mut bytes = [0u8; N];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(bytes)
}

impl FromStr for TraceParent {
    type Err = InvalidTraceParent;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidTraceParent(text.chars().take(80).collect());
        let mut fields = text.trim().split('-');
        let (Some(version), Some(trace_id), Some(parent_id), Some(flags)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(invalid());
        };
        // Version 00 has exactly four fields; a later version may add more
        // after them, which are ignored. `ff` is never valid.
        let version = hex::<1>(version).ok_or_else(invalid)?[0];
        if version == 0xff || (version == 0 && fields.next().is_some()) {
            return Err(invalid());
        }
        let parsed = Self {
            trace_id: hex::<16>(trace_id).ok_or_else(invalid)?,
            parent_id: hex::<8>(parent_id).ok_or_else(invalid)?,
            flags: hex::<1>(flags).ok_or_else(invalid)?[0],
        };
        if parsed.trace_id == [0; 16] || parsed.parent_id == [0; 8] {
            return Err(invalid());
        }
        Ok(parsed)
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("00-")?;
        for byte in self.trace_id {
            write!(f, "{byte:02x}")?;
        }
        f.write_str("-")?;
        for byte in self.parent_id {
            write!(f, "{byte:02x}")?;
        }
        write!(f, "-{:02x}", self.flags)
    }
}

impl Serialize for TraceParent {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TraceParent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for TraceParent {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "TraceParent".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "A W3C traceparent: 00-<trace id>-<parent span id>-<flags>, lowercase hexadecimal; version ff and ids of zeros are refused, a later version's extra fields ignored.",
            "pattern": "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-.*)?$"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIVEN: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_reads_and_prints_the_same() {
        let parsed: TraceParent = GIVEN.parse().unwrap();
        assert_eq!(parsed.trace_id[0], 0x4b);
        assert_eq!(parsed.parent_id[7], 0xb7);
        assert!(parsed.sampled());
        assert_eq!(parsed.to_string(), GIVEN);
        let json = serde_json::to_string(&parsed).unwrap();
        assert_eq!(json, format!("\"{GIVEN}\""));
        assert_eq!(serde_json::from_str::<TraceParent>(&json).unwrap(), parsed);
    }

    #[test]
    fn what_is_not_a_traceparent_is_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47z6-00f067aa0ba902b7-01",
            "0é-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(bad.parse::<TraceParent>().is_err(), "{bad:?} was taken");
        }
        // A later version may carry more fields after the four.
        let later: TraceParent = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-more"
            .parse()
            .unwrap();
        assert!(!later.sampled());
    }
}
