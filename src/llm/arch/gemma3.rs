//! gemma3: Gemma 3 (the text decoder: 270M, 1B, and the language model of the larger ones).
//!
//! Not covered: the 27B model scales queries by `1 / sqrt(embedding_len / head_count)`
//! instead of `1 / sqrt(head_dim)` (llama.cpp decides by model size; no metadata key says
//! it), and the vision tower of the multimodal files.

use super::{Architecture, SlidingWindowLayers};
use crate::graph::NodeId;
use crate::llm::graph::{Activation, Blocks, RopePairs};
use crate::llm::LlmError;

/// The gemma3 architecture: five of every six layers attend within a sliding window
/// (`gemma3.attention.sliding_window`, 512 for the 270M model) with a RoPE base of 10,000,
/// the sixth globally with `gemma3.rope.freq_base` (1,000,000).
pub const GEMMA3: Architecture = Architecture {
    name: "gemma3",
    families: "Gemma 3",
    sliding_window: Some(SlidingWindowLayers {
        pattern: 6,
        rope_base: 10_000.0,
    }),
    build,
};

/// llama's block with these differences: the embedding rows are multiplied by
/// `sqrt(embedding_len)`; each head of Q and of K is RMS-normalised (`attn_q_norm`,
/// `attn_k_norm`) before RoPE, which rotates halves; the attention output and the
/// feed-forward output are RMS-normalised (`post_attention_norm`, `post_ffw_norm`) before
/// their residual adds; the feed-forward is GeGLU (`down(gelu_tanh(gate(h)) * up(h))`). The
/// head is tied to the embedding. Norm weights are used as stored (the converter already
/// added Gemma's `1 +`).
fn build(m: &mut Blocks<'_>) -> Result<NodeId, LlmError> {
    let x = m.embed()?;
    let scale = f64::from(m.config().embedding_len).sqrt() as f32;
    let mut x = m.scale("embed", x, scale);
    for l in m.layers() {
        let h = m.norm(x, &l.name("attn_norm"))?;
        let p = m.qkv(&l, h)?;
        let p = m.head_norms(&l, p)?;
        let p = m.rope(&l, p, RopePairs::Halves)?;
        let a = m.attend(&l, p);
        let o = m.attn_output(&l, a)?;
        let o = m.norm(o, &l.name("post_attention_norm"))?;
        x = m.add(l.name("attn_res"), x, o);
        let h = m.norm(x, &l.name("ffn_norm"))?;
        let f = m.ffn(&l, h, Activation::GeluTanh)?;
        let f = m.norm(f, &l.name("post_ffw_norm"))?;
        x = m.add(l.name("ffn_res"), x, f);
    }
    m.head(x)
}
