//! Models by name, for a sub-agent whose definition names a model other
//! than its parent's (docs/agents.md). The binary implements it from its
//! configuration (providers, base URLs, prices); an agent without one
//! refuses such a sub-agent rather than running it on the wrong model.

use std::sync::Arc;

use crate::llm::Llm;
use crate::metrics::Pricing;

/// A model made from its name, and its prices when known.
#[derive(Clone)]
pub struct SourcedModel {
    /// The model.
    pub llm: Arc<dyn Llm>,
    /// Its prices, for cost budgets.
    pub pricing: Option<Pricing>,
}

impl std::fmt::Debug for SourcedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourcedModel")
            .field("llm", &self.llm.model_name())
            .field("pricing", &self.pricing)
            .finish()
    }
}

/// Makes models from names as `--model` takes them (`openai:gpt-4o-mini`).
pub trait ModelSource: Send + Sync + std::fmt::Debug {
    /// The model `spec` names for a run of `principal` (a gateway token's
    /// name, whose grant may limit the models), or why it cannot be made.
    fn model(&self, spec: &str, principal: Option<&str>) -> Result<SourcedModel, String>;
}
