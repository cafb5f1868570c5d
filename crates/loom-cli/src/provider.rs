//! The model of `loom run`: `--model`, `--base-url`, `[provider]`,
//! `[prices]`, and `--record`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use loom::models::{model_from_spec_with, HttpSettings, ProviderOptions, Recorder};
use loom::{Llm, Pricing};

use crate::config::{FileConfig, ProviderConfig};

/// Builds the model named by `spec`, recording it to `record` if asked.
pub(crate) fn model(
    spec: &str,
    base_url: Option<&str>,
    file: &FileConfig,
    record: Option<&Path>,
) -> Result<Arc<dyn Llm>> {
    let provider = file.provider.as_ref();
    let mut options = options(base_url, provider);
    if let Some(placement) = provider.and_then(|p| p.guidance.as_deref()) {
        options.guidance = Some(
            placement
                .parse()
                .map_err(|err| anyhow::anyhow!("[provider] guidance: {err}"))?,
        );
    }
    let llm = model_from_spec_with(spec, &options, &|name| std::env::var(name).ok())?;
    let Some(path) = record else {
        return Ok(llm);
    };
    // Fail now, not after the run, when the recording cannot be written.
    std::fs::write(path, "[]\n").with_context(|| format!("cannot write the recording {}", path.display()))?;
    Ok(Arc::new(Recorder::new(llm, path)))
}

fn options(base_url: Option<&str>, provider: Option<&ProviderConfig>) -> ProviderOptions {
    let mut http = HttpSettings::default();
    let mut options = ProviderOptions::default();
    if let Some(config) = provider {
        options.base_url = config.base_url.clone();
        options.stream = config.stream;
        options.max_tokens = config.max_tokens;
        options.text_tool_calls = config.text_tool_calls;
        http.headers = config.headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        if let Some(attempts) = config.max_attempts {
            http.retry.max_attempts = attempts.max(1);
        }
        if let Some(ms) = config.retry_base_ms {
            http.retry.base_delay = Duration::from_millis(ms);
        }
        if let Some(secs) = config.retry_max_secs {
            http.retry.max_delay = Duration::from_secs(secs);
        }
        if let Some(secs) = config.connect_timeout_secs {
            http.connect_timeout = Duration::from_secs(secs);
        }
        if let Some(secs) = config.first_byte_timeout_secs {
            http.first_byte_timeout = Duration::from_secs(secs);
        }
        if let Some(secs) = config.idle_timeout_secs {
            http.idle_timeout = Duration::from_secs(secs);
        }
        http.requests_per_minute = config.requests_per_minute;
        if let Some(failures) = config.breaker_failures {
            http.breaker.failure_threshold = failures.max(1);
        }
        if let Some(secs) = config.breaker_open_secs {
            http.breaker.open_for = Duration::from_secs(secs);
        }
    }
    if let Some(url) = base_url {
        options.base_url = Some(url.to_string());
    }
    options.http = http;
    options
}

/// The price of `spec` from `[prices]`, by full name or by model name.
pub(crate) fn pricing(spec: &str, file: &FileConfig) -> Option<Pricing> {
    let short = spec.split_once(':').map_or(spec, |(_, model)| model);
    file.prices
        .get(spec)
        .or_else(|| file.prices.get(short))
        .map(|price| Pricing {
            input_per_mtok: price.input_per_mtok,
            output_per_mtok: price.output_per_mtok,
        })
}

/// Models named by agents defined in files (docs/agents.md), made as
/// `--model` makes them: the same `[provider]`, base URL and `[prices]`.
/// Only models of the run's own provider: the base URL and the API key
/// are the run's, and an agent file (which comes with a project) must not
/// send one provider's key to the address configured for another. Each
/// model is made once and shared (one connection pool, rate limit and
/// breaker per model).
#[derive(Debug)]
pub(crate) struct ConfiguredModels {
    pub file: Arc<FileConfig>,
    pub base_url: Option<String>,
    /// The run's model, `provider:name`.
    pub parent: String,
    /// On a gateway: what the server and each token allow.
    pub served: Option<ServedModels>,
    pub made: std::sync::Mutex<std::collections::HashMap<String, loom::SourcedModel>>,
}

/// The models a gateway's runs may use: those it offers, narrowed by each
/// token's `models` grant (docs/server.md, "Roles").
#[derive(Debug, Clone)]
pub(crate) struct ServedModels {
    /// The default model and `[server] models`.
    pub offered: Vec<String>,
    /// Each token's name and its `models`, if limited.
    pub grants: std::collections::BTreeMap<String, Option<Vec<String>>>,
}

impl ServedModels {
    /// From `[server]`: `default` is the gateway's model.
    pub(crate) fn of(settings: Option<&loom_server::ServerSettings>, default: &str) -> Self {
        let mut offered = vec![default.to_string()];
        let mut grants = std::collections::BTreeMap::new();
        if let Some(settings) = settings {
            offered.extend(settings.models.iter().cloned());
            for token in &settings.tokens {
                grants.insert(token.name.clone(), token.models.clone());
            }
        }
        Self { offered, grants }
    }

    fn allows(&self, spec: &str, principal: Option<&str>) -> Result<(), String> {
        if !self.offered.iter().any(|offered| offered == spec) {
            return Err(format!("this server does not offer {spec} ([server] models)"));
        }
        let grant = match principal {
            Some(name) => self.grants.get(name),
            None => None,
        };
        match grant {
            Some(Some(models)) if !models.iter().any(|model| model == spec) => {
                Err(format!("the run's token may not use {spec}"))
            }
            Some(_) => Ok(()),
            // `LOOM_TOKEN` is `default`, with no limits; a name the file
            // does not know (a token removed since) gets nothing more.
            None if principal == Some("default") || self.grants.is_empty() => Ok(()),
            None => Err(format!("the run's token is not configured here, so {spec} is refused")),
        }
    }
}

impl loom::ModelSource for ConfiguredModels {
    fn model(&self, spec: &str, principal: Option<&str>) -> Result<loom::SourcedModel, String> {
        let provider = |spec: &str| spec.split_once(':').map(|(provider, _)| provider.to_string());
        let parent = provider(&self.parent).unwrap_or_default();
        // A script is a file path: a project's agent file must not point
        // the model at a file of its choosing (its text would come back in
        // the parse error).
        if spec.starts_with("scripted:") || parent == "scripted" {
            return Err("an agent file cannot name a model for a scripted run, nor a scripted model".to_string());
        }
        if provider(spec).as_deref() != Some(parent.as_str()) {
            return Err(format!(
                "an agent may name another model of its parent's provider ({parent}:…), not {spec}: the address and the API key are the parent's"
            ));
        }
        if let Some(served) = &self.served {
            served.allows(spec, principal)?;
        }
        let mut made = self.made.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(model) = made.get(spec) {
            return Ok(model.clone());
        }
        let llm = model(spec, self.base_url.as_deref(), &self.file, None).map_err(|err| format!("{err:#}"))?;
        let sourced = loom::SourcedModel {
            llm,
            pricing: pricing(spec, &self.file),
        };
        made.insert(spec.to_string(), sourced.clone());
        Ok(sourced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_served_agent_model_is_one_the_server_offers_and_the_token_may_use() {
        let settings: loom_server::ServerSettings = toml::from_str(
            "models = [\"openai:big\"]\n[[tokens]]\nname = \"small\"\ntoken = \"0123456789abcdefgh\"\nmodels = [\"openai:m\"]\n\
             [[tokens]]\nname = \"any\"\ntoken = \"0123456789abcdefgi\"\n",
        )
        .unwrap();
        let served = ServedModels::of(Some(&settings), "openai:m");
        assert!(served.allows("openai:big", Some("any")).is_ok());
        assert!(served
            .allows("openai:big", Some("small"))
            .unwrap_err()
            .contains("may not use"));
        assert!(served.allows("openai:m", Some("small")).is_ok());
        assert!(served
            .allows("openai:other", Some("any"))
            .unwrap_err()
            .contains("does not offer"));
        assert!(served.allows("openai:big", Some("removed")).is_err());
        assert!(served.allows("openai:big", Some("default")).is_ok());
    }
}
