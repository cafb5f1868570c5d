//! The AFL++ entry: `LOOM_FUZZ_TARGET=NAME` picks the target
//! (bench/fuzz/README.md; `bench/fuzz/run` sets it).

fn main() {
    let name = std::env::var("LOOM_FUZZ_TARGET").unwrap_or_default();
    let Some(target) = loom_fuzz::target(&name) else {
        let names: Vec<&str> = loom_fuzz::TARGETS.iter().map(|t| t.name).collect();
        eprintln!("LOOM_FUZZ_TARGET must name a target: {}", names.join(", "));
        std::process::exit(2);
    };
    afl::fuzz!(|data: &[u8]| {
        (target.run)(data);
    });
}
