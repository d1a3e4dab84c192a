//! qwen2: Qwen2 and Qwen2.5 (base, Instruct, Coder). Small models tie the head to the
//! embedding, larger ones ship `output.weight`; both load.

use super::Architecture;
use crate::graph::NodeId;
use crate::llm::graph::{Activation, Blocks, RopePairs};
use crate::llm::LlmError;

/// The qwen2 architecture.
pub const QWEN2: Architecture = Architecture {
    name: "qwen2",
    families: "Qwen2, Qwen2.5, Qwen2.5-Coder",
    sliding_window: None,
    build,
};

/// llama's block with two differences: the Q, K and V projections add biases
/// (`blk.N.attn_{q,k,v}.bias`), and RoPE rotates halves of each head (`x[i]` with
/// `x[i + d/2]`, llama.cpp's NEOX mode: the converter keeps the Hugging Face row order).
fn build(m: &mut Blocks<'_>) -> Result<NodeId, LlmError> {
    let mut x = m.embed()?;
    for l in m.layers() {
        let h = m.norm(x, &l.name("attn_norm"))?;
        let p = m.qkv(&l, h)?;
        let p = m.qkv_bias(&l, p)?;
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
