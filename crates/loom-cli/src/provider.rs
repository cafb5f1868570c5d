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
#[derive(Debug)]
pub(crate) struct ConfiguredModels {
    pub file: Arc<FileConfig>,
    pub base_url: Option<String>,
}

impl loom::ModelSource for ConfiguredModels {
    fn model(&self, spec: &str) -> Result<loom::SourcedModel, String> {
        // A script is a file path: a project's agent file must not point
        // the model at a file of its choosing (its text would come back in
        // the parse error).
        if spec.starts_with("scripted:") {
            return Err("a scripted model cannot be named in an agent file".to_string());
        }
        let llm = model(spec, self.base_url.as_deref(), &self.file, None).map_err(|err| format!("{err:#}"))?;
        Ok(loom::SourcedModel {
            llm,
            pricing: pricing(spec, &self.file),
        })
    }
}
