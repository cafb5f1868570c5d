//! What a start request must pass before a run is taken in: its params
//! (valid, within the token's grant), its idempotency key (a retry gets
//! the run of the first request) and its session (one token's).

use super::*;

/// A stable digest of a start request without its key (FNV-1a over its
/// JSON). Without its trace context too: a client's retry of the same
/// request is traced as a new span of its own.
pub(super) fn digest(params: &StartRun) -> u64 {
    let mut params = params.clone();
    params.idempotency_key = None;
    params.traceparent = None;
    let text = serde_json::to_string(&params).unwrap_or_default();
    loom_core::text::fnv1a(text.bytes())
}

impl Service {
    /// `FORBIDDEN` for a model or a tool the token is not granted; a
    /// token limited to some tools gives a run that names none those
    /// (docs/server.md, "Roles").
    pub(super) fn within_grant(&self, principal: &Principal, params: &mut StartRun) -> Result<(), ApiError> {
        let grant = principal.grant();
        if let Some(models) = &grant.models {
            let model = params
                .model
                .clone()
                .unwrap_or_else(|| self.inner.agents.default_model());
            if !models.contains(&model) {
                return Err(ApiError::new(
                    Code::Forbidden,
                    format!(
                        "the token '{}' may not use the model '{model}' (it may use: {})",
                        principal.name(),
                        models.join(", ")
                    ),
                ));
            }
        }
        if let Some(granted) = &grant.tools {
            match &params.tools {
                Some(asked) => {
                    if let Some(tool) = asked.iter().find(|tool| !granted.contains(tool)) {
                        return Err(ApiError::new(
                            Code::Forbidden,
                            format!("the token '{}' may not use the tool '{tool}'", principal.name()),
                        ));
                    }
                }
                None => params.tools = Some(granted.clone()),
            }
        }
        Ok(())
    }

    pub(super) fn validate(&self, params: &StartRun) -> Result<(), ApiError> {
        if params.prompt.trim().is_empty() {
            return Err(ApiError::new(Code::InvalidParams, "prompt must not be empty"));
        }
        if let Some(steps) = params.max_steps {
            let limit = self.inner.config.max_steps_limit;
            if steps == 0 || steps > limit {
                return Err(ApiError::new(
                    Code::InvalidParams,
                    format!("maxSteps must be between 1 and {limit}"),
                ));
            }
        }
        if let Some(model) = &params.model {
            if *model != self.inner.agents.default_model() && !self.inner.config.models.contains(model) {
                return Err(ApiError::new(
                    Code::InvalidParams,
                    format!("model '{model}' is not offered by this server"),
                ));
            }
        }
        if let Some(mode) = params.mode {
            let allowed = &self.inner.config.allowed_modes;
            if !allowed.contains(&mode) {
                let names: Vec<&str> = allowed.iter().map(|mode| mode.as_str()).collect();
                return Err(ApiError::new(
                    Code::Forbidden,
                    format!(
                        "mode '{mode}' is not allowed by this server (it allows: {})",
                        names.join(", ")
                    ),
                ));
            }
        }
        if let Some(session) = &params.session_id {
            let fine = !session.is_empty()
                && session.len() <= 128
                && session.chars().all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c));
            if !fine {
                return Err(ApiError::new(
                    Code::InvalidParams,
                    "sessionId: 1 to 128 characters of A-Z a-z 0-9 - _ . :",
                ));
            }
        }
        if params
            .idempotency_key
            .as_ref()
            .is_some_and(|key| key.is_empty() || key.len() > 256)
        {
            return Err(ApiError::new(
                Code::InvalidParams,
                "idempotencyKey: 1 to 256 characters",
            ));
        }
        Ok(())
    }

    /// Makes an idempotency key outlive this process: a retry after a
    /// restart gets the same run. Before the answer, so a client that got
    /// one can count on it; a store that fails here costs only that.
    pub(super) async fn persist_key(&self, principal: &Principal, key: &str, digest: u64, run_id: &str) {
        let Some(store) = &self.inner.store else { return };
        let request = KeyedRequest {
            digest,
            run_id: run_id.to_string(),
        };
        if let Err(err) = store.remember_request(principal.name(), key, &request).await {
            tracing::warn!(run_id, error = %err, "an idempotency key could not be stored; it holds until a restart");
        }
    }

    /// The run an earlier request with this key started, if any: one this
    /// process remembers, or one the store does (from before a restart).
    pub(super) async fn idempotent(
        &self,
        principal: &Principal,
        key: &str,
        digest: u64,
    ) -> Result<Option<RunAccepted>, ApiError> {
        let remembered = self.registry().remembered(principal, key).cloned();
        let (known, run_id) = match remembered {
            Some(found) => found,
            None => {
                let Some(store) = &self.inner.store else {
                    return Ok(None);
                };
                let Some(found) = store
                    .remembered_request(principal.name(), key)
                    .await
                    .map_err(store_error)?
                else {
                    return Ok(None);
                };
                self.registry()
                    .remember(principal, key.to_string(), found.digest, found.run_id.clone());
                (found.digest, found.run_id)
            }
        };
        if known != digest {
            return Err(conflicting_key());
        }
        {
            let registry = self.registry();
            if let Some(run) = registry.run(principal, &run_id) {
                if !run.stored {
                    return Err(being_accepted());
                }
                return Ok(Some(accepted_of(run, self.inner.queue.position(&run_id))));
            }
        }
        // It has ended: where it is now.
        let view = self.get(principal, &run_id).await?;
        Ok(Some(RunAccepted {
            run_id: view.run_id,
            session_id: view.session_id,
            status: view.status,
            queue_position: None,
            steered: false,
        }))
    }

    /// A session id belongs to the token that first used it.
    pub(super) async fn check_session_owner(&self, principal: &Principal, session: &str) -> Result<(), ApiError> {
        let taken = {
            let registry = self.registry();
            registry
                .on_session(session)
                .iter()
                .any(|run| &run.principal != principal)
                || registry
                    .finished
                    .values()
                    .any(|(owner, view)| view.session_id == session && owner != principal)
        };
        let taken = taken
            || match &self.inner.store {
                Some(store) => store
                    .session_runs(session)
                    .await
                    .map_err(store_error)?
                    .iter()
                    .any(|run| run.principal.as_deref() != Some(principal.name())),
                None => false,
            };
        if taken {
            return Err(session_taken(session));
        }
        Ok(())
    }
}

pub(super) fn session_taken(session: &str) -> ApiError {
    ApiError::new(Code::Conflict, format!("session '{session}' belongs to another token"))
}

/// A retry of a request whose run is being stored: it has no answer yet.
pub(super) fn being_accepted() -> ApiError {
    ApiError::new(
        Code::Overloaded,
        "the first request with this idempotency key is still being accepted; try again",
    )
    .retry_after(Duration::from_millis(200))
}

pub(super) fn conflicting_key() -> ApiError {
    ApiError::new(Code::Conflict, "this idempotency key was used with another payload")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(prompt: &str, key: Option<&str>) -> StartRun {
        StartRun {
            idempotency_key: key.map(str::to_string),
            ..super::super::testing::start(prompt)
        }
    }

    #[test]
    fn a_retry_is_the_same_payload_whatever_its_key_and_another_payload_is_not() {
        assert_eq!(digest(&request("hi", Some("a"))), digest(&request("hi", Some("b"))));
        assert_eq!(digest(&request("hi", Some("a"))), digest(&request("hi", None)));
        assert_ne!(digest(&request("hi", Some("a"))), digest(&request("hello", Some("a"))));
        // A retry traced as another span of the client's is the same request.
        let traced = StartRun {
            traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().ok(),
            ..request("hi", Some("a"))
        };
        assert!(traced.traceparent.is_some());
        assert_eq!(digest(&traced), digest(&request("hi", Some("a"))));
    }
}
