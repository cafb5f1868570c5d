//! Who runs a run, and whether that process is still alive.
//!
//! A stored run records its owner. A run left `RUNNING` by a process that
//! died (a crash, `kill -9`, a reboot) must become `INTERRUPTED` so it can be
//! resumed — but only when we are sure the owner is gone: a live owner's
//! run must never be taken over. The owner string therefore names the
//! machine, the process id and the process's start time (so a recycled pid
//! is not mistaken for the original process). The machine is its host name
//! and a digest of its `/etc/machine-id`: with runs in a Redis that several
//! machines share, two machines of one host name (cloned VMs, containers
//! given the same `--hostname`) must not judge each other's processes.

use std::path::Path;

/// Whether an owner process still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// It runs.
    Alive,
    /// It is gone: its runs may be marked interrupted.
    Dead,
    /// We cannot tell (another host, not a process owner, no `/proc`).
    Unknown,
}

/// The owner string of this process: `host#MACHINE/pid:N/start:TICKS`
/// (`host/…` where the machine has no id).
pub fn this_process() -> String {
    let pid = std::process::id();
    match start_ticks(pid) {
        Some(start) => format!("{}/pid:{pid}/start:{start}", machine()),
        None => format!("{}/pid:{pid}", machine()),
    }
}

/// This machine as owner strings name it: its host name and, where it has
/// one, 12 hex digits of a digest of its machine id (the id itself is not
/// to be shown: systemd asks that it be kept private).
pub fn this_machine() -> String {
    machine()
}

/// The machine an owner string (of [`this_process`]) names: what
/// [`this_machine`] said in that process.
pub fn machine_of(owner: &str) -> &str {
    owner.split('/').next().unwrap_or(owner)
}

fn machine() -> String {
    match machine_id() {
        Some(id) => format!(
            "{}#{:012x}",
            host_name(),
            crate::text::fnv1a(format!("loom-owner:{id}").bytes()) >> 16
        ),
        None => host_name(),
    }
}

fn machine_id() -> Option<String> {
    ["/etc/machine-id", "/var/lib/dbus/machine-id"]
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok())
        .map(|id| id.trim().to_string())
        .filter(|id| !id.is_empty())
}

/// Whether an owner's machine part names this machine. One written before
/// machines had ids in owner strings (a host name alone) is judged by the
/// host name, as it was then.
fn is_this_machine(recorded: &str) -> bool {
    if recorded.contains('#') {
        recorded == machine()
    } else {
        recorded == host_name()
    }
}

/// Whether the process named by `owner` (as written by [`this_process`])
/// still runs. Owners in other formats (workers, other hosts) are `Unknown`.
pub fn liveness(owner: &str) -> Liveness {
    let Some(parsed) = ProcessOwner::parse(owner) else {
        return Liveness::Unknown;
    };
    if !is_this_machine(parsed.host) || !Path::new("/proc/self/stat").exists() {
        return Liveness::Unknown;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", parsed.pid)) else {
        return Liveness::Dead;
    };
    let Some(fields) = stat_fields(&stat) else {
        return Liveness::Unknown;
    };
    // A zombie has exited; it only waits for its parent to reap it.
    if fields.first() == Some(&"Z") || fields.first() == Some(&"X") {
        return Liveness::Dead;
    }
    match (parsed.start, fields.get(19).and_then(|t| t.parse::<u64>().ok())) {
        (Some(recorded), Some(actual)) if recorded != actual => Liveness::Dead,
        _ => Liveness::Alive,
    }
}

/// The process id in an owner string of this format, for signalling it.
pub fn owner_pid(owner: &str) -> Option<u32> {
    ProcessOwner::parse(owner).map(|owner| owner.pid)
}

struct ProcessOwner<'a> {
    host: &'a str,
    pid: u32,
    start: Option<u64>,
}

impl<'a> ProcessOwner<'a> {
    fn parse(owner: &'a str) -> Option<Self> {
        let mut parts = owner.split('/');
        let host = parts.next()?;
        let pid = parts.next()?.strip_prefix("pid:")?.parse().ok()?;
        let start = match parts.next() {
            Some(part) => Some(part.strip_prefix("start:")?.parse().ok()?),
            None => None,
        };
        if parts.next().is_some() {
            return None;
        }
        Some(Self { host, pid, start })
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty() && !name.contains('/'))
        .unwrap_or_else(|| "localhost".to_string())
}

/// The fields of `/proc/PID/stat` after the command name (which may itself
/// hold spaces and parentheses): index 0 is the state, 19 the start time.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().collect())
}

fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_fields(&stat)?.get(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_parses() {
        let me = this_process();
        assert_eq!(owner_pid(&me), Some(std::process::id()));
        if Path::new("/proc/self/stat").exists() {
            assert_eq!(liveness(&me), Liveness::Alive);
        }
    }

    #[test]
    fn an_exited_process_is_dead_and_a_recycled_pid_is_not_the_owner() {
        if !Path::new("/proc/self/stat").exists() {
            return;
        }
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert_eq!(liveness(&format!("{}/pid:{pid}", machine())), Liveness::Dead);
        // An owner written before machine ids (the host name alone) is
        // judged as before.
        assert_eq!(liveness(&format!("{}/pid:{pid}", host_name())), Liveness::Dead);
        // Our own pid with another start time: a different process.
        let me = std::process::id();
        assert_eq!(liveness(&format!("{}/pid:{me}/start:1", machine())), Liveness::Dead);
    }

    #[test]
    fn other_hosts_and_other_formats_are_unknown() {
        let me = std::process::id();
        assert_eq!(liveness(&format!("elsewhere.example/pid:{me}")), Liveness::Unknown);
        // The same host name on another machine (another machine id).
        assert_eq!(
            liveness(&format!("{}#000000000000/pid:{me}", host_name())),
            Liveness::Unknown
        );
        assert_eq!(liveness("worker-7"), Liveness::Unknown);
        assert_eq!(liveness("pid:12"), Liveness::Unknown);
        assert_eq!(owner_pid("worker-7"), None);
    }

    #[test]
    fn command_names_with_parentheses_do_not_confuse_the_parser() {
        let stat = "42 (a) b) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 777 20";
        let fields = stat_fields(stat).unwrap();
        assert_eq!(fields[0], "S");
        assert_eq!(fields[19], "777");
    }
}
