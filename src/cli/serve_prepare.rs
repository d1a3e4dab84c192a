//! Tokenizing and chat templating for `dynrt serve`, off the scheduler's thread: a request's
//! prompt becomes token ids in a small pool of blocking threads before it is submitted, so
//! that a large prompt (or many) never stalls the steps of the requests already running.
//!
//! The pool has two lanes: prompts under [`LARGE_PROMPT_BYTES`] take one of
//! [`SMALL_WORKERS`] threads (they cost milliseconds), larger ones take the single large
//! lane, where each client may have one prompt at a time (waiting or being encoded) and at
//! most [`LARGE_WAITING`] wait in all; beyond that a client gets a 429. So clients sending
//! large prompts in a loop delay each other and never a short chat. A prompt whose bytes
//! alone prove it longer than the context ([`Prep::certainly_too_long`]) is refused before
//! any of this.

use super::serve_api::ApiError;
use super::serve_guard::{truncated, Client};
use axum::http::StatusCode;
use dynrt::llm::{chat_roles, encode_prompt, Prompt, ScheduleError};
use dynrt::tokenizer::{ChatMessage, Special, Tokenizer};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::Semaphore;

/// Prompts of at least this many bytes go to the large lane.
pub const LARGE_PROMPT_BYTES: usize = 32 << 10;
/// Threads of the small lane.
pub const SMALL_WORKERS: usize = 2;
/// Large prompts waiting for (or in) the large lane at most, all clients together.
pub const LARGE_WAITING: usize = 4;

/// The pool and the tokenizer it runs.
pub struct Prep {
    tokenizer: Arc<Tokenizer>,
    /// The model's context, tokens.
    context: usize,
    /// The most bytes one token stands for (control tokens included), 0 when some bytes
    /// encode to nothing (then no prompt is refused by its length alone).
    max_token_bytes: usize,
    small: Arc<Semaphore>,
    large: Arc<Semaphore>,
    /// Large prompts per client, waiting or being encoded.
    large_clients: Mutex<HashMap<Client, usize>>,
}

/// Gives a client's large-lane place back when its prompt is done (or its request dropped).
struct LargeTicket<'a> {
    prep: &'a Prep,
    client: Client,
}

impl Drop for LargeTicket<'_> {
    fn drop(&mut self) {
        let mut clients = self
            .prep
            .large_clients
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = clients.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                clients.remove(&self.client);
            }
        }
    }
}

fn busy(message: String) -> ApiError {
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_error",
        message,
        Some("prompt_queue_full"),
    )
}

impl Prep {
    /// A pool for `tokenizer`'s prompts on a model of `context` tokens.
    pub fn new(tokenizer: Tokenizer, context: usize) -> Prep {
        let max_token_bytes = if tokenizer.missing_bytes().is_empty() {
            (0..tokenizer.vocab_size() as u32)
                .filter_map(|id| tokenizer.token_bytes(id).ok().map(<[u8]>::len))
                .max()
                .unwrap_or(0)
        } else {
            0
        };
        Prep {
            tokenizer: Arc::new(tokenizer),
            context,
            max_token_bytes,
            small: Arc::new(Semaphore::new(SMALL_WORKERS)),
            large: Arc::new(Semaphore::new(1)),
            large_clients: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `bytes` of text encode to more tokens than the context whatever they say:
    /// no token stands for more than `max_token_bytes` bytes.
    pub fn certainly_too_long(&self, bytes: usize) -> bool {
        self.max_token_bytes > 0 && bytes > self.context.saturating_mul(self.max_token_bytes)
    }

    /// Runs `job` (of a prompt of `bytes`) on the pool for `client`.
    ///
    /// # Errors
    /// 429 when the large lane is full or the client has a large prompt in it already;
    /// 500 when the job panicked.
    pub async fn run<T: Send + 'static>(
        &self,
        client: Client,
        bytes: usize,
        job: impl FnOnce(&Tokenizer) -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        let tokenizer = self.tokenizer.clone();
        let _ticket;
        let _permit = if bytes < LARGE_PROMPT_BYTES {
            self.small.clone().acquire_owned().await
        } else {
            {
                let mut clients = self.large_clients.lock().unwrap_or_else(|e| e.into_inner());
                let waiting: usize = clients.values().sum();
                if clients.contains_key(&client) {
                    return Err(busy(format!(
                        "this client has a prompt of over {LARGE_PROMPT_BYTES} bytes being read \
                         already: send the next when it is done"
                    )));
                }
                if waiting >= LARGE_WAITING {
                    return Err(busy(format!(
                        "{waiting} prompts of over {LARGE_PROMPT_BYTES} bytes are waiting to \
                         be read already: try again later"
                    )));
                }
                clients.insert(client, 1);
            }
            _ticket = LargeTicket { prep: self, client };
            self.large.clone().acquire_owned().await
        }
        .map_err(|_| ApiError::server("the prompt pool has closed"))?;
        tokio::task::spawn_blocking(move || job(&tokenizer))
            .await
            .map_err(|e| ApiError::server(format!("reading the prompt failed: {e}")))
    }

    /// Refuses a chat whose roles the template does not know (cheap: before the queue and
    /// the pool, so that an invalid request is a 400 whatever the load).
    ///
    /// # Errors
    /// 400 naming the role and the roles known.
    pub fn check(&self, prompt: &Prompt) -> Result<(), ApiError> {
        match prompt {
            Prompt::Chat(messages) | Prompt::ChatWithTools { messages, .. } => {
                check_roles(&self.tokenizer, messages)
            }
            _ => Ok(()),
        }
    }

    /// `prompt` as token ids, in the pool (see the module docs).
    ///
    /// # Errors
    /// 400 `context_length_exceeded` for a prompt longer than the context by its bytes
    /// alone; the errors of [`Prep::run`]; 400 for a chat the template cannot render or a
    /// role it does not know.
    pub async fn encode(&self, client: Client, prompt: Prompt) -> Result<Vec<u32>, ApiError> {
        let bytes = prompt_bytes(&prompt);
        if self.certainly_too_long(bytes) {
            return Err(too_long(bytes, self.context));
        }
        self.run(client, bytes, move |t| {
            encode_prompt(t, &prompt).map_err(|e| ApiError::from(ScheduleError::from(e)))
        })
        .await?
    }
}

/// A 400 for the first message whose role `tokenizer`'s template does not know.
fn check_roles(tokenizer: &Tokenizer, messages: &[ChatMessage]) -> Result<(), ApiError> {
    let roles = chat_roles(tokenizer);
    match messages.iter().find(|m| !roles.contains(&m.role.as_str())) {
        Some(m) => Err(ApiError::bad(
            format!(
                "the role {:?} is not one this model's chat template knows: use one of {}",
                truncated(&m.role, 32),
                roles.join(", ")
            ),
            Some("messages"),
        )),
        None => Ok(()),
    }
}

/// The bytes of text a prompt carries (roles and contents; ids count 4 each).
fn prompt_bytes(prompt: &Prompt) -> usize {
    match prompt {
        Prompt::Text(t) => t.len(),
        // The tools' text only adds to the rendered prompt: left out of this lower bound.
        Prompt::Chat(messages) | Prompt::ChatWithTools { messages, .. } => chat_bytes(messages),
        Prompt::Ids(ids) => ids.len() * 4,
    }
}

fn chat_bytes(messages: &[ChatMessage]) -> usize {
    messages
        .iter()
        .map(|m| m.role.len() + m.content.len())
        .sum()
}

fn too_long(bytes: usize, context: usize) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        format!(
            "the prompt's {bytes} bytes are more tokens than the model's context of {context} \
             tokens: shorten the prompt"
        ),
        Some("context_length_exceeded"),
    )
}

/// `POST /tokenize` (llama-server's shape).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeBody {
    content: String,
    /// Add the model's BOS where it expects one.
    #[serde(default)]
    add_special: bool,
    /// Match control tokens written in the text (otherwise they are text).
    #[serde(default = "yes")]
    parse_special: bool,
    /// Each token with its text.
    #[serde(default)]
    with_pieces: bool,
}

fn yes() -> bool {
    true
}

/// The answer of `/tokenize`.
#[derive(serde::Serialize)]
struct Tokens<T: serde::Serialize> {
    tokens: T,
}

/// Tokens with their text, serialized one by one: `{"id", "piece"}`, the piece as its
/// bytes when it is not whole UTF-8.
struct Pieces<'a> {
    tokenizer: &'a Tokenizer,
    ids: &'a [u32],
}

impl serde::Serialize for Pieces<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        let mut seq = serializer.serialize_seq(Some(self.ids.len()))?;
        for &id in self.ids {
            struct Piece<'b>(u32, &'b [u8]);
            impl serde::Serialize for Piece<'_> {
                fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                    let mut m = s.serialize_map(Some(2))?;
                    m.serialize_entry("id", &self.0)?;
                    match std::str::from_utf8(self.1) {
                        Ok(text) => m.serialize_entry("piece", text)?,
                        Err(_) => m.serialize_entry("piece", self.1)?,
                    }
                    m.end()
                }
            }
            let bytes = self.tokenizer.token_bytes(id).unwrap_or_default();
            seq.serialize_element(&Piece(id, bytes))?;
        }
        seq.end()
    }
}

/// `POST /detokenize`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeBody {
    tokens: Vec<u32>,
}

impl Prep {
    /// `/tokenize`: `{"tokens": [...]}`, with `with_pieces` `[{"id", "piece"}]` (a piece
    /// that is not whole UTF-8 as its bytes).
    ///
    /// # Errors
    /// As [`Prep::run`].
    pub async fn tokenize(&self, client: Client, body: TokenizeBody) -> Result<String, ApiError> {
        let bytes = body.content.len();
        self.run(client, bytes, move |t| {
            let special = if body.parse_special {
                Special::Allow
            } else {
                Special::Plain
            };
            let mut ids = t.encode(&body.content, special);
            if body.add_special {
                ids = t.with_bos(ids);
            }
            // Written straight into the answer's text: a tree of JSON values would take
            // tens of bytes per token.
            let written = if body.with_pieces {
                serde_json::to_string(&Tokens {
                    tokens: Pieces {
                        tokenizer: t,
                        ids: &ids,
                    },
                })
            } else {
                serde_json::to_string(&Tokens { tokens: &ids })
            };
            written.map_err(|e| ApiError::server(format!("writing the tokens: {e}")))
        })
        .await?
    }

    /// `/detokenize`: `{"content": text}`.
    ///
    /// # Errors
    /// 400 for an id outside the vocabulary; as [`Prep::run`].
    pub async fn detokenize(
        &self,
        client: Client,
        body: DetokenizeBody,
    ) -> Result<Value, ApiError> {
        let bytes = body.tokens.len() * 4;
        self.run(client, bytes, move |t| {
            t.decode(&body.tokens)
                .map(|text| json!({ "content": text }))
                .map_err(|e| ApiError::bad(e.to_string(), Some("tokens")))
        })
        .await?
    }

    /// `/apply-template`: `{"prompt": text}`, the chat rendered with the model's template
    /// and the assistant's turn opened.
    ///
    /// # Errors
    /// 400 for a role the template does not know or a template error; as [`Prep::run`].
    pub async fn apply_template(
        &self,
        client: Client,
        messages: Vec<ChatMessage>,
    ) -> Result<Value, ApiError> {
        check_roles(&self.tokenizer, &messages)?;
        let bytes = chat_bytes(&messages);
        self.run(client, bytes, move |t| {
            t.apply_chat_template(&messages, true)
                .map(|prompt| json!({ "prompt": prompt }))
                .map_err(|e| ApiError::bad(e.to_string(), Some("messages")))
        })
        .await?
    }
}
