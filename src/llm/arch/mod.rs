//! The model architectures dynrt runs, one file each, and the configuration every one of them
//! is read into.
//!
//! An architecture is a short straight-line builder: its file composes the shared blocks of
//! [`super::graph`] (the embedding, RMSNorm, the Q/K/V projections and what follows them —
//! biases, per-head norms, RoPE —, the attention block over a contiguous or paged KV cache,
//! the feed-forward, the head) in its own order, choosing its own norms and activations.
//! What differs between the models of one architecture (sizes, RoPE bases, window lengths)
//! is data: [`ModelConfig::from_gguf`] reads it from the metadata under the architecture's key
//! prefix (`llama.*`, `qwen2.*`, ...) and checks every tensor the builder reads, before
//! anything goes to a device; a file whose architecture is not in [`ARCHITECTURES`] is refused
//! there, naming it and listing the supported ones.
//!
//! Adding an architecture is one file here (its constant and its builder) plus its line in
//! [`ARCHITECTURES`]; one with a new kind of layer also adds that layer as a block of
//! [`super::graph`] (docs/adding.md).

mod config;
mod gemma3;
mod llama;
mod qwen2;
mod qwen3;

pub use config::{ModelConfig, RopeScaling};

pub use gemma3::GEMMA3;
pub use llama::LLAMA;
pub use qwen2::QWEN2;
pub use qwen3::QWEN3;

use super::graph::Blocks;
use super::LlmError;
use crate::graph::NodeId;

/// A decoder architecture: its name and its forward pass. Everything else (sizes, RoPE
/// base and dims, epsilon, context, window lengths) is in the file's metadata
/// ([`ModelConfig`]).
pub struct Architecture {
    /// The `general.architecture` value, also the prefix of its metadata keys.
    pub name: &'static str,
    /// Model families known to use it, for messages and `dynrt fetch --list`.
    pub families: &'static str,
    /// Layers that attend within a sliding window, when the architecture has them.
    pub sliding_window: Option<SlidingWindowLayers>,
    /// The forward pass: the blocks in order, from the embedding to the head's logits.
    pub(crate) build: fn(&mut Blocks<'_>) -> Result<NodeId, LlmError>,
}

impl std::fmt::Debug for Architecture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Architecture")
            .field("name", &self.name)
            .field("families", &self.families)
            .field("sliding_window", &self.sliding_window)
            .finish()
    }
}

/// Architectures are equal when their names are (a name is one entry of [`ARCHITECTURES`]).
impl PartialEq for Architecture {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

/// Which layers attend within a sliding window and how their RoPE differs. The window's
/// length is metadata (`{arch}.attention.sliding_window`); these are the architecture's
/// rules where its GGUF files carry no key (llama.cpp sets the same per architecture).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlidingWindowLayers {
    /// Layer `l` is global when `l % pattern == pattern - 1`, else local (sliding window),
    /// unless `{arch}.attention.sliding_window_pattern` says otherwise.
    pub pattern: u32,
    /// RoPE base of the local layers, unless `{arch}.rope.freq_base_swa` says otherwise.
    pub rope_base: f32,
}

/// Every architecture dynrt runs.
pub const ARCHITECTURES: &[&Architecture] = &[&LLAMA, &QWEN2, &QWEN3, &GEMMA3];

/// The architecture called `name` in `general.architecture`, if dynrt runs it.
pub fn architecture(name: &str) -> Option<&'static Architecture> {
    ARCHITECTURES.iter().copied().find(|a| a.name == name)
}

/// The supported architectures' names, comma-separated (for error messages).
pub fn architecture_names() -> String {
    ARCHITECTURES
        .iter()
        .map(|a| a.name)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests;
