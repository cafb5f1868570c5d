//! Entry points for the fuzz targets (bench/fuzz): internal stages driven
//! exactly as a run drives them, reachable without a run. Not a stable API.

use serde_json::Value;

use crate::message::ToolCall;
use crate::tool::RegisteredTool;

/// The pipeline's validate stage on `arguments` for `registered`: the
/// arguments as the tool gets them, or the message the model would read.
pub fn validate_arguments(registered: &RegisteredTool, arguments: &Value) -> Result<Value, String> {
    let call = ToolCall {
        id: "fuzz".into(),
        name: registered.spec.name.clone(),
        arguments: arguments.clone(),
    };
    crate::pipeline::validate_for_fuzzing(&call, registered, arguments)
}
