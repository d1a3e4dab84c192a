//! The `rotary` family (`shaders/rotary.wgsl`): rotary position embedding, one invocation per
//! output element, cache rows picked by position ids or by `(batch, sequence)`.

use super::layout::{numel, u32_of};
use super::movement::element_words;
use super::{Encoder, Family, Kernel, KernelError, Operand};
use crate::graph::ops::RotaryEmbedding;
use crate::shape::{DType, Shape};
use bytemuck::{Pod, Zeroable};

/// `shaders/rotary.wgsl` after the prelude.
pub const WGSL: &str = crate::gpu::pipeline::with_prelude!("rotary");

/// The family: entry points and their storage bindings.
pub const FAMILY: Family = Family {
    name: "rotary",
    source: || WGSL,
    bindings: |entry| match entry {
        "rotary_pos" => &[1, 2, 3, 4, 5],
        _ => &[1, 2, 3, 5],
    },
    unchecked: &[],
};

/// `RotaryParams` of `shaders/rotary.wgsl` (64 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct RotaryParams {
    /// Elements.
    pub numel: u32,
    /// Heads.
    pub heads: u32,
    /// Sequence length.
    pub seq: u32,
    /// Features per head.
    pub head_dim: u32,
    /// Rotated features per head.
    pub rotary_dim: u32,
    /// 1: pairs are adjacent features.
    pub interleaved: u32,
    /// 1: x is `[B, S, H * D]`.
    pub packed: u32,
    /// Words per position id (1 or 2).
    pub pos_words: u32,
    /// x word offset.
    pub x_offset: u32,
    /// cos word offset.
    pub cos_offset: u32,
    /// sin word offset.
    pub sin_offset: u32,
    /// Position ids word offset.
    pub pos_offset: u32,
    /// Output word offset.
    pub out_offset: u32,
    /// Rows of the caches.
    pub rows: u32,
    /// Padding.
    pub _pad: [u32; 2],
}

impl Kernel for RotaryEmbedding {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        let floats = output == DType::F32
            && inputs[..3.min(inputs.len())]
                .iter()
                .all(|&d| d == DType::F32);
        let ids = inputs
            .get(3)
            .is_none_or(|&d| matches!(d, DType::I32 | DType::U32 | DType::I64));
        if floats && ids {
            Ok(())
        } else {
            Err("f32 x and caches, i32, u32 or i64 position ids")
        }
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let shapes: Vec<&Shape> = inputs.iter().map(|o| o.shape).collect();
        let d = self.dims(&shapes).map_err(|source| KernelError::Infer {
            op: "rotary_embedding",
            cause: source,
        })?;
        let n = numel("output", out.shape)?;
        let cache = numel("input 1", inputs[1].shape)?;
        let half = d.rotary_dim / 2;
        let (bx, ox) = e.bind("input 0", &inputs[0].tensor, n * 4)?;
        let (bc, oc) = e.bind("input 1", &inputs[1].tensor, (cache * 4).max(4))?;
        let (bs, os) = e.bind("input 2", &inputs[2].tensor, (cache * 4).max(4))?;
        let mut p = RotaryParams {
            numel: u32_of("output", n)?,
            heads: u32_of("input 0", d.heads)?,
            seq: u32_of("input 0", d.seq)?,
            head_dim: u32_of("input 0", d.head_dim)?,
            rotary_dim: u32_of("input 0", d.rotary_dim)?,
            interleaved: u32::from(self.interleaved),
            packed: u32::from(d.packed),
            pos_words: 1,
            x_offset: ox,
            cos_offset: oc,
            sin_offset: os,
            pos_offset: 0,
            out_offset: 0,
            rows: u32_of("input 1", cache.checked_div(half).unwrap_or(0))?,
            _pad: [0; 2],
        };
        match inputs.get(3) {
            Some(pos) => {
                let words = element_words(pos.dtype).unwrap_or(1);
                let (bp, op) = e.bind(
                    "input 3",
                    &pos.tensor,
                    numel("input 3", pos.shape)? * 4 * words,
                )?;
                let (bo, oo) = e.bind("output", &out.tensor, n * 4)?;
                p.pos_words = words as u32;
                p.pos_offset = op;
                p.out_offset = oo;
                e.dispatch(
                    FAMILY.key("rotary_pos"),
                    &p,
                    &[bx, bc, bs, bp, bo],
                    n.div_ceil(256),
                )?;
            }
            None => {
                let (bo, oo) = e.bind("output", &out.tensor, n * 4)?;
                p.out_offset = oo;
                e.dispatch(
                    FAMILY.key("rotary_seq"),
                    &p,
                    &[bx, bc, bs, bo],
                    n.div_ceil(256),
                )?;
            }
        }
        Ok(1)
    }
}
