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
