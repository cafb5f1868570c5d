//! An MCP server's tool as a Loom tool: calls sent to its server, and
//! results turned into text the model reads — `isError` results into
//! errors.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use loom_core::{DynTool, ToolContext, ToolError, ToolOutput};
use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};
use serde_json::Value;

use super::listing::ToolInfo;
use super::server::{CallError, McpServer};

/// One MCP tool as a Loom tool.
pub(crate) struct McpTool {
    pub info: ToolInfo,
    pub server: Arc<McpServer>,
}

impl DynTool for McpTool {
    fn name(&self) -> &str {
        &self.info.name
    }

    fn description(&self) -> &str {
        &self.info.description
    }

    fn parameters_schema(&self) -> Value {
        self.info.schema.clone()
    }

    fn concurrency_safe(&self) -> bool {
        self.info.read_only
    }

    fn read_only(&self) -> bool {
        self.info.read_only
    }

    fn check_available(&self) -> Result<(), String> {
        Ok(())
    }

    /// A server with its own `timeout_secs` bounds its calls itself.
    fn bounds_own_time(&self) -> bool {
        self.server.call_timeout().is_some()
    }

    fn call_json(&self, args: Value, ctx: ToolContext) -> BoxFuture<'_, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let result = self
                .server
                .call(&self.info.remote, args, self.server.call_timeout(), &ctx.cancel)
                .await;
            match result {
                Ok(result) => {
                    let text = render(&result);
                    if result.is_error.unwrap_or(false) {
                        Err(ToolError::Failed(text))
                    } else {
                        Ok(text.into())
                    }
                }
                Err(CallError::Cancelled) => Err(ToolError::Cancelled),
                Err(err) => Err(ToolError::Failed(err.to_string())),
            }
        })
    }
}

/// A result as text: text blocks as they are, other blocks described,
/// structured content when there is nothing else.
pub(crate) fn render(result: &CallToolResult) -> String {
    let mut parts: Vec<String> = Vec::new();
    for block in &result.content {
        parts.push(match block {
            ContentBlock::Text(text) => text.text.clone(),
            ContentBlock::Image(image) => format!("[image: {}, {} bytes base64]", image.mime_type, image.data.len()),
            ContentBlock::Audio(audio) => format!("[audio: {}, {} bytes base64]", audio.mime_type, audio.data.len()),
            ContentBlock::Resource(resource) => match &resource.resource {
                ResourceContents::TextResourceContents { uri, text, .. } => format!("[resource {uri}]\n{text}"),
                ResourceContents::BlobResourceContents { uri, blob, .. } => {
                    format!("[resource {uri}: {} bytes base64]", blob.len())
                }
                _ => "[resource]".to_string(),
            },
            ContentBlock::ResourceLink(link) => format!("[resource link: {}]", link.uri),
            _ => "[content of a kind Loom does not show]".to_string(),
        });
    }
    if parts.is_empty() {
        if let Some(structured) = &result.structured_content {
            parts.push(structured.to_string());
        }
    }
    parts.join("\n")
}
