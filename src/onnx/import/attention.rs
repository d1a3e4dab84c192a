//! Converters of the opset-23 attention ops: `RotaryEmbedding` (one kernel) and `Attention`
//! (lowered to matmuls, masks and a softmax).

use super::{Ctx, ImportError};
use crate::graph::ops::{
    BinaryOp, Concat, Constant, ConstantOfShape, Gather, MatMul, ReshapeTo, RotaryEmbedding,
    ShapeOf, Softmax, Transpose, Trilu, UnaryOp, Where,
};
use crate::graph::NodeId;
use crate::onnx::OnnxNode;
use crate::shape::{DType, Shape};
use crate::tensor::ConstData;

/// `RotaryEmbedding(X, cos_cache, sin_cache, position_ids?)` (`interleaved`,
/// `rotary_embedding_dim`, `num_heads`).
pub(super) fn rotary_embedding(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let mut ins = vec![
        ctx.input(node, 0)?,
        ctx.input(node, 1)?,
        ctx.input(node, 2)?,
    ];
    ins.extend(ctx.optional_input(node, 3)?);
    let non_negative = |name: &str, v: i64| {
        u64::try_from(v).map_err(|_| ctx.err(node, format!("`{name}` is {v}")))
    };
    let op = RotaryEmbedding {
        interleaved: ctx.attr_int(node, "interleaved", 0)? != 0,
        rotary_dim: non_negative(
            "rotary_embedding_dim",
            ctx.attr_int(node, "rotary_embedding_dim", 0)?,
        )?,
        num_heads: non_negative("num_heads", ctx.attr_int(node, "num_heads", 0)?)?,
    };
    ctx.emit(node, op, &ins)?;
    Ok(())
}

/// An f32 scalar constant helper of `node`.
fn scalar(ctx: &mut Ctx<'_>, node: &OnnxNode, suffix: &str, v: f32) -> Result<NodeId, ImportError> {
    let op = Constant {
        shape: Shape::new(vec![]),
        dtype: DType::F32,
        data: ConstData::from_f32(&[v]),
    };
    ctx.helper(node, suffix, op, &[])
}

/// A fixed dimension of `id` (from the end when `from_end`), needed by the lowering.
fn fixed_dim(
    ctx: &Ctx<'_>,
    node: &OnnxNode,
    id: NodeId,
    from_end: usize,
    what: &str,
) -> Result<u64, ImportError> {
    ctx.dims(id)
        .and_then(|d| d.len().checked_sub(from_end + 1).and_then(|i| d[i]))
        .ok_or_else(|| {
            ctx.err(
                node,
                format!("{what} must be known when the model is imported"),
            )
        })
}

/// `[B, S, H * D]` to `[B, H, S, D]`.
fn split_heads(
    ctx: &mut Ctx<'_>,
    node: &OnnxNode,
    x: NodeId,
    heads: u64,
    suffix: &str,
) -> Result<NodeId, ImportError> {
    let target = ctx.constant_i64(
        node,
        &format!("{suffix}_heads_shape"),
        Shape::new(vec![4]),
        &[0, 0, heads as i64, -1],
    )?;
    let r = ctx.helper(
        node,
        &format!("{suffix}_heads"),
        ReshapeTo::default(),
        &[x, target],
    )?;
    ctx.helper(
        node,
        &format!("{suffix}_bhsd"),
        Transpose {
            perm: vec![0, 2, 1, 3],
        },
        &[r],
    )
}

/// `Attention` (opset 23) lowered to dynrt ops: 3-D inputs split into heads, the past
/// concatenated on the sequence axis (the `present` outputs), grouped-query heads repeated
/// (a gather on the head axis), `Q K^T * scale`, the optional softcap (`tanh`), the mask
/// (float added; bool: false becomes -inf) and the causal mask (queries see keys up to their
/// position after the past: a trilu of -infs added), softmax, `* V`, 3-D outputs merged back. The `qk_matmul_output`
/// output follows `qk_matmul_output_mode` (0: scaled product, 1: after softcap, 2: after the
/// masks, 3: after softmax). `nonpad_kv_seqlen` and `softmax_precision` other than f32 are not
/// mapped.
pub(super) fn attention(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
    let mut q = ctx.input(node, 0)?;
    let mut k = ctx.input(node, 1)?;
    let mut v = ctx.input(node, 2)?;
    let mask = ctx.optional_input(node, 3)?;
    let past_k = ctx.optional_input(node, 4)?;
    let past_v = ctx.optional_input(node, 5)?;
    if ctx.optional_input(node, 6)?.is_some() {
        return Err(ctx.err(node, "nonpad_kv_seqlen is not mapped"));
    }
    let rank = ctx.need_rank(node, q)?;
    let packed = match rank {
        3 => true,
        4 => false,
        r => return Err(ctx.err(node, format!("Q of rank {r}; 3 or 4 is defined"))),
    };
    let positive = |ctx: &Ctx<'_>, name: &str| -> Result<u64, ImportError> {
        let v = ctx.attr_int(node, name, 0)?;
        u64::try_from(v).map_err(|_| ctx.err(node, format!("`{name}` is {v}")))
    };
    if packed {
        let (hq, hkv) = (
            positive(ctx, "q_num_heads")?,
            positive(ctx, "kv_num_heads")?,
        );
        if hq == 0 || hkv == 0 {
            return Err(ctx.err(node, "3-D inputs need q_num_heads and kv_num_heads"));
        }
        q = split_heads(ctx, node, q, hq, "q")?;
        k = split_heads(ctx, node, k, hkv, "k")?;
        v = split_heads(ctx, node, v, hkv, "v")?;
    }
    let hq = fixed_dim(ctx, node, q, 2, "the query heads")?;
    let hkv = fixed_dim(ctx, node, k, 2, "the key heads")?;
    let head = fixed_dim(ctx, node, q, 0, "the head size")?;
    // The caches: past and new rows on the sequence axis.
    for (past, cur, out) in [(past_k, &mut k, 1), (past_v, &mut v, 2)] {
        let wanted = node.outputs.get(out).is_some_and(|o| !o.is_empty());
        match past {
            Some(p) if wanted => {
                *cur = ctx.emit_output(node, out, Concat { axis: 2 }, &[p, *cur])?
            }
            Some(p) => {
                *cur = ctx.helper(
                    node,
                    &format!("present_{out}"),
                    Concat { axis: 2 },
                    &[p, *cur],
                )?
            }
            None if wanted => ctx.bind(node, out, *cur)?,
            None => {}
        }
    }
    // Grouped-query attention: kv head h serves query heads h * g .. (h + 1) * g.
    if hq != hkv {
        if hkv == 0 || hq % hkv != 0 {
            return Err(ctx.err(node, format!("{hq} query heads over {hkv} key heads")));
        }
        let g = hq / hkv;
        let ids: Vec<i64> = (0..hq as i64).map(|h| h / g as i64).collect();
        let ids = ctx.constant_i64(node, "kv_heads", Shape::new(vec![hq]), &ids)?;
        k = ctx.helper(node, "k_repeated", Gather { axis: 1 }, &[k, ids])?;
        v = ctx.helper(node, "v_repeated", Gather { axis: 1 }, &[v, ids])?;
    }
    let scale = ctx.attr_float(node, "scale", 1.0 / (head as f32).sqrt())?;
    let qk = ctx.helper(node, "qk", MatMul { transpose_b: true }, &[q, k])?;
    let s = scalar(ctx, node, "scale", scale)?;
    let mut scores = ctx.helper(node, "qk_scaled", BinaryOp::Mul, &[qk, s])?;
    let mode = ctx.attr_int(node, "qk_matmul_output_mode", 0)?;
    let mut qk_out = [Some(scores), None, None, None];
    let softcap = ctx.attr_float(node, "softcap", 0.0)?;
    if softcap > 0.0 {
        let inv = scalar(ctx, node, "softcap_inv", 1.0 / softcap)?;
        let cap = scalar(ctx, node, "softcap", softcap)?;
        let t = ctx.helper(node, "softcap_div", BinaryOp::Mul, &[scores, inv])?;
        let t = ctx.helper(node, "softcap_tanh", UnaryOp::Tanh, &[t])?;
        scores = ctx.helper(node, "softcapped", BinaryOp::Mul, &[t, cap])?;
    }
    qk_out[1] = Some(scores);
    if let Some(m) = mask {
        let bias = if ctx.dtype(m) == DType::Bool {
            let zero = scalar(ctx, node, "mask_zero", 0.0)?;
            let hidden = scalar(ctx, node, "mask_hidden", f32::NEG_INFINITY)?;
            ctx.helper(node, "mask_bias", Where, &[m, zero, hidden])?
        } else {
            m
        };
        scores = ctx.helper(node, "masked", BinaryOp::Add, &[scores, bias])?;
    }
    if ctx.attr_int(node, "is_causal", 0)? != 0 {
        // ONNX aligns the causal mask top-left after the past: query i sees keys j <= past + i.
        // The bias is -inf on and above diagonal past + 1 (an upper trilu of -infs), else 0.
        let i64_shape = |start, end| ShapeOf {
            start,
            end,
            dtype: DType::I64,
        };
        let k = match past_k {
            Some(p) => {
                let past = ctx.helper(node, "past_len", i64_shape(2, Some(3)), &[p])?;
                let one = ctx.constant_i64(node, "one", Shape::new(vec![1]), &[1])?;
                ctx.helper(node, "causal_k", BinaryOp::Add, &[past, one])?
            }
            None => ctx.constant_i64(node, "causal_k", Shape::new(vec![]), &[1])?,
        };
        let sq_t = ctx.helper(node, "scores_qk_shape", i64_shape(-2, None), &[scores])?;
        let fill = ConstantOfShape::f32(f32::NEG_INFINITY);
        let hidden = ctx.helper(node, "causal_fill", fill, &[sq_t])?;
        let bias = ctx.helper(node, "causal_bias", Trilu { upper: true }, &[hidden, k])?;
        scores = ctx.helper(node, "causal", BinaryOp::Add, &[scores, bias])?;
    }
    qk_out[2] = Some(scores);
    let probs = ctx.helper(node, "probs", Softmax::LAST, &[scores])?;
    qk_out[3] = Some(probs);
    let context = MatMul { transpose_b: false };
    if packed {
        let y = ctx.helper(node, "context", context, &[probs, v])?;
        let y = ctx.helper(
            node,
            "context_bshd",
            Transpose {
                perm: vec![0, 2, 1, 3],
            },
            &[y],
        )?;
        let target = ctx.constant_i64(node, "merged_shape", Shape::new(vec![3]), &[0, 0, -1])?;
        ctx.emit(node, ReshapeTo::default(), &[y, target])?;
    } else {
        ctx.emit(node, context, &[probs, v])?;
    }
    if node.outputs.get(3).is_some_and(|o| !o.is_empty()) {
        let picked = usize::try_from(mode)
            .ok()
            .and_then(|m| qk_out.get(m).copied().flatten())
            .ok_or_else(|| ctx.err(node, format!("qk_matmul_output_mode {mode}")))?;
        ctx.bind(node, 3, picked)?;
    }
    Ok(())
}
