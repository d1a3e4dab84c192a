//! Sentence embeddings: a sentence-transformers model (BERT from `model.safetensors`, or an
//! ONNX export of one) run on the runtime, one vector per sentence.
//!
//! * [`config`] reads what a sentence-transformers folder says: `config.json` (the BERT
//!   shape: [`BertConfig`]), `modules.json` (Transformer → Pooling → Normalize),
//!   `1_Pooling/config.json` (CLS, mean or max: [`Pooling`]) and
//!   `sentence_bert_config.json` (the most tokens per sentence): together a [`Pipeline`].
//! * [`graph`] builds BERT as a graph whose batch and sequence dimensions are both symbols
//!   (`batch`, `seq`): word + position + token-type embeddings, layer norm, attention with a
//!   padding mask, GELU (erf), then the pooling and the L2 normalization, which an imported
//!   ONNX encoder gets appended too.
//! * [`SentenceModel`] holds the WordPiece tokenizer ([`crate::tokenizer::WordPiece`]), the
//!   compiled [`crate::runtime::Network`] and one [`crate::runtime::InferRequest`], so the
//!   shape predictor and the memory pool see every call: [`SentenceModel::embed`] sorts the
//!   sentences by length, cuts them into batches of similar lengths ([`plan_batches`]: the
//!   padding stays small) and runs one iteration per batch, each of its own `[batch, seq]`.
//!
//! What sentence-transformers computes, step by step (checked against
//! `scripts/bert_ref.py`, an independent numpy implementation, and against ONNX Runtime for
//! the ONNX exports): the tokenizer's ids truncated to `max_seq_length`, padded to the
//! longest sentence of the batch; attention scores `q·kᵀ / sqrt(head_dim)` plus
//! `(1 - mask) · f32::MIN`; mean pooling `Σ mask·h / max(Σ mask, 1e-9)`, max pooling over
//! `h` where masked tokens are `-1e9`, CLS pooling the first token; normalization
//! `x / max(‖x‖, 1e-12)`.

pub mod config;
pub mod graph;
mod model;
#[cfg(not(target_arch = "wasm32"))]
mod open;

pub use config::{BertConfig, Pipeline, Pooling};
pub use model::{
    bert_inputs, bert_inputs_at, plan_batches, EmbedOptions, Embeddings, Envelope, FolderTexts,
    SentenceModel, ENVELOPE_BATCH, ENVELOPE_SEQ, PAD_FRACTION, PAD_SLACK,
};
#[cfg(not(target_arch = "wasm32"))]
pub use open::{folder_graph, spec_pipeline, OnnxParts};

/// Why a sentence model could not be loaded or run. Every variant names the file or field.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SentenceError {
    /// A configuration file is malformed or asks for what dynrt does not implement.
    #[error("{file}: {reason}")]
    Config {
        /// The file (`config.json`, `modules.json`, ...).
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// The weights file is not a valid safetensors file, or lacks a tensor of the shape the
    /// config asks for.
    #[error(transparent)]
    Weights(#[from] crate::safetensors::SafetensorsError),
    /// The tokenizer could not be read.
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    /// The ONNX file could not be loaded or imported, or has no input or output the
    /// pipeline needs.
    #[error("{0}")]
    Onnx(String),
    /// The graph failed to build.
    #[error(transparent)]
    Graph(#[from] crate::graph::GraphError),
    /// Compiling or running on the device failed.
    #[error(transparent)]
    Run(#[from] crate::runtime::RunError),
    /// A file could not be read.
    #[cfg(not(target_arch = "wasm32"))]
    #[error(transparent)]
    File(#[from] crate::fileio::FileError),
    /// The output read back does not have the expected size.
    #[error("the network returned {got} values for {sentences} sentences of {dim}")]
    Output {
        /// Values read.
        got: usize,
        /// Sentences in the batch.
        sentences: usize,
        /// The embedding width.
        dim: usize,
    },
}
