//! HTTP for providers: timeouts, retries with backoff (honouring
//! `Retry-After`), the circuit breaker and the rate limit, and turning a
//! server-sent-event stream into `LlmChunk`s.
//!
//! A call is retried only while nothing of its answer has been handed on:
//! the stream is returned once its first chunk is parsed, and any failure
//! after that reaches the engine as an error, never as a silently shorter
//! answer.

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::Duration;

use eventsource_stream::{EventStreamError, Eventsource};
use futures_util::stream::{self, Stream, StreamExt};
use loom_core::{LlmChunk, LlmError, LlmStream};

use crate::resilience::{BreakerCall, BreakerSettings, CircuitBreaker, RateLimiter, RetryPolicy};

/// Timeouts, retries and limits of a provider.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// Time to establish a connection.
    pub connect_timeout: Duration,
    /// Time from sending the request to the first piece of the answer.
    pub first_byte_timeout: Duration,
    /// Longest silence between two pieces of a streamed answer.
    pub idle_timeout: Duration,
    /// Retries of failed calls.
    pub retry: RetryPolicy,
    /// When to stop calling a failing provider for a while.
    pub breaker: BreakerSettings,
    /// Client-side requests-per-minute limit.
    pub requests_per_minute: Option<u32>,
    /// Extra headers sent with every request.
    pub headers: Vec<(String, String)>,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            // Minutes, not seconds: a model served on a CPU reads a long
            // prompt for minutes before its first token, and a server
            // answering two requests stalls one while it reads the other's
            // prompt (llama.cpp sends nothing meanwhile). The official SDKs
            // wait 10 minutes; Codex's stream idle limit is 5.
            first_byte_timeout: Duration::from_secs(300),
            idle_timeout: Duration::from_secs(300),
            retry: RetryPolicy::default(),
            breaker: BreakerSettings::default(),
            requests_per_minute: None,
            headers: Vec::new(),
        }
    }
}

/// Turns one provider's server-sent events into chunks.
pub(crate) trait StreamParser: Send + 'static {
    /// One event (`event:` name, may be empty, and its `data:`).
    fn event(&mut self, name: &str, data: &str) -> Result<Vec<LlmChunk>, LlmError>;
    /// The stream closed: the last chunks, or an error if it closed too early.
    fn end(&mut self) -> Result<Vec<LlmChunk>, LlmError>;
}

/// How one provider words its errors.
pub(crate) type ErrorMapper = fn(status: u16, retry_after: Option<Duration>, body: &str) -> LlmError;

type EventStream =
    Pin<Box<dyn Stream<Item = Result<eventsource_stream::Event, EventStreamError<reqwest::Error>>> + Send>>;

/// The HTTP side of one provider.
#[derive(Debug)]
pub(crate) struct Transport {
    client: reqwest::Client,
    settings: HttpSettings,
    breaker: CircuitBreaker,
    limiter: Option<RateLimiter>,
    provider: String,
}

impl Transport {
    pub(crate) fn new(provider: &str, settings: HttpSettings) -> Result<Self, LlmError> {
        let client = reqwest::Client::builder()
            .connect_timeout(settings.connect_timeout)
            .build()
            .map_err(|err| LlmError::Connection(format!("cannot set up the HTTP client: {err}")))?;
        Ok(Self {
            client,
            breaker: CircuitBreaker::new(provider, settings.breaker.clone()),
            limiter: settings.requests_per_minute.map(RateLimiter::new),
            provider: provider.to_string(),
            settings,
        })
    }

    pub(crate) fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// Sends the request built by `build` (again on each retry) and returns
    /// the parsed stream once its first chunk has arrived.
    pub(crate) async fn stream<P: StreamParser>(
        &self,
        build: impl Fn() -> reqwest::RequestBuilder,
        parser: impl Fn() -> P,
        map_error: ErrorMapper,
    ) -> Result<LlmStream, LlmError> {
        self.with_retries(|| self.open(build(), parser(), map_error)).await
    }

    /// Sends a request whose answer is one JSON document.
    pub(crate) async fn json(
        &self,
        build: impl Fn() -> reqwest::RequestBuilder,
        map_error: ErrorMapper,
    ) -> Result<serde_json::Value, LlmError> {
        self.with_retries(|| async {
            let response = self.send(build(), map_error).await?;
            let body = tokio::time::timeout(self.settings.first_byte_timeout, response.text())
                .await
                .map_err(|_| LlmError::Timeout("the answer did not arrive in time".into()))?
                .map_err(connection_error)?;
            serde_json::from_str(&body).map_err(|err| LlmError::Protocol(format!("the answer is not JSON: {err}")))
        })
        .await
    }

    async fn with_retries<T, F, Fut>(&self, attempt: F) -> Result<T, LlmError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, LlmError>>,
    {
        let policy = &self.settings.retry;
        let attempts = policy.max_attempts.max(1);
        let mut number = 1;
        let mut call = BreakerCall::new(&self.breaker);
        loop {
            let admission = match self.breaker.admit() {
                Ok(admission) => admission,
                Err(wait) => {
                    return Err(LlmError::Server {
                        status: 503,
                        message: format!(
                            "the circuit breaker for {} is open after repeated failures; next try in {:.0} s",
                            self.provider,
                            wait.as_secs_f64().ceil()
                        ),
                    })
                }
            };
            call.admitted(admission);
            if let Some(limiter) = &self.limiter {
                limiter.acquire().await;
            }
            let err = match attempt().await {
                Ok(value) => {
                    call.succeeded();
                    return Ok(value);
                }
                Err(err) => err,
            };
            if !is_transient(&err) {
                // The provider answered (it refused the request, not the
                // call): it is up, as far as the circuit goes.
                call.succeeded();
                return Err(err);
            }
            call.attempt_failed();
            // The breaker counts calls, not attempts (docs/cli.md), so a call
            // is patient with a restarting server; a trial is not. A call
            // dropped mid-way is counted too (`BreakerCall`).
            if number >= attempts || call.is_trial() {
                call.failed();
                return Err(gave_up(err, number));
            }
            let retry_after = match &err {
                LlmError::RateLimited { retry_after, .. } => *retry_after,
                _ => None,
            };
            let wait = policy.delay(number, retry_after);
            tracing::warn!(provider = %self.provider, attempt = number, wait_ms = wait.as_millis() as u64, error = %err, "model call failed; retrying");
            tokio::time::sleep(wait).await;
            number += 1;
        }
    }

    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        map_error: ErrorMapper,
    ) -> Result<reqwest::Response, LlmError> {
        let mut request = request;
        for (name, value) in &self.settings.headers {
            request = request.header(name, value);
        }
        let response = tokio::time::timeout(self.settings.first_byte_timeout, request.send())
            .await
            .map_err(|_| {
                LlmError::Timeout(format!(
                    "no response within {} s",
                    self.settings.first_byte_timeout.as_secs()
                ))
            })?
            .map_err(connection_error)?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let retry_after = retry_after(response.headers());
        let body = tokio::time::timeout(self.settings.first_byte_timeout, response.text())
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        Err(map_error(status.as_u16(), retry_after, &body))
    }

    async fn open<P: StreamParser>(
        &self,
        request: reqwest::RequestBuilder,
        mut parser: P,
        map_error: ErrorMapper,
    ) -> Result<LlmStream, LlmError> {
        let response = self.send(request, map_error).await?;
        // A final blank line makes sure the last event is dispatched even when
        // the server closed right after its `data:` line.
        let bytes = response
            .bytes_stream()
            .chain(stream::once(async { Ok(bytes::Bytes::from_static(b"\n\n")) }));
        let mut events: EventStream = Box::pin(bytes.eventsource());
        let mut pending = VecDeque::new();
        let mut ended = false;
        // Wait for the first chunk of the answer: until then a failure can
        // still be retried. What only describes the answer (the model that
        // gives it, as `message_start` or a role-only first chunk tells it)
        // is no part of it yet.
        while !pending.iter().any(is_answer) && !ended {
            match tokio::time::timeout(self.settings.first_byte_timeout, events.next()).await {
                Err(_) => return Err(LlmError::Timeout("the stream sent nothing in time".into())),
                Ok(None) => {
                    pending.extend(parser.end()?);
                    ended = true;
                }
                Ok(Some(Err(err))) => return Err(stream_error(err)),
                Ok(Some(Ok(event))) => pending.extend(parser.event(&event.event, &event.data)?),
            }
        }
        let state = Streaming {
            pending,
            events: (!ended).then_some(events),
            parser,
            idle: self.settings.idle_timeout,
        };
        Ok(Box::pin(stream::unfold(state, Streaming::next)))
    }
}

/// Whether `chunk` is the answer itself, not what describes it.
fn is_answer(chunk: &LlmChunk) -> bool {
    !matches!(chunk, LlmChunk::Model(_))
}

struct Streaming<P> {
    pending: VecDeque<LlmChunk>,
    events: Option<EventStream>,
    parser: P,
    idle: Duration,
}

impl<P: StreamParser> Streaming<P> {
    async fn next(mut self) -> Option<(Result<LlmChunk, LlmError>, Self)> {
        loop {
            if let Some(chunk) = self.pending.pop_front() {
                return Some((Ok(chunk), self));
            }
            let events = self.events.as_mut()?;
            let failure = match tokio::time::timeout(self.idle, events.next()).await {
                Err(_) => LlmError::Timeout(format!("the stream went silent for {} s", self.idle.as_secs())),
                Ok(Some(Ok(event))) => match self.parser.event(&event.event, &event.data) {
                    Ok(chunks) => {
                        self.pending.extend(chunks);
                        continue;
                    }
                    Err(err) => err,
                },
                Ok(Some(Err(err))) => stream_error(err),
                Ok(None) => match self.parser.end() {
                    Ok(chunks) => {
                        self.pending.extend(chunks);
                        self.events = None;
                        continue;
                    }
                    Err(err) => err,
                },
            };
            // One error ends the stream.
            self.events = None;
            return Some((Err(failure), self));
        }
    }
}

/// Failures worth another attempt.
fn is_transient(err: &LlmError) -> bool {
    matches!(
        err,
        LlmError::RateLimited { .. } | LlmError::Server { .. } | LlmError::Connection(_) | LlmError::Timeout(_)
    )
}

fn gave_up(err: LlmError, attempts: u32) -> LlmError {
    let note = format!(" (gave up after {attempts} attempts)");
    match err {
        LlmError::RateLimited { message, retry_after } => LlmError::RateLimited {
            message: message + &note,
            retry_after,
        },
        LlmError::Server { status, message } => LlmError::Server {
            status,
            message: message + &note,
        },
        LlmError::Connection(message) => LlmError::Connection(message + &note),
        LlmError::Timeout(message) => LlmError::Timeout(message + &note),
        other => other,
    }
}

fn connection_error(err: reqwest::Error) -> LlmError {
    if err.is_timeout() {
        LlmError::Timeout(err.to_string())
    } else {
        LlmError::Connection(full_chain(&err))
    }
}

fn stream_error(err: EventStreamError<reqwest::Error>) -> LlmError {
    match err {
        EventStreamError::Transport(err) => {
            LlmError::Connection(format!("the connection broke mid-stream: {}", full_chain(&err)))
        }
        EventStreamError::Utf8(err) => LlmError::Protocol(format!("the stream is not UTF-8: {err}")),
        EventStreamError::Parser(err) => LlmError::Protocol(format!("malformed server-sent events: {err}")),
    }
}

fn full_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `Retry-After` (seconds or an HTTP date) or OpenAI's `retry-after-ms`.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    if let Some(ms) = headers
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
    {
        // A value too large (or not finite) to be a duration is no hint.
        return Duration::try_from_secs_f64(ms.max(0.0) / 1000.0).ok();
    }
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(secs.max(0.0)).ok();
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(std::time::SystemTime::now()).unwrap_or_default())
}
