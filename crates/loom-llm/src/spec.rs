//! `provider:model` strings, as given to `--model` or `model =` in loom.toml.

use std::sync::Arc;

use loom_core::Llm;

use crate::scripted::{ScriptError, ScriptedModel};

/// Why a model string could not be turned into a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelSpecError {
    /// No `provider:` prefix.
    #[error("model '{0}' has no provider: write it as PROVIDER:MODEL, e.g. scripted:path/to/script.json")]
    MissingProvider(String),
    /// A provider Loom does not know.
    #[error("unknown model provider '{provider}' in '{spec}': use scripted:PATH")]
    UnknownProvider {
        /// The provider part.
        provider: String,
        /// The whole string.
        spec: String,
    },
    /// A provider that is planned but not in this build.
    #[error("the '{0}' provider is not available in this version of Loom yet: use scripted:PATH")]
    NotYetAvailable(String),
    /// `scripted:` with no path.
    #[error("scripted model needs a script path: scripted:PATH")]
    MissingScriptPath,
    /// The script could not be loaded.
    #[error(transparent)]
    Script(#[from] ScriptError),
}

/// Builds the model named by `spec` (`scripted:PATH`).
pub fn model_from_spec(spec: &str) -> Result<Arc<dyn Llm>, ModelSpecError> {
    let Some((provider, rest)) = spec.split_once(':') else {
        return Err(ModelSpecError::MissingProvider(spec.to_string()));
    };
    match provider {
        "scripted" => {
            if rest.is_empty() {
                return Err(ModelSpecError::MissingScriptPath);
            }
            Ok(Arc::new(ScriptedModel::from_path(rest)?))
        }
        "openai" | "anthropic" => Err(ModelSpecError::NotYetAvailable(provider.to_string())),
        other => Err(ModelSpecError::UnknownProvider {
            provider: other.to_string(),
            spec: spec.to_string(),
        }),
    }
}
