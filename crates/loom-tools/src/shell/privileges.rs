//! No program Loom starts gets a privilege (docs/security.md): every
//! capability dropped — effective, permitted, inheritable, ambient and the
//! bounding set, so exec cannot bring one back, not even for a root Loom's
//! uid 0 — and `no_new_privs`, so a setuid program does not raise it
//! either. bwrap does this for the commands it starts; this is the same
//! for a command started without it (no bubblewrap on the machine).

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// The highest capability number any kernel has had room for; dropping a
/// number past the kernel's last one fails harmlessly (EINVAL).
const LAST_CAPABILITY: libc::c_ulong = 63;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// In a forked child before `exec`: drop every capability and set
/// `no_new_privs`. Only system calls: safe after `fork`.
pub(crate) fn drop_in_child() -> std::io::Result<()> {
    // SAFETY: prctl and capset with pointers to locals that outlive the
    // calls; no allocation, no lock.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Each may fail without the privilege to drop (EPERM: there is
        // nothing of it to drop) or past the kernel's last number (EINVAL).
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        );
        for capability in 0..=LAST_CAPABILITY {
            libc::prctl(libc::PR_CAPBSET_DROP, capability, 0, 0, 0);
        }
        let header = CapHeader {
            version: CAPABILITY_VERSION_3,
            pid: 0,
        };
        let none = [CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        if libc::syscall(libc::SYS_capset, &header as *const CapHeader, none.as_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Loom itself: not dumpable, so no other process of its user can read
/// its memory or its environment (`/proc/PID/environ`, `/proc/PID/mem`,
/// ptrace) — its API keys and tokens — and it leaves no core file.
pub fn make_process_undumpable() -> std::io::Result<()> {
    // SAFETY: a plain system call.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_has_no_capability_and_no_new_privileges() {
        let mut cmd = std::process::Command::new("sh");
        cmd.args([
            "-c",
            "grep -E '^(CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs)' /proc/self/status",
        ]);
        // SAFETY: drop_in_child makes system calls only.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, drop_in_child);
        }
        let output = cmd.output().unwrap();
        let status = String::from_utf8_lossy(&output.stdout);
        for line in status.lines() {
            let (name, value) = line.split_once(':').unwrap();
            let value = value.trim();
            match name {
                "NoNewPrivs" => assert_eq!(value, "1", "{status}"),
                _ => assert_eq!(value, "0000000000000000", "{name} in {status}"),
            }
        }
        assert_eq!(status.lines().count(), 5, "{status}");
    }
}
