//! A hostile workspace for the file jail's tests: a thread that swaps a
//! directory and a symbolic link to the outside in a tight loop with
//! `renameat2(RENAME_EXCHANGE)`, as a process left behind by a sandboxed
//! shell can, and a snapshot of a directory to prove nothing outside changed.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Swaps two paths atomically, over and over, until dropped.
#[derive(Debug)]
pub struct Swapper {
    stop: Arc<AtomicBool>,
    swaps: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Swapper {
    /// Starts swapping `a` and `b` (both must exist). Panics when the kernel
    /// or file system cannot exchange them: the test would prove nothing.
    pub fn start(a: &Path, b: &Path) -> Self {
        let a = CString::new(a.as_os_str().as_bytes()).unwrap();
        let b = CString::new(b.as_os_str().as_bytes()).unwrap();
        exchange(&a, &b).expect("renameat2(RENAME_EXCHANGE) is not supported here");
        exchange(&a, &b).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let swaps = Arc::new(AtomicU64::new(0));
        let thread = std::thread::spawn({
            let stop = stop.clone();
            let swaps = swaps.clone();
            move || {
                while !stop.load(Ordering::Relaxed) {
                    exchange(&a, &b).unwrap();
                    swaps.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        Self {
            stop,
            swaps,
            thread: Some(thread),
        }
    }

    /// How many swaps happened so far.
    pub fn swaps(&self) -> u64 {
        self.swaps.load(Ordering::Relaxed)
    }
}

impl Drop for Swapper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn exchange(a: &CString, b: &CString) -> std::io::Result<()> {
    // SAFETY: both paths are valid NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Every entry under `dir` (links not followed): files with their content,
/// links with their target, directories as `<dir>`.
pub fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        for entry in std::fs::read_dir(&current).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            let path = entry.path();
            if kind.is_dir() {
                out.insert(path.clone(), b"<dir>".to_vec());
                stack.push(path);
            } else if kind.is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.insert(path, target.as_os_str().as_bytes().to_vec());
            } else {
                out.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

/// The paths whose entry differs between two snapshots, with what is there now.
pub fn changes(
    before: &BTreeMap<PathBuf, Vec<u8>>,
    after: &BTreeMap<PathBuf, Vec<u8>>,
) -> Vec<(PathBuf, Option<String>)> {
    let mut paths: Vec<&PathBuf> = before.keys().chain(after.keys()).collect();
    paths.sort();
    paths.dedup();
    paths
        .into_iter()
        .filter(|path| before.get(*path) != after.get(*path))
        .map(|path| {
            let now = after.get(path).map(|bytes| String::from_utf8_lossy(bytes).into_owned());
            (path.clone(), now)
        })
        .collect()
}
