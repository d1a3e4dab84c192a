//! The forward pass of a decoder as a dynrt graph, built from a GGUF's metadata and tensor
//! index by its architecture's straight-line builder ([`super::arch`]) over the shared
//! blocks of `Blocks`.
//!
//! The blocks: the token embedding, RMSNorm, the Q/K/V projections (and their biases, per-head
//! norms and RoPE, as the architecture asks), the attention block over a KV cache that is
//! contiguous (one session) or paged (a batch of sequences), a projection, the gated
//! feed-forward and the head. Each architecture composes them in its own file, choosing its
//! norms and activations; what differs between models of one architecture (sizes, window
//! lengths, RoPE bases) is data of the [`ModelConfig`]. After the last layer only the **last
//! row** (of each sequence, when paged) is normalised and projected to logits, so a prefill of
//! `S` tokens computes the head once, not `S` times.
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

use super::arch::RopeScaling;
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
    /// Dequantized to f32 on the host once, at load (4 bytes per weight on the device, where a
    /// Q4_1 weight takes 20 bytes per 32). Projections run through the tiled `matmul` with a transposed
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

/// One row range of a weight held as its own constant: (first row, rows, constant). A
/// weight that fits one storage binding is one piece.
type Piece = (u64, u64, NodeId);

/// Where the blocks' weights come from: the model's file, or nowhere when the builder only
/// lists the tensors an architecture reads ([`ModelConfig::expected_tensors`]).
enum Source<'a> {
    File {
        gguf: &'a Gguf,
        backing: &'a Backing,
        format: WeightFormat,
        /// The device's largest storage binding: a weight above it is used in row pieces.
        max_binding: u64,
    },
    /// Each tensor read, with its dims in ggml order (innermost first).
    Listing(Vec<(String, Vec<u64>)>),
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

/// The KV cache the attention blocks append to and read.
#[derive(Clone, Copy)]
enum KvCache {
    /// One sequence: each layer's keys and values grow by the step's rows
    /// ([`labels::past_k`] concatenated with them, in place).
    Contiguous,
    /// Many sequences in pools of pages, the step's rows written into their slots.
    Paged(PagedInputs),
}

/// One decoder layer as the blocks see it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layer {
    /// Its index, `0..num_layers`.
    pub index: u32,
    /// Whether it attends within the sliding window (a local layer, [`ModelConfig::is_local`]).
    pub local: bool,
}

impl Layer {
    /// `blk.{index}.{s}`: the prefix of the layer's tensors and node labels.
    pub fn name(&self, s: &str) -> String {
        format!("blk.{}.{s}", self.index)
    }
}

/// The three projections of an attention block, `[S, width]` each.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Qkv {
    pub q: NodeId,
    pub k: NodeId,
    pub v: NodeId,
}

/// How RoPE pairs the elements of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RopePairs {
    /// `(x[2i], x[2i+1])`: llama's GGUF rows are permuted for it by the converter.
    Adjacent,
    /// `(x[i], x[i + d/2])`: llama.cpp's NEOX mode, the Hugging Face row order.
    Halves,
}

/// The activation of a gated feed-forward: `down(act(gate(h)) * up(h))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Activation {
    /// SiLU: SwiGLU.
    Silu,
    /// GELU, tanh approximation: GeGLU.
    GeluTanh,
}

/// The shared blocks an architecture's builder composes ([`super::arch`]): each reads its
/// weights by their GGUF names under the layer's prefix and labels its nodes the same way,
/// and the cache, the RoPE tables and the outputs are kept here, so an architecture's file
/// is the order of its blocks and nothing else.
pub(crate) struct Blocks<'a> {
    b: GraphBuilder,
    config: &'a ModelConfig,
    source: Source<'a>,
    cache: KvCache,
    /// The element type of the KV cache (f32, or f16: the step's keys and values are cast
    /// to it before they are stored).
    kv: DType,
    tokens: NodeId,
    positions: NodeId,
    /// Positions the RoPE tables cover (`0..context`).
    context: u32,
    /// The RoPE tables of the global and the local layers, made on first use.
    tables: [Option<NodeId>; 2],
    /// The embedding's pieces (the tied head reads them too).
    embedding: Vec<Piece>,
    /// The KV states, layer by layer, keys before values, and their presents.
    states: Vec<StateBinding>,
    presents: Vec<NodeId>,
    weight_bytes: u64,
}

impl<'a> Blocks<'a> {
    fn new(
        config: &'a ModelConfig,
        source: Source<'a>,
        context: u32,
        paged: Option<u32>,
        kv: DType,
    ) -> Self {
        let mut b = GraphBuilder::new();
        let seq = Dim::sym("seq");
        let tokens = b.input(labels::TOKENS, std::slice::from_ref(&seq), DType::I32);
        let positions = b.input(labels::POSITIONS, std::slice::from_ref(&seq), DType::I32);
        let cache = match paged {
            None => KvCache::Contiguous,
            Some(page_size) => {
                let table = [Dim::sym("sequences"), Dim::sym("pages_per_seq")];
                let slots = b.input(labels::SLOTS, std::slice::from_ref(&seq), DType::I32);
                let pages = b.input(labels::PAGES, &table, DType::I32);
                let rows = b.input(labels::ROWS, &[seq.clone(), Dim::Fixed(2)], DType::I32);
                let local = config.local_layers().next().is_some();
                KvCache::Paged(PagedInputs {
                    page_size,
                    slots,
                    rows,
                    pages,
                    slots_swa: if local {
                        b.input(labels::SLOTS_SWA, std::slice::from_ref(&seq), DType::I32)
                    } else {
                        slots
                    },
                    pages_swa: if local {
                        b.input(labels::PAGES_SWA, &table, DType::I32)
                    } else {
                        pages
                    },
                })
            }
        };
        Blocks {
            b,
            config,
            source,
            cache,
            kv,
            tokens,
            positions,
            context: context.clamp(1, config.context_len),
            tables: [None, None],
            embedding: Vec::new(),
            states: Vec::new(),
            presents: Vec::new(),
            weight_bytes: 0,
        }
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        self.config
    }

    /// The decoder layers, in order.
    pub fn layers(&self) -> Vec<Layer> {
        (0..self.config.num_layers)
            .map(|index| Layer {
                index,
                local: self.config.is_local(index),
            })
            .collect()
    }

    /// Tensor `name`, whose dims (ggml order, innermost first) are `dims`, as a constant
    /// `[rows, row_len]` (or `[len]` for a vector) in the type the format asks for.
    fn weight(&mut self, name: &str, dims: &[u64]) -> Result<NodeId, LlmError> {
        let gguf = match &mut self.source {
            Source::Listing(list) => {
                list.push((name.to_owned(), dims.to_vec()));
                let shape: Vec<Dim> = dims.iter().rev().map(|&d| Dim::Fixed(d)).collect();
                return Ok(self.b.input(name, &shape, DType::F32));
            }
            Source::File { gguf, .. } => *gguf,
        };
        let rows = gguf.require_tensor(name)?.num_rows();
        self.weight_rows(name, name.to_owned(), 0..rows)
    }

    /// Rows `rows` of tensor `name` (its outermost dim) as the constant `label`.
    fn weight_rows(
        &mut self,
        name: &str,
        label: String,
        rows: std::ops::Range<u64>,
    ) -> Result<NodeId, LlmError> {
        let Source::File {
            gguf,
            backing,
            format,
            ..
        } = self.source
        else {
            return Ok(self.b.input(label, &[], DType::F32));
        };
        let info = gguf.require_tensor(name)?;
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
        let node = if dtype == DType::F32 || format == WeightFormat::Native {
            // The file's bytes, referenced (no copy): f32 norms, or every weight as stored.
            // Parsing checked that whole rows are whole blocks.
            let row_bytes = ty.size_bytes(info.row_len()).unwrap_or(0);
            let start = info.byte_range().start + rows.start * row_bytes;
            let end = info.byte_range().start + rows.end * row_bytes;
            let data = ConstData::slice(backing.clone(), start as usize..end as usize)?;
            self.weight_bytes += data.len() as u64;
            self.b.constant_bytes(label, shape, dtype, data)
        } else {
            let values = gguf.dequantize_rows((**backing).as_ref(), name, rows.clone())?;
            self.weight_bytes += values.len() as u64 * 4;
            self.b.constant(label, shape, values)
        };
        Ok(node)
    }

    /// Tensor `name` (`[rows, row_len]`, dims `dims` in ggml order) as constants of whole
    /// rows that each fit one storage binding: the whole tensor when it fits, else pieces
    /// `name#i`.
    fn weight_pieces(&mut self, name: &str, dims: &[u64]) -> Result<Vec<Piece>, LlmError> {
        let (gguf, format, max_binding) = match self.source {
            Source::File {
                gguf,
                format,
                max_binding,
                ..
            } => (gguf, format, max_binding),
            Source::Listing(_) => {
                let rows = dims.last().copied().unwrap_or(0);
                return Ok(vec![(0, rows, self.weight(name, dims)?)]);
            }
        };
        let info = gguf.require_tensor(name)?;
        let rows = info.num_rows();
        let row_bytes = match format {
            WeightFormat::Native => info.ggml_type().size_bytes(info.row_len()).unwrap_or(0),
            WeightFormat::F32 => info.row_len() * 4,
        };
        let per_piece = (max_binding / row_bytes.max(1)).max(1);
        if rows <= per_piece {
            return Ok(vec![(0, rows, self.weight(name, dims)?)]);
        }
        let mut pieces = Vec::new();
        for (i, start) in (0..rows).step_by(per_piece as usize).enumerate() {
            let end = (start + per_piece).min(rows);
            let w = self.weight_rows(name, format!("{name}#{i}"), start..end)?;
            pieces.push((start, end - start, w));
        }
        Ok(pieces)
    }

    /// `x · wᵀ` for `w` `[n_out, n_in]`.
    fn linear(&mut self, label: String, x: NodeId, w: NodeId) -> NodeId {
        match self.source {
            Source::File {
                format: WeightFormat::F32,
                ..
            } => self.b.matmul(label, x, w, true),
            _ => self.b.linear(label, x, w),
        }
    }

    /// `x · wᵀ` for a weight `[n_out, n_in]` held in `pieces`: one projection per piece,
    /// their outputs concatenated (`[S, n_out]` either way).
    fn linear_pieces(&mut self, label: String, x: NodeId, pieces: &[Piece]) -> NodeId {
        if let [(_, _, w)] = pieces {
            return self.linear(label, x, *w);
        }
        let parts: Vec<NodeId> = pieces
            .iter()
            .enumerate()
            .map(|(i, &(_, _, w))| self.linear(format!("{label}#{i}"), x, w))
            .collect();
        self.b.concat(label, &parts, 1)
    }

    /// `x · wᵀ` with the weight `{name}.weight` of dims `dims` (ggml order: `[n_in, n_out]`),
    /// labelled `label`.
    fn project(
        &mut self,
        label: String,
        x: NodeId,
        name: &str,
        dims: [u32; 2],
    ) -> Result<NodeId, LlmError> {
        let w = self.weight(&format!("{name}.weight"), &dims.map(u64::from))?;
        Ok(self.linear(label, x, w))
    }

    /// The token embedding: rows `tokens` of `token_embd.weight`, f32 `[S, W]` whatever the
    /// table's format. A table in pieces (above one binding) is gathered from every piece
    /// with the ids made local and clamped into it, and each row taken from the last piece
    /// whose first row is at most its id (`where`); ids are known to be inside the
    /// vocabulary (the session checks them).
    pub fn embed(&mut self) -> Result<NodeId, LlmError> {
        let c = self.config;
        let dims = [u64::from(c.embedding_len), u64::from(c.vocab_size)];
        let pieces = self.weight_pieces("token_embd.weight", &dims)?;
        self.embedding = pieces.clone();
        let ids = self.tokens;
        if let [(_, _, table)] = pieces[..] {
            return Ok(self.b.gather("embed", table, ids));
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
        Ok(out.unwrap_or(zero))
    }

    /// `x * factor`, the constant `{label}.scale` and the product `{label}.scaled`.
    pub fn scale(&mut self, label: &str, x: NodeId, factor: f32) -> NodeId {
        let c = self
            .b
            .constant(format!("{label}.scale"), Shape::new(vec![1]), vec![factor]);
        self.b.mul(format!("{label}.scaled"), x, c)
    }

    /// RMSNorm of `x`'s rows (the model's width) with the weight `{name}.weight`, labelled
    /// `name`.
    pub fn norm(&mut self, x: NodeId, name: &str) -> Result<NodeId, LlmError> {
        let w = self.weight(
            &format!("{name}.weight"),
            &[u64::from(self.config.embedding_len)],
        )?;
        Ok(self.b.rms_norm(name, x, w, self.config.rms_eps))
    }

    /// `a + b`, labelled `label`.
    pub fn add(&mut self, label: String, a: NodeId, b: NodeId) -> NodeId {
        self.b.add(label, a, b)
    }

    /// Layer `l`'s query, key and value projections of `h` (`attn_q`, `attn_k`, `attn_v`).
    pub fn qkv(&mut self, l: &Layer, h: NodeId) -> Result<Qkv, LlmError> {
        let c = self.config;
        let (w, q, kv) = (c.embedding_len, c.q_len(), c.kv_len());
        Ok(Qkv {
            q: self.project(l.name("q"), h, &l.name("attn_q"), [w, q])?,
            k: self.project(l.name("k"), h, &l.name("attn_k"), [w, kv])?,
            v: self.project(l.name("v"), h, &l.name("attn_v"), [w, kv])?,
        })
    }

    /// The projections plus their biases (`attn_{q,k,v}.bias`).
    pub fn qkv_bias(&mut self, l: &Layer, p: Qkv) -> Result<Qkv, LlmError> {
        let c = self.config;
        let mut bias = |s: &str, y: NodeId, n: u32| -> Result<NodeId, LlmError> {
            let b = self.weight(&l.name(&format!("attn_{s}.bias")), &[u64::from(n)])?;
            Ok(self.b.add(l.name(&format!("{s}.bias")), y, b))
        };
        Ok(Qkv {
            q: bias("q", p.q, c.q_len())?,
            k: bias("k", p.k, c.kv_len())?,
            v: bias("v", p.v, c.kv_len())?,
        })
    }

    /// Each head of Q and of K RMS-normalised with the `head_dim` weights `attn_q_norm` and
    /// `attn_k_norm` shared by the heads: viewed as `[S * heads, head_dim]`, normalised,
    /// viewed back.
    pub fn head_norms(&mut self, l: &Layer, p: Qkv) -> Result<Qkv, LlmError> {
        let d = self.config.head_dim;
        let mut norm = |s: &str, x: NodeId| -> Result<NodeId, LlmError> {
            let gamma = self.weight(&l.name(&format!("attn_{s}_norm.weight")), &[u64::from(d)])?;
            let label = l.name(&format!("{s}_norm"));
            let width = self.b.shape_of(format!("{label}.width"), x);
            let heads = self
                .b
                .reshape(format!("{label}.heads"), x, &[-1, i64::from(d)]);
            let normed = self
                .b
                .rms_norm(label.clone(), heads, gamma, self.config.rms_eps);
            Ok(self.b.reshape_to(format!("{label}.rows"), normed, width))
        };
        Ok(Qkv {
            q: norm("q", p.q)?,
            k: norm("k", p.k)?,
            v: p.v,
        })
    }

    /// The RoPE table of a global (`local` false) or local layer: positions `0..context` in
    /// two levels of about `sqrt(context)` rows each (kilobytes even for a context of
    /// millions). Global layers' angles are scaled as the metadata says (and divided by
    /// `rope_freqs.weight`); local layers rotate with their own base, without scaling.
    fn rope_table(&mut self, local: bool) -> Result<NodeId, LlmError> {
        let c = self.config;
        // A model whose local layers use the global base shares one table.
        let local = local && c.rope_base_swa != c.rope_base;
        if let Some(t) = self.tables[usize::from(local)] {
            return Ok(t);
        }
        let shape = Shape::new(vec![
            u64::from(rope_table_rows(self.context)),
            u64::from(c.rope_dim),
        ]);
        let values = match self.source {
            Source::Listing(_) => Vec::new(),
            Source::File { .. } if local => {
                rope_table(f64::from(c.rope_base_swa), c.rope_dim, self.context)
            }
            Source::File { gguf, backing, .. } => {
                let factors = if c.rope_freq_factors {
                    gguf.dequantize_tensor((**backing).as_ref(), "rope_freqs.weight")?
                } else {
                    Vec::new()
                };
                let scale = match c.rope_scaling {
                    RopeScaling::None => 1.0,
                    RopeScaling::Linear { factor } => 1.0 / f64::from(factor),
                };
                rope_table_scaled(
                    f64::from(c.rope_base),
                    c.rope_dim,
                    self.context,
                    scale,
                    &factors,
                )
            }
        };
        self.weight_bytes += values.len() as u64 * 4;
        let label = if local {
            "rope_table_swa"
        } else {
            "rope_table"
        };
        let t = self.b.constant(label, shape, values);
        self.tables[usize::from(local)] = Some(t);
        Ok(t)
    }

    /// Q and K rotated by their positions (`pairs` says which elements of a head form a
    /// pair), with the table of the layer's kind.
    pub fn rope(&mut self, l: &Layer, p: Qkv, pairs: RopePairs) -> Result<Qkv, LlmError> {
        let table = self.rope_table(l.local)?;
        let rope = Rope {
            head_dim: self.config.head_dim,
            block: rope_block(self.context),
            interleaved: pairs == RopePairs::Adjacent,
        };
        Ok(Qkv {
            q: self
                .b
                .rope(l.name("q.rope"), p.q, self.positions, table, rope),
            k: self
                .b
                .rope(l.name("k.rope"), p.k, self.positions, table, rope),
            v: p.v,
        })
    }

    /// Grouped-query attention of layer `l`: the step's keys and values appended to the
    /// layer's cache (in place: a state of the runtime), the queries attending over the
    /// whole cache (within the window for a local layer). `[S, heads * head_dim]`.
    pub fn attend(&mut self, l: &Layer, p: Qkv) -> NodeId {
        let c = self.config;
        let (h, kvh, window) = (c.num_heads, c.num_kv_heads, c.window_of(l.index));
        let rows = match (self.cache, l.local) {
            (KvCache::Paged(_), true) => Dim::sym(labels::POOL_ROWS_SWA),
            (KvCache::Paged(_), false) => Dim::sym(labels::POOL_ROWS),
            // Sliding-window layers drop their oldest rows (the session keeps them bounded):
            // their caches hold fewer rows than the global layers', under a symbol of their
            // own.
            (KvCache::Contiguous, true) => Dim::sym("past_swa"),
            (KvCache::Contiguous, false) => Dim::sym("past"),
        };
        let kv = Dim::Fixed(u64::from(c.kv_len()));
        let i = l.index;
        let past_k = self
            .b
            .input(labels::past_k(i), &[rows.clone(), kv.clone()], self.kv);
        let past_v = self.b.input(labels::past_v(i), &[rows, kv], self.kv);
        // A cache of another type (f16) stores the step's rows converted.
        let p = if self.kv == DType::F32 {
            p
        } else {
            Qkv {
                q: p.q,
                k: self.b.node(l.name("k.cache"), Cast { to: self.kv }, &[p.k]),
                v: self.b.node(l.name("v.cache"), Cast { to: self.kv }, &[p.v]),
            }
        };
        let (kc, vc, attn) = match self.cache {
            KvCache::Paged(pg) => {
                // A sliding-window layer's own pool, slots and page table.
                let (slots, pages) = match l.local {
                    true => (pg.slots_swa, pg.pages_swa),
                    false => (pg.slots, pg.pages),
                };
                // The step's rows written into their slots of the pools, in place.
                let kc = self
                    .b
                    .scatter_rows(labels::present_k(i), past_k, p.k, slots);
                let vc = self
                    .b
                    .scatter_rows(labels::present_v(i), past_v, p.v, slots);
                let attn = self.b.paged_attention(
                    l.name("attn"),
                    [p.q, kc, vc, pg.rows, pages],
                    PagedAttention {
                        num_heads: h,
                        num_kv_heads: kvh,
                        window,
                        page_size: pg.page_size,
                    },
                );
                (kc, vc, attn)
            }
            KvCache::Contiguous => {
                // In-place concatenation: the runtime appends the step's rows to the cache.
                let kc = self.b.concat(labels::present_k(i), &[past_k, p.k], 0);
                let vc = self.b.concat(labels::present_v(i), &[past_v, p.v], 0);
                let attn = self.b.attention(
                    l.name("attn"),
                    p.q,
                    kc,
                    vc,
                    Attention {
                        num_heads: h,
                        num_kv_heads: kvh,
                        window,
                    },
                );
                (kc, vc, attn)
            }
        };
        self.presents.extend([kc, vc]);
        for (past, present) in [
            (labels::past_k(i), labels::present_k(i)),
            (labels::past_v(i), labels::present_v(i)),
        ] {
            self.states.push(StateBinding { past, present });
        }
        attn
    }

    /// Layer `l`'s output projection (`attn_output`) of the attention `a`.
    pub fn attn_output(&mut self, l: &Layer, a: NodeId) -> Result<NodeId, LlmError> {
        let c = self.config;
        self.project(
            l.name("attn_out"),
            a,
            &l.name("attn_output"),
            [c.q_len(), c.embedding_len],
        )
    }

    /// Layer `l`'s gated feed-forward of `h`: `down(act(gate(h)) * up(h))`.
    pub fn ffn(&mut self, l: &Layer, h: NodeId, act: Activation) -> Result<NodeId, LlmError> {
        let (w, f) = (self.config.embedding_len, self.config.ffn_len);
        let gate = self.project(l.name("ffn_gate"), h, &l.name("ffn_gate"), [w, f])?;
        let up = self.project(l.name("ffn_up"), h, &l.name("ffn_up"), [w, f])?;
        let a = match act {
            Activation::Silu => self.b.silu_mul(l.name("ffn_act"), gate, up),
            Activation::GeluTanh => {
                let g = self.b.unary(l.name("ffn_gelu"), UnaryOp::Gelu, gate);
                self.b.mul(l.name("ffn_act"), g, up)
            }
        };
        self.project(l.name("ffn_down"), a, &l.name("ffn_down"), [f, w])
    }

    /// The head: the last row of `x` (of each sequence, when paged) normalised with
    /// `output_norm` and projected to logits by `output.weight`, or by the embedding when the
    /// file has none (tied): the logits, which the architecture's builder returns.
    pub fn head(&mut self, x: NodeId) -> Result<NodeId, LlmError> {
        let last = match self.cache {
            KvCache::Paged(_) => {
                let at = self
                    .b
                    .input(labels::LOGIT_ROWS, &[Dim::sym("batch")], DType::I32);
                self.b.gather("last_rows", x, at)
            }
            KvCache::Contiguous => self.b.slice("last_row", x, &[0], &[-1], &[i64::MAX], &[1]),
        };
        let xf = self.norm(last, "output_norm")?;
        let c = self.config;
        let pieces = if c.tied_output {
            self.embedding.clone()
        } else {
            let dims = [u64::from(c.embedding_len), u64::from(c.vocab_size)];
            self.weight_pieces("output.weight", &dims)?
        };
        Ok(self.linear_pieces(labels::LOGITS.into(), xf, &pieces))
    }

    /// The graph: `logits` (the first output), then the presents in state order, then the
    /// tokens the `sample` op chooses (one per row of logits: one sequence on the
    /// contiguous cache, each sequence of a batched step on the paged one).
    fn finish(self, logits: NodeId) -> Result<ModelGraph, LlmError> {
        let mut b = self.b;
        b.output(logits);
        for pr in self.presents {
            b.output(pr);
        }
        let rows = match self.cache {
            KvCache::Contiguous => Dim::Fixed(1),
            KvCache::Paged(_) => Dim::sym("batch"),
        };
        append_sampling(&mut b, logits, rows);
        Ok(ModelGraph {
            graph: b.build()?,
            states: self.states,
            weight_bytes: self.weight_bytes,
        })
    }
}

/// Every tensor `config`'s architecture reads, with its dims in ggml order (innermost
/// first), in the order its builder reads them: the builder run without a file.
pub(crate) fn tensors_read(config: &ModelConfig) -> Vec<(String, Vec<u64>)> {
    let mut blocks = Blocks::new(config, Source::Listing(Vec::new()), 1, None, DType::F32);
    // Reading nothing, the blocks cannot fail: what was listed is all there is.
    let _ = (config.arch.build)(&mut blocks);
    match blocks.source {
        Source::Listing(list) => list,
        Source::File { .. } => Vec::new(),
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
    let source = Source::File {
        gguf,
        backing,
        format,
        max_binding,
    };
    let mut blocks = Blocks::new(config, source, context, page_size, kv);
    let logits = (config.arch.build)(&mut blocks)?;
    blocks.finish(logits)
}
