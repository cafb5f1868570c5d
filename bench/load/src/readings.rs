//! Reading a process and a gateway from outside, for the benches: a field
//! of `/proc/PID/status` and a series of a `/metrics` text.

/// A field of `/proc/PID/status` (`VmRSS:`, `VmHWM:` in KiB; `Threads:`);
/// 0 when it cannot be read.
pub(crate) fn status_field(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with(field))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|value| value.parse().ok())
        })
        .unwrap_or(0)
}

/// The value of the series `name` (with its labels, if any, and a space)
/// in a Prometheus text; NaN when it is not there.
pub(crate) fn gauge(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or(f64::NAN)
}
