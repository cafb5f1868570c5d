//! Where the gateway's agents come from: the embedding program (the `loom`
//! binary reads loom.toml) builds them; the gateway keeps one per model and
//! tool set.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use loom_core::async_trait;
use loom_core::{Agent, Store};

/// What a run asks of its agent.
#[derive(Clone)]
pub struct AgentSpec {
    /// The model (`None`: the default one).
    pub model: Option<String>,
    /// Only these tools (`None`: all of them).
    pub tools: Option<Vec<String>>,
    /// The permission mode.
    pub mode: loom_core::Mode,
    /// The store the agent must record its runs in (the gateway's).
    pub store: Option<Arc<dyn Store>>,
}

/// Builds agents for the gateway.
#[async_trait]
pub trait AgentFactory: Send + Sync {
    /// The model runs use when they name none, as `provider:model`.
    fn default_model(&self) -> String;

    /// An agent for `spec`; the error is shown to the client (an unknown
    /// tool, a model that cannot be reached).
    async fn build(&self, spec: AgentSpec) -> Result<Agent, String>;
}

type Key = (Option<String>, Option<Vec<String>>, loom_core::Mode);

/// The agents built so far, one per model, tool set and mode.
pub(crate) struct Agents {
    factory: Arc<dyn AgentFactory>,
    store: Option<Arc<dyn Store>>,
    built: Mutex<HashMap<Key, Agent>>,
}

impl Agents {
    pub(crate) fn new(factory: Arc<dyn AgentFactory>, store: Option<Arc<dyn Store>>) -> Self {
        Self {
            factory,
            store,
            built: Mutex::default(),
        }
    }

    pub(crate) fn default_model(&self) -> String {
        self.factory.default_model()
    }

    pub(crate) async fn get(
        &self,
        model: Option<&str>,
        tools: Option<&[String]>,
        mode: loom_core::Mode,
    ) -> Result<Agent, String> {
        let tools = tools.map(|tools| {
            let mut tools = tools.to_vec();
            tools.sort();
            tools.dedup();
            tools
        });
        let key: Key = (model.map(str::to_string), tools.clone(), mode);
        if let Some(agent) = self.lock().get(&key) {
            return Ok(agent.clone());
        }
        let agent = self
            .factory
            .build(AgentSpec {
                model: key.0.clone(),
                tools,
                mode,
                store: self.store.clone(),
            })
            .await?;
        // Two first requests may both build; either agent is right.
        Ok(self.lock().entry(key).or_insert(agent).clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Agent>> {
        self.built.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
