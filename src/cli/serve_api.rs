//! The JSON of `dynrt serve`'s OpenAI-compatible API: request bodies and the checks that
//! every field is honoured or refused, the parameters they map onto (with the server's
//! defaults), responses and stream chunks (log-probabilities and tool calls included),
//! errors, and the Prometheus metrics text.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use dynrt::llm::{FinishReason, GenerateParams, LiveStats, LogitRules, Penalties, Recommended};
use dynrt::llm::{LlmError, Prompt, Request, SamplingParams, ScheduleError, TokenLogprobs};
use dynrt::structured::{Answer, Constraint, Grammar, Json, TokenTrie, ToolFormat};
use dynrt::tokenizer::{ChatMessage, ChatToolCall, Tokenizer};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    kind: &'static str,
    param: Option<String>,
    code: Option<&'static str>,
}

/// The longest piece of a client's text an error message repeats.
const ECHO_CHARS: usize = 64;

/// `text` cut to [`ECHO_CHARS`] characters (a client's 100 KB field name is not sent back).
pub fn truncated(text: &str) -> String {
    match text.char_indices().nth(ECHO_CHARS) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_string(),
    }
}

impl ApiError {
    /// A 400 about the request.
    pub fn bad(message: impl Into<String>, param: Option<&str>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(truncated),
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
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// A 400 for a field this server does not implement.
    pub fn unsupported(field: &str) -> ApiError {
        ApiError {
            code: Some("unsupported_parameter"),
            ..ApiError::bad(
                format!(
                    "the field `{}` is not supported by this server (dynrt serve \
                     --lenient-fields ignores fields it does not know)",
                    truncated(field)
                ),
                Some(field),
            )
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
                LlmError::UnknownToken { .. } => ApiError::bad(message, Some("logit_bias")),
                LlmError::EmptyPrompt | LlmError::Tokenizer(_) => ApiError::bad(message, None),
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

/// Which endpoint a request or response is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// The fields each endpoint implements (anything else with a value other than `null` is
/// refused, or ignored with `--lenient-fields`).
const CHAT_FIELDS: &[&str] = &[
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "logprobs",
    "top_logprobs",
];
const COMPLETION_FIELDS: &[&str] = &["prompt", "logprobs", "echo", "suffix", "best_of"];
const COMMON_FIELDS: &[&str] = &[
    "model",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "repetition_penalty",
    "repeat_last_n",
    "logit_bias",
    "response_format",
    "user",
    "cache_salt",
    "cache_prompt",
];
const MESSAGE_FIELDS: &[&str] = &["role", "content", "name", "tool_calls", "tool_call_id"];

/// Refuses a body with a field this server does not implement (a `null` value means
/// nothing and passes). Returns the names of the fields ignored under `lenient`.
pub fn check_fields(
    body: &[u8],
    endpoint: Endpoint,
    lenient: bool,
) -> Result<Vec<String>, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad(format!("the body is not valid JSON: {e}"), None))?;
    let Value::Object(fields) = &v else {
        return Err(ApiError::bad("the body must be a JSON object", None));
    };
    let own = match endpoint {
        Endpoint::Chat => CHAT_FIELDS,
        Endpoint::Completion => COMPLETION_FIELDS,
    };
    let mut ignored = Vec::new();
    let mut unknown = |name: String| -> Result<(), ApiError> {
        if lenient {
            ignored.push(truncated(&name));
            Ok(())
        } else {
            Err(ApiError::unsupported(&name))
        }
    };
    for (k, value) in fields {
        if !value.is_null() && !own.contains(&k.as_str()) && !COMMON_FIELDS.contains(&k.as_str()) {
            unknown(k.clone())?;
        }
    }
    if let Some(Value::Array(messages)) = fields.get("messages") {
        for (i, m) in messages.iter().enumerate() {
            let Value::Object(m) = m else { continue };
            for (k, value) in m {
                if !value.is_null() && !MESSAGE_FIELDS.contains(&k.as_str()) {
                    unknown(format!("messages[{i}].{}", truncated(k)))?;
                }
            }
        }
    }
    if let Some(Value::Object(o)) = fields.get("stream_options") {
        for (k, value) in o {
            if !value.is_null() && k != "include_usage" {
                unknown(format!("stream_options.{}", truncated(k)))?;
            }
        }
    }
    Ok(ignored)
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

/// A tool call in an assistant message of the history.
#[derive(Debug, Deserialize)]
pub struct MessageToolCall {
    id: Option<String>,
    function: CalledFunction,
}

#[derive(Debug, Deserialize)]
pub struct CalledFunction {
    name: String,
    /// JSON text, as OpenAI sends it (an object is accepted too).
    arguments: Option<Json>,
}

#[derive(Debug, Deserialize)]
pub struct Message {
    role: String,
    content: Option<Content>,
    name: Option<String>,
    tool_calls: Option<Vec<MessageToolCall>>,
    tool_call_id: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// `logit_bias`: token ids (as strings, OpenAI's form) to biases, or `[id, bias]` pairs
/// (llama-server's).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum LogitBias {
    Map(HashMap<String, f32>),
    Pairs(Vec<(u32, f32)>),
}

/// `response_format`.
#[derive(Debug, Deserialize)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    kind: String,
    json_schema: Option<JsonSchemaFormat>,
    /// llama-server's form: `{"type": "json_object", "schema": {...}}`.
    schema: Option<Json>,
}

#[derive(Debug, Deserialize)]
pub struct JsonSchemaFormat {
    #[allow(dead_code)]
    name: Option<String>,
    schema: Option<Json>,
    #[allow(dead_code)]
    strict: Option<bool>,
    #[allow(dead_code)]
    description: Option<String>,
}

/// One of `tools`.
#[derive(Debug, Deserialize)]
pub struct Tool {
    #[serde(rename = "type")]
    kind: String,
    function: ToolFunction,
}

#[derive(Debug, Deserialize)]
pub struct ToolFunction {
    name: String,
    description: Option<String>,
    parameters: Option<Json>,
    strict: Option<bool>,
}

/// `tool_choice`: `"none"`, `"auto"`, `"required"`, or one function by name.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ToolChoice {
    Mode(String),
    Function {
        #[serde(rename = "type")]
        kind: String,
        function: NamedFunction,
    },
}

#[derive(Debug, Deserialize)]
pub struct NamedFunction {
    name: String,
}

/// The fields both endpoints share.
#[derive(Debug, Deserialize)]
pub struct Common {
    #[allow(dead_code)]
    pub model: Option<String>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub n: Option<u64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub repeat_last_n: Option<i64>,
    pub logit_bias: Option<LogitBias>,
    pub response_format: Option<ResponseFormat>,
    #[allow(dead_code)]
    pub user: Option<String>,
    pub cache_salt: Option<String>,
    pub cache_prompt: Option<bool>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatBody {
    pub messages: Vec<Message>,
    pub tools: Option<Vec<Tool>>,
    pub tool_choice: Option<ToolChoice>,
    pub parallel_tool_calls: Option<bool>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u64>,
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
    pub logprobs: Option<u64>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    pub best_of: Option<u64>,
    #[serde(flatten)]
    pub common: Common,
}

/// The sampling a request gets for the fields it leaves out: the model file's recommended
/// settings ([`Recommended`]) where it has them, else llama-server's defaults.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Defaults {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub repeat_last_n: usize,
}

impl Defaults {
    /// llama-server's defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, repeat
    /// penalty 1 over the last 64 tokens) with the model's recommendations on top.
    pub fn new(recommended: Recommended) -> Defaults {
        Defaults {
            temperature: recommended.temperature.unwrap_or(0.8),
            top_k: recommended.top_k.unwrap_or(40),
            top_p: recommended.top_p.unwrap_or(0.95),
            min_p: recommended.min_p.unwrap_or(0.05),
            repeat_penalty: recommended.repeat_penalty.unwrap_or(1.0),
            repeat_last_n: recommended.repeat_last_n.unwrap_or(64),
        }
    }
}

/// What the server knows that turns a body into requests.
pub struct Server<'a> {
    /// The model's context, tokens.
    pub context: usize,
    /// The client's prompt-cache partition (`serve_guard::cache_partition`): requests
    /// share KV pages only within one.
    pub partition: u64,
    pub defaults: &'a Defaults,
    /// How the model's template writes tool calls (`None`: no tools).
    pub tool_format: Option<ToolFormat>,
}

/// How a chat's answer is read for tool calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tools {
    /// No tools: the answer is text.
    Off,
    /// The answer may call the tools `names` (`format` says how); `parallel`: more than one
    /// call.
    On {
        format: ToolFormat,
        parallel: bool,
        names: Arc<[String]>,
    },
}

/// Log-probabilities a request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logprobs {
    Off,
    /// The chat endpoint's `logprobs: true` with `top_logprobs`.
    Chat(usize),
    /// The completions endpoint's `logprobs: N`.
    Completion(usize),
}

/// A request as the scheduler will run it: `n` copies of one request (seeds `seed`,
/// `seed + 1`, ...), each with a constraint of its own.
pub struct Plan {
    pub endpoint: Endpoint,
    pub prompt: Prompt,
    pub params: GenerateParams,
    pub stop: Vec<String>,
    pub n: usize,
    pub bias: Vec<(u32, f32)>,
    pub grammar: Option<Arc<Grammar>>,
    pub salt: u64,
    pub tools: Tools,
    pub logprobs: Logprobs,
    pub stream: bool,
    pub include_usage: bool,
    /// The fields ignored under `--lenient-fields`.
    pub ignored: Vec<String>,
}

/// Most answers one request may ask for (`n`).
pub const MAX_N: u64 = 16;

/// 64 random bits (a seed when a request gives none).
pub fn random_u64() -> u64 {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    // RandomState's keys come from the operating system's random source.
    std::collections::hash_map::RandomState::new().hash_one((n, t))
}

/// The prompt cache's partition of a request: the client's (`partition`, e.g. a hash of its
/// API key) mixed with the request's `cache_salt`. Requests share KV pages only within one
/// partition.
pub fn cache_partition(partition: u64, salt: Option<&str>) -> u64 {
    match salt {
        None => partition,
        Some(s) => {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (partition, s).hash(&mut h);
            h.finish()
        }
    }
}

fn bias_of(b: &LogitBias) -> Result<Vec<(u32, f32)>, ApiError> {
    let pairs: Vec<(u32, f32)> = match b {
        LogitBias::Map(m) => m
            .iter()
            .map(|(k, &v)| {
                k.parse::<u32>().map(|id| (id, v)).map_err(|_| {
                    ApiError::bad(
                        format!("logit_bias keys are token ids: `{}` is not", truncated(k)),
                        Some("logit_bias"),
                    )
                })
            })
            .collect::<Result<_, _>>()?,
        LogitBias::Pairs(p) => p.clone(),
    };
    if let Some((_, v)) = pairs.iter().find(|(_, v)| !(-100.0..=100.0).contains(v)) {
        return Err(ApiError::bad(
            format!("logit_bias values must be in [-100, 100], not {v}"),
            Some("logit_bias"),
        ));
    }
    Ok(pairs)
}

/// A tool name as OpenAI allows it: letters, digits, `_` and `-`, 1 to 64 of them.
fn valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl Common {
    /// The parameters both endpoints share; `logprobs` as the endpoint asked.
    fn plan(
        &self,
        server: &Server<'_>,
        endpoint: Endpoint,
        prompt: Prompt,
        logprobs: Logprobs,
    ) -> Result<Plan, ApiError> {
        let d = server.defaults;
        let n = self.n.unwrap_or(1);
        if !(1..=MAX_N).contains(&n) {
            return Err(ApiError::bad(
                format!("n = {n} is out of range: ask for 1 to {MAX_N} answers"),
                Some("n"),
            ));
        }
        let (max, param) = match (self.max_completion_tokens, self.max_tokens) {
            (Some(m), _) => (Some(m), "max_completion_tokens"),
            (None, m) => (m, "max_tokens"),
        };
        let max_tokens = match max {
            // Until the model stops or its context (the KV pool) is full, as llama-server.
            None | Some(-1) => usize::MAX,
            Some(m) if m < 1 => {
                return Err(ApiError::bad(
                    format!("{param} must be at least 1 (or -1: until the context is full)"),
                    Some(param),
                ))
            }
            Some(m) if m as u64 > server.context as u64 => {
                return Err(ApiError::bad(
                    format!(
                        "{param} = {m} is more than the model's context of {} tokens",
                        server.context
                    ),
                    Some(param),
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
        let repeat = match (self.repeat_penalty, self.repetition_penalty) {
            (Some(a), Some(b)) if a != b => {
                return Err(ApiError::bad(
                    "repeat_penalty and repetition_penalty name one penalty: give one value",
                    Some("repetition_penalty"),
                ))
            }
            (a, b) => a.or(b).unwrap_or(d.repeat_penalty),
        };
        let last_n = match self.repeat_last_n {
            None => d.repeat_last_n,
            Some(-1) => server.context,
            Some(n) if n < 0 => {
                return Err(ApiError::bad(
                    "repeat_last_n must be 0 (off), -1 (the context) or a count of tokens",
                    Some("repeat_last_n"),
                ))
            }
            Some(n) => n as usize,
        };
        let top_logprobs = match logprobs {
            Logprobs::Off => None,
            Logprobs::Chat(k) | Logprobs::Completion(k) => Some(k),
        };
        let sampling = SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            // llama-server's: 0 or less keeps every token.
            top_k: self.top_k.map_or(d.top_k, |k| k.max(0) as usize),
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            seed: match self.seed {
                Some(s) if s >= 0 => s as u64,
                _ => random_u64(),
            },
            penalties: Penalties {
                last_n,
                repeat,
                presence: self.presence_penalty.unwrap_or(0.0),
                frequency: self.frequency_penalty.unwrap_or(0.0),
            },
            logprobs: top_logprobs,
        };
        sampling
            .validate()
            .map_err(|e| ApiError::from(ScheduleError::from(e)))?;
        let bias = self.logit_bias.as_ref().map(bias_of).transpose()?;
        let grammar = match &self.response_format {
            None => None,
            Some(f) => match (f.kind.as_str(), &f.json_schema, &f.schema) {
                ("text", None, None) => None,
                ("json_object", None, None) => Some(Grammar::json_object()),
                ("json_object", None, Some(schema)) => Some(compile(schema)?),
                ("json_schema", Some(js), None) => match &js.schema {
                    Some(schema) => Some(compile(schema)?),
                    None => Some(Grammar::json_object()),
                },
                ("json_schema", None, _) => {
                    return Err(ApiError::bad(
                        "response_format of type json_schema needs `json_schema`",
                        Some("response_format"),
                    ))
                }
                (kind, _, _) => {
                    return Err(ApiError::bad(
                        format!(
                            "response_format `{}` is not supported: text, json_object or \
                             json_schema",
                            truncated(kind)
                        ),
                        Some("response_format"),
                    ))
                }
            },
        };
        let partition = if self.cache_prompt == Some(false) {
            // No reuse: a partition of its own.
            random_u64()
        } else {
            server.partition
        };
        Ok(Plan {
            endpoint,
            prompt,
            params: GenerateParams {
                max_tokens,
                sampling,
                stop_at_eos: true,
                keep_logits: false,
            },
            stop,
            n: n as usize,
            bias: bias.unwrap_or_default(),
            grammar: grammar.map(Arc::new),
            salt: cache_partition(partition, self.cache_salt.as_deref()),
            tools: Tools::Off,
            logprobs,
            stream: self.stream,
            include_usage: self
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
            ignored: Vec::new(),
        })
    }
}

fn compile(schema: &Json) -> Result<Grammar, ApiError> {
    Grammar::json_schema(schema).map_err(|e| ApiError::bad(e.to_string(), Some("response_format")))
}

impl ChatBody {
    /// The chat as messages the template renders: text parts joined with newlines (as
    /// llama-server and vLLM join them), tool calls and tool answers kept.
    pub fn messages(&self) -> Result<Vec<ChatMessage>, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::bad(
                "`messages` is empty: give at least one message",
                Some("messages"),
            ));
        }
        let mut out = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.iter().enumerate() {
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut texts = Vec::with_capacity(parts.len());
                    for p in parts {
                        match (&*p.kind, &p.text) {
                            ("text", Some(t)) => texts.push(t.as_str()),
                            (kind, _) => {
                                return Err(ApiError::bad(
                                    format!(
                                        "content parts of type `{}` are not supported: this \
                                         model reads text only",
                                        truncated(kind)
                                    ),
                                    Some(&format!("messages[{i}].content")),
                                ))
                            }
                        }
                    }
                    texts.join("\n")
                }
            };
            let mut message = ChatMessage::new(&m.role, content);
            message.name = m.name.clone();
            message.tool_call_id = m.tool_call_id.clone();
            for (k, call) in m.tool_calls.iter().flatten().enumerate() {
                let arguments = match &call.function.arguments {
                    None => "{}".to_string(),
                    Some(Json::String(s)) => s.clone(),
                    Some(other) => other.compact(),
                };
                message.tool_calls.push(ChatToolCall {
                    id: call.id.clone().unwrap_or_else(|| format!("call_{i}_{k}")),
                    name: call.function.name.clone(),
                    arguments,
                });
            }
            out.push(message);
        }
        Ok(out)
    }

    /// The request as the scheduler runs it.
    pub fn plan(&self, server: &Server<'_>) -> Result<Plan, ApiError> {
        let messages = self.messages()?;
        let logprobs = match (self.logprobs, self.top_logprobs) {
            (Some(true), k) => Logprobs::Chat(k.unwrap_or(0) as usize),
            (_, Some(k)) if k > 0 => {
                return Err(ApiError::bad(
                    "top_logprobs needs logprobs: true",
                    Some("top_logprobs"),
                ))
            }
            _ => Logprobs::Off,
        };
        let tools = self.tools.as_deref().unwrap_or_default();
        let mut defs = Vec::with_capacity(tools.len());
        for (i, t) in tools.iter().enumerate() {
            if t.kind != "function" {
                return Err(ApiError::bad(
                    format!(
                        "tools of type `{}` are not supported: only functions",
                        truncated(&t.kind)
                    ),
                    Some(&format!("tools[{i}].type")),
                ));
            }
            if !valid_tool_name(&t.function.name) {
                return Err(ApiError::bad(
                    "a tool's name is 1 to 64 letters, digits, `_` or `-`",
                    Some(&format!("tools[{i}].function.name")),
                ));
            }
            let mut function = vec![("name".to_string(), Json::String(t.function.name.clone()))];
            if let Some(d) = &t.function.description {
                function.push(("description".into(), Json::String(d.clone())));
            }
            if let Some(p) = &t.function.parameters {
                function.push(("parameters".into(), p.clone()));
            }
            if let Some(s) = t.function.strict {
                function.push(("strict".into(), Json::Bool(s)));
            }
            defs.push(Json::Object(vec![
                ("type".into(), Json::String("function".into())),
                ("function".into(), Json::Object(function)),
            ]));
        }
        let choice =
            match &self.tool_choice {
                None => "auto".to_string(),
                Some(ToolChoice::Mode(m)) if matches!(m.as_str(), "none" | "auto" | "required") => {
                    m.clone()
                }
                Some(ToolChoice::Function { kind, function }) if kind == "function" => {
                    if !tools.iter().any(|t| t.function.name == function.name) {
                        return Err(ApiError::bad(
                            format!(
                                "tool_choice names `{}`, which is not among the tools",
                                truncated(&function.name)
                            ),
                            Some("tool_choice"),
                        ));
                    }
                    format!("function:{}", function.name)
                }
                Some(_) => return Err(ApiError::bad(
                    "tool_choice is \"none\", \"auto\", \"required\" or {\"type\": \"function\", \
                     \"function\": {\"name\": ...}}",
                    Some("tool_choice"),
                )),
            };
        let use_tools = !defs.is_empty() && choice != "none";
        let prompt = if use_tools {
            Prompt::ChatWithTools {
                messages,
                tools: defs,
            }
        } else {
            Prompt::Chat(messages)
        };
        let mut plan = self.common.plan(server, Endpoint::Chat, prompt, logprobs)?;
        if use_tools {
            let format = server.tool_format.ok_or_else(|| {
                ApiError::bad(
                    "this model's chat template does not offer tools (no tool-call format \
                     dynrt reads: Hermes-style <tool_call> blocks)",
                    Some("tools"),
                )
            })?;
            let parallel = self.parallel_tool_calls.unwrap_or(true);
            let names = tools.iter().map(|t| t.function.name.clone()).collect();
            plan.tools = Tools::On {
                format,
                parallel,
                names,
            };
            if choice != "auto" {
                if plan.grammar.is_some() {
                    return Err(ApiError::bad(
                        "response_format and a required tool call both decide the answer's \
                         form: give one",
                        Some("tool_choice"),
                    ));
                }
                let forced: Vec<(String, Json)> = tools
                    .iter()
                    .filter(|t| match choice.strip_prefix("function:") {
                        Some(name) => t.function.name == name,
                        None => true,
                    })
                    .map(|t| {
                        let params = t.function.parameters.clone().unwrap_or(Json::Bool(true));
                        (t.function.name.clone(), params)
                    })
                    .collect();
                let (open, close) = format.call_frame();
                let g = Grammar::tool_call(&forced, open, close)
                    .map_err(|e| ApiError::bad(e.to_string(), Some("tools")))?;
                plan.grammar = Some(Arc::new(g));
            }
        } else if self.tools.is_some() && choice != "none" && tools.is_empty() {
            return Err(ApiError::bad("`tools` is empty", Some("tools")));
        }
        Ok(plan)
    }
}

impl CompletionBody {
    /// The request as the scheduler runs it.
    pub fn plan(&self, server: &Server<'_>) -> Result<Plan, ApiError> {
        let prompt = match &self.prompt {
            PromptField::Text(t) => Prompt::Text(t.clone()),
            PromptField::Texts(t) if t.len() == 1 => Prompt::Text(t[0].clone()),
            PromptField::Texts(_) => {
                return Err(ApiError::bad(
                    "give one prompt per request (a list of several is not supported)",
                    Some("prompt"),
                ))
            }
            PromptField::Ids(ids) => Prompt::Ids(ids.clone()),
        };
        if self.echo == Some(true) {
            return Err(ApiError::bad(
                "echo is not supported: the answer holds the completion only",
                Some("echo"),
            ));
        }
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::bad(
                "suffix (insertion) is not supported",
                Some("suffix"),
            ));
        }
        if let Some(b) = self.best_of {
            if b != self.common.n.unwrap_or(1) {
                return Err(ApiError::bad(
                    "best_of other than n is not supported (no ranking of answers)",
                    Some("best_of"),
                ));
            }
        }
        let logprobs = match self.logprobs {
            None => Logprobs::Off,
            Some(k) if k <= 5 => Logprobs::Completion(k as usize),
            Some(_) => {
                return Err(ApiError::bad("logprobs is at most 5", Some("logprobs")));
            }
        };
        self.common
            .plan(server, Endpoint::Completion, prompt, logprobs)
    }
}

impl Plan {
    /// The scheduler's requests: one per answer, seeds counting up from the request's, each
    /// with its own constraint over `trie`.
    pub fn requests(&self, trie: &Arc<TokenTrie>) -> Vec<Request> {
        (0..self.n)
            .map(|i| {
                let mut params = self.params;
                params.sampling.seed = params.sampling.seed.wrapping_add(i as u64);
                Request {
                    prompt: self.prompt.clone(),
                    params,
                    stop: self.stop.clone(),
                    rules: LogitRules {
                        bias: self.bias.clone(),
                        constraint: self
                            .grammar
                            .as_ref()
                            .map(|g| Constraint::new(g.clone(), trie.clone())),
                    },
                    cache_salt: self.salt,
                }
            })
            .collect()
    }
}

/// OpenAI's `finish_reason`.
pub fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length | FinishReason::ContextFull => "length",
    }
}

/// Token counts of a response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
}

impl Usage {
    /// The `usage` object.
    pub fn json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }
}

/// One token's log-probabilities with their texts: what a response shows.
#[derive(Debug, Clone)]
pub struct ShownLogprob {
    pub text: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
    /// The alternatives: text, bytes, log-probability.
    pub top: Vec<(String, Vec<u8>, f32)>,
}

/// JSON has no infinities: a log-probability of minus infinity is shown as -9999 (OpenAI's
/// floor).
fn finite(lp: f32) -> f32 {
    if lp.is_finite() {
        lp
    } else {
        -9999.0
    }
}

impl ShownLogprob {
    /// The token's and its alternatives' texts from `tokenizer`.
    pub fn new(tokenizer: &Tokenizer, token: u32, lp: &TokenLogprobs) -> ShownLogprob {
        let bytes_of = |t: u32| {
            tokenizer
                .token_bytes(t)
                .map(<[u8]>::to_vec)
                .unwrap_or_default()
        };
        let text_of = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let bytes = bytes_of(token);
        ShownLogprob {
            text: text_of(&bytes),
            bytes,
            logprob: finite(lp.logprob),
            top: (lp.top.iter())
                .map(|&(t, l)| {
                    let b = bytes_of(t);
                    (text_of(&b), b, finite(l))
                })
                .collect(),
        }
    }

    fn chat_json(&self) -> Value {
        json!({
            "token": self.text,
            "logprob": finite(self.logprob),
            "bytes": self.bytes,
            "top_logprobs": self.top.iter().map(|(t, b, l)| json!({
                "token": t, "logprob": finite(*l), "bytes": b,
            })).collect::<Vec<_>>(),
        })
    }
}

/// The `logprobs` object of a choice for `shown` tokens (`null` when not asked for).
pub fn logprobs_json(mode: Logprobs, shown: &[ShownLogprob], text_offset: usize) -> Value {
    match mode {
        Logprobs::Off => Value::Null,
        Logprobs::Chat(_) => json!({
            "content": shown.iter().map(ShownLogprob::chat_json).collect::<Vec<_>>(),
        }),
        Logprobs::Completion(_) => {
            let mut offset = text_offset;
            let mut offsets = Vec::with_capacity(shown.len());
            for s in shown {
                offsets.push(offset);
                offset += s.text.len();
            }
            json!({
                "tokens": shown.iter().map(|s| s.text.clone()).collect::<Vec<_>>(),
                "token_logprobs": shown.iter().map(|s| finite(s.logprob)).collect::<Vec<_>>(),
                "top_logprobs": shown.iter().map(|s| {
                    s.top.iter().map(|(t, _, l)| (t.clone(), json!(finite(*l)))).collect::<serde_json::Map<_, _>>()
                }).collect::<Vec<_>>(),
                "text_offset": offsets,
            })
        }
    }
}

/// One answer of a response, whole.
#[derive(Debug, Clone, Default)]
pub struct Choice {
    pub text: String,
    pub logprobs: Vec<ShownLogprob>,
    pub finish: &'static str,
}

/// A call id nobody else's response shares.
fn call_id() -> String {
    format!("call_{:016x}", random_u64())
}

/// The `tool_calls` entries of `answer`'s calls (with `index` for stream deltas).
fn tool_calls_json(answer: &Answer, parallel: bool, with_index: bool) -> Vec<Value> {
    let calls = if parallel {
        &answer.tool_calls[..]
    } else {
        &answer.tool_calls[..answer.tool_calls.len().min(1)]
    };
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = json!({
                "id": call_id(),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            });
            if with_index {
                v["index"] = json!(i);
            }
            v
        })
        .collect()
}

/// What every response object of one request carries.
#[derive(Debug, Clone)]
pub struct Header {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub tools: Tools,
    pub logprobs: Logprobs,
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

    /// `text` read for tool calls: the answer's text and calls (none without tools).
    pub fn answer(&self, text: &str) -> Answer {
        match &self.tools {
            Tools::Off => Answer {
                content: Some(text.to_string()),
                tool_calls: Vec::new(),
            },
            Tools::On { format, names, .. } => format.parse(text, names),
        }
    }

    /// The whole answer (`stream: false`).
    pub fn response(&self, choices: &[Choice], usage: Usage) -> Value {
        let choices: Vec<Value> = (choices.iter().enumerate())
            .map(|(i, c)| match self.endpoint {
                Endpoint::Chat => {
                    let answer = self.answer(&c.text);
                    let mut message = json!({"role": "assistant", "content": answer.content});
                    let mut finish = c.finish;
                    if let (false, Tools::On { parallel, .. }) =
                        (answer.tool_calls.is_empty(), &self.tools)
                    {
                        message["tool_calls"] = json!(tool_calls_json(&answer, *parallel, false));
                        if finish == "stop" {
                            finish = "tool_calls";
                        }
                    }
                    json!({
                        "index": i,
                        "message": message,
                        "logprobs": logprobs_json(self.logprobs, &c.logprobs, 0),
                        "finish_reason": finish,
                    })
                }
                Endpoint::Completion => json!({
                    "index": i, "text": c.text,
                    "logprobs": logprobs_json(self.logprobs, &c.logprobs, 0),
                    "finish_reason": c.finish,
                }),
            })
            .collect();
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion",
            Endpoint::Completion => "text_completion",
        };
        self.object(json!({"choices": choices, "usage": usage.json()}), object)
    }

    /// One stream chunk of answer `index`: `text` with its tokens' log-probabilities (a
    /// chat's first chunk carries the role), or the end with its finish reason.
    pub fn chunk(
        &self,
        index: usize,
        text: Option<&str>,
        logprobs: &[ShownLogprob],
        text_offset: usize,
        first: bool,
        finish: Option<&str>,
    ) -> Value {
        let lp = match logprobs.is_empty() {
            true => Value::Null,
            false => logprobs_json(self.logprobs, logprobs, text_offset),
        };
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
                        "index": index, "delta": delta, "logprobs": lp, "finish_reason": finish,
                    }]}),
                    "chat.completion.chunk",
                )
            }
            Endpoint::Completion => self.object(
                json!({"choices": [{
                    "index": index, "text": text.unwrap_or(""), "logprobs": lp,
                    "finish_reason": finish,
                }]}),
                "text_completion",
            ),
        }
    }

    /// The chunk of answer `index`'s tool calls, read from its whole `text` at the end
    /// (`None` when it made none); with it the finish reason becomes `tool_calls`.
    pub fn tool_call_chunk(&self, index: usize, text: &str, first: bool) -> Option<Value> {
        let Tools::On { parallel, .. } = self.tools else {
            return None;
        };
        let answer = self.answer(text);
        if answer.tool_calls.is_empty() {
            return None;
        }
        let mut delta = json!({"tool_calls": tool_calls_json(&answer, parallel, true)});
        if first {
            delta["role"] = json!("assistant");
        }
        Some(self.object(
            json!({"choices": [{
                "index": index, "delta": delta, "logprobs": null, "finish_reason": null,
            }]}),
            "chat.completion.chunk",
        ))
    }

    /// The stream's last chunk with the token counts (`stream_options.include_usage`).
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completion => "text_completion",
        };
        self.object(json!({"choices": [], "usage": usage.json()}), object)
    }
}

/// Text held back from a stream so that no piece of a tool call goes out as text: of
/// `pending` (the end of the answer `all` not sent yet), everything while the answer may be
/// a bare call (it starts with `{`), else everything from a call's opening on, or the bytes
/// at the end that may start one.
pub fn held_for_tools(tools: &Tools, all: &str, pending: &str) -> usize {
    match tools {
        Tools::Off => 0,
        Tools::On { format, .. } => {
            // A bare call, maybe in a Markdown fence.
            let start = all.trim_start();
            if start.is_empty() || start.starts_with('{') || start.starts_with('`') {
                return pending.len();
            }
            match pending.find(format.open()) {
                Some(at) => pending.len() - at,
                None => format.held(pending),
            }
        }
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
    let single: [(&str, &str, &str, String); 25] = [
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
            "dynrt_kv_pages_cached",
            "gauge",
            "KV pages in the prompt cache, held by no request (given back when needed).",
            s.pages_cached.to_string(),
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
            "Prompt tokens read from pages a running request computed instead of computed.",
            s.tokens_shared.to_string(),
        ),
        (
            "dynrt_prompt_tokens_cached_total",
            "counter",
            "Prompt tokens read from the prompt cache (pages of requests that ended).",
            s.tokens_cached.to_string(),
        ),
        (
            "dynrt_prefix_index_bytes",
            "gauge",
            "Host bytes of the prefix index of full KV pages.",
            s.prefix_index_bytes.to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn server_with(defaults: &Defaults) -> Server<'_> {
        Server {
            context: 2048,
            partition: 0,
            defaults,
            tool_format: Some(ToolFormat::Hermes),
        }
    }

    fn trie() -> Arc<TokenTrie> {
        Arc::new(TokenTrie::from_tokens(4, |_| None, &[]))
    }

    fn chat(body: Value) -> Result<Plan, ApiError> {
        let bytes = body.to_string().into_bytes();
        check_fields(&bytes, Endpoint::Chat, false)?;
        let b: ChatBody = parse(&bytes)?;
        let d = Defaults::new(Recommended::default());
        b.plan(&server_with(&d))
    }

    fn param(e: ApiError) -> Option<String> {
        e.param
    }

    #[test]
    fn unknown_fields_are_refused_by_name_and_null_ones_pass() {
        let msg = json!([{"role": "user", "content": "hi"}]);
        let e = chat(json!({"messages": msg, "mirostat": 2})).err().unwrap();
        assert_eq!(e.code, Some("unsupported_parameter"));
        assert_eq!(param(e).as_deref(), Some("mirostat"));
        assert!(chat(json!({"messages": msg, "functions": null})).is_ok());
        let e = chat(json!({"messages": [{"role": "user", "content": "hi", "audio": {"id": 1}}]}))
            .err()
            .unwrap();
        assert_eq!(param(e).as_deref(), Some("messages[0].audio"));
        // Echoed names are cut short.
        let long = "x".repeat(100_000);
        let e = chat(json!({"messages": msg, long.clone(): 1}))
            .err()
            .unwrap();
        assert!(e.message.len() < 400, "{}", e.message.len());
        // Lenient: ignored and listed.
        let bytes = json!({"messages": msg, "mirostat": 2})
            .to_string()
            .into_bytes();
        assert_eq!(
            check_fields(&bytes, Endpoint::Chat, true).unwrap(),
            ["mirostat"]
        );
        // Completions fields are not chat fields.
        let e = chat(json!({"messages": msg, "echo": true})).err().unwrap();
        assert_eq!(param(e).as_deref(), Some("echo"));
    }

    #[test]
    fn defaults_are_llama_servers_unless_the_model_recommends_others() {
        let p = chat(json!({"messages": [{"role": "user", "content": "hi"}]})).unwrap();
        let s = p.params.sampling;
        assert_eq!(
            (s.temperature, s.top_k, s.top_p, s.min_p),
            (0.8, 40, 0.95, 0.05)
        );
        assert_eq!(s.penalties, Penalties::default());
        assert_eq!(p.params.max_tokens, usize::MAX);
        assert_eq!((p.n, p.logprobs, &p.tools), (1, Logprobs::Off, &Tools::Off));
        let d = Defaults::new(Recommended {
            temperature: Some(0.6),
            top_k: Some(20),
            ..Recommended::default()
        });
        assert_eq!((d.temperature, d.top_k, d.top_p), (0.6, 20, 0.95));
        // Two requests without a seed get different ones.
        let q = chat(json!({"messages": [{"role": "user", "content": "hi"}]})).unwrap();
        assert_ne!(s.seed, q.params.sampling.seed);
    }

    #[test]
    fn every_field_maps_onto_the_parameters() {
        let p = chat(json!({
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
            "max_completion_tokens": 7, "max_tokens": 9, "temperature": 0, "top_k": -1,
            "top_p": 0.5, "min_p": 0.1, "seed": 3, "stop": ["x"], "n": 2,
            "presence_penalty": 0.5, "frequency_penalty": 0.25, "repetition_penalty": 1.1,
            "repeat_last_n": -1, "logit_bias": {"5": -100}, "logprobs": true,
            "top_logprobs": 3, "cache_salt": "s", "stream": true,
            "stream_options": {"include_usage": true},
            "response_format": {"type": "json_object"},
        }))
        .unwrap();
        let s = p.params.sampling;
        assert_eq!(p.params.max_tokens, 7);
        assert_eq!(
            (s.temperature, s.top_k, s.top_p, s.min_p, s.seed),
            (0.0, 0, 0.5, 0.1, 3)
        );
        assert_eq!(
            s.penalties,
            Penalties {
                last_n: 2048,
                repeat: 1.1,
                presence: 0.5,
                frequency: 0.25
            }
        );
        assert_eq!(s.logprobs, Some(3));
        assert_eq!((p.n, p.stream, p.include_usage), (2, true, true));
        assert_eq!(p.bias, [(5, -100.0)]);
        assert!(p.grammar.is_some());
        assert_eq!(p.salt, cache_partition(0, Some("s")));
        let Prompt::Chat(m) = &p.prompt else {
            panic!("{:?}", p.prompt)
        };
        assert_eq!(m[0].content, "a\nb");
        let reqs = p.requests(&trie());
        assert_eq!(reqs.len(), 2);
        assert_eq!(reqs[1].params.sampling.seed, 4);
        assert!(reqs.iter().all(|r| r.rules.constraint.is_some()));
    }

    #[test]
    fn out_of_range_values_are_refused_with_their_field() {
        let m = json!([{"role": "user", "content": "hi"}]);
        for (extra, field) in [
            (json!({"n": 0}), "n"),
            (json!({"n": 99}), "n"),
            (json!({"max_tokens": 0}), "max_tokens"),
            (
                json!({"max_completion_tokens": 5000}),
                "max_completion_tokens",
            ),
            (json!({"min_p": 2}), "min_p"),
            (json!({"presence_penalty": 3}), "presence_penalty"),
            (
                json!({"repeat_penalty": 1.1, "repetition_penalty": 1.2}),
                "repetition_penalty",
            ),
            (json!({"logit_bias": {"x": 1}}), "logit_bias"),
            (json!({"logit_bias": {"1": 101}}), "logit_bias"),
            (json!({"top_logprobs": 2}), "top_logprobs"),
            (
                json!({"logprobs": true, "top_logprobs": 21}),
                "top_logprobs",
            ),
            (
                json!({"response_format": {"type": "yaml"}}),
                "response_format",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {
                    "name": "x", "schema": {"type": "string", "format": "email"}}}}),
                "response_format",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"tools": [{"type": "code", "function": {"name": "a"}}]}),
                "tools[0].type",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a"}}],
                       "tool_choice": {"type": "function", "function": {"name": "b"}}}),
                "tool_choice",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
                "messages[0].content",
            ),
        ] {
            let mut body = json!({"messages": m});
            if let (Some(b), Value::Object(e)) = (body.as_object_mut(), extra) {
                b.extend(e);
            }
            let e = chat(body.clone())
                .err()
                .unwrap_or_else(|| panic!("accepted {body}"));
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert_eq!(param(e).as_deref(), Some(field), "{body}");
        }
    }

    #[test]
    fn tools_are_offered_through_the_template_and_required_calls_constrained() {
        let tools = json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
        let m = json!([{"role": "user", "content": "weather?"}]);
        let p = chat(json!({"messages": m, "tools": tools})).unwrap();
        assert!(matches!(p.prompt, Prompt::ChatWithTools { .. }));
        assert!(matches!(
            &p.tools,
            Tools::On { format: ToolFormat::Hermes, parallel: true, names } if names[..] == ["get_weather".to_string()]
        ));
        assert!(p.grammar.is_none());
        let p = chat(json!({"messages": m, "tools": tools, "tool_choice": "required"})).unwrap();
        assert!(p.grammar.is_some());
        let p = chat(json!({"messages": m, "tools": tools, "tool_choice": "none"})).unwrap();
        assert!(matches!(p.prompt, Prompt::Chat(_)));
        assert_eq!(p.tools, Tools::Off);
        // History with a call and its answer.
        let p = chat(json!({"messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}], "tools": tools}))
        .unwrap();
        let Prompt::ChatWithTools { messages, .. } = &p.prompt else {
            panic!()
        };
        assert_eq!(messages[1].tool_calls[0].arguments, r#"{"city":"Paris"}"#);
        assert_eq!(messages[2].tool_call_id.as_deref(), Some("c1"));
        // The response reads the calls.
        let header = Header {
            endpoint: Endpoint::Chat,
            id: "x".into(),
            created: 0,
            model: "m".into(),
            tools: p.tools.clone(),
            logprobs: Logprobs::Off,
        };
        let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        let v = header.response(
            &[Choice {
                text: text.into(),
                logprobs: Vec::new(),
                finish: "stop",
            }],
            Usage::default(),
        );
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls");
        assert_eq!(c["message"]["content"], Value::Null);
        assert_eq!(
            c["message"]["tool_calls"][0]["function"]["name"],
            "get_weather"
        );
        assert_eq!(
            c["message"]["tool_calls"][0]["function"]["arguments"],
            r#"{"city":"Oslo"}"#
        );
        assert_eq!(held_for_tools(&p.tools, "It is <tool", "It is <tool"), 5);
        assert_eq!(
            held_for_tools(&p.tools, "a <tool_call>\n{", "a <tool_call>\n{"),
            13
        );
        assert_eq!(held_for_tools(&p.tools, " {\"na", "me\""), 3);
        assert_eq!(held_for_tools(&Tools::Off, "<tool_call>", "<tool_call>"), 0);
    }

    #[test]
    fn completions_refuse_what_they_cannot_do() {
        let d = Defaults::new(Recommended::default());
        let s = server_with(&d);
        let plan = |v: Value| -> Result<Plan, ApiError> {
            let bytes = v.to_string().into_bytes();
            check_fields(&bytes, Endpoint::Completion, false)?;
            parse::<CompletionBody>(&bytes)?.plan(&s)
        };
        let p = plan(json!({"prompt": "a", "logprobs": 2, "best_of": 1})).unwrap();
        assert_eq!(p.logprobs, Logprobs::Completion(2));
        for (body, field) in [
            (json!({"prompt": "a", "echo": true}), "echo"),
            (json!({"prompt": "a", "suffix": "b"}), "suffix"),
            (json!({"prompt": "a", "best_of": 3}), "best_of"),
            (json!({"prompt": "a", "logprobs": 6}), "logprobs"),
            (json!({"prompt": ["a", "b"]}), "prompt"),
            (json!({"prompt": "a", "tools": []}), "tools"),
        ] {
            let e = plan(body.clone()).err().unwrap_or_else(|| panic!("{body}"));
            assert_eq!(param(e).as_deref(), Some(field), "{body}");
        }
    }

    #[test]
    fn logprobs_are_shown_in_each_endpoints_shape() {
        let shown = [ShownLogprob {
            text: "Hi".into(),
            bytes: b"Hi".to_vec(),
            logprob: -0.5,
            top: vec![
                ("Hi".into(), b"Hi".to_vec(), -0.5),
                ("Yo".into(), b"Yo".to_vec(), f32::NEG_INFINITY),
            ],
        }];
        let chat = logprobs_json(Logprobs::Chat(2), &shown, 0);
        assert_eq!(chat["content"][0]["token"], "Hi");
        assert_eq!(chat["content"][0]["bytes"], json!([72, 105]));
        assert_eq!(chat["content"][0]["top_logprobs"][1]["logprob"], -9999.0);
        let legacy = logprobs_json(Logprobs::Completion(2), &shown, 3);
        assert_eq!(legacy["tokens"], json!(["Hi"]));
        assert_eq!(legacy["text_offset"], json!([3]));
        assert_eq!(legacy["top_logprobs"][0]["Yo"], -9999.0);
        assert_eq!(logprobs_json(Logprobs::Off, &shown, 0), Value::Null);
    }
}
