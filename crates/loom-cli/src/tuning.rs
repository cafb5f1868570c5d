//! The context settings of `loom run`: memory and compression, feedback and
//! the monitor, project instructions, retrieval.

use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use loom::tools::FolderRetriever;
use loom::{AgentBuilder, MemoryConfig, MonitorConfig};

use crate::config::{self, FileConfig};
use crate::provider;

/// Applies loom.toml's context keys to `builder`, for a run of `model`.
pub(crate) async fn apply(
    mut builder: AgentBuilder,
    file: &FileConfig,
    config_dir: Option<&Path>,
    model: &str,
    base_url: Option<&str>,
) -> Result<AgentBuilder> {
    let defaults = MemoryConfig::default();
    builder = builder.memory(MemoryConfig {
        context_window: file.context_window.unwrap_or(defaults.context_window),
        compression_threshold: file.compression_threshold.unwrap_or(defaults.compression_threshold),
        warning_threshold: file.compression_warning.unwrap_or(defaults.warning_threshold),
        keep_recent_messages: file.keep_recent_messages.unwrap_or(defaults.keep_recent_messages),
        ..defaults
    });
    if let Some(spec) = &file.compression_model {
        let spec = config::model_from_file(spec, config_dir);
        // With a base URL (the flag's or [provider]'s) the summaries are
        // written at the run's address: a model of another provider would
        // send its key there. Without one each provider has its own.
        let provider = |spec: &str| spec.split_once(':').map(|(provider, _)| provider.to_string());
        let one_address = base_url.is_some() || file.provider.as_ref().is_some_and(|p| p.base_url.is_some());
        // A scripted model reaches no address.
        let reaches_out = provider(&spec).as_deref() != Some("scripted");
        if one_address && reaches_out && provider(&spec) != provider(model) {
            return Err(anyhow!(
                "compression_model = \"{}\" is not of the run's provider ({}:…): the summaries are written with the run's address and API key",
                crate::text::shown(&spec),
                provider(model).unwrap_or_default()
            ));
        }
        builder = builder.summarizer(provider::model(&spec, base_url, file, None).context("compression_model")?);
    }
    if let Some(budget) = file.system_prompt_budget {
        builder = builder.system_prompt_budget(budget);
    }
    if let Some(feedback) = &file.feedback {
        let defaults = MonitorConfig::default();
        let monitor = MonitorConfig {
            enabled: feedback.monitor.unwrap_or(defaults.enabled),
            duplicate_threshold: count("duplicate_threshold", feedback.duplicate_threshold)?
                .map_or(Ok(defaults.duplicate_threshold), u32::try_from)
                .map_err(|_| anyhow!("[feedback] duplicate_threshold is too large"))?,
            loop_window: count("loop_window", feedback.loop_window)?.unwrap_or(defaults.loop_window),
            error_threshold: feedback.error_threshold.unwrap_or(defaults.error_threshold),
            error_window: count("error_window", feedback.error_window)?.unwrap_or(defaults.error_window),
            warning_ratio: feedback.warning_ratio.unwrap_or(defaults.warning_ratio),
        };
        monitor.validate().map_err(|err| anyhow!("[feedback] {err}"))?;
        builder = builder.feedback(feedback.enabled.unwrap_or(true)).monitor(monitor);
    }
    if let Some(times) = file.max_continuations {
        builder = builder.max_continuations(times);
    }
    if let Some(dir) = config::user_config_dir() {
        builder = builder.instructions_dir(dir);
    }
    if let Some(retrieval) = &file.retrieval {
        let folder = match config_dir {
            Some(base) if retrieval.dir.is_relative() => base.join(&retrieval.dir),
            _ => retrieval.dir.clone(),
        };
        let shown = folder.display().to_string();
        let retriever = tokio::task::spawn_blocking(move || FolderRetriever::index(&folder))
            .await
            .map_err(|err| anyhow!("indexing {shown} failed: {err}"))?
            .map_err(|err| anyhow!("[retrieval] {err}"))?;
        builder = builder.retriever(Arc::new(retriever), retrieval.limit.unwrap_or(5));
    }
    Ok(builder)
}

/// A count from `[feedback]`, which must not be negative.
fn count(key: &str, value: Option<i64>) -> Result<Option<usize>> {
    value
        .map(|n| usize::try_from(n).map_err(|_| anyhow!("[feedback] {key} must not be negative (got {n})")))
        .transpose()
}
