//! `fused_linear`: a [`super::Linear`] with the work of its neighbours folded in — an RMSNorm
//! of x before the product; after it a gated activation of two projections, a bias, an
//! RMSNorm of each head, a RoPE rotation, an RMSNorm of the row and a residual — and the
//! query, key and value projections of an attention block as one, whose key and value rows
//! go to a KV cache ([`KvRows`]). The graph rewrites of [`crate::graph::fuse`] make these
//! nodes out of `rms_norm`, `linear`, `add`, `silu_mul` / `gelu` + `mul`, `rope`, `concat`
//! and `scatter_rows` nodes, so a decoder layer runs five dispatches (seven with post-norms,
//! each finished by a second dispatch); the kernels are the
//! `linear` ones of `src/gpu/kernels/quant.rs` with a prologue and an epilogue.

use super::attention::{matrix, Rope};
use super::linear::{self, Linear};
use super::{DTypeError, InferError, OpDef};
use crate::graph::reference::{RefError, RefTensor, Values};
use crate::shape::{DType, Shape};

/// The activation of a gated projection: `act(x · gateᵀ) * (x · upᵀ)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateAct {
    /// `silu(g) * u` (SwiGLU), as the `silu_mul` op computes it.
    Silu,
    /// `gelu_tanh(g) * u` (GeGLU, Gemma), as the `gelu` and `mul` ops compute it.
    GeluTanh,
}

impl GateAct {
    /// `act(g) * u` in f64, as the references of the unfused ops compute it.
    pub fn apply(self, g: f64, u: f64) -> f64 {
        match self {
            GateAct::Silu => g / (1.0 + (-g).exp()) * u,
            GateAct::GeluTanh => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * g * (1.0 + (c * (g + 0.044715 * g * g * g)).tanh()) * u
            }
        }
    }

    /// The code of the kernel's `EPILOGUE` constant (bits 2 and 3, `shaders/quant.wgsl`).
    pub fn code(self) -> u32 {
        match self {
            GateAct::Silu => 1,
            GateAct::GeluTanh => 2,
        }
    }
}

/// The query, key and value projections as one: the weight comes as three inputs side by
/// side (queries `[Nq, K]`, keys and values `[kv_rows, K]` each), the output holds the
/// queries, and the key and value rows are the [`KvRows`] of the node, which the runtime
/// writes straight into the layer's KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvSplit {
    /// Rows of the keys (and of the values): `kv_heads * head_dim`.
    pub kv_rows: u32,
    /// The cache is a pool written at slots (the slots follow the positions in the integer
    /// input); else the step's rows are appended to it.
    pub slots: bool,
}

/// An RMSNorm of each head of the product (Gemma's and Qwen3's Q/K norms): groups of
/// `head_dim` outputs normalised with `head_dim` weights shared by the heads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeadNorm {
    /// Elements per head.
    pub head_dim: u32,
    /// Epsilon.
    pub eps: f32,
}

/// `y = post?(rope?(head_norm?(act?( norm?(x) · wᵀ ) + bias?))) + residual?`, with the
/// key and value rows of a [`KvSplit`] taken out to the cache.
///
/// Inputs, in this order:
/// * x f32 `[..., K]`;
/// * w `[N', K]` in any format of [`crate::formats`] (as [`Linear`]); with `kv`, three
///   weights (queries, keys, values), each in its own format, `N' = Nq + 2 kv_rows`;
/// * the parameters, f32, one vector of what the op folds in, in this order: gamma of the
///   norm (`K`), the bias (`N'`), the head norms' weights (`head_dim` each: one, or with
///   `kv` the queries' then the keys'), the post-norm's (`N`);
/// * with `residual`, r f32 of the output's shape;
/// * with `rope` or with the slots of a `kv`, the integers (i32): the positions `[S]` of
///   the rope op, then with `kv.slots` the slots `[S]` (one vector `[2S]`);
/// * with `rope`, its cos/sin table.
///
/// Output f32 `[..., N]`: `N = N'`, half of it with a gate, `Nq` with `kv`.
///
/// * `norm = Some(eps)`: x is first RMS-normalised over its last dimension (the `rms_norm`
///   op on the last axis).
/// * `gate = Some(act)`: w holds the gate rows then the up rows (`N' = 2N`) and `y[..., n] =
///   act(g_n) * u_n`; not with a bias, head norms or `kv`.
/// * `bias`: `+ bias[n]` on each of the `N'` products.
/// * `head_norm`: each head of the product (with `kv`, of the queries and of the keys) is
///   RMS-normalised as the `rms_norm` op normalises rows of `head_dim`.
/// * `rope = Some(r)`: the product (x `[S, K]`) is rotated as the `rope` op `r` rotates its
///   input (with `kv`, the queries and the keys; the values are not rotated).
/// * `post_norm = Some(eps)`: the output row is RMS-normalised (Gemma's post-norms).
/// * `residual`: `y += r` elementwise (same shape, no broadcasting).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FusedLinear {
    /// RMSNorm of x with this epsilon (and the gamma of the parameters) before the product.
    pub norm: Option<f32>,
    /// Gated activation of the two halves of the weight.
    pub gate: Option<GateAct>,
    /// A residual input added to the output.
    pub residual: bool,
    /// RoPE of the product, with the positions and table inputs.
    pub rope: Option<Rope>,
    /// A bias (in the parameters) added to the product.
    pub bias: bool,
    /// Queries, keys and values as one projection, the keys and values to a KV cache.
    pub kv: Option<KvSplit>,
    /// RMSNorm of each head of the product (weights in the parameters).
    pub head_norm: Option<HeadNorm>,
    /// RMSNorm of the output row with this epsilon before the residual (weights in the
    /// parameters).
    pub post_norm: Option<f32>,
}

/// The plain linear as a fused one (nothing folded in).
pub const PLAIN: FusedLinear = FusedLinear {
    norm: None,
    gate: None,
    residual: false,
    rope: None,
    bias: false,
    kv: None,
    head_norm: None,
    post_norm: None,
};

/// Where the parts of the parameters input start, and its length (elements).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ParamOffsets {
    /// Gamma of the norm of x.
    pub gamma: usize,
    /// The bias.
    pub bias: usize,
    /// The head norms' weights (the queries', then with `kv` the keys').
    pub head_norm: usize,
    /// The post-norm's weights.
    pub post_norm: usize,
    /// Elements in all.
    pub len: usize,
}

impl FusedLinear {
    /// Weight inputs: 3 with `kv` (queries, keys, values), else 1.
    pub fn weights(&self) -> usize {
        if self.kv.is_some() {
            3
        } else {
            1
        }
    }

    /// Whether the op has a parameters input.
    pub fn has_params(&self) -> bool {
        self.norm.is_some() || self.bias || self.head_norm.is_some() || self.post_norm.is_some()
    }

    /// Input position of the parameters.
    pub fn params_input(&self) -> Option<usize> {
        self.has_params().then_some(1 + self.weights())
    }

    /// Input position of the residual (with `residual`).
    pub fn residual_input(&self) -> Option<usize> {
        self.residual
            .then_some(1 + self.weights() + usize::from(self.has_params()))
    }

    /// Whether the op has an integer input (positions, slots).
    pub fn has_ints(&self) -> bool {
        self.rope.is_some() || self.kv.is_some_and(|k| k.slots)
    }

    /// Input position of the integers (positions, then slots).
    pub fn ints_input(&self) -> Option<usize> {
        self.has_ints().then_some(
            1 + self.weights() + usize::from(self.has_params()) + usize::from(self.residual),
        )
    }

    /// Input position of the RoPE table (with `rope`).
    pub fn table_input(&self) -> Option<usize> {
        self.rope.and(self.ints_input()).map(|i| i + 1)
    }

    /// Inputs of the node in the graph.
    pub fn graph_inputs(&self) -> usize {
        1 + self.weights()
            + usize::from(self.has_params())
            + usize::from(self.residual)
            + usize::from(self.has_ints())
            + usize::from(self.rope.is_some())
    }

    /// Head-norm weight vectors in the parameters: with `kv` the queries' and the keys'.
    fn head_norms(&self) -> usize {
        match (self.head_norm, self.kv) {
            (None, _) => 0,
            (Some(_), Some(_)) => 2,
            (Some(_), None) => 1,
        }
    }

    /// Where each part of the parameters starts, for `K` inputs, `n_all` weight rows and
    /// `n_out` outputs.
    pub fn param_offsets(&self, k: usize, n_all: usize, n_out: usize) -> ParamOffsets {
        let mut at = 0;
        let mut take = |present: bool, len: usize| {
            let start = at;
            if present {
                at += len;
            }
            start
        };
        let gamma = take(self.norm.is_some(), k);
        let bias = take(self.bias, n_all);
        let d = self.head_norm.map_or(0, |h| h.head_dim as usize);
        let head_norm = take(self.head_norm.is_some(), d * self.head_norms());
        let post_norm = take(self.post_norm.is_some(), n_out);
        ParamOffsets {
            gamma,
            bias,
            head_norm,
            post_norm,
            len: at,
        }
    }

    /// The rows of the product, all `N'` (gate and up rows made one output each with a
    /// gate): x `[S, K]` (its leading dimensions flattened) times the weights, with the
    /// norm of x, the activation, the bias, the head norms and RoPE; not the post-norm and
    /// the residual, which apply to the output only. Returns the values `[S, n]` and `n`.
    fn products(&self, inputs: &[&RefTensor]) -> Result<(Vec<f32>, usize), RefError> {
        let x = inputs[0].floats("fused_linear")?;
        let k = inputs[1].shape.dims()[1] as usize;
        let mut w: Vec<f32> = Vec::new();
        for t in &inputs[1..1 + self.weights()] {
            w.extend_from_slice(t.floats("fused_linear")?);
        }
        let n_all = w.len() / k.max(1);
        let rows = x.len() / k.max(1);
        let n = if self.gate.is_some() {
            n_all / 2
        } else {
            n_all
        };
        let params = match self.params_input() {
            Some(i) => inputs[i].floats("fused_linear")?,
            None => &[],
        };
        let n_out = match self.kv {
            Some(kv) => n_all - 2 * kv.kv_rows as usize,
            None => n,
        };
        let at = self.param_offsets(k, n_all, n_out);
        let dot = |xr: &[f64], j: usize| -> f64 {
            let wr = &w[j * k..(j + 1) * k];
            xr.iter().zip(wr).map(|(&a, &b)| a * f64::from(b)).sum()
        };
        let mut y = Vec::with_capacity(rows * n);
        for r in 0..rows {
            let raw = &x[r * k..(r + 1) * k];
            let xr: Vec<f64> = match self.norm {
                Some(eps) => {
                    let g = &params[at.gamma..at.gamma + k];
                    let ms = raw.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / k as f64;
                    let inv = 1.0 / (ms + f64::from(eps)).sqrt();
                    // Rounded to f32 as the rms_norm op's output is.
                    raw.iter()
                        .zip(g)
                        .map(|(&v, &g)| f64::from((f64::from(v) * inv * f64::from(g)) as f32))
                        .collect()
                }
                None => raw.iter().map(|&v| f64::from(v)).collect(),
            };
            for j in 0..n {
                let v = match self.gate {
                    Some(act) => {
                        let (g, u) = (dot(&xr, j) as f32, dot(&xr, n + j) as f32);
                        act.apply(f64::from(g), f64::from(u)) as f32
                    }
                    None => dot(&xr, j) as f32,
                };
                // The add op's rounding.
                y.push(match self.bias {
                    true => v + params[at.bias + j],
                    false => v,
                });
            }
        }
        // The rows that are heads of queries and keys: all of them without `kv`.
        let rotated = match self.kv {
            Some(kv) => n - kv.kv_rows as usize,
            None => n,
        };
        if let Some(h) = self.head_norm {
            let d = h.head_dim as usize;
            for r in 0..rows {
                for head in 0..rotated / d.max(1) {
                    let start = r * n + head * d;
                    // With `kv`, the keys' heads start at Nq and take the second weights.
                    let second = self.kv.is_some() && head * d >= n_out;
                    let g = &params[at.head_norm + usize::from(second) * d..][..d];
                    rms_norm_in_place(&mut y[start..start + d], g, h.eps);
                }
            }
        }
        if let (Some(rope), Some(i), Some(t)) = (self.rope, self.ints_input(), self.table_input()) {
            let positions = RefTensor {
                shape: Shape::new(vec![rows as u64]),
                dtype: DType::I32,
                values: Values::Int(inputs[i].ints("fused_linear")?[..rows].to_vec()),
            };
            // Queries, then keys: each rotated as the rope op rotates it.
            let parts: &[(usize, usize)] = &[(0, n_out), (n_out, rotated)];
            let parts = if self.kv.is_some() {
                parts
            } else {
                &parts[..1]
            };
            for &(from, to) in parts {
                let width = if self.kv.is_some() { to - from } else { n };
                let mut part = Vec::with_capacity(rows * width);
                for r in 0..rows {
                    part.extend_from_slice(&y[r * n + from..r * n + from + width]);
                }
                let shape = Shape::new(vec![rows as u64, width as u64]);
                let t_part = RefTensor::from_f32(shape.clone(), DType::F32, part);
                let out = rope.reference(&[&t_part, &positions, inputs[t]], &shape, DType::F32)?;
                let out = RefTensor {
                    shape,
                    dtype: DType::F32,
                    values: out,
                };
                let out = out.floats("fused_linear")?;
                for r in 0..rows {
                    y[r * n + from..r * n + from + width]
                        .copy_from_slice(&out[r * width..(r + 1) * width]);
                }
            }
        }
        Ok((y, n))
    }

    /// The key (`values` false) or value rows of a node with `kv`, `[S, kv_rows]`: what
    /// [`KvRows`] holds (the graph evaluator calls it with the node's inputs).
    ///
    /// # Errors
    /// [`RefError`] for inputs the reference cannot read; [`RefError::Producer`] for an op
    /// without `kv`.
    pub fn reference_kv(&self, inputs: &[&RefTensor], values: bool) -> Result<Values, RefError> {
        let kv = self.kv.ok_or(RefError::Producer { op: "kv_rows" })?;
        let (y, n) = self.products(inputs)?;
        let rows = kv.kv_rows as usize;
        let from = n - 2 * rows + usize::from(values) * rows;
        let out = y
            .chunks(n.max(1))
            .flat_map(|r| r[from..from + rows].iter().copied())
            .collect();
        Ok(Values::F32(out))
    }
}

/// `x / sqrt(mean(x²) + eps) * gamma` in f64, rounded to f32, as the `rms_norm` op computes
/// one row.
fn rms_norm_in_place(x: &mut [f32], gamma: &[f32], eps: f32) {
    let ms = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / x.len().max(1) as f64;
    let inv = 1.0 / (ms + f64::from(eps)).sqrt();
    for (v, &g) in x.iter_mut().zip(gamma) {
        *v = (f64::from(*v) * inv * f64::from(g)) as f32;
    }
}

impl OpDef for FusedLinear {
    fn name(&self) -> &'static str {
        "fused_linear"
    }
    fn arity(&self) -> (usize, usize) {
        let n = self.graph_inputs();
        (n, n)
    }
    /// x f32, weights any format of [`crate::formats`], parameters, residual and table f32,
    /// integers i32; output f32.
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        Linear.output_dtype(&inputs[..inputs.len().min(2)])?;
        let weights = 1..1 + self.weights();
        let ints = self.ints_input();
        for (i, &d) in inputs.iter().enumerate().skip(2) {
            if weights.contains(&i) {
                Linear
                    .output_dtype(&[DType::F32, d])
                    .map_err(|_| DTypeError::at(i, crate::formats::dtype_names()))?;
            } else if Some(i) == ints {
                if d != DType::I32 {
                    return Err(DTypeError::at(i, "i32 (positions, slots)"));
                }
            } else if d != DType::F32 {
                return Err(DTypeError::at(i, "f32"));
            }
        }
        Ok(DType::F32)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        infer(self, inputs)
    }
    /// The unfused ops' references in a row: RMSNorm in f64, the product with f64
    /// accumulation, the activation, the bias, the head norms, the `rope` op's reference,
    /// the post-norm and the residual.
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let (mut y, n) = self.products(inputs)?;
        let k = inputs[1].shape.dims()[1] as usize;
        let n_out = out.dims().last().copied().unwrap_or(0) as usize;
        if n_out != n {
            // `kv`: the queries only.
            y = y
                .chunks(n.max(1))
                .flat_map(|r| r[..n_out].iter().copied())
                .collect();
        }
        if let (Some(eps), Some(i)) = (self.post_norm, self.params_input()) {
            let params = inputs[i].floats("fused_linear")?;
            let n_all: u64 = inputs[1..1 + self.weights()]
                .iter()
                .map(|t| t.shape.dims()[0])
                .sum();
            let at = self.param_offsets(k, n_all as usize, n_out);
            let g = &params[at.post_norm..at.post_norm + n_out];
            for row in y.chunks_mut(n_out.max(1)) {
                rms_norm_in_place(row, g, eps);
            }
        }
        if let Some(i) = self.residual_input() {
            let res = inputs[i].floats("fused_linear")?;
            for (v, &r) in y.iter_mut().zip(res) {
                *v += r;
            }
        }
        Ok(Values::F32(y))
    }
}

/// The shape rule: [`linear::infer`] of x and each weight (the same `K`), the last dimension
/// halved for a gated projection (whose weight rows must then be even) or the queries' with
/// `kv`; the parameters must hold their parts ([`FusedLinear::param_offsets`]), the
/// residual must have the output's shape, the integers `[S]` (`[2S]` with slots) for x `[S,
/// K]`, heads must divide what they normalise or rotate.
///
/// # Errors
/// [`linear::infer`]'s errors; [`InferError::Mismatch`] or [`InferError::Invalid`] for
/// anything else that does not fit.
pub fn infer(op: &FusedLinear, inputs: &[&Shape]) -> Result<Shape, InferError> {
    let x = inputs[0];
    let mismatch = |what: &'static str, right: &Shape| InferError::Mismatch {
        what,
        left: x.clone(),
        right: right.clone(),
    };
    let invalid = |reason: &str| InferError::Invalid {
        op: "fused_linear",
        reason: reason.into(),
    };
    let mut out = linear::infer(x, inputs[1])?;
    let k = x.dims()[x.rank() - 1];
    let last = out.rank() - 1;
    let mut n_all = inputs[1].dims()[0];
    if let Some(kv) = op.kv {
        if op.gate.is_some() {
            return Err(invalid("a gate does not go with a KV split"));
        }
        for &w in &inputs[2..4] {
            linear::infer(x, w)?;
            if w.dims()[0] != u64::from(kv.kv_rows) {
                return Err(mismatch(
                    "fused_linear: the key and value weights must have kv_rows rows",
                    w,
                ));
            }
            n_all += w.dims()[0];
        }
    }
    if op.gate.is_some() {
        if n_all % 2 != 0 {
            return Err(mismatch(
                "fused_linear: a gated weight holds gate and up rows, an even count",
                inputs[1],
            ));
        }
        if op.bias || op.head_norm.is_some() {
            return Err(invalid("a gate does not go with a bias or head norms"));
        }
        out.0[last] = n_all / 2;
    }
    let n_out = out.dims()[last];
    // Rows of queries and keys: what head norms and RoPE see.
    let rotated = match op.kv {
        Some(kv) => n_out + u64::from(kv.kv_rows),
        None => n_out,
    };
    if let Some(h) = op.head_norm {
        let d = u64::from(h.head_dim);
        let kv_ok = op.kv.is_none_or(|kv| u64::from(kv.kv_rows) % d.max(1) == 0);
        if d == 0 || n_out % d != 0 || !kv_ok {
            return Err(invalid("head_dim must divide the queries and the keys"));
        }
    }
    if let Some(i) = op.params_input() {
        let p = inputs[i];
        let want = op
            .param_offsets(k as usize, n_all as usize, n_out as usize)
            .len;
        if p.rank() != 1 || p.dims()[0] != want as u64 {
            return Err(mismatch(
                "fused_linear: the parameters must be one vector of the parts folded in",
                p,
            ));
        }
    }
    if let Some(i) = op.ints_input() {
        let (s, _) = matrix(x, 0, "[S, K] (x of a projection with positions or slots)")?;
        let per_row = 1 + u64::from(op.rope.is_some() && op.kv.is_some_and(|kv| kv.slots));
        if inputs[i].dims() != [per_row * s] {
            return Err(mismatch(
                "fused_linear: the integers must be the positions (and the slots) of x's rows",
                inputs[i],
            ));
        }
    }
    if let (Some(rope), Some(i), Some(t)) = (op.rope, op.ints_input(), op.table_input()) {
        if op.gate.is_some() {
            return Err(invalid("a RoPE epilogue does not follow a gate"));
        }
        let s = x.dims()[0];
        let positions = Shape::new(vec![s]);
        debug_assert!(i < t);
        rope.infer(&[&Shape::new(vec![s, rotated]), &positions, inputs[t]], &[])?;
        if op.head_norm.is_some_and(|h| h.head_dim != rope.head_dim) {
            return Err(invalid("the head norms and RoPE must have one head_dim"));
        }
        if op.kv.is_some() {
            rope.infer(&[&Shape::new(vec![s, n_out]), &positions, inputs[t]], &[])?;
        }
    }
    if let Some(r) = op.residual_input().map(|i| inputs[i]) {
        if *r != out {
            return Err(InferError::Mismatch {
                what: "fused_linear: the residual must have the output's shape",
                left: out,
                right: r.clone(),
            });
        }
    }
    Ok(out)
}

/// The key (`values` false) or value rows of the [`FusedLinear`] with a [`KvSplit`] that is
/// its input: `[S, rows]`. No device work: that node's kernel writes them into the KV cache
/// whose present reads them (a `concat` of the past and them, or a `scatter_rows` of them
/// into the pool), which is the only reader the runtime accepts. The graph evaluator takes
/// their values from that node's inputs ([`FusedLinear::reference_kv`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvRows {
    /// The values' rows (else the keys').
    pub values: bool,
    /// Rows: [`KvSplit::kv_rows`].
    pub rows: u32,
}

impl OpDef for KvRows {
    fn name(&self) -> &'static str {
        "kv_rows"
    }
    fn arity(&self) -> (usize, usize) {
        (1, 1)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        match inputs.first() {
            Some(DType::F32) => Ok(DType::F32),
            _ => Err(DTypeError::at(0, "f32 (a fused_linear with a KV split)")),
        }
    }
    /// The queries' leading dimensions, `rows` wide.
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        let (s, _) = matrix(inputs[0], 0, "[S, Nq] (the queries of the projection)")?;
        Ok(Shape::new(vec![s, u64::from(self.rows)]))
    }
    /// Evaluated with its producer's inputs by the graph evaluator, not on its own.
    fn reference(&self, _: &[&RefTensor], _: &Shape, _: DType) -> Result<Values, RefError> {
        Err(RefError::Producer { op: "kv_rows" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::reference::eval_op;
    use crate::graph::Op;

    fn s(d: &[u64]) -> Shape {
        Shape(d.to_vec())
    }

    const ALL: FusedLinear = FusedLinear {
        norm: Some(1e-5),
        gate: Some(GateAct::Silu),
        residual: true,
        ..PLAIN
    };

    #[test]
    fn shape_and_dtype_rules() {
        let i = |op: &FusedLinear, shapes: &[&[u64]]| {
            let v: Vec<Shape> = shapes.iter().map(|d| s(d)).collect();
            let r: Vec<&Shape> = v.iter().collect();
            infer(op, &r)
        };
        assert_eq!(
            i(&ALL, &[&[3, 64], &[10, 64], &[64], &[3, 5]]).unwrap(),
            s(&[3, 5])
        );
        assert!(i(&ALL, &[&[3, 64], &[9, 64], &[64], &[3, 4]]).is_err());
        assert!(i(&ALL, &[&[3, 64], &[10, 64], &[32], &[3, 5]]).is_err());
        assert!(i(&ALL, &[&[3, 64], &[10, 64], &[64], &[1, 5]]).is_err());
        let plain_res = FusedLinear {
            residual: true,
            ..PLAIN
        };
        assert_eq!(
            i(&plain_res, &[&[2, 32], &[7, 32], &[2, 7]]).unwrap(),
            s(&[2, 7])
        );
        assert_eq!(ALL.arity(), (4, 4));
        assert_eq!(plain_res.residual_input(), Some(2));
        assert_eq!(
            ALL.output_dtype(&[DType::F32, DType::Q4_1, DType::F32, DType::F32]),
            Ok(DType::F32)
        );
        assert_eq!(
            ALL.output_dtype(&[DType::F32, DType::Q4_1, DType::F16, DType::F32]),
            Err(DTypeError::at(2, "f32"))
        );
        // Q/K/V as one with the norm, biases, head norms and RoPE on heads of 8: queries 16,
        // keys and values 8 each; the parameters: gamma 32, bias 32, head norms 2 x 8.
        let rope = Rope {
            head_dim: 8,
            block: 4,
            interleaved: false,
        };
        let qkv = FusedLinear {
            norm: Some(1e-6),
            bias: true,
            kv: Some(KvSplit {
                kv_rows: 8,
                slots: true,
            }),
            head_norm: Some(HeadNorm {
                head_dim: 8,
                eps: 1e-6,
            }),
            rope: Some(rope),
            ..PLAIN
        };
        let ok: [&[u64]; 7] = [
            &[3, 32],
            &[16, 32],
            &[8, 32],
            &[8, 32],
            &[80],
            &[6],
            &[8, 8],
        ];
        assert_eq!(i(&qkv, &ok).unwrap(), s(&[3, 16]));
        assert_eq!(qkv.arity(), (7, 7));
        assert_eq!(
            (qkv.params_input(), qkv.ints_input(), qkv.table_input()),
            (Some(4), Some(5), Some(6))
        );
        let mut bad = ok;
        bad[4] = &[72];
        assert!(i(&qkv, &bad).is_err(), "parameters without the keys' norm");
        let mut bad = ok;
        bad[5] = &[3];
        assert!(i(&qkv, &bad).is_err(), "positions without slots");
        let mut bad = ok;
        bad[3] = &[16, 32];
        assert!(i(&qkv, &bad).is_err(), "values of another width");
        assert_eq!(
            qkv.output_dtype(&[
                DType::F32,
                DType::Q5_0,
                DType::Q5_0,
                DType::Q8_0,
                DType::F32,
                DType::I32,
                DType::F32
            ]),
            Ok(DType::F32)
        );
        assert_eq!(
            KvRows {
                values: true,
                rows: 8
            }
            .infer(&[&s(&[3, 16])], &[])
            .unwrap(),
            s(&[3, 8])
        );
    }

    #[test]
    fn reference_is_the_unfused_chain() {
        // x = [3, 4] (rms 3.5355), gamma = [2, 1]; w rows: gate [1, 0], up [0, 1].
        let x = RefTensor::from_f32(s(&[1, 2]), DType::F32, vec![3.0, 4.0]);
        let w = RefTensor::from_f32(s(&[2, 2]), DType::F32, vec![1.0, 0.0, 0.0, 1.0]);
        let g = RefTensor::from_f32(s(&[2]), DType::F32, vec![2.0, 1.0]);
        let r = RefTensor::from_f32(s(&[1, 1]), DType::F32, vec![0.5]);
        let y = eval_op(&Op::FusedLinear(ALL), &[&x, &w, &g, &r], &s(&[1, 1])).unwrap();
        let inv = 1.0 / (12.5f64 + 1e-5).sqrt();
        let (gv, uv) = (3.0 * inv * 2.0, 4.0 * inv);
        let want = (gv / (1.0 + (-gv).exp()) * uv + 0.5) as f32;
        assert!(
            (y.to_f32()[0] - want).abs() < 1e-6,
            "{:?} vs {want}",
            y.to_f32()
        );
        // A post-norm of the product [3, 4] with weights [1, 2], then the residual [1, 1].
        let post = FusedLinear {
            residual: true,
            post_norm: Some(0.0),
            ..PLAIN
        };
        let w = RefTensor::from_f32(s(&[2, 2]), DType::F32, vec![1.0, 0.0, 0.0, 1.0]);
        let p = RefTensor::from_f32(s(&[2]), DType::F32, vec![1.0, 2.0]);
        let r = RefTensor::from_f32(s(&[1, 2]), DType::F32, vec![1.0, 1.0]);
        let y = eval_op(&Op::FusedLinear(post), &[&x, &w, &p, &r], &s(&[1, 2])).unwrap();
        let inv = 1.0 / 12.5f64.sqrt();
        let want = [(3.0 * inv + 1.0) as f32, (8.0 * inv + 1.0) as f32];
        assert!(
            y.to_f32()
                .iter()
                .zip(want)
                .all(|(a, b)| (a - b).abs() < 1e-6),
            "{:?} vs {want:?}",
            y.to_f32()
        );
        // Keys and values of a split with biases: x [1, 2] times weights q [1, 0], k [0, 1],
        // v [1, 1], plus biases 10, 20, 30.
        let qkv = FusedLinear {
            bias: true,
            kv: Some(KvSplit {
                kv_rows: 1,
                slots: false,
            }),
            ..PLAIN
        };
        let t = |rows: u64, v: Vec<f32>| RefTensor::from_f32(s(&[rows, 2]), DType::F32, v);
        let (wq, wk, wv) = (
            t(1, vec![1.0, 0.0]),
            t(1, vec![0.0, 1.0]),
            t(1, vec![1.0, 1.0]),
        );
        let b = RefTensor::from_f32(s(&[3]), DType::F32, vec![10.0, 20.0, 30.0]);
        let ins = [&x, &wq, &wk, &wv, &b];
        let q = eval_op(&Op::FusedLinear(qkv), &ins, &s(&[1, 1])).unwrap();
        assert_eq!(q.to_f32(), [13.0]);
        assert_eq!(
            qkv.reference_kv(&ins, false).unwrap(),
            Values::F32(vec![24.0])
        );
        assert_eq!(
            qkv.reference_kv(&ins, true).unwrap(),
            Values::F32(vec![37.0])
        );
    }
}
