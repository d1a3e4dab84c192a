//! Structured output: generation held to a JSON schema, and tool calls.
//!
//! A [`Grammar`] is compiled from a JSON schema ([`Grammar::json_schema`]: a subset of the
//! standard, enough for OpenAI's `response_format` and for tools' parameters), from "any
//! JSON object" ([`Grammar::json_object`]) or from a set of tools ([`Grammar::tool_call`]).
//! It is read as a byte-level pushdown automaton: a state is a set of stacks of frames
//! (objects, arrays, strings, numbers, literals), advanced one byte at a time, so the bytes of
//! a token can be checked without knowing how the tokenizer cut them. A [`TokenTrie`] holds
//! a model's vocabulary as a trie of token bytes; walking it together with the automaton
//! finds every token that may come next while dropping each subtree at the first byte the
//! grammar refuses. A [`Constraint`] is one generation's automaton state: the sampler masks
//! the logits with [`Constraint::mask`] (or checks one token with [`Constraint::allows`])
//! and moves it on with [`Constraint::accept`]. The stop tokens are allowed exactly where
//! the value is complete, so a constrained generation that stops has produced a whole,
//! valid value.
//!
//! [`ToolFormat`] knows how a chat template asks its model to call tools (Hermes-style
//! `<tool_call>` blocks: Qwen2.5) and splits a generated answer into text and calls.
//!
//! Everything here is plain Rust on the host; the masks are applied in the CPU sampler
//! ([`crate::llm::Sampler`]).

mod automaton;
mod json;
mod schema;
mod tools;
mod vocab;

pub use automaton::{MAX_DEPTH, MAX_DIGITS, MAX_WS};
pub use json::Json;
pub use schema::{Grammar, SchemaError, MAX_LITERAL_BYTES, MAX_NODES};
pub use tools::{Answer, ToolCall, ToolFormat};
pub use vocab::{Constraint, Refused, TokenTrie};
