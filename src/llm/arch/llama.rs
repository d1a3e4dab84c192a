//! llama: SmolLM2, TinyLlama, Llama 2 and Llama 3.x (3.1's frequency factors come as the
//! `rope_freqs.weight` tensor, which [`super::ModelConfig`] reads), Mistral without sliding
//! windows.

use super::Architecture;
use crate::graph::NodeId;
use crate::llm::graph::{Activation, Blocks, RopePairs};
use crate::llm::LlmError;

/// The llama architecture.
pub const LLAMA: Architecture = Architecture {
    name: "llama",
    families: "SmolLM2, TinyLlama, Llama 2, Llama 3.x",
    sliding_window: None,
    build,
};

/// RMSNorm, Q/K/V projections without biases, RoPE on adjacent pairs (llama.cpp's converter
/// permutes the Hugging Face Q/K rows so that rotated pairs are adjacent), grouped-query
/// attention, the output projection and the residual; RMSNorm, the SwiGLU feed-forward and
/// the residual. The head is `output.weight`, or the embedding when the file has none (tied).
fn build(m: &mut Blocks<'_>) -> Result<NodeId, LlmError> {
    let mut x = m.embed()?;
    for l in m.layers() {
        let h = m.norm(x, &l.name("attn_norm"))?;
        let p = m.qkv(&l, h)?;
        let p = m.rope(&l, p, RopePairs::Adjacent)?;
        let a = m.attend(&l, p);
        let o = m.attn_output(&l, a)?;
        x = m.add(l.name("attn_res"), x, o);
        let h = m.norm(x, &l.name("ffn_norm"))?;
        let f = m.ffn(&l, h, Activation::Silu)?;
        x = m.add(l.name("ffn_res"), x, f);
    }
    m.head(x)
}
