//! A command's process group: started in a session of its own, killed as a
//! whole. Whatever a command starts — a pipeline, a background job, a
//! grandchild that keeps the output pipes open — is in the group, and the
//! group never outlives the call: not on timeout, not on cancel, not when
//! the call's future is dropped, not when Loom dies (parent-death signal).

use std::ffi::OsString;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use super::sandbox::Confinement;

/// How long a group gets between SIGTERM and SIGKILL.
pub(crate) const KILL_GRACE: Duration = Duration::from_secs(2);

/// Starts `bash -c command` in `dir` with exactly `env`, stdin closed (or
/// piped, with `stdin`), stdout and stderr piped, as the leader of a new
/// session; through `launcher` (bwrap and its arguments) when it is not
/// empty; confined by `confinement` when given.
pub(crate) fn spawn(
    launcher: &[OsString],
    command: &str,
    dir: &Path,
    env: &[(String, String)],
    confinement: Option<&Confinement>,
    stdin: bool,
) -> std::io::Result<(Child, ProcessGroup)> {
    let mut cmd = match launcher.split_first() {
        Some((program, args)) => {
            let mut cmd = Command::new(program);
            cmd.args(args).arg("bash");
            cmd
        }
        None => Command::new("bash"),
    };
    cmd.arg("-c")
        .arg(command)
        .current_dir(dir)
        .env_clear()
        .envs(env.iter().map(|(name, value)| (name, value)))
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let ruleset = confinement.map(Confinement::raw_fd);
    // bwrap drops every privilege itself, and needs a root Loom's to build
    // the namespaces; a command started without it drops them here.
    let unprivileged = launcher.is_empty();
    // SAFETY: the closure only makes system calls (setsid, prctl, getppid,
    // landlock_restrict_self, capset); it allocates nothing and takes no lock, as
    // required between fork and exec.
    let parent = std::process::id() as libc::pid_t;
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            die_with_parent(parent)?;
            if let Some(fd) = ruleset {
                Confinement::apply_in_child(fd)?;
            }
            if unprivileged {
                super::privileges::drop_in_child()?;
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    let pgid = child
        .id()
        .ok_or_else(|| std::io::Error::other("the command exited before its id was read"))?;
    Ok((child, ProcessGroup::new(pgid as libc::pid_t)))
}

/// In a forked child before `exec`: be killed when Loom dies. The signal
/// fires when the spawning thread exits — a runtime worker, which lives as
/// long as the runtime. Only system calls: safe after `fork`.
pub(crate) fn die_with_parent(parent: libc::pid_t) -> std::io::Result<()> {
    // SAFETY: prctl, getppid and _exit are plain system calls.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Loom died between fork and prctl: nobody will read or reap us.
        if libc::getppid() != parent {
            libc::_exit(1);
        }
    }
    Ok(())
}

/// The command's process group; dropping it kills whatever is left.
#[derive(Debug)]
pub(crate) struct ProcessGroup {
    pgid: libc::pid_t,
    armed: bool,
}

impl ProcessGroup {
    /// The group led by `pgid` (a process started in a group of its own);
    /// dropping the value kills the group.
    pub(crate) fn new(pgid: libc::pid_t) -> Self {
        Self { pgid, armed: true }
    }

    /// Sends `signal` to every process of the group.
    pub(crate) fn signal(&self, signal: libc::c_int) {
        // SAFETY: killpg with a group id we created; errors (ESRCH once the
        // group is gone) are harmless.
        unsafe {
            libc::killpg(self.pgid, signal);
        }
    }

    /// Whether any process of the group is still alive. A zombie does not
    /// count: a dead grandchild waits for init to reap it, and the init of
    /// many containers does so late or never — waiting for it would make
    /// every timeout last its whole grace.
    pub(crate) fn alive(&self) -> bool {
        // SAFETY: signal 0 only checks for existence.
        let exists = unsafe { libc::killpg(self.pgid, 0) == 0 };
        exists && has_living_member(self.pgid)
    }

    /// SIGTERM to the group, SIGKILL to what is left after `grace`; reaps
    /// the leader.
    pub(crate) async fn terminate(&mut self, leader: &mut Child, grace: Duration) {
        self.signal(libc::SIGTERM);
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            let leader_done = matches!(leader.try_wait(), Ok(Some(_)));
            if leader_done && !self.alive() {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                self.signal(libc::SIGKILL);
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = leader.wait().await;
        self.armed = false;
    }

    /// Kills what is left of the group at once (the leader has exited and
    /// been reaped, or is about to be).
    pub(crate) fn kill_rest(&mut self) {
        if self.alive() {
            self.signal(libc::SIGKILL);
        }
        self.armed = false;
    }
}

/// Whether the group (which `killpg` says exists) has a member that has
/// not exited. Gone only when /proc shows members and every one is a
/// zombie; where /proc cannot tell (unreadable, another PID namespace),
/// the group counts as alive.
fn has_living_member(pgid: libc::pid_t) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    let pgid = pgid.to_string();
    let mut zombies = 0usize;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().filter(|name| name.bytes().all(|b| b.is_ascii_digit())) else {
            continue;
        };
        // `pid (comm) state ppid pgrp …`; comm may hold spaces and ')'.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let (state, pgrp) = (fields.next(), fields.nth(1));
        if pgrp == Some(pgid.as_str()) {
            if !matches!(state, Some("Z" | "X")) {
                return true;
            }
            zombies += 1;
        }
    }
    zombies == 0
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // The call's future was dropped mid-way (the run's grace ran out):
        // no chance to be gentle, and nothing may be left behind.
        if self.armed {
            self.signal(libc::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    #[test]
    fn a_group_of_only_zombies_is_not_alive() {
        let mut child = std::process::Command::new("true").process_group(0).spawn().unwrap();
        let pid = child.id() as libc::pid_t;
        let group = ProcessGroup::new(pid);
        // Not reaped yet: it exists (signal 0 reaches it) as a zombie.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while group.alive() {
            assert!(std::time::Instant::now() < deadline, "`true` never exited");
            std::thread::sleep(Duration::from_millis(10));
        }
        // SAFETY: signal 0 only checks for existence.
        assert_eq!(unsafe { libc::killpg(pid, 0) }, 0, "the zombie is still there");
        child.wait().unwrap();
        let mut group = group;
        group.kill_rest();
    }
}
