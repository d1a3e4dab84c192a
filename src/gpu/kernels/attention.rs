//! The `attention` family (`shaders/attention.wgsl`): rotary position embedding on adjacent
//! pairs ([`Rope`]) and causal grouped-query attention with an online softmax
//! ([`Attention`], sliding windows included), one kernel for prefill and decode. A
//! workgroup takes one query row, one head and up to [`HEAD_CHUNK`] of its output dims, and
//! all the keys the row sees (one dispatch) or, when that leaves the adapter short of work
//! ([`attention_splits`]), one chunk of them: then each writes a partial softmax to the
//! kernel workspace and a second dispatch (`attention_combine`) merges them (flash-decoding).

use super::layout::{numel, u32_of};
use super::{Encoder, Family, Kernel, KernelError, Operand};
use crate::gpu::QuantLayout;
use crate::graph::ops::{Attention, PagedAttention, Rope, ScatterRows};
use crate::shape::DType;
use bytemuck::{Pod, Zeroable};

/// `shaders/attention.wgsl` after the prelude.
pub const WGSL: &str = crate::gpu::pipeline::with_prelude!("attention");

/// The family: entry points and their storage bindings.
pub const FAMILY: Family = Family {
    name: "attention",
    source: || WGSL,
    bindings: |entry| match entry {
        "attention_combine" => &[1, 4],
        "attention_scatter" => &[1, 2, 4],
        "attention_rope" => &[1, 2, 3, 4],
        _ => &[1, 2, 3, 4, 5, 6],
    },
    unchecked: &[],
};

/// `shaders/gqa.wgsl` after the prelude.
pub const GQA_WGSL: &str = crate::gpu::pipeline::with_prelude!("gqa");

/// The grouped-query kernel for hardware GPUs with subgroup operations
/// (`shaders/gqa.wgsl`, a module of its own: it calls subgroup operations): one workgroup per
/// (query row, KV head, key chunk) serving every query head of the group.
pub const FAMILY_GQA: Family = Family {
    name: "gqa",
    source: || GQA_WGSL,
    bindings: |_| &[1, 2, 3, 4, 5, 6],
    unchecked: &[],
};

/// Most query heads per KV head `gqa_grouped` serves (`MAX_GROUP` of `shaders/gqa.wgsl`).
pub const MAX_GROUP: u64 = 8;

/// Most pairs of a head's elements one lane of `gqa_grouped` holds (`MAX_UPL`).
const MAX_UPL: u64 = 8;

/// Pairs of partial sums `gqa_grouped` merges in workgroup memory (`MERGE_PAIRS`): its
/// subgroups times half a head.
const MERGE_PAIRS: u64 = 1024;

/// The `(GROUP, UPL)` constants of `gqa_grouped` for `heads` query heads over `kv_heads` of
/// `head_dim` elements on subgroups of `subgroup` invocations at least, `None` where the
/// kernel does not take the shape (an odd head, a group above [`MAX_GROUP`], a head too
/// long for its registers or its workgroup memory): the other kernels do.
pub fn grouped_constants(
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
    subgroup: u32,
) -> Option<(u32, u32)> {
    // Half the smallest subgroup: a device may run fewer lanes than it reports (lavapipe's
    // widest vectors run 16 of a reported 32).
    let lanes = u64::from((subgroup / 2).clamp(1, 64));
    let group = heads.checked_div(kv_heads)?;
    let pairs = head_dim / 2;
    let upl = pairs.div_ceil(lanes);
    let fits = head_dim % 2 == 0
        && head_dim > 0
        && (1..=MAX_GROUP).contains(&group)
        && upl <= MAX_UPL
        && (64 / lanes) * pairs <= MERGE_PAIRS;
    fits.then_some((group as u32, upl as u32))
}

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

/// Fewest keys a chunk of split-key attention takes: below this the partial records and the
/// second dispatch cost more than the parallel work gains.
pub const MIN_SPLIT_KEYS: u64 = 128;

/// How many chunks split-key attention cuts the keys of each (query row, head) into, for
/// `items` workgroups of the one-pass kernel (rows x heads x chunks of output dims), rows
/// that see at most `span` keys, and an adapter that wants `target` workgroups per dispatch
/// ([`crate::gpu::kernels::Kernels::attention_workgroups`]): 1 (the one-pass kernel) when
/// `items` already fill it, else enough chunks to, each of at least [`MIN_SPLIT_KEYS`] keys.
/// Returns the chunks and the keys per chunk.
pub fn attention_splits(items: u64, span: u64, target: u64) -> (u64, u64) {
    let splits = if items == 0 || items >= target {
        1
    } else {
        target.div_ceil(items).min(span / MIN_SPLIT_KEYS).max(1)
    };
    let chunk_keys = span.div_ceil(splits).max(1);
    (span.div_ceil(chunk_keys).max(1), chunk_keys)
}

/// Workgroups an attention dispatch should have before it splits keys, on an adapter the
/// quantized kernels lay their work out for as `layout`: a hardware GPU runs hundreds of
/// workgroups at once; a software adapter runs one per thread at a time, so more than one
/// per thread only adds the partial records and the second dispatch (measured on lavapipe:
/// splitting SmolLM2's decode workgroups into chunks of keys made a layer slower, not
/// faster).
pub fn workgroups_for(layout: QuantLayout) -> u64 {
    match layout {
        QuantLayout::Cpu { threads } => u64::from(threads),
        QuantLayout::Gpu { .. } => GPU_WORKGROUPS,
    }
}

/// [`workgroups_for`] on hardware GPUs.
const GPU_WORKGROUPS: u64 = 512;

/// Invocations per workgroup of `attention_gqa(4)` (the `WG` override) on an adapter laid
/// out as `layout`: 64 on hardware GPUs, which need them to hide load latency; 16 on software
/// adapters, where a workgroup runs on one thread anyway and merging 64 partial softmaxes
/// through workgroup memory and barriers is about half the cost of a short context's
/// attention there (`dynrt-bench generate --profile` shows it). 8 (one SIMD group) is about
/// as fast but gives wrong sums on lavapipe for the scalar entry point with a head of 256 over
/// 1500 keys, which 16 and 64 do not: not understood, so not used.
pub fn workgroup_size(layout: QuantLayout) -> u32 {
    match layout {
        QuantLayout::Cpu { .. } => 16,
        QuantLayout::Gpu { .. } => 64,
    }
}

/// `GqaParams` of `shaders/attention.wgsl` (80 bytes).
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
    /// Chunks the keys of a row are cut into (1: one pass, no workspace).
    pub splits: u32,
    /// Keys per chunk (from the row's first key).
    pub chunk_keys: u32,
    /// Paged: element offset of the rows input (page-table row, position per query row).
    pub rows_offset: u32,
    /// Paged: element offset of the page table.
    pub pages_offset: u32,
    /// Paged: positions per page.
    pub page_size: u32,
    /// Paged: entries per page-table row.
    pub pages_per_seq: u32,
    /// Paged: rows of the page table.
    pub seqs: u32,
    /// Padding.
    pub _pad: [u32; 2],
}

/// `ScatterParams` of `shaders/attention.wgsl` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct ScatterParams {
    /// Rows written.
    pub rows: u32,
    /// Elements per row.
    pub width: u32,
    /// Rows of the pool.
    pub pool_rows: u32,
    /// Element offset of the rows.
    pub src_offset: u32,
    /// Element offset of the slots.
    pub slot_offset: u32,
    /// Element offset of the pool.
    pub dst_offset: u32,
    /// Padding.
    pub _pad: [u32; 2],
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

/// Whether keys and values are both f32 or both f16 (a KV cache stored as f16).
fn kv_types_ok(k: DType, v: DType) -> bool {
    k == v && matches!(k, DType::F32 | DType::F16)
}

impl Kernel for Attention {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        if inputs.len() == 3
            && inputs[0] == DType::F32
            && kv_types_ok(inputs[1], inputs[2])
            && output == DType::F32
        {
            Ok(())
        } else {
            Err("f32 queries and output, keys and values both f32 or both f16")
        }
    }

    /// One dispatch, or two when [`attention_splits`] cuts the keys into chunks: the
    /// partial softmaxes into the workspace, then `attention_combine` into the output.
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let (q, k, v) = (&inputs[0], &inputs[1], &inputs[2]);
        let t = k.shape.dims()[0];
        let span = match self.window {
            0 => t,
            w => t.min(u64::from(w)),
        };
        let gqa = Gqa {
            heads: self.num_heads,
            kv_heads: self.num_kv_heads,
            window: self.window,
            span,
        };
        let (mut p, [bq, bk, bv, bo], items) = gqa.bind(e, [q, k, v], out)?;
        p.t = u32_of("keys", t)?;
        let (pad5, pad6) = (e.unused(), e.unused());
        let (key, items) = gqa.plan(e, &mut p, items, k.dtype == DType::F16, false)?;
        gqa.dispatch(e, key, &p, [bq, bk, bv, bo, pad5, pad6], items)
    }
}

/// What the contiguous and the paged attention kernels share: heads, window and the span
/// of keys the longest row sees (which sets how keys are split).
struct Gqa {
    heads: u32,
    kv_heads: u32,
    window: u32,
    span: u64,
}

impl Gqa {
    /// Binds q, k, v and the output and fills the parameters they set (`t` and the paged
    /// fields left 0). Returns the parameters, the four bindings and the workgroups of one
    /// pass.
    fn bind<'t>(
        &self,
        e: &mut Encoder<'_, '_>,
        [q, k, v]: [&Operand<'t>; 3],
        out: &Operand<'t>,
    ) -> Result<(GqaParams, [super::Bound<'t>; 4], u64), KernelError> {
        let (s, qw) = (q.shape.dims()[0], q.shape.dims()[1]);
        let head_dim = qw / u64::from(self.heads);
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
        // Keys and values as words (f16 two to a word): offsets in their elements.
        let kv_bytes = |o: &Operand<'_>, what| -> Result<u64, KernelError> {
            let elem = if o.dtype == DType::F16 { 2 } else { 4 };
            Ok((numel(what, o.shape)? * elem).div_ceil(4) * 4)
        };
        let per_word = |o: &Operand<'_>| if o.dtype == DType::F16 { 2 } else { 1 };
        let (bk, ok) = e.bind("keys", &k.tensor, kv_bytes(k, "keys")?)?;
        let (bv, ov) = e.bind("values", &v.tensor, kv_bytes(v, "values")?)?;
        let (ok, ov) = (ok * per_word(k), ov * per_word(v));
        let (bo, oo) = e.bind("output", &out.tensor, numel("output", out.shape)? * 4)?;
        let items = s * u64::from(self.heads) * head_dim.div_ceil(HEAD_CHUNK);
        let (splits, chunk_keys) =
            attention_splits(items, self.span, e.kernels.attention_workgroups);
        let p = GqaParams {
            s: u32_of("queries", s)?,
            t: 0,
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: head_dim as u32,
            q_offset: oq,
            k_offset: ok,
            v_offset: ov,
            out_offset: oo,
            scale: (1.0 / (head_dim as f64).sqrt()) as f32,
            window: self.window,
            splits: u32_of("key chunks", splits)?,
            chunk_keys: u32_of("keys", chunk_keys)?,
            rows_offset: 0,
            pages_offset: 0,
            page_size: 0,
            pages_per_seq: 0,
            seqs: 0,
            _pad: [0; 2],
        };
        Ok((p, [bq, bk, bv, bo], items))
    }

    /// The pass of `key` over `items` workgroups with `[q, k, v, out, slot 5, slot 6]`: into
    /// the output, or, when the keys are split, the partial softmaxes into the workspace and
    /// `attention_combine` into the output. Returns the dispatches recorded.
    fn dispatch(
        &self,
        e: &mut Encoder<'_, '_>,
        key: super::PipelineKey,
        p: &GqaParams,
        [bq, bk, bv, bo, b5, b6]: [super::Bound<'_>; 6],
        items: u64,
    ) -> Result<usize, KernelError> {
        if p.splits == 1 {
            e.dispatch(key, p, &[bq, bk, bv, bo, b5, b6], items)?;
            return Ok(1);
        }
        // One record of head_dim + 2 floats per (query row, head, split).
        let rows = u64::from(p.s) * u64::from(self.heads);
        let splits = u64::from(p.splits);
        let records = rows * splits * (u64::from(p.head_dim) + 2) * 4;
        let part = e.workspace("output", records)?;
        e.dispatch(key, p, &[bq, bk, bv, part, b5, b6], items * splits)?;
        let part = e.workspace("partial softmaxes", records)?;
        e.dispatch(FAMILY.key("attention_combine"), p, &[part, bo], rows)?;
        Ok(2)
    }

    /// The pipeline of the pass and its workgroups before splitting (`items` for the
    /// per-head kernels): on a hardware GPU with subgroups the grouped kernel where it takes
    /// the shape (the keys then split over its (row, KV head) items: `p.splits` and
    /// `p.chunk_keys` set again); else the per-head kernel with vec4 loads where head and
    /// offsets allow and the keys are f32 (the usual case: arena offsets are aligned, heads
    /// are multiples of 4), in workgroups of the adapter's size ([`workgroup_size`]).
    /// `kv_f16`: keys and values stored as f16; `paged`: through a page table.
    fn plan(
        &self,
        e: &Encoder<'_, '_>,
        p: &mut GqaParams,
        items: u64,
        kv_f16: bool,
        paged: bool,
    ) -> Result<(super::PipelineKey, u64), KernelError> {
        let layout = e.kernels.quant_layout;
        let grouped = match layout {
            QuantLayout::Gpu { subgroup: Some(sg) } => grouped_constants(
                u64::from(self.heads),
                u64::from(self.kv_heads),
                u64::from(p.head_dim),
                sg,
            ),
            _ => None,
        };
        if let Some((group, upl)) = grouped {
            let items = u64::from(p.s) * u64::from(self.kv_heads);
            let (splits, chunk_keys) =
                attention_splits(items, self.span, e.kernels.attention_workgroups);
            p.splits = u32_of("key chunks", splits)?;
            p.chunk_keys = u32_of("keys", chunk_keys)?;
            let key = FAMILY_GQA
                .key("gqa_grouped")
                .with("PAGED", u32::from(paged))
                .with("KV_F16", u32::from(kv_f16))
                .with("GROUP", group)
                .with("UPL", upl);
            return Ok((key, items));
        }
        let vec4 = !kv_f16
            && p.head_dim % 4 == 0
            && [p.q_offset, p.k_offset, p.v_offset]
                .iter()
                .all(|o| o % 4 == 0);
        let key = if vec4 {
            FAMILY.key("attention_gqa4")
        } else {
            FAMILY
                .key("attention_gqa")
                .with("KV_F16", u32::from(kv_f16))
        };
        Ok((
            key.with("WG", workgroup_size(layout))
                .with("PAGED", u32::from(paged)),
            items,
        ))
    }
}

impl Kernel for PagedAttention {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        if inputs.len() == 5
            && inputs[0] == DType::F32
            && kv_types_ok(inputs[1], inputs[2])
            && inputs[3..] == [DType::I32, DType::I32]
            && output == DType::F32
        {
            Ok(())
        } else {
            Err("f32 q, pools both f32 or both f16, i32 rows and pages")
        }
    }

    /// The attention kernel with `PAGED` on: every key is read through the page table. Keys
    /// are split as for the contiguous kernel ([`attention_splits`]) over the most a row may
    /// see (every position of a page-table row, or the window): a row that sees fewer leaves
    /// its last chunks empty. One dispatch, or two with the combine.
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let (rows, pages) = (&inputs[3], &inputs[4]);
        let pages_per_seq = u32_of("pages", pages.shape.dims()[1])?;
        // Every position a page-table row reaches (first key + chunk must not wrap around).
        let most = pages_per_seq.saturating_mul(self.page_size).max(1);
        let span = match self.window {
            0 => u64::from(most),
            w => u64::from(most.min(w)),
        };
        let gqa = Gqa {
            heads: self.num_heads,
            kv_heads: self.num_kv_heads,
            window: self.window,
            span,
        };
        let (mut p, [bq, bk, bv, bo], items) =
            gqa.bind(e, [&inputs[0], &inputs[1], &inputs[2]], out)?;
        let (br, or) = e.bind("rows", &rows.tensor, numel("rows", rows.shape)? * 4)?;
        let (bp, op) = e.bind(
            "pages",
            &pages.tensor,
            numel("pages", pages.shape)?.max(1) * 4,
        )?;
        p.rows_offset = or;
        p.pages_offset = op;
        p.page_size = self.page_size;
        p.seqs = u32_of("pages", pages.shape.dims()[0])?;
        p.pages_per_seq = pages_per_seq;
        let (key, items) = gqa.plan(e, &mut p, items, inputs[1].dtype == DType::F16, true)?;
        if p.splits == 1 {
            p.chunk_keys = most;
        }
        gqa.dispatch(e, key, &p, [bq, bk, bv, bo, br, bp], items)
    }
}

impl Kernel for ScatterRows {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        let pool = output;
        if matches!(pool, DType::F32 | DType::F16) && inputs == [pool, pool, DType::I32] {
            Ok(())
        } else {
            Err("a pool and rows both f32 or both f16, i32 slots")
        }
    }

    /// Writes the rows into their slots of the output, which must be the pool itself (the
    /// runtime runs this op in place on a state): the rest of the pool is not copied. The
    /// kernel moves 32-bit words: f16 rows (of an even width) go two elements a word.
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let (pool, rows, slots) = (&inputs[0], &inputs[1], &inputs[2]);
        let same = pool.tensor.buffer.uid() == out.tensor.buffer.uid()
            && pool.tensor.offset_bytes == out.tensor.offset_bytes;
        if !same {
            return Err(KernelError::Unsupported {
                op: "scatter_rows",
                reason: "it runs in place: its output must be its pool (a state's buffer)".into(),
            });
        }
        let (pool_rows, width) = (out.shape.dims()[0], out.shape.dims()[1]);
        let per_word = if out.dtype == DType::F16 { 2 } else { 1 };
        if width % per_word != 0 {
            return Err(KernelError::Unsupported {
                op: "scatter_rows",
                reason: format!("f16 rows of an odd width ({width}) do not fill whole words"),
            });
        }
        let width = width / per_word;
        let n = numel("rows", rows.shape)? / per_word;
        let (bx, ox) = e.bind("rows", &rows.tensor, n * 4)?;
        let (bs, os) = e.bind(
            "slots",
            &slots.tensor,
            numel("slots", slots.shape)?.max(1) * 4,
        )?;
        let (bo, oo) = e.bind(
            "output",
            &out.tensor,
            numel("output", out.shape)? / per_word * 4,
        )?;
        let p = ScatterParams {
            rows: u32_of("rows", rows.shape.dims()[0])?,
            width: u32_of("rows", width)?,
            pool_rows: u32_of("pool", pool_rows)?,
            src_offset: ox,
            slot_offset: os,
            dst_offset: oo,
            _pad: [0; 2],
        };
        if n == 0 {
            return Ok(0);
        }
        e.dispatch(
            FAMILY.key("attention_scatter"),
            &p,
            &[bx, bs, bo],
            n.div_ceil(256),
        )?;
        Ok(1)
    }
}

#[cfg(test)]
mod tests {
    use super::{attention_splits, workgroups_for, QuantLayout, MIN_SPLIT_KEYS};

    #[test]
    fn keys_are_split_only_where_workgroups_are_short() {
        let two = workgroups_for(QuantLayout::Cpu { threads: 2 });
        let sixteen = workgroups_for(QuantLayout::Cpu { threads: 16 });
        let gpu = workgroups_for(QuantLayout::Gpu { subgroup: None });
        // SmolLM2's decode (9 heads): one pass at context 64, chunks of at least
        // MIN_SPLIT_KEYS keys at 2048 until the adapter has its workgroups; 9 workgroups
        // already keep 2 threads busy.
        assert_eq!(attention_splits(9, 64, gpu), (1, 64));
        assert_eq!(attention_splits(9, 2048, two), (1, 2048));
        assert_eq!(attention_splits(9, 2048, sixteen), (2, 1024));
        assert_eq!(attention_splits(9, 2048, gpu), (16, 128));
        // The last chunk the longest row sees is never empty: 3000 keys in 23 chunks of 131.
        assert_eq!(attention_splits(9, 3000, gpu), (23, 131));
        // A prefill of many rows already fills the adapter.
        assert_eq!(attention_splits(9 * 512, 2048, gpu), (1, 2048));
        // Fewer keys than two chunks' minimum: one pass.
        assert_eq!(attention_splits(1, 2 * MIN_SPLIT_KEYS - 1, gpu).0, 1);
        // No queries.
        assert_eq!(attention_splits(0, 100, gpu), (1, 100));
        for t in [1, 127, 128, 129, 1000, 4097] {
            let (n, c) = attention_splits(3, t, gpu);
            assert!(n * c >= t && (n - 1) * c < t, "t {t}: {n} x {c}");
            assert!(n == 1 || c >= MIN_SPLIT_KEYS, "t {t}: {n} x {c}");
        }
    }
}
