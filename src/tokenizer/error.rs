//! The tokenizer's error type.

use crate::gguf::GgufError;

/// Errors of building a tokenizer from GGUF metadata, decoding ids, and rendering a chat
/// template. Encoding text never fails: construction checks everything it relies on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A metadata key is missing or of the wrong type.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// `tokenizer.ggml.model` is neither byte-level BPE (`gpt2`) nor SentencePiece
    /// (`llama`).
    #[error(
        "tokenizer.ggml.model is `{model}`: supported are byte-level BPE (`gpt2`) and \
         SentencePiece (`llama`)"
    )]
    UnsupportedModel {
        /// The value found.
        model: String,
    },
    /// `tokenizer.ggml.pre` names a pre-tokenizer dynrt does not implement.
    #[error(
        "tokenizer.ggml.pre is `{name}`: supported are `gpt2`, `default` and the digit-splitting \
         `smollm`, `starcoder`, `refact`, `codeshell`"
    )]
    UnsupportedPreTokenizer {
        /// The value found.
        name: String,
    },
    /// Two lists that must be as long as each other are not.
    #[error("{what}: {actual} entries, expected {expected}")]
    LengthMismatch {
        /// Which list.
        what: &'static str,
        /// Entries expected (the number of tokens).
        expected: usize,
        /// Entries found.
        actual: usize,
    },
    /// More tokens than 32-bit ids can number, or none.
    #[error("{count} tokens: a vocabulary needs 1 to 2^32 - 1 tokens")]
    BadVocabularySize {
        /// The number of tokens.
        count: usize,
    },
    /// A `tokenizer.ggml.token_type` value outside llama.cpp's 1..=6.
    #[error("token {id} has unknown type {value} (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte)")]
    UnknownTokenType {
        /// The token id.
        id: u32,
        /// The value found.
        value: i32,
    },
    /// A normal token whose text has a character outside GPT-2's byte-to-character table.
    #[error("normal token {id} `{token}` is not byte-level text (character {ch:?})")]
    NotByteLevel {
        /// The token id.
        id: u32,
        /// Its text.
        token: String,
        /// The first character that is not in the table.
        ch: char,
    },
    /// A SentencePiece byte token (type 6) whose text is not `<0xXX>`.
    #[error("byte token {id} `{token}` is not spelled <0xXX>")]
    BadByteToken {
        /// The token id.
        id: u32,
        /// Its text.
        token: String,
    },
    /// A merge rule that is malformed or names tokens outside the vocabulary.
    #[error("merge #{index} `{merge}`: {reason}")]
    BadMerge {
        /// Its rank (position in `tokenizer.ggml.merges`).
        index: usize,
        /// The rule as written.
        merge: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A special token id (BOS, EOS, ...) outside the vocabulary.
    #[error("{key} = {id} is outside the vocabulary of {vocab_size} tokens")]
    SpecialIdOutOfRange {
        /// The metadata key.
        key: &'static str,
        /// The id.
        id: u64,
        /// The number of tokens.
        vocab_size: usize,
    },
    /// An id given to decode that is not in the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    UnknownId {
        /// The id.
        id: u32,
        /// The number of tokens.
        vocab_size: usize,
    },
    /// The model has no `tokenizer.chat_template`.
    #[error("the model has no chat template (tokenizer.chat_template)")]
    NoChatTemplate,
    /// The chat template failed to compile or render (syntax error, `raise_exception`, out of
    /// fuel).
    #[error("chat template: {reason}")]
    Template {
        /// minijinja's message.
        reason: String,
    },
    /// A `tokenizer.json` (WordPiece) that is malformed or asks for what dynrt does not
    /// implement.
    #[error("tokenizer.json: {reason}")]
    Json {
        /// What is wrong, naming the field.
        reason: String,
    },
}
