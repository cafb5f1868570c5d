//! The namespace layer of the `bash` sandbox, through Debian's
//! `bubblewrap` (`bwrap`): every command runs in its own PID namespace
//! with a fresh `/proc` (no other process, Loom included, can be seen or
//! signalled), its own mount namespace, IPC and UTS namespaces, and —
//! sandboxed — its own empty network namespace.
//!
//! What the command sees of the file system depends on the mode:
//! - sandboxed: the system directories read-only (`/usr`, `/bin`, `/lib*`,
//!   `/etc`), the workspace and the call's temp dir writable, and
//!   empty, private `/tmp`, `/run` and `$HOME`. No pathname socket outside
//!   the workspace (a Docker daemon, an ssh-agent, the session bus, X11)
//!   is there to connect to, and no file of Loom's own.
//! - unsandboxed (`sandbox = "none"`): the whole file system as Loom sees
//!   it, except Loom's state, which is hidden.
//!
//! In both, Loom's state (`ToolContext::protected`) is covered by an empty
//! mount and the configuration Loom reads (`ToolContext::read_only`) is
//! bound read-only over itself: a mount point cannot be replaced, renamed
//! or written from inside. bwrap drops every capability (bounding set
//! included) and sets `no_new_privs`, so the command cannot undo a mount
//! nor gain a privilege from a setuid program, and the kernel's settings
//! (`/proc/sys`, `/sys`) are read-only, which uid 0 without capabilities
//! could otherwise still write.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use super::sandbox::SandboxMode;

/// Where bwrap is looked for, by absolute path only: never through PATH,
/// on which a command run earlier (unsandboxed, or a project's
/// `node_modules/.bin`) may have put a `bwrap` of its own. Debian installs
/// it in /usr/bin.
const BWRAP_PLACES: &[&str] = &["/usr/bin/bwrap", "/bin/bwrap", "/usr/local/bin/bwrap"];

/// Where the Landlock helper is bound inside the namespaces.
pub(crate) const HELPER_INSIDE: &str = "/run/loom-sandbox/helper";

/// System directories a sandboxed command may read and run from: the
/// system's programs and libraries and `/etc`. Not `/opt`, `/srv`,
/// `/home`, `/root` or `/var`, where another program's (or another
/// Loom's) files and secrets live.
const SYSTEM_DIRS: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"];

/// The kernel's settings and triggers, read-only in every mode: a command
/// runs without capabilities, but a root Loom's command is still uid 0,
/// which the file modes there let write — `/proc/sys/kernel/core_pattern`
/// names a program the kernel runs as real root, outside every namespace,
/// on the next crash. What does not exist is skipped.
const KERNEL_READ_ONLY: &[&str] = &[
    "/proc/sys",
    "/proc/sysrq-trigger",
    "/proc/irq",
    "/proc/bus",
    "/proc/fs",
    "/proc/acpi",
    "/proc/scsi",
    "/sys",
];

/// The bwrap to use: `configured` (`[tools.bash] bwrap`), else the first
/// of [`BWRAP_PLACES`] that exists, and whether the namespace layer can be
/// used with it here, or why not. Tried once per program per process: it
/// must run, and the kernel must let it make namespaces (unprivileged user
/// namespaces on, or root).
pub fn namespaces_available(configured: Option<&Path>) -> Result<PathBuf, String> {
    static PROBES: OnceLock<Mutex<HashMap<PathBuf, Result<PathBuf, String>>>> = OnceLock::new();
    let program = match configured {
        Some(path) => path.to_path_buf(),
        None => match BWRAP_PLACES.iter().map(Path::new).find(|place| place.is_file()) {
            Some(place) => place.to_path_buf(),
            None => {
                return Err(format!(
                    "bwrap is not installed (looked for {}; Debian: apt-get install bubblewrap)",
                    BWRAP_PLACES.join(", ")
                ))
            }
        },
    };
    let probes = PROBES.get_or_init(Mutex::default);
    if let Some(known) = probes
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .get(&program)
    {
        return known.clone();
    }
    let result = probe(&program);
    probes
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .insert(program, result.clone());
    result
}

/// Runs `true` under `program` with the namespaces a command gets.
fn probe(program: &Path) -> Result<PathBuf, String> {
    let output = std::process::Command::new(program)
        .args([
            "--unshare-all",
            "--die-with-parent",
            "--cap-drop",
            "ALL",
            "--ro-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
            "--",
            "true",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output();
    match output {
        Ok(output) if output.status.success() => Ok(program.to_path_buf()),
        Ok(output) => Err(format!(
            "{} cannot create namespaces here: {}",
            program.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        )),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Err(format!(
            "bwrap is not installed ({} does not exist; Debian: apt-get install bubblewrap)",
            program.display()
        )),
        Err(err) => Err(format!("{} could not be started: {err}", program.display())),
    }
}

/// What a command's view of the file system is built from.
#[derive(Debug)]
pub(crate) struct View<'a> {
    pub mode: SandboxMode,
    pub workspace: &'a Path,
    /// The call's private temp dir.
    pub tmp: &'a Path,
    /// Loom's state: hidden.
    pub protected: &'a [PathBuf],
    /// Loom's configuration: read-only.
    pub read_only: &'a [PathBuf],
    /// The user's home, replaced by an empty one when sandboxed.
    pub home: Option<PathBuf>,
}

impl View<'_> {
    /// bwrap and its arguments, up to and including `--`: what comes after
    /// is the command.
    pub(crate) fn bwrap_args(&self, bwrap: &Path, helper: Option<&Path>) -> Vec<OsString> {
        let mut args = Args::default();
        args.push(bwrap);
        args.extend(["--unshare-all", "--die-with-parent", "--cap-drop", "ALL"]);
        let sandboxed = self.mode == SandboxMode::Landlock;
        if sandboxed {
            for dir in SYSTEM_DIRS {
                args.extend(["--ro-bind-try", dir, dir]);
            }
            args.extend(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/run"]);
            args.extend(["--tmpfs", "/var", "--dir", "/var/tmp"]);
            if let Some(home) = self
                .home
                .as_deref()
                .filter(|home| home.is_absolute() && *home != Path::new("/") && !home.starts_with(self.workspace))
            {
                args.push("--tmpfs");
                args.push(home);
            }
            args.bind("--bind", self.workspace, self.workspace);
            args.bind("--bind", self.tmp, self.tmp);
            if let Some(helper) = helper {
                args.bind("--ro-bind", helper, Path::new(HELPER_INSIDE));
            }
        } else {
            // Everything as Loom sees it, with a /proc of its own.
            args.extend(["--share-net", "--dev-bind", "/", "/", "--proc", "/proc"]);
            if is_root() {
                // Uid 0 without capabilities still opens root's device
                // files (a disk, read around every hidden file): only the
                // harmless ones.
                args.extend(["--dev", "/dev"]);
            }
            // The workspace, Loom's state and its configuration, and every
            // folder above them, each made a mount point: a mount point
            // cannot be renamed, so a command cannot move the workspace or
            // a parent of Loom's state aside and plant a new one in its
            // place (which the next hook, trust check or `loom` would read).
            // Their contents stay as writable as they were.
            // `--dev-bind`, as `/` is: `--bind` would remount them nodev.
            // `-try`: a folder removed since it was seen (another Loom's
            // state, gone with it) is no reason to refuse the command.
            for dir in pinned(self.workspace, self.protected, self.read_only) {
                args.bind("--dev-bind-try", &dir, &dir);
            }
        }
        // The sandboxed view has no /sys at all, and its /proc is its own.
        for path in KERNEL_READ_ONLY
            .iter()
            .filter(|path| !sandboxed || path.starts_with("/proc/"))
        {
            args.extend(["--ro-bind-try", path, path]);
        }
        // Only what is in the command's view needs covering; a mount on a
        // path outside it would create directories in read-only places.
        let visible = |path: &Path| {
            !sandboxed
                || path.starts_with(self.workspace)
                || path.starts_with(self.tmp)
                || SYSTEM_DIRS.iter().any(|dir| path.starts_with(dir))
        };
        for path in sorted(self.read_only) {
            if visible(&path) && path.exists() {
                args.bind("--ro-bind", &path, &path);
            }
        }
        let protected = sorted(self.protected);
        for (index, path) in protected.iter().enumerate() {
            // Under a directory already covered: nothing to cover, and no
            // need to tell the command where it is.
            let covered = protected[..index].iter().any(|outer| path.starts_with(outer));
            if covered || !visible(path) {
                continue;
            }
            match std::fs::symlink_metadata(path) {
                Ok(meta) if meta.is_dir() => {
                    args.push("--tmpfs");
                    args.push(path);
                }
                Ok(_) => args.bind("--ro-bind", Path::new("/dev/null"), path),
                Err(_) => {}
            }
        }
        args.push("--chdir");
        args.push(self.workspace);
        args.push("--");
        args.0
    }
}

/// Whether Loom runs as root: its commands are then uid 0, which the file
/// modes of the kernel's and the system's files let write.
pub(crate) fn is_root() -> bool {
    // SAFETY: a plain system call.
    unsafe { libc::geteuid() == 0 }
}

/// The existing directories to pin as mount points ([`View::bwrap_args`]):
/// the workspace, and every folder above it and above each of `protected`
/// and `read_only` (not `/`, which is one already), outermost first.
fn pinned(workspace: &Path, protected: &[PathBuf], read_only: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = workspace.ancestors().map(Path::to_path_buf).collect();
    for path in protected.iter().chain(read_only) {
        dirs.extend(path.ancestors().skip(1).map(Path::to_path_buf));
    }
    // Nothing under the kernel's own file systems: `/proc` is the
    // command's own (a pin from outside would bring Loom's back), and
    // `/sys` and `/dev` are no place for Loom's files.
    let kernel = ["/proc", "/sys", "/dev"];
    dirs.retain(|dir| {
        dir.is_absolute()
            && dir.parent().is_some()
            && !kernel.iter().any(|root| dir.starts_with(root))
            && std::fs::symlink_metadata(dir).is_ok_and(|meta| meta.is_dir())
    });
    dirs.sort();
    dirs.dedup();
    sorted(&dirs)
}

/// Parents before what is under them, so an inner mount is not covered by
/// an outer one made after it.
fn sorted(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut paths = paths.to_vec();
    paths.sort_by_key(|path| path.components().count());
    paths
}

#[derive(Default)]
struct Args(Vec<OsString>);

impl Args {
    fn push(&mut self, arg: impl AsRef<std::ffi::OsStr>) {
        self.0.push(arg.as_ref().to_os_string());
    }

    fn extend<'a>(&mut self, args: impl IntoIterator<Item = &'a str>) {
        for arg in args {
            self.push(arg);
        }
    }

    fn bind(&mut self, how: &str, from: &Path, to: &Path) {
        self.push(how);
        self.push(from);
        self.push(to);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn joined(args: &[OsString]) -> String {
        args.iter()
            .map(|arg| arg.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn a_sandboxed_view_hides_home_and_state_and_keeps_configuration_read_only() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join(".loom")).unwrap();
        std::fs::write(ws.join("loom.toml"), "").unwrap();
        std::fs::write(ws.join("state.db"), "").unwrap();
        let tmp = dir.path().join("tmp");
        let view = View {
            mode: SandboxMode::Landlock,
            workspace: &ws,
            tmp: &tmp,
            protected: &[ws.join("state.db"), PathBuf::from("/elsewhere/state")],
            read_only: &[ws.join("loom.toml"), ws.join(".loom"), ws.join("missing.toml")],
            home: Some(PathBuf::from("/home/someone")),
        };
        let args = joined(&view.bwrap_args(Path::new("bwrap"), None));
        let ws = ws.display();
        assert!(
            args.starts_with("bwrap --unshare-all --die-with-parent --cap-drop ALL"),
            "{args}"
        );
        assert!(!args.contains("--share-net"), "{args}");
        assert!(args.contains("--tmpfs /home/someone"), "{args}");
        assert!(args.contains(&format!("--bind {ws} {ws}")), "{args}");
        assert!(
            args.contains(&format!("--ro-bind {ws}/loom.toml {ws}/loom.toml")),
            "{args}"
        );
        assert!(args.contains(&format!("--ro-bind {ws}/.loom {ws}/.loom")), "{args}");
        assert!(!args.contains("missing.toml"), "{args}");
        assert!(args.contains(&format!("--ro-bind /dev/null {ws}/state.db")), "{args}");
        assert!(!args.contains("/elsewhere"), "outside the view: {args}");
        assert!(args.ends_with(&format!("--chdir {ws} --")), "{args}");
        // The workspace is bound after the home and /tmp are emptied.
        assert!(
            args.find("--tmpfs /tmp").unwrap() < args.find("--bind ").unwrap(),
            "{args}"
        );
    }

    #[test]
    fn an_unsandboxed_view_is_everything_but_loom_state() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        let view = View {
            mode: SandboxMode::None,
            workspace: dir.path(),
            tmp: dir.path(),
            protected: std::slice::from_ref(&state),
            read_only: &[],
            home: None,
        };
        let args = joined(&view.bwrap_args(Path::new("bwrap"), None));
        assert!(args.contains("--share-net --dev-bind / / --proc /proc"), "{args}");
        assert!(args.contains(&format!("--tmpfs {}", state.display())), "{args}");
        // The workspace and every folder above it and above the state are
        // mount points (they cannot be renamed aside), before the state's
        // cover is mounted.
        let pin = |path: &Path| format!("--dev-bind-try {0} {0} ", path.display());
        for dir in dir.path().ancestors().filter(|dir| dir.parent().is_some()) {
            assert!(args.contains(&pin(dir)), "{} in {args}", dir.display());
        }
        assert!(!args.contains("--dev-bind / / --dev-bind / /"), "{args}");
        let cover = args.find(&format!("--tmpfs {}", state.display()));
        assert!(cover.is_some() && args.find(&pin(dir.path())) < cover, "{args}");
        // Never under /proc, /sys or /dev (a `--config <(…)` is under /proc).
        let odd = View {
            protected: &[PathBuf::from("/proc/self/fd"), PathBuf::from("/dev/shm/x.db")],
            ..view
        };
        let args = joined(&odd.bwrap_args(Path::new("bwrap"), None));
        for dir in ["/proc", "/proc/self", "/dev", "/dev/shm"] {
            assert!(!args.contains(&format!("--dev-bind-try {dir} {dir}")), "{args}");
        }
    }
}
