//! The errors of loading a model and generating text.

use crate::gguf::GgufError;
use crate::gpu::DeviceLost;
use crate::graph::GraphError;
use crate::runtime::RunError;
use crate::tensor::TensorError;
use crate::tokenizer::TokenizerError;

/// Why a model could not be loaded or a generation could not run. After any of them the
/// engine holds no more memory than before the call that failed (a failed load frees what
/// it had uploaded), and a session stays usable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    /// The GGUF is malformed or is not a model of an architecture dynrt runs (one of
    /// [`crate::llm::arch::ARCHITECTURES`]); names the key, tensor or offset.
    #[error("model file: {0}")]
    Gguf(GgufError),
    /// The model's tokenizer could not be built, or a token id is unknown.
    #[error("tokenizer: {0}")]
    Tokenizer(TokenizerError),
    /// A tensor of a type dynrt cannot hold on the device.
    #[error(
        "tensor `{tensor}` has type {ggml_type}, which dynrt cannot run (supported: {})",
        crate::formats::ggml_names()
    )]
    UnsupportedWeight {
        /// The tensor's name.
        tensor: String,
        /// Its GGUF type name.
        ggml_type: &'static str,
    },
    /// The graph could not be built (a bug in the builder, reported rather than a panic).
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// A tensor's bytes could not be referenced.
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// The runtime failed: compiling, allocating (over budget, too large) or running.
    #[error(transparent)]
    Run(#[from] RunError),
    /// The prompt does not fit in the context with what the session already holds.
    #[error(
        "{new_tokens} new tokens after {past_tokens} in the cache exceed the model's context of \
         {context_len} tokens: shorten the prompt or start a new session"
    )]
    ContextFull {
        /// Tokens already in the KV cache.
        past_tokens: usize,
        /// Tokens the call wanted to add.
        new_tokens: usize,
        /// The model's context length.
        context_len: u32,
    },
    /// The prompt encodes to no tokens.
    #[error("the prompt is empty: give at least one token of text")]
    EmptyPrompt,
    /// A generation parameter is out of range.
    #[error("{name} = {value} is invalid: {reason}")]
    BadParameter {
        /// The parameter (`temperature`, `top_p`, ...).
        name: &'static str,
        /// The value given.
        value: String,
        /// What it must be.
        reason: &'static str,
    },
    /// A token id outside the vocabulary was given to the model.
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    UnknownToken {
        /// The id.
        id: u32,
        /// Tokens in the vocabulary.
        vocab_size: u32,
    },
    /// No next token could be chosen: the row of logits came back empty or short, or every
    /// token was excluded (a structured-output constraint that allows none of them).
    #[error("no next token could be chosen: {reason}")]
    NoToken {
        /// Why.
        reason: &'static str,
    },
    /// A batched forward pass failed: every sequence it computed for fails with it.
    #[error("the batched forward pass of {sequences} sequences failed: {reason}")]
    BatchFailed {
        /// Sequences the pass computed rows for.
        sequences: usize,
        /// The error, as the first sequence got it.
        reason: String,
    },
    /// The model file could not be read.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: String,
        /// The operating system's error.
        cause: std::io::Error,
    },
    /// The device is lost: the model, its sessions and batch engines are gone with it (every
    /// later call on them fails with this at once). Create a new [`crate::gpu::Gpu`] and
    /// load the model again ([`LlmError::device_lost`] also finds the loss inside
    /// [`LlmError::Run`]).
    #[error(transparent)]
    DeviceLost(#[from] DeviceLost),
}

impl LlmError {
    /// The loss, when this error is (or carries) [`LlmError::DeviceLost`] or a runtime error
    /// that is [`RunError::DeviceLost`].
    pub fn device_lost(&self) -> Option<&DeviceLost> {
        match self {
            LlmError::DeviceLost(lost) | LlmError::Run(RunError::DeviceLost(lost)) => Some(lost),
            LlmError::Run(RunError::Alloc {
                cause: crate::gpu::AllocError::DeviceLost(lost),
                ..
            }) => Some(lost),
            _ => None,
        }
    }

    /// Whether the device is lost ([`LlmError::device_lost`]).
    pub fn is_device_lost(&self) -> bool {
        self.device_lost().is_some()
    }
}

// The message shows the cause, so it is not also returned as the source: printed as a chain,
// the cause would read twice.
impl From<GgufError> for LlmError {
    fn from(e: GgufError) -> Self {
        LlmError::Gguf(e)
    }
}

impl From<TokenizerError> for LlmError {
    fn from(e: TokenizerError) -> Self {
        LlmError::Tokenizer(e)
    }
}
