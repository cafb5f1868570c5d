//! Every input kept for a target — its corpus (`corpus/TARGET/`) and every
//! crash or hang the fuzzer ever found (`crashes/TARGET/`) — replayed on
//! each `cargo test`: no panic, and none takes longer than a few seconds.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use std::path::Path;
use std::time::Duration;

/// Far above any input's time (microseconds to milliseconds); a hang the
/// fuzzer found must come back under it.
const PATIENCE: Duration = Duration::from_secs(10);

fn inputs(target: &str) -> Vec<std::path::PathBuf> {
    let base = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for folder in ["corpus", "crashes"] {
        let Ok(entries) = std::fs::read_dir(base.join(folder).join(target)) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_file() && path.file_name().is_some_and(|name| name != "README.md") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

#[test]
fn every_kept_input_of_every_target_passes() {
    let mut replayed = 0;
    for target in loom_fuzz::TARGETS {
        let inputs = inputs(target.name);
        assert!(
            !inputs.is_empty(),
            "{}: no corpus (bench/fuzz/corpus/{})",
            target.name,
            target.name
        );
        for path in inputs {
            let data = std::fs::read(&path).unwrap();
            let run = target.run;
            let (done, finished) = std::sync::mpsc::channel();
            let worker = std::thread::spawn(move || {
                run(&data);
                let _ = done.send(());
            });
            match finished.recv_timeout(PATIENCE) {
                Ok(()) => worker.join().unwrap(),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    panic!("{}: {} took over {PATIENCE:?}", target.name, path.display())
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    panic!(
                        "{}: {} panicked: {:?}",
                        target.name,
                        path.display(),
                        worker.join().err()
                    )
                }
            }
            replayed += 1;
        }
    }
    println!("replayed {replayed} inputs");
}
