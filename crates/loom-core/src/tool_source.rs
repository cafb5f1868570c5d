//! Tools that change while an agent lives: an MCP server adds or removes
//! tools (`notifications/tools/list_changed`), or comes and goes. A
//! [`ToolSource`] says so by bumping its generation; a top-level run picks
//! the new list up before its next model call, never in the middle of a
//! turn.

use std::sync::{Arc, Mutex};

use crate::pipeline::ToolPipeline;
use crate::tool::DynTool;

/// A set of tools that may change between turns.
pub trait ToolSource: Send + Sync + 'static {
    /// Changes whenever [`ToolSource::tools`] would answer differently.
    fn generation(&self) -> u64;
    /// The tools now. Each must have a valid name and schema; a tool the
    /// registry refuses (a duplicate name, say) is skipped with a warning.
    fn tools(&self) -> Vec<Arc<dyn DynTool>>;

    /// Waits (briefly) for a change already announced to take effect — an
    /// MCP server's list being fetched again after `list_changed` — so the
    /// next model call sees it. Default: nothing to wait for.
    fn settle(&self) -> futures_util::future::BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }
}

/// An agent's tools: the fixed ones and those of its sources, as one
/// pipeline rebuilt only when a source's generation changes.
pub(crate) struct ToolSet {
    fixed: Arc<ToolPipeline>,
    sources: Vec<Arc<dyn ToolSource>>,
    current: Mutex<(Vec<u64>, Arc<ToolPipeline>)>,
}

impl ToolSet {
    pub(crate) fn new(fixed: Arc<ToolPipeline>, sources: Vec<Arc<dyn ToolSource>>) -> Self {
        let set = Self {
            current: Mutex::new((Vec::new(), fixed.clone())),
            fixed,
            sources,
        };
        set.current();
        set
    }

    /// Lets every source finish a change in flight.
    pub(crate) async fn settle(&self) {
        for source in &self.sources {
            source.settle().await;
        }
    }

    /// The pipeline over the tools as they are now.
    pub(crate) fn current(&self) -> Arc<ToolPipeline> {
        if self.sources.is_empty() {
            return self.fixed.clone();
        }
        let generations: Vec<u64> = self.sources.iter().map(|source| source.generation()).collect();
        let mut current = self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if current.0 != generations {
            let mut registry = self.fixed.registry().subset(|_| true);
            for tool in self.sources.iter().flat_map(|source| source.tools()) {
                let name = tool.name().to_string();
                if let Err(err) = registry.register(tool) {
                    tracing::warn!(tool = %name, "tool not offered: {err}");
                }
            }
            *current = (generations, Arc::new(self.fixed.with_tools(registry)));
        }
        current.1.clone()
    }
}
