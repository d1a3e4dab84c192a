//! qwen2: Qwen2 and Qwen2.5 (base, Instruct, Coder).
//!
//! llama's block with two differences: the Q, K and V projections add biases
//! (`blk.N.attn_{q,k,v}.bias`), and RoPE rotates halves of each head (`x[i]` with
//! `x[i + d/2]`, llama.cpp's NEOX mode: the converter keeps the Hugging Face row order).
//! Small models tie the head to the embedding, larger ones ship `output.weight`; both load.

use super::{Architecture, FfnActivation};

/// The qwen2 architecture.
pub const QWEN2: Architecture = Architecture {
    name: "qwen2",
    families: "Qwen2, Qwen2.5, Qwen2.5-Coder",
    rope_interleaved: false,
    qkv_bias: true,
    qk_norm: false,
    post_norms: false,
    scale_embedding: false,
    ffn_activation: FfnActivation::Silu,
    sliding_window: None,
};
