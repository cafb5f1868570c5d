//! The attribute names of the OpenTelemetry GenAI semantic conventions
//! (agent and model spans), written here rather than taken from
//! `opentelemetry-semantic-conventions`, whose GenAI constants are marked
//! deprecated while the conventions move. Loom's own are under `loom.`.

/// What the span does: `invoke_agent`, `chat`, `execute_tool`.
pub const OPERATION_NAME: &str = "gen_ai.operation.name";
/// The model's provider (`openai`, `anthropic`, …).
pub const PROVIDER_NAME: &str = "gen_ai.provider.name";
/// The agent's name.
pub const AGENT_NAME: &str = "gen_ai.agent.name";
/// The agent run's id: Loom's run id.
pub const AGENT_ID: &str = "gen_ai.agent.id";
/// The conversation: Loom's session id.
pub const CONVERSATION_ID: &str = "gen_ai.conversation.id";
/// The model asked for.
pub const REQUEST_MODEL: &str = "gen_ai.request.model";
/// The model that answered, as the provider named it.
pub const RESPONSE_MODEL: &str = "gen_ai.response.model";
/// Why the model stopped, one per choice.
pub const RESPONSE_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
/// Seconds from the request to the first chunk of the answer.
pub const RESPONSE_TIME_TO_FIRST_CHUNK: &str = "gen_ai.response.time_to_first_chunk";
/// Prompt tokens.
pub const USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
/// Completion tokens.
pub const USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
/// Prompt tokens read from the provider's prompt cache.
pub const USAGE_CACHE_READ_INPUT_TOKENS: &str = "gen_ai.usage.cache_read.input_tokens";
/// Prompt tokens written to the provider's prompt cache.
pub const USAGE_CACHE_CREATION_INPUT_TOKENS: &str = "gen_ai.usage.cache_creation.input_tokens";
/// The tool's name.
pub const TOOL_NAME: &str = "gen_ai.tool.name";
/// The tool call's id.
pub const TOOL_CALL_ID: &str = "gen_ai.tool.call.id";
/// `function` (run by Loom), `extension` (an MCP server's), `datastore`.
pub const TOOL_TYPE: &str = "gen_ai.tool.type";
/// A low-cardinality class of the error a span ended in.
pub const ERROR_TYPE: &str = "error.type";
/// How the run ended (`DONE`, `FAILED`, …).
pub const RUN_STATUS: &str = "loom.run.status";
/// How the tool call ended (`ok`, `error`, `denied`, …).
pub const TOOL_STATUS: &str = "loom.tool.status";
/// The run's depth in its run tree (0: top-level).
pub const RUN_DEPTH: &str = "loom.run.depth";
/// Messages before and after a compression.
pub const COMPRESSION_MESSAGES_BEFORE: &str = "loom.compression.messages_before";
/// Messages after a compression.
pub const COMPRESSION_MESSAGES_AFTER: &str = "loom.compression.messages_after";
/// How a compression was made (`summary`, `fallback`).
pub const COMPRESSION_METHOD: &str = "loom.compression.method";
/// The tool a person was asked about.
pub const PERMISSION_TOOL: &str = "loom.permission.tool";
/// What the person (or a rule) decided.
pub const PERMISSION_DECISION: &str = "loom.permission.decision";
/// The messages given to the model, as JSON (`capture_content` only).
pub const INPUT_MESSAGES: &str = "gen_ai.input.messages";
/// The model's answer, as JSON (`capture_content` only).
pub const OUTPUT_MESSAGES: &str = "gen_ai.output.messages";
/// A tool call's arguments, as JSON (`capture_content` only).
pub const TOOL_CALL_ARGUMENTS: &str = "gen_ai.tool.call.arguments";
/// A tool call's result (`capture_content` only).
pub const TOOL_CALL_RESULT: &str = "gen_ai.tool.call.result";
/// The step a checkpoint of the workspace was recorded as.
pub const CHECKPOINT_STEP: &str = "loom.checkpoint.step";
/// Files the step created or changed.
pub const CHECKPOINT_FILES_CHANGED: &str = "loom.checkpoint.files_changed";
/// Files the step removed.
pub const CHECKPOINT_FILES_REMOVED: &str = "loom.checkpoint.files_removed";
/// Files left out of the checkpoint (too large, a secret in them, unreadable).
pub const CHECKPOINT_FILES_SKIPPED: &str = "loom.checkpoint.files_skipped";
