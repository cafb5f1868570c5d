//! A scripted-model file (docs/library.md), JSON or YAML: turns or a typed
//! error, never a panic.

pub fn run(data: &[u8]) {
    let Some((&format, body)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(body) else {
        return;
    };
    if let Ok(turns) = loom_llm::scripted::parse_script(text, format % 2 == 1) {
        // A model made of them plays them back in order.
        let model = loom_llm::ScriptedModel::new(turns);
        assert_eq!(model.played(), 0);
    }
}
