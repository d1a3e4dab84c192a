//! qwen3: Qwen3 (the dense models: 0.6B to 32B).

use super::Architecture;
use crate::graph::NodeId;
use crate::llm::graph::{Activation, Blocks, RopePairs};
use crate::llm::LlmError;

/// The qwen3 architecture.
pub const QWEN3: Architecture = Architecture {
    name: "qwen3",
    families: "Qwen3",
    sliding_window: None,
    build,
};

/// qwen2's block without the Q/K/V biases and with each head of Q and of K RMS-normalised
/// (`attn_q_norm`, `attn_k_norm`: `head_dim` weights shared by the heads) before RoPE, which
/// rotates halves. Its heads are wider than `embedding_len / head_count`
/// (`qwen3.attention.key_length`, which [`super::ModelConfig`] reads).
fn build(m: &mut Blocks<'_>) -> Result<NodeId, LlmError> {
    let mut x = m.embed()?;
    for l in m.layers() {
        let h = m.norm(x, &l.name("attn_norm"))?;
        let p = m.qkv(&l, h)?;
        let p = m.head_norms(&l, p)?;
        let p = m.rope(&l, p, RopePairs::Halves)?;
        let a = m.attend(&l, p);
        let o = m.attn_output(&l, a)?;
        x = m.add(l.name("attn_res"), x, o);
        let h = m.norm(x, &l.name("ffn_norm"))?;
        let f = m.ffn(&l, h, Activation::Silu)?;
        x = m.add(l.name("ffn_res"), x, f);
    }
    m.head(x)
}
