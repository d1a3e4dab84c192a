//! BERT as a graph with symbolic `batch` and `seq`, and the pooling that turns token vectors
//! into sentence vectors (appended to this graph or to an imported ONNX encoder).
//!
//! Inputs of [`build_bert`]'s graph: `input_ids` `[batch, seq]` i32, `attention_mask`
//! `[batch, seq]` f32 (1 for a token, 0 for padding) and `position_ids` `[seq]` i32; output
//! `sentence_embedding` `[batch, hidden]` f32.

use super::config::{BertConfig, Pipeline, Pooling};
use super::SentenceError;
use crate::graph::ops::{BinaryOp, Reduce, ReduceAxes, ReduceKind, UnaryOp};
use crate::graph::{Dim, Graph, GraphBuilder, NodeId};
use crate::safetensors::{SafeTensors, SafetensorsError};
use crate::shape::{DType, Shape};
use crate::tensor::{Backing, ConstData};

/// The output's label.
pub const OUTPUT: &str = "sentence_embedding";

/// The weights of a BERT encoder: a checked safetensors index over its bytes. Names are
/// Hugging Face's (`embeddings.word_embeddings.weight`, `encoder.layer.0.attention.self.query.weight`,
/// ...), with or without the `bert.` prefix of a model saved with a head.
pub struct BertWeights<'a> {
    index: &'a SafeTensors,
    backing: Backing,
    prefix: &'static str,
}

impl<'a> BertWeights<'a> {
    /// The weights of `index`, whose bytes are `backing` (the whole file).
    pub fn new(index: &'a SafeTensors, backing: Backing) -> Self {
        let prefix = if index
            .tensor("bert.embeddings.word_embeddings.weight")
            .is_ok()
        {
            "bert."
        } else {
            ""
        };
        BertWeights {
            index,
            backing,
            prefix,
        }
    }

    /// Tensor `name` (without the prefix), which must be f32 `dims`, as a constant node.
    fn constant(
        &self,
        b: &mut GraphBuilder,
        name: &str,
        dims: &[usize],
    ) -> Result<NodeId, SafetensorsError> {
        let full = format!("{}{name}", self.prefix);
        let dims: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        let t = self.index.expect(&full, DType::F32, &dims)?;
        let data = ConstData::slice(self.backing.clone(), t.range.clone())
            .map_err(|_| SafetensorsError::Missing { name: full.clone() })?;
        Ok(b.constant_bytes(full, Shape::new(dims), DType::F32, data))
    }

    /// [`BertWeights::constant`] times `factor`: a copy on the host.
    fn constant_scaled(
        &self,
        b: &mut GraphBuilder,
        name: &str,
        dims: &[usize],
        factor: f32,
    ) -> Result<NodeId, SafetensorsError> {
        let full = format!("{}{name}", self.prefix);
        let shape: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        let t = self.index.expect(&full, DType::F32, &shape)?;
        let data = ConstData::slice(self.backing.clone(), t.range.clone())
            .map_err(|_| SafetensorsError::Missing { name: full.clone() })?;
        let values: Vec<f32> = data
            .bytes()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * factor)
            .collect();
        Ok(b.constant(format!("{full}*{factor}"), Shape::new(shape), values))
    }

    /// Row `row` of tensor `name` (f32 `[rows, width]`) as a constant `[width]`.
    fn row(
        &self,
        b: &mut GraphBuilder,
        name: &str,
        rows: usize,
        width: usize,
        row: usize,
    ) -> Result<NodeId, SafetensorsError> {
        let full = format!("{}{name}", self.prefix);
        let t = self
            .index
            .expect(&full, DType::F32, &[rows as u64, width as u64])?;
        let start = t.range.start + row * width * 4;
        let data = ConstData::slice(self.backing.clone(), start..start + width * 4)
            .map_err(|_| SafetensorsError::Missing { name: full.clone() })?;
        Ok(b.constant_bytes(
            format!("{full}[{row}]"),
            Shape::new(vec![width as u64]),
            DType::F32,
            data,
        ))
    }
}

fn scalar(b: &mut GraphBuilder, label: &str, v: f32) -> NodeId {
    b.constant(label, Shape::new(Vec::<u64>::new()), vec![v])
}

fn reduce(b: &mut GraphBuilder, label: String, kind: ReduceKind, x: NodeId, keep: bool) -> NodeId {
    b.node(
        label,
        Reduce {
            kind,
            axes: ReduceAxes::List(vec![1]),
            keepdims: keep,
        },
        &[x],
    )
}

/// `linear(x, w) + bias` with the weight `[out, in]` of `name.weight`.
fn dense(
    b: &mut GraphBuilder,
    w: &BertWeights<'_>,
    name: &str,
    x: NodeId,
    out: usize,
    inp: usize,
) -> Result<NodeId, SafetensorsError> {
    dense_scaled(b, w, name, x, (out, inp), 1.0)
}

/// [`dense`] of weight and bias times `factor` (1: the file's bytes, no copy).
fn dense_scaled(
    b: &mut GraphBuilder,
    w: &BertWeights<'_>,
    name: &str,
    x: NodeId,
    (out, inp): (usize, usize),
    factor: f32,
) -> Result<NodeId, SafetensorsError> {
    let (wn, bn) = (format!("{name}.weight"), format!("{name}.bias"));
    let (weight, bias) = if factor == 1.0 {
        (
            w.constant(b, &wn, &[out, inp])?,
            w.constant(b, &bn, &[out])?,
        )
    } else {
        (
            w.constant_scaled(b, &wn, &[out, inp], factor)?,
            w.constant_scaled(b, &bn, &[out], factor)?,
        )
    };
    let y = b.node(
        format!("{name}/linear"),
        crate::graph::ops::Linear,
        &[x, weight],
    );
    Ok(b.add(format!("{name}/out"), y, bias))
}

fn norm(
    b: &mut GraphBuilder,
    w: &BertWeights<'_>,
    name: &str,
    x: NodeId,
    hidden: usize,
    eps: f32,
) -> Result<NodeId, SafetensorsError> {
    let gamma = w.constant(b, &format!("{name}.weight"), &[hidden])?;
    let beta = w.constant(b, &format!("{name}.bias"), &[hidden])?;
    Ok(b.layer_norm(format!("{name}/out"), x, gamma, beta, eps))
}

/// BERT with `pipeline`'s pooling and normalization, from `weights`.
///
/// # Errors
/// [`SentenceError::Weights`] naming a tensor that is missing or of another type or shape
/// than `config` asks for; [`SentenceError::Graph`].
pub fn build_bert(
    config: &BertConfig,
    weights: &BertWeights<'_>,
    pipeline: &Pipeline,
) -> Result<Graph, SentenceError> {
    let c = config;
    let (h, heads, dh) = (c.hidden_size, c.num_heads, c.head_dim());
    let mut b = GraphBuilder::new();
    let batch_seq = [Dim::sym("batch"), Dim::sym("seq")];
    let ids = b.input("input_ids", &batch_seq, DType::I32);
    let mask = b.input("attention_mask", &batch_seq, DType::F32);
    let pos = b.input("position_ids", &[Dim::sym("seq")], DType::I32);

    let word = weights.constant(
        &mut b,
        "embeddings.word_embeddings.weight",
        &[c.vocab_size, h],
    )?;
    let table = weights.constant(
        &mut b,
        "embeddings.position_embeddings.weight",
        &[c.max_positions, h],
    )?;
    let token_type = weights.row(
        &mut b,
        "embeddings.token_type_embeddings.weight",
        c.type_vocab_size,
        h,
        0,
    )?;
    let we = b.gather("embeddings/word", word, ids);
    let pe = b.gather("embeddings/position", table, pos);
    let x = b.add("embeddings/word+position", we, pe);
    let x = b.add("embeddings/sum", x, token_type);
    let mut x = norm(
        &mut b,
        weights,
        "embeddings.LayerNorm",
        x,
        h,
        c.layer_norm_eps,
    )?;

    // (mask - 1) * f32::MAX: 0 for tokens, f32::MIN for padding, as [batch, 1, 1, seq].
    let one = scalar(&mut b, "mask/one", 1.0);
    let big = scalar(&mut b, "mask/big", f32::MAX);
    let m = b.sub("mask/minus_one", mask, one);
    let m = b.mul("mask/bias", m, big);
    let bias = b.reshape("mask/bias4", m, &[0, 1, 1, -1]);
    // 1 / sqrt(head_dim) folded into the query projection: `(q / sqrt(d)) kᵀ` is the same
    // scores without a product over every `[batch, heads, seq, seq]` score (a visible share
    // of a call on lavapipe: docs/benchmarks/2026-11-28-embeddings-lavapipe.md).
    let scale = 1.0 / (dh as f32).sqrt();

    for l in 0..c.num_layers {
        let p = format!("encoder.layer.{l}");
        let split = |b: &mut GraphBuilder, name: &str, t: NodeId| {
            let r = b.reshape(
                format!("{p}/{name}/heads"),
                t,
                &[0, 0, heads as i64, dh as i64],
            );
            b.transpose(format!("{p}/{name}/bhsd"), r, &[0, 2, 1, 3])
        };
        let q = dense_scaled(
            &mut b,
            weights,
            &format!("{p}.attention.self.query"),
            x,
            (h, h),
            scale,
        )?;
        let k = dense(&mut b, weights, &format!("{p}.attention.self.key"), x, h, h)?;
        let v = dense(
            &mut b,
            weights,
            &format!("{p}.attention.self.value"),
            x,
            h,
            h,
        )?;
        let (q, k, v) = (
            split(&mut b, "q", q),
            split(&mut b, "k", k),
            split(&mut b, "v", v),
        );
        let s = b.matmul(format!("{p}/scores"), q, k, true);
        let s = b.add(format!("{p}/masked"), s, bias);
        let probs = b.softmax(format!("{p}/probs"), s);
        let ctx = b.matmul(format!("{p}/context"), probs, v, false);
        let ctx = b.transpose(format!("{p}/context/bshd"), ctx, &[0, 2, 1, 3]);
        let ctx = b.reshape(format!("{p}/context/merged"), ctx, &[0, 0, h as i64]);
        let a = dense(
            &mut b,
            weights,
            &format!("{p}.attention.output.dense"),
            ctx,
            h,
            h,
        )?;
        let a = b.add(format!("{p}/attention/residual"), a, x);
        x = norm(
            &mut b,
            weights,
            &format!("{p}.attention.output.LayerNorm"),
            a,
            h,
            c.layer_norm_eps,
        )?;
        let i = dense(
            &mut b,
            weights,
            &format!("{p}.intermediate.dense"),
            x,
            c.intermediate_size,
            h,
        )?;
        let i = if c.gelu_erf {
            b.unary(format!("{p}/gelu"), UnaryOp::GeluErf, i)
        } else {
            b.gelu(format!("{p}/gelu"), i)
        };
        let o = dense(
            &mut b,
            weights,
            &format!("{p}.output.dense"),
            i,
            h,
            c.intermediate_size,
        )?;
        let o = b.add(format!("{p}/output/residual"), o, x);
        x = norm(
            &mut b,
            weights,
            &format!("{p}.output.LayerNorm"),
            o,
            h,
            c.layer_norm_eps,
        )?;
    }
    let out = append_pooling(&mut b, x, mask, pipeline)?;
    b.output(out);
    Ok(b.build()?)
}

/// Appends `pipeline`'s pooling (and normalization) of `hidden` (`[batch, seq, width]`
/// f32) under `mask` (`[batch, seq]` f32, 1 for tokens) and returns the node of
/// [`OUTPUT`], `[batch, width]`.
///
/// # Errors
/// [`SentenceError::Config`] when `hidden` or `mask` is not f32.
pub fn append_pooling(
    b: &mut GraphBuilder,
    hidden: NodeId,
    mask: NodeId,
    pipeline: &Pipeline,
) -> Result<NodeId, SentenceError> {
    for (id, what) in [(hidden, "the hidden state"), (mask, "the mask")] {
        if b.dtype_of(id) != Some(DType::F32) {
            return Err(SentenceError::Config {
                file: "the encoder".into(),
                reason: format!("{what} is {:?}, not f32", b.dtype_of(id)),
            });
        }
    }
    let mask3 = b.reshape("pool/mask3", mask, &[0, 0, 1]);
    let pooled = match pipeline.pooling {
        Pooling::Mean => {
            let masked = b.mul("pool/masked", hidden, mask3);
            let sum = reduce(b, "pool/sum".into(), ReduceKind::Sum, masked, false);
            let count = reduce(b, "pool/count".into(), ReduceKind::Sum, mask3, false);
            let floor = scalar(b, "pool/count_floor", 1e-9);
            let count = b.binary("pool/count_clamped", BinaryOp::Max, count, floor);
            b.div("pool/mean", sum, count)
        }
        Pooling::Max => {
            // Padding becomes -1e9 (h * 0 + (0 - 1) * 1e9); tokens stay h (h * 1 + 0).
            let one = scalar(b, "pool/one", 1.0);
            let big = scalar(b, "pool/big", 1e9);
            let kept = b.mul("pool/kept", hidden, mask3);
            let off = b.sub("pool/off", mask3, one);
            let off = b.mul("pool/off_big", off, big);
            let t = b.add("pool/masked", kept, off);
            reduce(b, "pool/max".into(), ReduceKind::Max, t, false)
        }
        Pooling::Cls => {
            let first = b.slice("pool/first", hidden, &[1], &[0], &[1], &[1]);
            b.reshape("pool/cls", first, &[0, -1])
        }
    };
    if !pipeline.normalize {
        return Ok(b.node(OUTPUT, crate::graph::ops::Identity, &[pooled]));
    }
    let sq = b.mul("norm/square", pooled, pooled);
    let ss = reduce(b, "norm/sum".into(), ReduceKind::Sum, sq, true);
    let n = b.sqrt("norm/length", ss);
    let floor = scalar(b, "norm/floor", 1e-12);
    let n = b.binary("norm/clamped", BinaryOp::Max, n, floor);
    Ok(b.div(OUTPUT, pooled, n))
}
