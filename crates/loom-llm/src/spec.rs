//! `provider:model` strings, as given to `--model` or `model =` in loom.toml.

use std::sync::Arc;

use loom_core::{GuidancePlacement, Llm, LlmError};

use crate::anthropic::{AnthropicConfig, AnthropicModel, ANTHROPIC_BASE_URL};
use crate::openai::{OpenAiConfig, OpenAiModel, OPENAI_BASE_URL};
use crate::scripted::{ScriptError, ScriptedModel};
use crate::transport::HttpSettings;

/// Provider settings that do not fit in the model string.
#[derive(Debug, Clone, Default)]
pub struct ProviderOptions {
    /// The API base (else `OPENAI_BASE_URL` / `ANTHROPIC_BASE_URL`, else the official one).
    pub base_url: Option<String>,
    /// Stream answers (default true; OpenAI-compatible only).
    pub stream: Option<bool>,
    /// `max_tokens` of each answer.
    pub max_tokens: Option<u32>,
    /// Read `<tool_call>` blocks from the text (OpenAI-compatible only).
    pub text_tool_calls: bool,
    /// Where guidance goes (OpenAI-compatible only; Anthropic always takes
    /// it inline). Default: a system message at the official OpenAI API, an
    /// inline reminder at any other server; `System` is refused at any
    /// other server, whose chat template would not keep it.
    pub guidance: Option<GuidancePlacement>,
    /// Timeouts, retries, limits and extra headers.
    pub http: HttpSettings,
}

/// Why a model string could not be turned into a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelSpecError {
    /// No `provider:` prefix.
    #[error(
        "model '{0}' has no provider: write it as PROVIDER:MODEL, e.g. openai:gpt-4o-mini or scripted:script.json"
    )]
    MissingProvider(String),
    /// A provider Loom does not know.
    #[error("unknown model provider '{provider}' in '{spec}': use openai:MODEL, anthropic:MODEL or scripted:PATH")]
    UnknownProvider {
        /// The provider part.
        provider: String,
        /// The whole string.
        spec: String,
    },
    /// `provider:` with nothing after it.
    #[error("'{0}' names no model: write {0}MODEL")]
    MissingModel(String),
    /// The API key is not set.
    #[error("{var} is not set: export {var}=… to use {provider} (or point --base-url at a server that needs no key)")]
    MissingApiKey {
        /// The variable to set.
        var: &'static str,
        /// The provider.
        provider: &'static str,
    },
    /// The API base is not an http(s) URL.
    #[error(
        "invalid base URL '{url}': {reason}; give an http:// or https:// address such as http://localhost:11434/v1"
    )]
    InvalidBaseUrl {
        /// The address given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A setting the provider cannot honour.
    #[error("{0}")]
    Unsupported(String),
    /// `scripted:` with no path.
    #[error("scripted model needs a script path: scripted:PATH")]
    MissingScriptPath,
    /// The script could not be loaded.
    #[error(transparent)]
    Script(#[from] ScriptError),
    /// The provider could not be set up.
    #[error("cannot set up the model: {0}")]
    Setup(#[from] LlmError),
}

/// Builds the model named by `spec` with default options and this process's environment.
pub fn model_from_spec(spec: &str) -> Result<Arc<dyn Llm>, ModelSpecError> {
    model_from_spec_with(spec, &ProviderOptions::default(), &|name| std::env::var(name).ok())
}

/// Builds the model named by `spec` (`openai:MODEL`, `anthropic:MODEL`,
/// `scripted:PATH`); `env` reads variables such as `OPENAI_API_KEY`.
pub fn model_from_spec_with(
    spec: &str,
    options: &ProviderOptions,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Arc<dyn Llm>, ModelSpecError> {
    let Some((provider, rest)) = spec.split_once(':') else {
        return Err(ModelSpecError::MissingProvider(spec.to_string()));
    };
    let var = |name: &str| env(name).filter(|value| !value.trim().is_empty());
    match provider {
        "scripted" => {
            if rest.is_empty() {
                return Err(ModelSpecError::MissingScriptPath);
            }
            Ok(Arc::new(ScriptedModel::from_path(rest)?))
        }
        "openai" => {
            if rest.is_empty() {
                return Err(ModelSpecError::MissingModel("openai:".into()));
            }
            let base_url = options
                .base_url
                .clone()
                .or_else(|| var("OPENAI_BASE_URL"))
                .unwrap_or_else(|| OPENAI_BASE_URL.to_string());
            check_base_url(&base_url)?;
            let api_key = var("OPENAI_API_KEY");
            if api_key.is_none() && base_url.trim_end_matches('/') == OPENAI_BASE_URL {
                return Err(ModelSpecError::MissingApiKey {
                    var: "OPENAI_API_KEY",
                    provider: "openai",
                });
            }
            let mut config = OpenAiConfig::new(rest);
            config.base_url = base_url;
            if options.guidance == Some(GuidancePlacement::System) && !config.is_official_api() {
                return Err(ModelSpecError::Unsupported(crate::openai::system_guidance_refused(
                    &config.base_url,
                )));
            }
            config.api_key = api_key;
            config.stream = options.stream.unwrap_or(true);
            config.max_tokens = options.max_tokens;
            config.text_tool_calls = options.text_tool_calls;
            config.guidance = options.guidance;
            config.http = options.http.clone();
            Ok(Arc::new(OpenAiModel::new(config)?))
        }
        "anthropic" => {
            if rest.is_empty() {
                return Err(ModelSpecError::MissingModel("anthropic:".into()));
            }
            let base_url = options
                .base_url
                .clone()
                .or_else(|| var("ANTHROPIC_BASE_URL"))
                .unwrap_or_else(|| ANTHROPIC_BASE_URL.to_string());
            check_base_url(&base_url)?;
            let api_key = var("ANTHROPIC_API_KEY");
            if api_key.is_none() && base_url.trim_end_matches('/') == ANTHROPIC_BASE_URL {
                return Err(ModelSpecError::MissingApiKey {
                    var: "ANTHROPIC_API_KEY",
                    provider: "anthropic",
                });
            }
            if options.guidance == Some(GuidancePlacement::System) {
                return Err(ModelSpecError::Unsupported(
                    "guidance = \"system\" cannot be used with anthropic: the Messages API takes no system message inside the conversation (guidance is an inline reminder there)".into(),
                ));
            }
            let mut config = AnthropicConfig::new(rest);
            config.base_url = base_url;
            config.api_key = api_key;
            if let Some(max_tokens) = options.max_tokens {
                config.max_tokens = max_tokens;
            }
            config.http = options.http.clone();
            Ok(Arc::new(AnthropicModel::new(config)?))
        }
        other => Err(ModelSpecError::UnknownProvider {
            provider: other.to_string(),
            spec: spec.to_string(),
        }),
    }
}

/// An API base must be an absolute http(s) URL with a host; anything else
/// would only fail later, after retries, as a connection error.
fn check_base_url(url: &str) -> Result<(), ModelSpecError> {
    let invalid = |reason: &str| ModelSpecError::InvalidBaseUrl {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    let parsed = reqwest::Url::parse(url.trim()).map_err(|err| invalid(&err.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(invalid(&format!(
            "the scheme is '{}', not http or https",
            parsed.scheme()
        )));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(invalid("it names no host"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn missing_keys_name_the_variable() {
        let err = model_from_spec_with("openai:gpt-4o-mini", &ProviderOptions::default(), &no_env)
            .err()
            .unwrap();
        assert!(err.to_string().starts_with("OPENAI_API_KEY is not set"), "{err}");
        let err = model_from_spec_with("anthropic:claude-x", &ProviderOptions::default(), &no_env)
            .err()
            .unwrap();
        assert!(err.to_string().starts_with("ANTHROPIC_API_KEY is not set"), "{err}");
        let local = ProviderOptions {
            base_url: Some("http://127.0.0.1:11434/v1".into()),
            ..ProviderOptions::default()
        };
        let model = model_from_spec_with("openai:llama3", &local, &no_env).unwrap();
        assert_eq!(model.model_name(), "openai:llama3");
        assert!(matches!(
            model_from_spec_with("openai:", &local, &no_env),
            Err(ModelSpecError::MissingModel(_))
        ));
        assert!(matches!(
            model_from_spec_with("gemini:x", &local, &no_env),
            Err(ModelSpecError::UnknownProvider { .. })
        ));
    }

    #[test]
    fn base_urls_must_be_http() {
        for bad in [
            "localhost:11434",
            "ftp://example.com/v1",
            "not a url",
            "http://",
            "file:///tmp/x",
        ] {
            for spec in ["openai:m", "anthropic:m"] {
                let options = ProviderOptions {
                    base_url: Some(bad.into()),
                    ..ProviderOptions::default()
                };
                let err = model_from_spec_with(spec, &options, &no_env).err().unwrap();
                assert!(
                    matches!(err, ModelSpecError::InvalidBaseUrl { .. }),
                    "{spec} {bad}: {err}"
                );
                assert!(err.to_string().contains(bad), "{err}");
            }
        }
        let env = |name: &str| (name == "OPENAI_BASE_URL").then(|| "127.0.0.1:8080".to_string());
        assert!(matches!(
            model_from_spec_with("openai:m", &ProviderOptions::default(), &env),
            Err(ModelSpecError::InvalidBaseUrl { .. })
        ));
        for good in [
            "http://127.0.0.1:8080/v1",
            "https://api.example.com",
            "http://[::1]:11434/v1/",
        ] {
            let options = ProviderOptions {
                base_url: Some(good.into()),
                ..ProviderOptions::default()
            };
            assert!(model_from_spec_with("openai:m", &options, &no_env).is_ok(), "{good}");
        }
    }
}
