//! The model architectures dynrt runs, one file each, and the configuration every one of them
//! is read into.
//!
//! An architecture is data: an [`Architecture`] names its `general.architecture` value and
//! says how its decoder block differs from llama's (how RoPE pairs the elements of a head,
//! whether the Q/K/V projections carry biases, Q/K norms, post-norms, the embedding scale,
//! the feed-forward's activation, sliding-window layers). [`ModelConfig::from_gguf`] reads the
//! hyper-parameters from the metadata under the architecture's key prefix (`llama.*`,
//! `qwen2.*`, `gemma3.*`) and checks every tensor the forward pass will read, before anything goes to a
//! device; a file whose architecture is not in [`ARCHITECTURES`] is refused there, naming it
//! and listing the supported ones. [`super::graph`] builds the forward pass from the config.
//!
//! Adding an architecture whose block is llama's with other switches is one file here (its
//! constant) plus its line in [`ARCHITECTURES`]; one with a new kind of layer also adds the
//! switch and its branch in the graph builder (docs/adding.md).

mod config;
mod gemma3;
mod llama;
mod qwen2;

pub use config::{ModelConfig, RopeScaling};

pub use gemma3::GEMMA3;
pub use llama::LLAMA;
pub use qwen2::QWEN2;

/// How an architecture's decoder block differs from llama's. Everything else (sizes, RoPE
/// base and dims, epsilon, context) is in the file's metadata ([`ModelConfig`]).
#[derive(Debug, PartialEq)]
pub struct Architecture {
    /// The `general.architecture` value, also the prefix of its metadata keys.
    pub name: &'static str,
    /// Model families known to use it, for messages and `dynrt fetch --list`.
    pub families: &'static str,
    /// RoPE rotates adjacent pairs `(x[2i], x[2i+1])` (llama: the converter permutes the Q/K
    /// rows for it) instead of halves `(x[i], x[i + d/2])`.
    pub rope_interleaved: bool,
    /// The Q, K and V projections add a bias (`blk.N.attn_{q,k,v}.bias`).
    pub qkv_bias: bool,
    /// Each head of Q and of K is RMS-normalised before RoPE (`blk.N.attn_{q,k}_norm`,
    /// `head_dim` weights shared by the heads).
    pub qk_norm: bool,
    /// The attention and feed-forward outputs are RMS-normalised before their residual adds
    /// (`blk.N.post_attention_norm`, `blk.N.post_ffw_norm`).
    pub post_norms: bool,
    /// The embedding rows are multiplied by `sqrt(embedding_len)`.
    pub scale_embedding: bool,
    /// The feed-forward's gate activation: `down(act(gate(h)) * up(h))`.
    pub ffn_activation: FfnActivation,
    /// Layers that attend within a sliding window, when the architecture has them.
    pub sliding_window: Option<SlidingWindowLayers>,
}

/// The activation of a gated feed-forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnActivation {
    /// SiLU: SwiGLU (llama, qwen2).
    Silu,
    /// GELU, tanh approximation: GeGLU (gemma).
    GeluTanh,
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
pub const ARCHITECTURES: &[&Architecture] = &[&LLAMA, &QWEN2, &GEMMA3];

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
