//! gemma3: Gemma 3 (the text decoder: 270M, 1B, and the language model of the larger ones).
//!
//! llama's block with these differences: the embedding rows are multiplied by
//! `sqrt(embedding_len)`; each head of Q and of K is RMS-normalised (`attn_q_norm`,
//! `attn_k_norm`) before RoPE, which rotates halves; the attention output and the
//! feed-forward output are RMS-normalised (`post_attention_norm`, `post_ffw_norm`) before
//! their residual adds; the feed-forward is GeGLU (`down(gelu_tanh(gate(h)) * up(h))`);
//! five of every six layers attend within a sliding window
//! (`gemma3.attention.sliding_window`, 512 for the 270M model) with a RoPE base of 10,000,
//! the sixth globally with `gemma3.rope.freq_base` (1,000,000). The head is tied to the
//! embedding. Norm weights are used as stored (the converter already added Gemma's `1 +`).
//!
//! Not covered: the 27B model scales queries by `1 / sqrt(embedding_len / head_count)`
//! instead of `1 / sqrt(head_dim)` (llama.cpp decides by model size; no metadata key says
//! it), and the vision tower of the multimodal files.

use super::{Architecture, FfnActivation, SlidingWindowLayers};

/// The gemma3 architecture.
pub const GEMMA3: Architecture = Architecture {
    name: "gemma3",
    families: "Gemma 3",
    rope_interleaved: false,
    qkv_bias: false,
    qk_norm: true,
    post_norms: true,
    scale_embedding: true,
    ffn_activation: FfnActivation::GeluTanh,
    sliding_window: Some(SlidingWindowLayers {
        pattern: 6,
        rope_base: 10_000.0,
    }),
};
