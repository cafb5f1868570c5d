//! A path a model names, resolved and opened through the workspace jail.
//! The workspace holds files, a folder, a symlink to a file inside, and
//! symlinks that lead out (to a file and a folder beside the workspace,
//! and to `/`). Whatever the path — absolute, `..`, NUL bytes, long, odd
//! Unicode — what the jail opens is beneath the workspace and never the
//! secret beside it.

use std::io::Read;
use std::path::PathBuf;
use std::sync::OnceLock;

use loom_tools::Jail;

const SECRET: &str = "the-secret-outside-the-workspace";

struct Place {
    _dir: tempfile::TempDir,
    root: PathBuf,
    jail: Jail,
}

fn place() -> Option<&'static Place> {
    static PLACE: OnceLock<Option<Place>> = OnceLock::new();
    PLACE
        .get_or_init(|| {
            let dir = tempfile::tempdir().ok()?;
            let root = dir.path().join("ws");
            let outside = dir.path().join("outside");
            std::fs::create_dir_all(root.join("src/deep")).ok()?;
            std::fs::create_dir_all(&outside).ok()?;
            std::fs::write(outside.join("secret.txt"), SECRET).ok()?;
            std::fs::write(dir.path().join("secret.txt"), SECRET).ok()?;
            std::fs::write(root.join("README.md"), "# inside\n").ok()?;
            std::fs::write(root.join("src/main.rs"), "fn main() {}\n").ok()?;
            std::fs::write(root.join("src/deep/a.txt"), "a\n").ok()?;
            #[cfg(unix)]
            {
                use std::os::unix::fs::symlink;
                symlink("../secret.txt", root.join("leak")).ok()?;
                symlink(&outside, root.join("out")).ok()?;
                symlink("/", root.join("slash")).ok()?;
                symlink("src/main.rs", root.join("main")).ok()?;
                symlink("deep/../../README.md", root.join("src/up")).ok()?;
            }
            let root = root.canonicalize().ok()?;
            let jail = Jail::new(&root).ok()?;
            Some(Place { _dir: dir, root, jail })
        })
        .as_ref()
}

pub fn run(data: &[u8]) {
    let Some(place) = place() else {
        return;
    };
    let requested = String::from_utf8_lossy(data);
    let Ok(relative) = place.jail.relative(&requested) else {
        return;
    };
    if let Ok(mut file) = place.jail.open_read(&requested, &relative) {
        if let Ok(real) = loom_tools::jail::real_path(&file) {
            assert!(real.starts_with(&place.root), "{requested:?} opened {}", real.display());
        }
        let mut head = vec![0u8; SECRET.len()];
        let read = file.read(&mut head).unwrap_or(0);
        assert_ne!(&head[..read], SECRET.as_bytes(), "{requested:?} read the secret");
    }
    if let Ok(dir) = place.jail.open_dir(&requested, &relative) {
        // A directory handle beneath the workspace, never beside it.
        if let Ok(real) = loom_tools::jail::real_path(&dir) {
            assert!(real.starts_with(&place.root), "{requested:?} opened {}", real.display());
        }
    }
}
