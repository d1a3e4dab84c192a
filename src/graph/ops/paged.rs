//! A paged KV cache: keys and values of many sequences in one *pool* of fixed-size pages per
//! layer, each sequence holding a page table ([`PagedAttention`] reads through it), and the
//! in-place write of a step's rows into their slots of the pool ([`ScatterRows`]).
//!
//! A pool is `[pages * page_size, kv_heads * head_dim]`: row `p * page_size + i` is position
//! `i` of page `p`. A sequence's position `j` is in its page `pages[seq, j / page_size]` at
//! row `j % page_size`. A growing sequence takes a page when it crosses a page boundary and
//! never moves its old rows; sequences that share a prefix can share its pages.

use super::attention::{attend_row, invalid, matrix};
use super::{DTypeError, InferError, OpDef};
use crate::graph::reference::{RefError, RefTensor, Values};
use crate::shape::{DType, Shape};

/// Causal grouped-query attention of rows from many sequences over a paged KV pool.
///
/// Inputs: q `[S, H * D]` (f32), the pools k and v `[R, KVH * D]` (f32, `R` a multiple of
/// [`PagedAttention::page_size`]), rows `[S, 2]` (i32: for each query row the row of the page
/// table its sequence uses and the row's absolute position `p`), pages `[N, P]` (i32: row `n`
/// lists sequence `n`'s pages in order). Output `[S, H * D]`: query row `s` of head `h` sees
/// positions `0..=p` of its sequence (the last [`PagedAttention::window`] of them when
/// non-zero), each read from its page, as [`super::Attention`] computes it over a contiguous
/// cache. Rows of one step may come from different sequences at different positions: a
/// batch of decode steps and prefill chunks is one dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedAttention {
    /// Query heads `H`.
    pub num_heads: u32,
    /// Key/value heads `KVH` (divides `H`).
    pub num_kv_heads: u32,
    /// Positions a query sees, its own included; 0: all up to its own.
    pub window: u32,
    /// Positions per page.
    pub page_size: u32,
}

impl PagedAttention {
    /// The first position a query at position `p` sees.
    pub fn first_key(&self, p: u64) -> u64 {
        match self.window {
            0 => 0,
            w => (p + 1).saturating_sub(u64::from(w)),
        }
    }
}

/// Rows written in place into a pool: output = input 0 with row `slots[i]` replaced by row
/// `i` of input 1.
///
/// Inputs: pool `[R, W]`, rows `[S, W]` (the pool's type), slots `[S]` (i32, each in
/// `0..R`, no slot twice). Output `[R, W]`. The runtime runs it only as the present of a
/// state whose past is the pool ([`crate::runtime::StateBinding`]): the kernel writes the `S`
/// rows into the state's buffer and nothing else moves. A slot outside the pool is skipped
/// by the kernel and an error in the CPU reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScatterRows;

impl OpDef for PagedAttention {
    fn name(&self) -> &'static str {
        "paged_attention"
    }
    fn arity(&self) -> (usize, usize) {
        (5, 5)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        for (i, &d) in inputs.iter().enumerate().skip(3) {
            if d != DType::I32 {
                return Err(DTypeError::at(i, "i32 (rows, pages)"));
            }
        }
        super::attention::kv_dtypes(inputs)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        let (h, kvh) = (u64::from(self.num_heads), u64::from(self.num_kv_heads));
        if h == 0 || kvh == 0 || h % kvh != 0 || self.page_size == 0 {
            return Err(invalid(
                "paged_attention",
                format!(
                    "{h} query heads must be a positive multiple of {kvh} key/value heads and \
                     the page size ({}) positive",
                    self.page_size
                ),
            ));
        }
        let (s, qw) = matrix(inputs[0], 0, "[S, heads * head_dim] (queries)")?;
        let (r, kw) = matrix(inputs[1], 1, "[R, kv_heads * head_dim] (the key pool)")?;
        if inputs[2] != inputs[1] {
            return Err(InferError::Mismatch {
                what: "the value pool must have the key pool's shape",
                left: inputs[1].clone(),
                right: inputs[2].clone(),
            });
        }
        if qw == 0 || qw % h != 0 || kw != kvh * (qw / h) {
            return Err(InferError::Mismatch {
                what: "paged attention needs q [S, H * D] and pools [R, KVH * D]",
                left: inputs[0].clone(),
                right: inputs[1].clone(),
            });
        }
        if r % u64::from(self.page_size) != 0 {
            return Err(invalid(
                "paged_attention",
                format!(
                    "the pool's {r} rows are not whole pages of {}",
                    self.page_size
                ),
            ));
        }
        if inputs[3].dims() != [s, 2] {
            return Err(InferError::Mismatch {
                what: "paged attention rows must be [S, 2] (page-table row, position)",
                left: inputs[0].clone(),
                right: inputs[3].clone(),
            });
        }
        matrix(
            inputs[4],
            4,
            "[sequences, pages per sequence] (the page table)",
        )?;
        Ok(inputs[0].clone())
    }
    /// Per query row and head: the row's positions looked up in its page table (an entry or
    /// a page outside the pool is an error), then [`super::Attention`]'s reference.
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let q = inputs[0].floats("paged_attention")?;
        let k = inputs[1].floats("paged_attention")?;
        let v = inputs[2].floats("paged_attention")?;
        let rows = inputs[3].ints("paged_attention")?;
        let pages = inputs[4].ints("paged_attention")?;
        let (s, qw) = (out.dims()[0] as usize, out.dims()[1] as usize);
        let (r, kw) = (
            inputs[1].shape.dims()[0] as usize,
            inputs[1].shape.dims()[1] as usize,
        );
        let (n, per_seq) = (
            inputs[4].shape.dims()[0] as usize,
            inputs[4].shape.dims()[1] as usize,
        );
        let page = self.page_size as usize;
        let h = self.num_heads as usize;
        let group = h / self.num_kv_heads as usize;
        let oob = |position: usize, index: i64, bound: usize| RefError::IndexOutOfRange {
            position: position as u64,
            index,
            bound: bound as u64,
        };
        let mut y = vec![0f32; s * qw];
        for row in 0..s {
            let (seq, pos) = (rows[2 * row], rows[2 * row + 1]);
            if seq < 0 || seq as usize >= n {
                return Err(oob(2 * row, seq, n));
            }
            if pos < 0 || pos as usize / page >= per_seq {
                return Err(oob(2 * row + 1, pos, per_seq * page));
            }
            let first = self.first_key(pos as u64) as usize;
            let mut at = Vec::with_capacity(pos as usize + 1 - first);
            for j in first..=pos as usize {
                let entry = seq as usize * per_seq + j / page;
                let p = pages[entry];
                if p < 0 || (p as usize + 1) * page > r {
                    return Err(oob(entry, p, r / page));
                }
                at.push(p as usize * page + j % page);
            }
            let out = row * qw..(row + 1) * qw;
            attend_row(&q[out.clone()], &at, [k, v], kw, [h, group], &mut y[out]);
        }
        Ok(Values::F32(y))
    }
}

impl OpDef for ScatterRows {
    fn name(&self) -> &'static str {
        "scatter_rows"
    }
    fn arity(&self) -> (usize, usize) {
        (3, 3)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        if !matches!(inputs[0], DType::F32 | DType::F16) {
            return Err(DTypeError::at(0, "f32 or f16"));
        }
        if inputs[1] != inputs[0] {
            return Err(DTypeError::at(1, "the pool's type"));
        }
        if inputs[2] != DType::I32 {
            return Err(DTypeError::at(2, "i32 (slots)"));
        }
        Ok(inputs[0])
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        let (_, w) = matrix(inputs[0], 0, "[R, W] (the pool)")?;
        let (s, rw) = matrix(inputs[1], 1, "[S, W] (the rows)")?;
        if rw != w || inputs[2].dims() != [s] {
            return Err(InferError::Mismatch {
                what: "scatter_rows needs rows [S, W] of the pool's width and slots [S]",
                left: inputs[0].clone(),
                right: inputs[1].clone(),
            });
        }
        Ok(inputs[0].clone())
    }
    fn preserves_shape(&self) -> bool {
        true
    }
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let mut y = inputs[0].floats("scatter_rows")?.to_vec();
        let rows = inputs[1].floats("scatter_rows")?;
        let slots = inputs[2].ints("scatter_rows")?;
        let (r, w) = (out.dims()[0] as usize, out.dims()[1] as usize);
        for (i, &slot) in slots.iter().enumerate() {
            if slot < 0 || slot as usize >= r {
                return Err(RefError::IndexOutOfRange {
                    position: i as u64,
                    index: slot,
                    bound: r as u64,
                });
            }
            let at = slot as usize * w;
            y[at..at + w].copy_from_slice(&rows[i * w..][..w]);
        }
        Ok(Values::F32(y))
    }
}

impl crate::graph::GraphBuilder {
    /// Grouped-query attention of `q` over the paged pools `k`, `v` through `rows` and
    /// `pages`; see [`PagedAttention`].
    pub fn paged_attention(
        &mut self,
        label: impl Into<String>,
        [q, k, v, rows, pages]: [crate::graph::NodeId; 5],
        attention: PagedAttention,
    ) -> crate::graph::NodeId {
        self.node(label, attention, &[q, k, v, rows, pages])
    }

    /// `pool` with row `slots[i]` replaced by row `i` of `rows`; see [`ScatterRows`].
    pub fn scatter_rows(
        &mut self,
        label: impl Into<String>,
        pool: crate::graph::NodeId,
        rows: crate::graph::NodeId,
        slots: crate::graph::NodeId,
    ) -> crate::graph::NodeId {
        self.node(label, ScatterRows, &[pool, rows, slots])
    }
}
