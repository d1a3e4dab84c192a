//! The JSON of `dynrt serve`'s OpenAI-compatible API: request bodies, the parameters they map
//! onto, responses and stream chunks, errors, and the Prometheus metrics text.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use dynrt::llm::{FinishReason, GenerateParams, LiveStats, SamplingParams, ScheduleError};
use dynrt::llm::{LlmError, Prompt};
use dynrt::tokenizer::ChatMessage;
use serde::Deserialize;
use serde_json::{json, Value};

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    kind: &'static str,
    param: Option<&'static str>,
    code: Option<&'static str>,
}

impl ApiError {
    /// A 400 about the request.
    pub fn bad(message: impl Into<String>, param: Option<&'static str>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
        }
    }

    /// Any error: the HTTP layer's (401, 403, 415, 429, 503 ...) with its `type` and `code`.
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        message: impl Into<String>,
        code: Option<&'static str>,
    ) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code,
        }
    }

    /// A 404 for a model this server does not have (the name given is repeated up to 64
    /// bytes).
    pub fn unknown_model(asked: &str, served: &str) -> ApiError {
        let asked = super::serve_guard::truncated(asked, 64);
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "the model `{asked}` does not exist here: this server runs `{served}`"
            ),
            kind: "invalid_request_error",
            param: Some("model"),
            code: Some("model_not_found"),
        }
    }

    /// A 404 for a path this server does not answer.
    pub fn no_endpoint() -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            ..ApiError::bad(
                "no such endpoint: this server answers /v1/chat/completions, \
                 /v1/completions, /v1/models, /v1/memory, /tokenize, /detokenize, \
                 /apply-template, /health and /metrics",
                None,
            )
        }
    }

    /// A 500: the server failed.
    pub fn server(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

impl From<ScheduleError> for ApiError {
    fn from(e: ScheduleError) -> ApiError {
        let message = e.to_string();
        match e {
            ScheduleError::Invalid(e) => match *e {
                LlmError::ContextFull { .. } => ApiError {
                    code: Some("context_length_exceeded"),
                    ..ApiError::bad(message, None)
                },
                LlmError::BadParameter { name, .. } => ApiError::bad(message, Some(name)),
                LlmError::EmptyPrompt | LlmError::Tokenizer(_) | LlmError::UnknownToken { .. } => {
                    ApiError::bad(message, None)
                }
                _ => ApiError::server(message),
            },
            ScheduleError::OverBudget { .. } => ApiError::bad(message, Some("max_tokens")),
            ScheduleError::Stopped => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                ..ApiError::server(message)
            },
            ScheduleError::QueueFull { .. } => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                message,
                Some("queue_full"),
            ),
            _ => ApiError::server(message),
        }
    }
}

/// Parses a request body, a 400 in OpenAI's shape when it is not the JSON expected.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad(format!("the body is not a valid request: {e}"), None))
}

/// `stop`: one text or several.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// A message's `content`: text, or parts of which only text ones are understood.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct Message {
    role: String,
    content: Option<Content>,
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// The fields both endpoints share.
#[derive(Debug, Deserialize)]
pub struct Common {
    pub model: Option<String>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    pub n: Option<u64>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatBody {
    pub messages: Vec<Message>,
    #[serde(flatten)]
    pub common: Common,
}

/// `prompt` of a completion: text, one text in a list, or token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionBody {
    pub prompt: PromptField,
    #[serde(flatten)]
    pub common: Common,
}

impl ChatBody {
    /// The chat as the model's messages.
    pub fn prompt(&self) -> Result<Prompt, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::bad(
                "`messages` is empty: give at least one message",
                Some("messages"),
            ));
        }
        let mut out = Vec::with_capacity(self.messages.len());
        for m in &self.messages {
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for p in parts {
                        match (&*p.kind, &p.text) {
                            ("text", Some(t)) => text.push_str(t),
                            (kind, _) => {
                                return Err(ApiError::bad(
                                    format!(
                                        "content parts of type `{kind}` are not supported: \
                                         this model reads text only"
                                    ),
                                    Some("messages"),
                                ))
                            }
                        }
                    }
                    text
                }
            };
            out.push(ChatMessage::new(&m.role, content));
        }
        Ok(Prompt::Chat(out))
    }
}

impl CompletionBody {
    /// The prompt as text or ids.
    pub fn prompt(&self) -> Result<Prompt, ApiError> {
        match &self.prompt {
            PromptField::Text(t) => Ok(Prompt::Text(t.clone())),
            PromptField::Texts(t) if t.len() == 1 => Ok(Prompt::Text(t[0].clone())),
            PromptField::Texts(_) => Err(ApiError::bad(
                "give one prompt per request (a list of several is not supported)",
                Some("prompt"),
            )),
            PromptField::Ids(ids) => Ok(Prompt::Ids(ids.clone())),
        }
    }
}

impl Common {
    /// The generation parameters: `max_tokens` (default `default_max`, at most `context`),
    /// `temperature` (default 1, as OpenAI's), `top_p`, `seed` (default `seed`), `stop`.
    pub fn params(
        &self,
        context: usize,
        default_max: usize,
        seed: u64,
    ) -> Result<(GenerateParams, Vec<String>), ApiError> {
        if self.n.is_some_and(|n| n != 1) {
            return Err(ApiError::bad(
                "only n = 1 is supported: send one request per answer",
                Some("n"),
            ));
        }
        let max = self.max_completion_tokens.or(self.max_tokens);
        let max_tokens = match max {
            None => default_max.min(context),
            Some(0) => {
                return Err(ApiError::bad(
                    "max_tokens must be at least 1",
                    Some("max_tokens"),
                ))
            }
            Some(m) if m > context as u64 => {
                return Err(ApiError::bad(
                    format!(
                        "max_tokens = {m} is more than the model's context of {context} tokens"
                    ),
                    Some("max_tokens"),
                ))
            }
            Some(m) => m as usize,
        };
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) if v.len() <= 4 => v.clone(),
            Some(Stop::Many(_)) => {
                return Err(ApiError::bad("stop takes at most 4 texts", Some("stop")))
            }
        };
        let params = GenerateParams {
            max_tokens,
            sampling: SamplingParams {
                temperature: self.temperature.unwrap_or(1.0),
                top_k: 0,
                top_p: self.top_p.unwrap_or(1.0),
                seed: self.seed.unwrap_or(seed),
            },
            stop_at_eos: true,
            keep_logits: false,
        };
        params
            .sampling
            .validate()
            .map_err(|e| ApiError::from(ScheduleError::from(e)))?;
        Ok((params, stop))
    }

    /// Whether a stream ends with a chunk of token counts.
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }
}

/// OpenAI's `finish_reason`.
pub fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length | FinishReason::ContextFull => "length",
    }
}

/// The `usage` object.
pub fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

/// Which endpoint a response is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// What every response object of one request carries.
#[derive(Debug, Clone)]
pub struct Header {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Header {
    fn object(&self, fields: Value, object: &str) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
        });
        if let (Some(o), Value::Object(f)) = (v.as_object_mut(), fields) {
            o.extend(f);
        }
        v
    }

    /// The whole answer (`stream: false`).
    pub fn response(
        &self,
        text: &str,
        finish: &str,
        prompt_tokens: usize,
        completion_tokens: usize,
    ) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
            }),
            Endpoint::Completion => json!({
                "index": 0, "text": text, "logprobs": null, "finish_reason": finish,
            }),
        };
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion",
            Endpoint::Completion => "text_completion",
        };
        self.object(
            json!({"choices": [choice], "usage": usage(prompt_tokens, completion_tokens)}),
            object,
        )
    }

    /// One stream chunk: `text` (a chat's first chunk carries the role), or the end with its
    /// finish reason.
    pub fn chunk(&self, text: Option<&str>, first: bool, finish: Option<&str>) -> Value {
        match self.endpoint {
            Endpoint::Chat => {
                let mut delta = serde_json::Map::new();
                if first {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = text {
                    delta.insert("content".into(), json!(t));
                }
                self.object(
                    json!({"choices": [{
                        "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish,
                    }]}),
                    "chat.completion.chunk",
                )
            }
            Endpoint::Completion => self.object(
                json!({"choices": [{
                    "index": 0, "text": text.unwrap_or(""), "logprobs": null,
                    "finish_reason": finish,
                }]}),
                "text_completion",
            ),
        }
    }

    /// The stream's last chunk with the token counts (`stream_options.include_usage`).
    pub fn usage_chunk(&self, prompt_tokens: usize, completion_tokens: usize) -> Value {
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completion => "text_completion",
        };
        self.object(
            json!({"choices": [], "usage": usage(prompt_tokens, completion_tokens)}),
            object,
        )
    }
}

/// Upper bounds of the time-to-first-token histogram, seconds.
const TTFT_BOUNDS: [f64; 10] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// A Prometheus histogram of times to first token.
#[derive(Debug, Default, Clone)]
pub struct Histogram {
    counts: [u64; TTFT_BOUNDS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    /// Adds one observation (seconds).
    pub fn observe(&mut self, seconds: f64) {
        for (c, &b) in self.counts.iter_mut().zip(&TTFT_BOUNDS) {
            if seconds <= b {
                *c += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }
}

/// The `/metrics` text (Prometheus exposition format 0.0.4).
pub fn metrics_text(live: &LiveStats, ttft: &Histogram) -> String {
    let s = &live.scheduler;
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, lines: &[(String, String)]| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (labels, value) in lines {
            out.push_str(&format!("{name}{labels} {value}\n"));
        }
    };
    let single: [(&str, &str, &str, String); 22] = [
        (
            "dynrt_tokens_generated_total",
            "counter",
            "Tokens generated.",
            s.tokens_generated_total.to_string(),
        ),
        (
            "dynrt_prompt_tokens_total",
            "counter",
            "Prompt tokens prefilled.",
            s.prompt_tokens_total.to_string(),
        ),
        (
            "dynrt_tokens_per_second",
            "gauge",
            "Tokens generated per second over the last 10 seconds.",
            format!("{:.3}", live.tokens_per_s),
        ),
        (
            "dynrt_active_sessions",
            "gauge",
            "Requests with a session (prefilling or decoding).",
            s.active.to_string(),
        ),
        (
            "dynrt_queue_length",
            "gauge",
            "Requests waiting for memory or a slot.",
            s.queued.to_string(),
        ),
        (
            "dynrt_kv_budget_bytes",
            "gauge",
            "KV-cache bytes of the pools (whole pages; the requests share them).",
            s.budget_bytes.to_string(),
        ),
        (
            "dynrt_kv_reserved_bytes",
            "gauge",
            "KV-cache bytes of the pages the active requests hold.",
            s.kv_reserved_bytes.to_string(),
        ),
        (
            "dynrt_kv_allocated_bytes",
            "gauge",
            "KV-cache bytes allocated: the pools, once the first request ran.",
            s.kv_allocated_bytes.to_string(),
        ),
        (
            "dynrt_kv_needed_bytes",
            "gauge",
            "KV-cache bytes the active requests need for the tokens they hold.",
            s.kv_needed_bytes.to_string(),
        ),
        (
            "dynrt_kv_allocated_peak_bytes",
            "gauge",
            "Largest KV-cache bytes the active sessions' caches held after a step.",
            s.kv_allocated_peak_bytes.to_string(),
        ),
        (
            "dynrt_kv_reserved_peak_bytes",
            "gauge",
            "Largest KV-cache bytes admission counted for the active requests.",
            s.kv_reserved_peak_bytes.to_string(),
        ),
        (
            "dynrt_kv_pages_total",
            "gauge",
            "Pages of each layer's KV pool.",
            s.pages_total.to_string(),
        ),
        (
            "dynrt_kv_pages_used",
            "gauge",
            "KV pages the active requests hold (a shared page once).",
            s.pages_used.to_string(),
        ),
        (
            "dynrt_kv_pages_shared",
            "gauge",
            "KV pages held by more than one request (a common prompt start).",
            s.pages_shared.to_string(),
        ),
        (
            "dynrt_kv_preemptions_total",
            "counter",
            "Requests that gave their pages back to let others run (computed again later).",
            s.preemptions.to_string(),
        ),
        (
            "dynrt_kv_pages_spare",
            "gauge",
            "KV pages held ahead of the requests' next tokens (reclaimed when needed).",
            s.pages_spare.to_string(),
        ),
        (
            "dynrt_kv_offloads_total",
            "counter",
            "Requests whose pages went to host memory to let others run (restored later).",
            s.offloads.to_string(),
        ),
        (
            "dynrt_kv_offloaded_bytes",
            "gauge",
            "KV-cache bytes in host memory now.",
            s.kv_offloaded_bytes.to_string(),
        ),
        (
            "dynrt_prompt_tokens_shared_total",
            "counter",
            "Prompt tokens read from shared pages instead of computed.",
            s.tokens_shared.to_string(),
        ),
        (
            "dynrt_batch_size",
            "gauge",
            "Requests the last forward pass computed rows for.",
            s.batch_sequences.to_string(),
        ),
        (
            "dynrt_device_bytes",
            "gauge",
            "Device memory in use: weights, caches, activations.",
            s.device_bytes.to_string(),
        ),
        (
            "dynrt_device_peak_bytes",
            "gauge",
            "Largest device memory of each on-device kind, summed (an upper bound of the peak).",
            s.device_peak_bytes.to_string(),
        ),
    ];
    for (name, kind, help, value) in single {
        metric(name, kind, help, &[(String::new(), value)]);
    }
    let outcomes = [
        ("finished", s.finished),
        ("cancelled", s.cancelled),
        ("failed", s.failed),
    ];
    let lines: Vec<(String, String)> = outcomes
        .iter()
        .map(|(o, n)| (format!("{{outcome=\"{o}\"}}"), n.to_string()))
        .collect();
    metric(
        "dynrt_requests_total",
        "counter",
        "Requests that ended, by outcome.",
        &lines,
    );
    let mut lines: Vec<(String, String)> = TTFT_BOUNDS
        .iter()
        .zip(&ttft.counts)
        .map(|(b, c)| (format!("_bucket{{le=\"{b}\"}}"), c.to_string()))
        .collect();
    lines.push(("_bucket{le=\"+Inf\"}".into(), ttft.count.to_string()));
    lines.push(("_sum".into(), format!("{:.6}", ttft.sum)));
    lines.push(("_count".into(), ttft.count.to_string()));
    metric(
        "dynrt_time_to_first_token_seconds",
        "histogram",
        "Seconds from a request's arrival to its first token.",
        &lines,
    );
    out
}
