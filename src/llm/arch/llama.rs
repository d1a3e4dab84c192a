//! llama: SmolLM2, TinyLlama, Llama 2 and Llama 3.x (3.1's frequency factors come as the
//! `rope_freqs.weight` tensor, which [`super::ModelConfig`] reads), Mistral without sliding
//! windows.
//!
//! The block: RMSNorm, Q/K/V projections without biases, RoPE on adjacent pairs (llama.cpp's
//! converter permutes the Hugging Face Q/K rows so that rotated pairs are adjacent), grouped-
//! query attention, the output projection and the residual; RMSNorm, the SwiGLU feed-forward
//! (`down(silu(gate(h)) * up(h))`) and the residual. The head is `output.weight`, or the
//! embedding when the file has none (tied).

use super::{Architecture, FfnActivation};

/// The llama architecture.
pub const LLAMA: Architecture = Architecture {
    name: "llama",
    families: "SmolLM2, TinyLlama, Llama 2, Llama 3.x",
    rope_interleaved: true,
    qkv_bias: false,
    qk_norm: false,
    post_norms: false,
    scale_embedding: false,
    ffn_activation: FfnActivation::Silu,
    sliding_window: None,
};
