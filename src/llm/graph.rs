//! The forward pass of a decoder ([`super::arch`]) as a dynrt graph, built from a GGUF's
//! metadata and tensor index.
//!
//! Per layer: RMSNorm, the Q/K/V projections (plus their biases where the architecture has
//! them), RoPE on Q and K (adjacent pairs or halves, as the architecture says), the K/V
//! rows appended in place to the layer's KV cache (a state of the runtime), grouped-query
//! attention over the whole cache, the output projection and the residual; RMSNorm, the
//! SwiGLU feed-forward (`down(silu(gate(h)) * up(h))`) and the residual. After the last
//! layer only the **last row** is normalised and projected to logits, so a prefill of `S`
//! tokens computes the head once, not `S` times.
//!
//! Symbols: `seq` (tokens this step), `past` (tokens already in the cache) and `past_swa`
//! (rows a sliding-window layer's cache holds: fewer once the session drops the keys no
//! query will see again, see [`super::Session`]). The KV cache
//! is sequence-major, `[past, kv_heads * head_dim]` per layer: a step's rows are one
//! contiguous range at its end, so the runtime appends them with one copy and grows the
//! buffer with one copy of the old rows (a head-major `[kv_heads, past, head_dim]` layout
//! would interleave new rows into every head's block). The attention kernel reads it in
//! this layout directly.
//!
//! Weights are constants referencing the model's bytes ([`crate::tensor::ConstData::slice`]
//! of the memory map or of the bytes a page fetched): nothing is expanded or copied on the
//! host; the runtime streams them into the constants region in bounded chunks.

use super::arch::{FfnActivation, RopeScaling};
use super::LlmError;
use super::ModelConfig;
use crate::gguf::{GgmlType, Gguf};
use crate::graph::ops::{
    rope_block, rope_table, rope_table_rows, rope_table_scaled, Attention, BinaryOp, Cast,
    CompareOp, PagedAttention, Rope, UnaryOp, Unsqueeze,
};
use crate::graph::{Dim, Graph, GraphBuilder, NodeId};
use crate::runtime::StateBinding;
use crate::shape::{DType, Shape};
use crate::tensor::{Backing, ConstData};

/// Labels of the graph's inputs and outputs.
pub mod labels {
    /// Token ids of the step, `[seq]` i32.
    pub const TOKENS: &str = "tokens";
    /// Absolute positions of the step's tokens, `[seq]` i32 (`past..past + seq`).
    pub const POSITIONS: &str = "positions";
    /// Logits of the step's last token, `[1, vocab]` f32.
    pub const LOGITS: &str = "logits";
    /// How the next token is chosen from the logits, `[1, 8]` u32 (paged graph: `[batch,
    /// 8]`, a row per logit row): a row of the `sample` op
    /// ([`crate::graph::ops::SampleRow::to_words`]).
    pub const SAMPLE_PARAMS: &str = "sample_params";
    /// The token chosen from the logits on the device, `[1]` i32 (paged graph: `[batch]`).
    pub const NEXT_TOKEN: &str = "next_token";

    /// Layer `l`'s past keys input, `[past, kv_heads * head_dim]`.
    pub fn past_k(l: u32) -> String {
        format!("blk.{l}.past_k")
    }
    /// Layer `l`'s past values input.
    pub fn past_v(l: u32) -> String {
        format!("blk.{l}.past_v")
    }
    /// Layer `l`'s keys after this step (`past_k` with the step's rows appended).
    pub fn present_k(l: u32) -> String {
        format!("blk.{l}.present_k")
    }
    /// Layer `l`'s values after this step.
    pub fn present_v(l: u32) -> String {
        format!("blk.{l}.present_v")
    }
    /// Paged graph: the pool row each token's key and value go to, `[seq]` i32.
    pub const SLOTS: &str = "slots";
    /// Paged graph: per token its page-table row and position, `[seq, 2]` i32.
    pub const ROWS: &str = "rows";
    /// Paged graph: the page table, `[sequences, pages_per_seq]` i32.
    pub const PAGES: &str = "pages";
    /// Paged graph: the token rows whose logits are computed, `[batch]` i32.
    pub const LOGIT_ROWS: &str = "logit_rows";
    /// Paged graph: symbol of the pools' rows (pages times page size).
    pub const POOL_ROWS: &str = "pool_rows";
    /// Paged graph with sliding-window layers: their pools' rows (a pool of its own, whose
    /// pages a sequence gives back once they fall out of the window).
    pub const POOL_ROWS_SWA: &str = "pool_rows_swa";
    /// Paged graph with sliding-window layers: each token's row in their pools, `[seq]`.
    pub const SLOTS_SWA: &str = "slots_swa";
    /// Paged graph with sliding-window layers: their page table, the shape of
    /// [`PAGES`] (entries of pages out of the window are never read).
    pub const PAGES_SWA: &str = "pages_swa";

    /// Indices of layer `l`'s key and value states in [`super::ModelGraph::states`] (and so
    /// in a request's states): layer by layer, keys before values.
    pub fn states_of(l: u32) -> [usize; 2] {
        let k = 2 * l as usize;
        [k, k + 1]
    }
}

/// How the projection weights reach the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WeightFormat {
    /// As stored in the file (any type of [`crate::formats::FORMATS`]): the bytes of the memory map go to the
    /// device unchanged, the `linear` kernels dequantize blocks as they read them, the
    /// embedding rows are gathered from the quantized table, and the tied head is a
    /// `linear` on that same table. Device bytes for weights equal the file's tensor bytes
    /// (plus the RoPE table).
    Native,
    /// Dequantized to f32 on the host once, at load (4 bytes per weight on the device: about
    /// 5.6x the Q4_1 bytes). Projections run through the tiled `matmul` with a transposed
    /// right side.
    F32,
}

/// The graph of a model and the KV-cache states the runtime carries between steps.
#[derive(Debug, Clone)]
pub struct ModelGraph {
    /// Inputs `tokens`, `positions`, per layer `past_k`/`past_v` (and, but in the paged graph,
    /// `sample_params`); outputs `logits`, then per layer `present_k`/`present_v` (and, but
    /// in the paged graph, `next_token`).
    pub graph: Graph,
    /// `(past, present)` of each cache tensor, layer by layer, keys before values.
    pub states: Vec<StateBinding>,
    /// Bytes of every weight constant the graph holds (the rope table included).
    pub weight_bytes: u64,
}

/// The dtype a GGUF tensor of type `ty` has on the device: that of its row in
/// [`crate::formats::FORMATS`] (`None` for the other types: such a tensor is
/// [`LlmError::UnsupportedWeight`]).
pub fn weight_dtype(ty: GgmlType) -> Option<DType> {
    crate::formats::of_ggml(ty).map(|f| f.dtype)
}

struct Builder<'a> {
    b: GraphBuilder,
    gguf: &'a Gguf,
    backing: &'a Backing,
    format: WeightFormat,
    /// The device's largest storage binding: a weight above it is used in row pieces.
    max_binding: u64,
    weight_bytes: u64,
}

impl Builder<'_> {
    /// Tensor `name` as a constant `[rows, row_len]` (or `[len]` for a vector) in the type
    /// the format asks for.
    fn weight(&mut self, name: &str) -> Result<NodeId, LlmError> {
        let rows = self.gguf.require_tensor(name)?.num_rows();
        self.weight_rows(name, name.to_owned(), 0..rows)
    }

    /// Rows `rows` of tensor `name` (its outermost dim) as the constant `label`.
    fn weight_rows(
        &mut self,
        name: &str,
        label: String,
        rows: std::ops::Range<u64>,
    ) -> Result<NodeId, LlmError> {
        let info = self.gguf.require_tensor(name)?;
        let ty = info.ggml_type();
        let dtype = weight_dtype(ty).ok_or_else(|| LlmError::UnsupportedWeight {
            tensor: name.to_owned(),
            ggml_type: ty.name(),
        })?;
        let mut dims: Vec<u64> = info.dims().iter().rev().copied().collect();
        if dims.len() > 1 {
            dims[0] = rows.end - rows.start;
        }
        let shape = Shape::new(dims);
        let node = if dtype == DType::F32 || self.format == WeightFormat::Native {
            // The file's bytes, referenced (no copy): f32 norms, or every weight as stored.
            // Parsing checked that whole rows are whole blocks.
            let row_bytes = ty.size_bytes(info.row_len()).unwrap_or(0);
            let start = info.byte_range().start + rows.start * row_bytes;
            let end = info.byte_range().start + rows.end * row_bytes;
            let data = ConstData::slice(self.backing.clone(), start as usize..end as usize)?;
            self.weight_bytes += data.len() as u64;
            self.b.constant_bytes(label, shape, dtype, data)
        } else {
            let values =
                self.gguf
                    .dequantize_rows((**self.backing).as_ref(), name, rows.clone())?;
            self.weight_bytes += values.len() as u64 * 4;
            self.b.constant(label, shape, values)
        };
        Ok(node)
    }

    /// Tensor `name` (`[rows, row_len]`) as constants of whole rows that each fit one
    /// storage binding: the whole tensor when it fits, else pieces `name#i`. Each entry is
    /// (first row, rows, constant).
    fn weight_pieces(&mut self, name: &str) -> Result<Vec<(u64, u64, NodeId)>, LlmError> {
        let info = self.gguf.require_tensor(name)?;
        let rows = info.num_rows();
        let row_bytes = match self.format {
            WeightFormat::Native => info.ggml_type().size_bytes(info.row_len()).unwrap_or(0),
            WeightFormat::F32 => info.row_len() * 4,
        };
        let per_piece = (self.max_binding / row_bytes.max(1)).max(1);
        if rows <= per_piece {
            return Ok(vec![(0, rows, self.weight(name)?)]);
        }
        let mut pieces = Vec::new();
        for (i, start) in (0..rows).step_by(per_piece as usize).enumerate() {
            let end = (start + per_piece).min(rows);
            let w = self.weight_rows(name, format!("{name}#{i}"), start..end)?;
            pieces.push((start, end - start, w));
        }
        Ok(pieces)
    }

    /// `x · wᵀ` for a weight `[n_out, n_in]` held in `pieces` ([`Builder::weight_pieces`]):
    /// one projection per piece, their outputs concatenated (`[S, n_out]` either way).
    fn project_pieces(
        &mut self,
        label: String,
        x: NodeId,
        pieces: &[(u64, u64, NodeId)],
    ) -> NodeId {
        if let [(_, _, w)] = pieces {
            return self.project(label, x, *w);
        }
        let parts: Vec<NodeId> = pieces
            .iter()
            .enumerate()
            .map(|(i, &(_, _, w))| self.project(format!("{label}#{i}"), x, w))
            .collect();
        self.b.concat(label, &parts, 1)
    }

    /// RMSNorm of each head of `x` `[S, N * d]` with the `d` weights `gamma` shared by the
    /// heads (gemma's Q/K norms): viewed as `[S * N, d]`, normalised, viewed back.
    fn head_norm(&mut self, label: String, x: NodeId, gamma: NodeId, d: u32, eps: f32) -> NodeId {
        let width = self.b.shape_of(format!("{label}.width"), x);
        let heads = self
            .b
            .reshape(format!("{label}.heads"), x, &[-1, i64::from(d)]);
        let normed = self.b.rms_norm(label.clone(), heads, gamma, eps);
        self.b.reshape_to(format!("{label}.rows"), normed, width)
    }

    /// `RMSNorm(x)` with the weight `{label}.weight` when the architecture normalises block
    /// outputs before the residual (gemma's post-norms), else `x`.
    fn post_norm(
        &mut self,
        config: &ModelConfig,
        label: String,
        x: NodeId,
    ) -> Result<NodeId, LlmError> {
        if !config.arch.post_norms {
            return Ok(x);
        }
        let w = self.weight(&format!("{label}.weight"))?;
        Ok(self.b.rms_norm(label, x, w, config.rms_eps))
    }

    /// `x · wᵀ` for `w` `[n_out, n_in]`.
    fn project(&mut self, label: String, x: NodeId, w: NodeId) -> NodeId {
        match self.format {
            WeightFormat::Native => self.b.linear(label, x, w),
            WeightFormat::F32 => self.b.matmul(label, x, w, true),
        }
    }

    /// `x · wᵀ + bias` when `bias` is `Some` (the tensor's name), else [`Builder::project`].
    fn project_bias(
        &mut self,
        label: String,
        x: NodeId,
        w: NodeId,
        bias: Option<String>,
    ) -> Result<NodeId, LlmError> {
        let y = self.project(label.clone(), x, w);
        Ok(match bias {
            None => y,
            Some(name) => {
                let b = self.weight(&name)?;
                self.b.add(format!("{label}.bias"), y, b)
            }
        })
    }

    /// Rows `ids` (i32 `[S]`) of the embedding table held in `pieces` (f32 `[S, W]`
    /// whatever the table's format). A table in pieces is gathered from every piece with the
    /// ids made local and clamped into it, and each row taken from the last piece whose first
    /// row is at most its id (`where`); ids are known to be inside the vocabulary (the
    /// session checks them).
    fn embed_pieces(&mut self, pieces: &[(u64, u64, NodeId)], ids: NodeId) -> NodeId {
        if let [(_, _, table)] = pieces {
            return self.b.gather("embed", *table, ids);
        }
        let one = Shape::new(vec![1]);
        let zero = self.b.constant_i32("embed.zero", one.clone(), &[0]);
        let mut out = None;
        for (i, &(start, rows, table)) in pieces.iter().enumerate() {
            let p = |s: &str| format!("embed#{i}.{s}");
            // Rows of a piece fit a binding: far below i32::MAX, as the vocabulary is.
            let first = self
                .b
                .constant_i32(p("first"), one.clone(), &[start as i32]);
            let last = self
                .b
                .constant_i32(p("last"), one.clone(), &[rows as i32 - 1]);
            let local = self.b.sub(p("local"), ids, first);
            let local = self.b.binary(p("low"), BinaryOp::Max, local, zero);
            let local = self.b.binary(p("high"), BinaryOp::Min, local, last);
            let rows_here = self.b.gather(p("rows"), table, local);
            out = Some(match out {
                None => rows_here,
                Some(before) => {
                    let take = self
                        .b
                        .node(p("take"), CompareOp::GreaterOrEqual, &[ids, first]);
                    let take = self
                        .b
                        .node(p("take2d"), Unsqueeze { axes: vec![1] }, &[take]);
                    self.b.where_(p("select"), take, rows_here, before)
                }
            });
        }
        // At least two pieces here.
        out.unwrap_or(zero)
    }
}

/// Builds the forward pass of the model in `gguf` (whose bytes are `backing`) for `config`,
/// for positions `0..context` (the RoPE table's reach: at most the model's context, see
/// [`super::context_on_device`]), for a device whose largest storage binding is
/// `max_binding` bytes (a projection weight above it is used in row pieces), with a KV cache
/// of element type `kv` (f32, or f16: each step's keys and values are cast to it before they
/// are stored, and attention reads them as f16).
///
/// # Errors
/// [`LlmError::UnsupportedWeight`] for a tensor type dynrt cannot hold; GGUF errors for a
/// tensor that is missing or whose bytes cannot be read; [`LlmError::Graph`] if the graph
/// does not validate.
pub fn build_graph(
    gguf: &Gguf,
    backing: &Backing,
    config: &ModelConfig,
    format: WeightFormat,
    context: u32,
    max_binding: u64,
    kv: DType,
) -> Result<ModelGraph, LlmError> {
    build(
        gguf,
        backing,
        config,
        format,
        context,
        max_binding,
        kv,
        None,
    )
}

/// The forward pass of [`build_graph`] over a **paged KV cache**: the rows of a step may
/// belong to many sequences (a batch of decode steps and prefill chunks). Per layer the keys
/// and values live in a pool `[pool_rows, kv_heads * head_dim]` (pages of `page_size`
/// positions; a state written in place by `scatter_rows`), and attention reads each
/// sequence's positions through its page table ([`crate::graph::ops::PagedAttention`]).
///
/// Inputs: `tokens`, `positions` `[seq]`; [`labels::SLOTS`] `[seq]` (each token's pool row);
/// [`labels::ROWS`] `[seq, 2]` (its page-table row and position); [`labels::PAGES`] (the page
/// table); [`labels::LOGIT_ROWS`] `[batch]` (the rows whose logits are wanted: the last of
/// each sequence in the step); per layer the pools (`past_k`/`past_v`, rows
/// [`labels::POOL_ROWS`]); [`labels::SAMPLE_PARAMS`] `[batch, 8]` (each logit row's
/// sampling). Outputs `logits` `[batch, vocab]`, then the pools, then
/// [`labels::NEXT_TOKEN`] `[batch]` (each row's token, chosen on the device).
///
/// # Errors
/// As [`build_graph`].
#[allow(clippy::too_many_arguments)]
pub fn build_paged_graph(
    gguf: &Gguf,
    backing: &Backing,
    config: &ModelConfig,
    format: WeightFormat,
    context: u32,
    max_binding: u64,
    kv: DType,
    page_size: u32,
) -> Result<ModelGraph, LlmError> {
    build(
        gguf,
        backing,
        config,
        format,
        context,
        max_binding,
        kv,
        Some(page_size),
    )
}

/// The `sample` op after the head: input [`labels::SAMPLE_PARAMS`], output
/// [`labels::NEXT_TOKEN`], so a step's token is chosen on the device and only its id comes
/// back (the logits stay on the device unless a caller reads them).
fn append_sampling(b: &mut GraphBuilder, logits: NodeId, rows: Dim) {
    let words = crate::graph::ops::sample::PARAM_WORDS as u64;
    let params = b.input(
        labels::SAMPLE_PARAMS,
        &[rows, Dim::Fixed(words)],
        DType::U32,
    );
    let next = b.sample(labels::NEXT_TOKEN, logits, params);
    b.output(next);
}

/// The paged graph's inputs shared by every layer (`*_swa`: those of the sliding-window
/// layers, the global ones' where the model has none).
#[derive(Clone, Copy)]
struct PagedInputs {
    page_size: u32,
    slots: NodeId,
    rows: NodeId,
    pages: NodeId,
    slots_swa: NodeId,
    pages_swa: NodeId,
}

#[allow(clippy::too_many_arguments)]
fn build(
    gguf: &Gguf,
    backing: &Backing,
    config: &ModelConfig,
    format: WeightFormat,
    context: u32,
    max_binding: u64,
    kv: DType,
    page_size: Option<u32>,
) -> Result<ModelGraph, LlmError> {
    let kv_len = u64::from(config.kv_len());
    let d = config.head_dim;
    let (h, kvh) = (config.num_heads, config.num_kv_heads);
    let eps = config.rms_eps;
    let mut bl = Builder {
        b: GraphBuilder::new(),
        gguf,
        backing,
        format,
        max_binding,
        weight_bytes: 0,
    };
    let seq = Dim::sym("seq");
    let past = Dim::sym("past");
    // Sliding-window layers drop their oldest rows (the session keeps them bounded): their
    // caches hold fewer rows than the global layers', under a symbol of their own.
    let past_local = Dim::sym("past_swa");
    let tokens =
        bl.b.input(labels::TOKENS, std::slice::from_ref(&seq), DType::I32);
    let positions =
        bl.b.input(labels::POSITIONS, std::slice::from_ref(&seq), DType::I32);
    let paged = page_size.map(|page_size| {
        let table = [Dim::sym("sequences"), Dim::sym("pages_per_seq")];
        let slots =
            bl.b.input(labels::SLOTS, std::slice::from_ref(&seq), DType::I32);
        let pages = bl.b.input(labels::PAGES, &table, DType::I32);
        let local = config.local_layers().next().is_some();
        PagedInputs {
            page_size,
            slots,
            rows: bl
                .b
                .input(labels::ROWS, &[seq.clone(), Dim::Fixed(2)], DType::I32),
            pages,
            slots_swa: if local {
                bl.b.input(labels::SLOTS_SWA, std::slice::from_ref(&seq), DType::I32)
            } else {
                slots
            },
            pages_swa: if local {
                bl.b.input(labels::PAGES_SWA, &table, DType::I32)
            } else {
                pages
            },
        }
    });
    // Two levels of about sqrt(context) rows each: kilobytes even for a context of millions.
    let context = context.clamp(1, config.context_len);
    let factors = if config.rope_freq_factors {
        gguf.dequantize_tensor((**backing).as_ref(), "rope_freqs.weight")?
    } else {
        Vec::new()
    };
    let scale = match config.rope_scaling {
        RopeScaling::None => 1.0,
        RopeScaling::Linear { factor } => 1.0 / f64::from(factor),
    };
    let table_values = rope_table_scaled(
        f64::from(config.rope_base),
        config.rope_dim,
        context,
        scale,
        &factors,
    );
    bl.weight_bytes += table_values.len() as u64 * 4;
    let rope = Rope {
        head_dim: d,
        block: rope_block(context),
        interleaved: config.arch.rope_interleaved,
    };
    let table_shape = Shape::new(vec![
        u64::from(rope_table_rows(context)),
        u64::from(config.rope_dim),
    ]);
    let table =
        bl.b.constant("rope_table", table_shape.clone(), table_values);
    // Local (sliding-window) layers rotate with their own base, without scaling.
    let any_local = config.local_layers().next().is_some();
    let table_local = if any_local && config.rope_base_swa != config.rope_base {
        let values = rope_table(f64::from(config.rope_base_swa), config.rope_dim, context);
        bl.weight_bytes += values.len() as u64 * 4;
        bl.b.constant("rope_table_swa", table_shape, values)
    } else {
        table
    };
    let embd = bl.weight_pieces("token_embd.weight")?;
    let mut x = bl.embed_pieces(&embd, tokens);
    if config.arch.scale_embedding {
        let scale = (f64::from(config.embedding_len)).sqrt() as f32;
        let c =
            bl.b.constant("embed.scale", Shape::new(vec![1]), vec![scale]);
        x = bl.b.mul("embed.scaled", x, c);
    }
    let mut presents = Vec::new();
    let mut states = Vec::new();
    for l in 0..config.num_layers {
        let p = |s: &str| format!("blk.{l}.{s}");
        let rows = match (paged, config.is_local(l)) {
            (Some(_), true) => Dim::sym(labels::POOL_ROWS_SWA),
            (Some(_), false) => Dim::sym(labels::POOL_ROWS),
            (None, true) => past_local.clone(),
            (None, false) => past.clone(),
        };
        let past_k =
            bl.b.input(labels::past_k(l), &[rows.clone(), Dim::Fixed(kv_len)], kv);
        let past_v =
            bl.b.input(labels::past_v(l), &[rows, Dim::Fixed(kv_len)], kv);
        let attn_norm = bl.weight(&p("attn_norm.weight"))?;
        let hn = bl.b.rms_norm(p("attn_norm"), x, attn_norm, eps);
        let wq = bl.weight(&p("attn_q.weight"))?;
        let wk = bl.weight(&p("attn_k.weight"))?;
        let wv = bl.weight(&p("attn_v.weight"))?;
        let bias = |s: &str| config.arch.qkv_bias.then(|| p(&format!("{s}.bias")));
        let q = bl.project_bias(p("q"), hn, wq, bias("attn_q"))?;
        let k = bl.project_bias(p("k"), hn, wk, bias("attn_k"))?;
        let v = bl.project_bias(p("v"), hn, wv, bias("attn_v"))?;
        let (q, k) = if config.arch.qk_norm {
            let (qn, kn) = (
                bl.weight(&p("attn_q_norm.weight"))?,
                bl.weight(&p("attn_k_norm.weight"))?,
            );
            (
                bl.head_norm(p("q_norm"), q, qn, d, eps),
                bl.head_norm(p("k_norm"), k, kn, d, eps),
            )
        } else {
            (q, k)
        };
        let table = if config.is_local(l) {
            table_local
        } else {
            table
        };
        let q = bl.b.rope(p("q.rope"), q, positions, table, rope);
        let k = bl.b.rope(p("k.rope"), k, positions, table, rope);
        // A cache of another type (f16) stores the step's rows converted.
        let (k, v) = if kv == DType::F32 {
            (k, v)
        } else {
            (
                bl.b.node(p("k.cache"), Cast { to: kv }, &[k]),
                bl.b.node(p("v.cache"), Cast { to: kv }, &[v]),
            )
        };
        // A sliding-window layer's own pool, slots and page table.
        let local = paged.map(|pg| match config.is_local(l) {
            true => (pg.slots_swa, pg.pages_swa),
            false => (pg.slots, pg.pages),
        });
        let (kc, vc) = match local {
            // The step's rows written into their slots of the pools, in place.
            Some((slots, _)) => (
                bl.b.scatter_rows(labels::present_k(l), past_k, k, slots),
                bl.b.scatter_rows(labels::present_v(l), past_v, v, slots),
            ),
            // In-place concatenation: the runtime appends the step's rows to the cache buffer.
            None => (
                bl.b.concat(labels::present_k(l), &[past_k, k], 0),
                bl.b.concat(labels::present_v(l), &[past_v, v], 0),
            ),
        };
        presents.extend([kc, vc]);
        states.push(StateBinding {
            past: labels::past_k(l),
            present: labels::present_k(l),
        });
        states.push(StateBinding {
            past: labels::past_v(l),
            present: labels::present_v(l),
        });
        let attention = Attention {
            num_heads: h,
            num_kv_heads: kvh,
            window: config.window_of(l),
        };
        let attn = match (paged, local) {
            (Some(pg), Some((_, pages))) => bl.b.paged_attention(
                p("attn"),
                [q, kc, vc, pg.rows, pages],
                PagedAttention {
                    num_heads: h,
                    num_kv_heads: kvh,
                    window: config.window_of(l),
                    page_size: pg.page_size,
                },
            ),
            _ => bl.b.attention(p("attn"), q, kc, vc, attention),
        };
        let wo = bl.weight(&p("attn_output.weight"))?;
        let o = bl.project(p("attn_out"), attn, wo);
        let o = bl.post_norm(config, p("post_attention_norm"), o)?;
        x = bl.b.add(p("attn_res"), x, o);
        let ffn_norm = bl.weight(&p("ffn_norm.weight"))?;
        let hf = bl.b.rms_norm(p("ffn_norm"), x, ffn_norm, eps);
        let wg = bl.weight(&p("ffn_gate.weight"))?;
        let wu = bl.weight(&p("ffn_up.weight"))?;
        let wd = bl.weight(&p("ffn_down.weight"))?;
        let gate = bl.project(p("ffn_gate"), hf, wg);
        let up = bl.project(p("ffn_up"), hf, wu);
        let act = match config.arch.ffn_activation {
            FfnActivation::Silu => bl.b.silu_mul(p("ffn_act"), gate, up),
            FfnActivation::GeluTanh => {
                let g = bl.b.unary(p("ffn_gelu"), UnaryOp::Gelu, gate);
                bl.b.mul(p("ffn_act"), g, up)
            }
        };
        let down = bl.project(p("ffn_down"), act, wd);
        let down = bl.post_norm(config, p("post_ffw_norm"), down)?;
        x = bl.b.add(p("ffn_res"), x, down);
    }
    // Only the last position (of each sequence, when paged) needs logits.
    let last = if paged.is_some() {
        let at =
            bl.b.input(labels::LOGIT_ROWS, &[Dim::sym("batch")], DType::I32);
        bl.b.gather("last_rows", x, at)
    } else {
        bl.b.slice("last_row", x, &[0], &[-1], &[i64::MAX], &[1])
    };
    let out_norm = bl.weight("output_norm.weight")?;
    let xf = bl.b.rms_norm("output_norm", last, out_norm, eps);
    let logits = if config.tied_output {
        bl.project_pieces(labels::LOGITS.into(), xf, &embd)
    } else {
        let head = bl.weight_pieces("output.weight")?;
        bl.project_pieces(labels::LOGITS.into(), xf, &head)
    };
    let mut b = bl.b;
    b.output(logits);
    for pr in presents {
        b.output(pr);
    }
    // The tokens the `sample` op chooses: one per row of logits (one sequence on the
    // contiguous cache, each sequence of a batched step on the paged one).
    let rows = if paged.is_none() {
        Dim::Fixed(1)
    } else {
        Dim::sym("batch")
    };
    append_sampling(&mut b, logits, rows);
    Ok(ModelGraph {
        graph: b.build()?,
        states,
        weight_bytes: bl.weight_bytes,
    })
}
