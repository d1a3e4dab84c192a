//! The `attention` family (`shaders/attention.wgsl`): rotary position embedding on adjacent
//! pairs ([`Rope`]) and causal grouped-query attention with an online softmax
//! ([`Attention`], sliding windows included), one kernel for prefill and decode. A
//! workgroup takes one query row, one head and up to [`HEAD_CHUNK`] of its output dims.

use super::layout::{numel, u32_of};
use super::{f32_only, Encoder, Family, Kernel, KernelError, Operand};
use crate::graph::ops::{Attention, Rope};
use crate::shape::DType;
use bytemuck::{Pod, Zeroable};

/// `shaders/attention.wgsl` after the prelude.
pub const WGSL: &str = crate::gpu::pipeline::with_prelude!("attention");

/// The family: entry points and their storage bindings.
pub const FAMILY: Family = Family {
    name: "attention",
    source: || WGSL,
    bindings: |_| &[1, 2, 3, 4],
    unchecked: &[],
};

/// Largest head the attention kernel takes (`MAX_D` of the WGSL: the query of a workgroup
/// is shared in workgroup memory).
pub const MAX_HEAD_DIM: u64 = 512;

/// Output dims of a head one workgroup accumulates in registers (`CHUNK` of the WGSL): a
/// head takes `ceil(head_dim / CHUNK)` workgroups per query row.
pub const HEAD_CHUNK: u64 = 128;

/// `RopeParams` of `shaders/attention.wgsl` (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct RopeParams {
    /// Rows of x (tokens).
    pub rows: u32,
    /// Row length (heads * head_dim).
    pub width: u32,
    /// Elements per head.
    pub head_dim: u32,
    /// Elements of each head that are rotated (the table's row length).
    pub rope_dim: u32,
    /// Rows of the table (both levels).
    pub table_rows: u32,
    /// x element offset.
    pub x_offset: u32,
    /// Positions element offset.
    pub pos_offset: u32,
    /// Table element offset.
    pub table_offset: u32,
    /// Output element offset.
    pub out_offset: u32,
    /// Rows of the table's first level.
    pub block: u32,
    /// 1: adjacent pairs, 0: halves.
    pub interleaved: u32,
    /// Padding.
    pub _pad: u32,
}

/// `GqaParams` of `shaders/attention.wgsl` (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct GqaParams {
    /// Query rows S.
    pub s: u32,
    /// Key rows T (past + S).
    pub t: u32,
    /// Query heads.
    pub heads: u32,
    /// Key/value heads.
    pub kv_heads: u32,
    /// Elements per head.
    pub head_dim: u32,
    /// q element offset.
    pub q_offset: u32,
    /// k element offset.
    pub k_offset: u32,
    /// v element offset.
    pub v_offset: u32,
    /// Output element offset.
    pub out_offset: u32,
    /// `1 / sqrt(head_dim)`.
    pub scale: f32,
    /// Keys a query sees (sliding window), 0 for all.
    pub window: u32,
    /// Padding.
    pub _pad: u32,
}

impl Kernel for Rope {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        if inputs == [DType::F32, DType::I32, DType::F32] && output == DType::F32 {
            Ok(())
        } else {
            Err("f32 x, i32 positions, an f32 table")
        }
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let n = numel("output", out.shape)?;
        let (rows, width) = (out.shape.dims()[0], out.shape.dims()[1]);
        let table = &inputs[2];
        let (table_rows, rope_dim) = (table.shape.dims()[0], table.shape.dims()[1]);
        let (bx, ox) = e.bind("input 0", &inputs[0].tensor, n * 4)?;
        let (bp, op) = e.bind("positions", &inputs[1].tensor, rows * 4)?;
        let (bt, ot) = e.bind("table", &table.tensor, numel("table", table.shape)? * 4)?;
        let (bo, oo) = e.bind("output", &out.tensor, n * 4)?;
        let p = RopeParams {
            rows: u32_of("output", rows)?,
            width: u32_of("output", width)?,
            head_dim: self.head_dim,
            rope_dim: u32_of("table", rope_dim)?,
            table_rows: u32_of("table", table_rows)?,
            x_offset: ox,
            pos_offset: op,
            table_offset: ot,
            out_offset: oo,
            block: self.block,
            interleaved: u32::from(self.interleaved),
            _pad: 0,
        };
        e.dispatch(
            FAMILY.key("attention_rope"),
            &p,
            &[bx, bp, bt, bo],
            (n / 2).div_ceil(256),
        )?;
        Ok(1)
    }
}

impl Kernel for Attention {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        f32_only(inputs, output)
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let (q, k, v) = (&inputs[0], &inputs[1], &inputs[2]);
        let (s, qw) = (q.shape.dims()[0], q.shape.dims()[1]);
        let t = k.shape.dims()[0];
        let head_dim = qw / u64::from(self.num_heads);
        if head_dim > MAX_HEAD_DIM {
            return Err(KernelError::Unsupported {
                op: "attention",
                reason: format!(
                    "head_dim {head_dim} is above the kernel's limit of {MAX_HEAD_DIM} (the \
                     query it shares in workgroup memory)"
                ),
            });
        }
        let (bq, oq) = e.bind("queries", &q.tensor, numel("queries", q.shape)? * 4)?;
        let (bk, ok) = e.bind("keys", &k.tensor, numel("keys", k.shape)? * 4)?;
        let (bv, ov) = e.bind("values", &v.tensor, numel("values", v.shape)? * 4)?;
        let (bo, oo) = e.bind("output", &out.tensor, numel("output", out.shape)? * 4)?;
        let p = GqaParams {
            s: u32_of("queries", s)?,
            t: u32_of("keys", t)?,
            heads: self.num_heads,
            kv_heads: self.num_kv_heads,
            head_dim: head_dim as u32,
            q_offset: oq,
            k_offset: ok,
            v_offset: ov,
            out_offset: oo,
            scale: (1.0 / (head_dim as f64).sqrt()) as f32,
            window: self.window,
            _pad: 0,
        };
        // vec4 loads where head and offsets allow (the usual case: arena offsets are
        // aligned, heads are multiples of 4).
        let vec4 = head_dim % 4 == 0 && [oq, ok, ov].iter().all(|o| o % 4 == 0);
        let entry = if vec4 {
            "attention_gqa4"
        } else {
            "attention_gqa"
        };
        e.dispatch(
            FAMILY.key(entry),
            &p,
            &[bq, bk, bv, bo],
            s * u64::from(self.num_heads) * head_dim.div_ceil(HEAD_CHUNK),
        )?;
        Ok(1)
    }
}
