//! Events' timestamps: RFC 3339 in UTC with milliseconds, as
//! `humantime::format_rfc3339_millis` writes them. Formatting a date costs
//! more than the rest of an event's stamping, and a run emits many events
//! within one second: the part up to the second is formatted once per
//! second and reused.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The last millisecond of the year 9999, since the epoch.
const LAST: Duration = Duration::from_millis(253_402_300_799_999);

/// The last second formatted, for the next timestamps within it.
#[derive(Debug, Default)]
pub(crate) struct Clock {
    /// Seconds since the epoch of `prefix`.
    second: u64,
    /// `YYYY-MM-DDTHH:MM:SS` of that second; empty before the first use.
    prefix: String,
}

impl Clock {
    /// `time` as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
    pub(crate) fn format(&mut self, time: SystemTime) -> String {
        // A clock set before 1970 reads as 1970, one past the year 9999 as
        // its last millisecond: humantime panics outside those years.
        let (time, since_epoch) = match time.duration_since(UNIX_EPOCH) {
            Ok(since_epoch) if since_epoch < LAST => (time, since_epoch),
            Ok(_) => (UNIX_EPOCH + LAST, LAST),
            Err(_) => (UNIX_EPOCH, Duration::ZERO),
        };
        let second = since_epoch.as_secs();
        if self.prefix.is_empty() || second != self.second {
            let whole = humantime::format_rfc3339_seconds(time).to_string();
            self.prefix = whole.trim_end_matches('Z').to_string();
            self.second = second;
        }
        let millis = since_epoch.subsec_millis();
        let mut stamp = String::with_capacity(self.prefix.len() + 5);
        stamp.push_str(&self.prefix);
        stamp.push('.');
        for place in [100, 10, 1] {
            stamp.push(char::from(b'0' + (millis / place % 10) as u8));
        }
        stamp.push('Z');
        stamp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_what_humantime_writes_across_seconds_days_and_years() {
        let mut clock = Clock::default();
        let starts = [0u64, 951_782_399, 1_767_225_599, 1_798_761_599, 4_102_444_799];
        for start in starts {
            // Milliseconds up to and across the second's end, and back.
            for millis in [0u64, 1, 999, 1_000, 1_001, 1_999, 2_000, 999, 86_400_000] {
                let time = UNIX_EPOCH + Duration::from_secs(start) + Duration::from_millis(millis);
                assert_eq!(clock.format(time), humantime::format_rfc3339_millis(time).to_string());
            }
        }
        let before_epoch = UNIX_EPOCH - Duration::from_millis(1_500);
        assert_eq!(clock.format(before_epoch), "1970-01-01T00:00:00.000Z");
        let year_10000 = UNIX_EPOCH + Duration::from_secs(253_402_300_800);
        assert_eq!(clock.format(year_10000), "9999-12-31T23:59:59.999Z");
        let last = UNIX_EPOCH + LAST - Duration::from_millis(1);
        assert_eq!(clock.format(last), humantime::format_rfc3339_millis(last).to_string());
    }
}
