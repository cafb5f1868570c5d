//! The Landlock layer of the sandbox (Linux): a command may read and run
//! anything, write only under the workspace, its private temp dir and a
//! few device files, and — when the kernel's Landlock ABI has network
//! rules (v4, Linux 6.7) — neither connect nor bind TCP sockets (UDP too
//! from v10); from v6 it can neither reach abstract UNIX sockets nor signal
//! processes outside the sandbox.
//!
//! The ruleset is built in Loom's process (it opens files and allocates);
//! the forked child only makes two system calls before `exec`, which is all
//! that is safe between `fork` and `exec` in a threaded program.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use landlock::{path_beneath_rules, Access, AccessFs, AccessNet, Ruleset, RulesetAttr, RulesetCreatedAttr, Scope, ABI};

/// How a command is confined (docs/tools.md, docs/security.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SandboxMode {
    /// Not confined (the default) — but, where namespaces can be made, in
    /// a PID namespace of its own with Loom's state hidden.
    #[default]
    None,
    /// Namespaces (its own processes, network and file-system view) and
    /// Landlock inside them; where namespaces cannot be made, Landlock
    /// alone, marked `landlock-only`; a kernel without Landlock refuses
    /// the command.
    Landlock,
}

impl std::str::FromStr for SandboxMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "none" => Ok(Self::None),
            "landlock" => Ok(Self::Landlock),
            other => Err(format!("sandbox must be \"landlock\" or \"none\", not \"{other}\"")),
        }
    }
}

/// A ruleset ready to apply in the child, and what it covers.
#[derive(Debug)]
pub(crate) struct Confinement {
    ruleset: OwnedFd,
    /// The kernel's Landlock ABI version in use.
    pub abi: i32,
    /// Whether TCP connect and bind are blocked too.
    pub network_blocked: bool,
}

/// Why the sandbox cannot be applied.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SandboxError {
    #[error("{0}; the sandbox is required, so the command was not run")]
    Unavailable(String),
    #[error("the Landlock ruleset could not be built: {0}")]
    Ruleset(String),
}

/// The kernel's Landlock ABI version, or why Landlock cannot be used.
pub fn landlock_available() -> Result<i32, String> {
    /// `LANDLOCK_CREATE_RULESET_VERSION`: ask for the ABI version.
    const VERSION: libc::c_uint = 1;
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) only returns a number.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            VERSION,
        )
    };
    if version > 0 {
        return Ok(version as i32);
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EOPNOTSUPP) => Err("Landlock is built into the kernel but not enabled at boot".to_string()),
        _ => Err("the kernel has no Landlock".to_string()),
    }
}

/// The ABI to build the ruleset for, or why the sandbox cannot be applied
/// (and the command must not run).
fn usable_abi(kernel: Result<i32, String>) -> Result<ABI, SandboxError> {
    let version = kernel.map_err(SandboxError::Unavailable)?;
    if version < ABI::V3 as i32 {
        // Before ABI 3 truncating a file is not a handled right: a command
        // could empty any file it can read.
        return Err(SandboxError::Unavailable(format!(
            "the kernel's Landlock ABI is {version}; the sandbox needs 3 (Linux 6.2) or later"
        )));
    }
    Ok(ABI::from(version))
}

impl Confinement {
    /// Builds the ruleset for a command in `workspace` with temp dir `tmp`.
    pub(crate) fn build(workspace: &Path, tmp: &Path) -> Result<Self, SandboxError> {
        let abi = usable_abi(landlock_available())?;
        let network_blocked = abi as i32 >= ABI::V4 as i32;
        let bad = |err: landlock::RulesetError| SandboxError::Ruleset(err.to_string());
        let mut ruleset = Ruleset::default().handle_access(AccessFs::from_all(abi)).map_err(bad)?;
        if network_blocked {
            // Handled with no rule allowing any port: no TCP connect or
            // bind (and, from ABI 10, no UDP either).
            ruleset = ruleset.handle_access(AccessNet::from_all(abi)).map_err(bad)?;
        }
        if abi as i32 >= ABI::V6 as i32 {
            // No connecting to abstract UNIX sockets made outside the
            // sandbox (a D-Bus or an X server), no signals to processes
            // outside it.
            ruleset = ruleset.scope(Scope::from_all(abi)).map_err(bad)?;
        }
        let writable = [workspace, tmp];
        let devices = [
            "/dev/null",
            "/dev/zero",
            "/dev/full",
            "/dev/tty",
            "/dev/urandom",
            "/dev/random",
        ];
        let created = ruleset
            .create()
            .map_err(bad)?
            .add_rules(path_beneath_rules(["/"], AccessFs::from_read(abi)))
            .map_err(bad)?
            .add_rules(path_beneath_rules(writable, AccessFs::from_all(abi)))
            .map_err(bad)?
            .add_rules(path_beneath_rules(devices, AccessFs::from_all(abi)))
            .map_err(bad)?;
        let fd: Option<OwnedFd> = created.into();
        let ruleset = fd.ok_or_else(|| SandboxError::Unavailable("no Landlock ruleset was created".to_string()))?;
        Ok(Self {
            ruleset,
            abi: abi as i32,
            network_blocked,
        })
    }

    /// The ruleset's descriptor, for [`Confinement::apply_in_child`].
    pub(crate) fn raw_fd(&self) -> i32 {
        self.ruleset.as_raw_fd()
    }

    /// Restricts the calling (forked, single-threaded) process: no new
    /// privileges, then the ruleset. Only system calls: safe after `fork`.
    pub(crate) fn apply_in_child(ruleset_fd: i32) -> std::io::Result<()> {
        // SAFETY: plain system calls with integer arguments; nothing is
        // allocated or locked between fork and exec.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::syscall(libc::SYS_landlock_restrict_self, ruleset_fd, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// The Landlock helper's entry point, inside the namespaces: `ARGS` are
/// `WORKSPACE TMP -- PROGRAM ARGS…`. Restricts this process (which must
/// still be single-threaded: call it first thing in `main`) with the
/// ruleset for `WORKSPACE` and `TMP`, then becomes `PROGRAM`. Returns only
/// on failure. Landlock forbids mounting, so it cannot be applied before
/// bwrap builds the namespaces: bwrap starts this helper instead, and the
/// helper applies it (the `loom` binary answers to `loom __landlock …`).
pub fn landlock_helper_main(args: impl IntoIterator<Item = std::ffi::OsString>) -> std::io::Error {
    use std::os::unix::process::CommandExt;
    let args: Vec<std::ffi::OsString> = args.into_iter().collect();
    let (Some(workspace), Some(tmp), Some(separator)) = (args.first(), args.get(1), args.get(2)) else {
        return std::io::Error::other("usage: __landlock WORKSPACE TMP -- PROGRAM ARGS...");
    };
    if separator != "--" || args.len() < 4 {
        return std::io::Error::other("usage: __landlock WORKSPACE TMP -- PROGRAM ARGS...");
    }
    let confinement = match Confinement::build(Path::new(workspace), Path::new(tmp)) {
        Ok(confinement) => confinement,
        Err(err) => return std::io::Error::other(err.to_string()),
    };
    if let Err(err) = Confinement::apply_in_child(confinement.raw_fd()) {
        return err;
    }
    drop(confinement);
    std::process::Command::new(&args[3]).args(&args[4..]).exec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_without_landlock_or_with_an_old_abi_refuses_the_sandbox() {
        let none = usable_abi(Err("the kernel has no Landlock".to_string())).unwrap_err();
        assert!(none.to_string().contains("the command was not run"), "{none}");
        let old = usable_abi(Ok(2)).unwrap_err();
        assert!(old.to_string().contains("needs 3"), "{old}");
        assert!(matches!(usable_abi(Ok(3)), Ok(ABI::V3)));
        assert!(
            usable_abi(Ok(99)).is_ok(),
            "a newer kernel than the crate knows still works"
        );
    }
}
