//! Pure-Rust CPU reference of every op (plain loops, f64 accumulation in reductions and
//! matmul) and a whole-graph evaluator. Used by the kernel tests and the decode demo's
//! self-check.
//!
//! Integer tensors (ids, shape tensors) are carried as f32 holding the exact integer value, so
//! one `Vec<f32>` type serves every tensor; this is exact for |v| < 2^24, which covers token
//! ids and dimensions of any model dynrt runs. On the GPU the same tensors are 32-bit integers
//! (`i32`/`u32` bits); uploaders convert.

use super::ops::{matmul, movement, movement::AxisRange, norm, Op, MASK_VALUE};
use super::{Graph, GraphError, NodeId};
use crate::shape::Shape;

/// A tensor on the host: its shape and row-major values.
pub type HostTensor = (Shape, Vec<f32>);

/// Multi-index iteration: calls `f(linear_out_index, index)` for every index of `shape`.
fn for_each_index(shape: &Shape, mut f: impl FnMut(usize, &[u64])) {
    let Some(n) = shape.checked_num_elements() else {
        return;
    };
    let mut idx = vec![0u64; shape.rank()];
    for lin in 0..n as usize {
        f(lin, &idx);
        for k in (0..idx.len()).rev() {
            idx[k] += 1;
            if idx[k] < shape.0[k] {
                break;
            }
            idx[k] = 0;
        }
    }
}

fn dot(idx: &[u64], strides: &[u64]) -> usize {
    idx.iter().zip(strides).map(|(i, s)| i * s).sum::<u64>() as usize
}

/// Elementwise binary op with NumPy broadcasting into `out`.
pub fn broadcast_binary<T: Copy>(
    a: &[T],
    sa: &Shape,
    b: &[T],
    sb: &Shape,
    out: &Shape,
    f: impl Fn(T, T) -> T,
) -> Vec<T> {
    let st_a = super::ops::elementwise::broadcast_strides(sa, out);
    let st_b = super::ops::elementwise::broadcast_strides(sb, out);
    let mut v = Vec::with_capacity(out.checked_num_elements().unwrap_or(0) as usize);
    for_each_index(out, |_, idx| {
        v.push(f(a[dot(idx, &st_a)], b[dot(idx, &st_b)]))
    });
    v
}

/// `cond ? a : b` with three-way broadcasting; cond true where nonzero.
pub fn where_(
    c: &[f32],
    sc: &Shape,
    a: &[f32],
    sa: &Shape,
    b: &[f32],
    sb: &Shape,
    out: &Shape,
) -> Vec<f32> {
    let (st_c, st_a, st_b) = (
        super::ops::elementwise::broadcast_strides(sc, out),
        super::ops::elementwise::broadcast_strides(sa, out),
        super::ops::elementwise::broadcast_strides(sb, out),
    );
    let mut v = Vec::new();
    for_each_index(out, |_, idx| {
        v.push(if c[dot(idx, &st_c)] != 0.0 {
            a[dot(idx, &st_a)]
        } else {
            b[dot(idx, &st_b)]
        })
    });
    v
}

/// Batched matmul with broadcast batch dimensions, f64 accumulation.
pub fn matmul(a: &[f32], sa: &Shape, b: &[f32], sb: &Shape, transpose_b: bool) -> Vec<f32> {
    let Ok(d) = matmul::dims(sa, sb, transpose_b) else {
        return Vec::new();
    };
    let (m, k, n) = (d.m as usize, d.k as usize, d.n as usize);
    let batch_a = Shape(sa.0[..sa.rank() - 2].to_vec());
    let batch_b = Shape(sb.0[..sb.rank() - 2].to_vec());
    let st_a = super::ops::elementwise::broadcast_strides(&batch_a, &d.batch);
    let st_b = super::ops::elementwise::broadcast_strides(&batch_b, &d.batch);
    let mut out = vec![0f32; d.batch.checked_num_elements().unwrap_or(0) as usize * m * n];
    for_each_index(&d.batch, |bi, idx| {
        let oa = dot(idx, &st_a) * m * k;
        let ob = dot(idx, &st_b) * k * n;
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0f64;
                for p in 0..k {
                    let bv = if transpose_b {
                        b[ob + j * k + p]
                    } else {
                        b[ob + p * n + j]
                    };
                    acc += a[oa + i * k + p] as f64 * bv as f64;
                }
                out[bi * m * n + i * n + j] = acc as f32;
            }
        }
    });
    out
}

/// Softmax over the last axis: `exp(x - max) / sum`, in f64.
pub fn softmax(x: &[f32], shape: &Shape) -> Vec<f32> {
    let (_, d) = norm::rows(shape);
    let d = d as usize;
    let mut out = Vec::with_capacity(x.len());
    if d == 0 {
        return out;
    }
    for row in x.chunks(d) {
        let max = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
        out.extend(row.iter().map(|&v| ((v as f64 - max).exp() / sum) as f32));
    }
    out
}

/// Layer norm over the last axis (biased variance), in f64.
pub fn layer_norm(x: &[f32], shape: &Shape, gamma: &[f32], beta: &[f32], eps: f32) -> Vec<f32> {
    let d = norm::rows(shape).1 as usize;
    let mut out = Vec::with_capacity(x.len());
    if d == 0 {
        return out;
    }
    for row in x.chunks(d) {
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        out.extend(
            row.iter()
                .enumerate()
                .map(|(i, &v)| ((v as f64 - mean) * inv * gamma[i] as f64 + beta[i] as f64) as f32),
        );
    }
    out
}

/// RMS norm over the last axis, in f64.
pub fn rms_norm(x: &[f32], shape: &Shape, gamma: &[f32], eps: f32) -> Vec<f32> {
    let d = norm::rows(shape).1 as usize;
    let mut out = Vec::with_capacity(x.len());
    if d == 0 {
        return out;
    }
    for row in x.chunks(d) {
        let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / d as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        out.extend(
            row.iter()
                .enumerate()
                .map(|(i, &v)| (v as f64 * inv * gamma[i] as f64) as f32),
        );
    }
    out
}

/// Transpose: output dimension `i` is input dimension `perm[i]`.
pub fn transpose<T: Copy>(x: &[T], shape: &Shape, perm: &[usize]) -> Vec<T> {
    let st = movement::strides(shape);
    let out = Shape(perm.iter().map(|&p| shape.0[p]).collect());
    let pst: Vec<u64> = perm.iter().map(|&p| st[p]).collect();
    let mut v = Vec::with_capacity(x.len());
    for_each_index(&out, |_, idx| v.push(x[dot(idx, &pst)]));
    v
}

/// Concatenation along `axis`.
pub fn concat<T: Copy>(xs: &[&[T]], shapes: &[&Shape], axis: usize) -> Vec<T> {
    let outer: u64 = shapes[0].0[..axis].iter().product();
    let mut v = Vec::new();
    for o in 0..outer as usize {
        for (x, s) in xs.iter().zip(shapes) {
            let chunk = s.0[axis..].iter().product::<u64>() as usize;
            v.extend_from_slice(&x[o * chunk..(o + 1) * chunk]);
        }
    }
    v
}

/// Slice with per-axis ranges from [`movement::slice_ranges`].
pub fn slice<T: Copy>(x: &[T], shape: &Shape, ranges: &[AxisRange]) -> Vec<T> {
    let st = movement::strides(shape);
    let out = Shape(ranges.iter().map(|r| r.len).collect());
    let base: u64 = ranges.iter().zip(&st).map(|(r, s)| r.start * s).sum();
    let sst: Vec<u64> = ranges.iter().zip(&st).map(|(r, s)| r.step * s).collect();
    let mut v = Vec::new();
    for_each_index(&out, |_, idx| v.push(x[base as usize + dot(idx, &sst)]));
    v
}

/// Gather rows of `table` along axis 0; ids out of range give `T::default()` (zeros).
pub fn gather<T: Copy + Default>(
    table: &[T],
    tshape: &Shape,
    ids: &[i64],
    _ids_shape: &Shape,
) -> Vec<T> {
    let rows = tshape.0.first().copied().unwrap_or(0);
    let row = tshape.0[1..].iter().product::<u64>() as usize;
    let mut v = Vec::with_capacity(ids.len() * row);
    for &id in ids {
        if id >= 0 && (id as u64) < rows {
            v.extend_from_slice(&table[id as usize * row..(id as usize + 1) * row]);
        } else {
            v.extend(std::iter::repeat_n(T::default(), row));
        }
    }
    v
}

/// Causal mask over `[..., S, T]`: query `i` sees key `j <= (T - S) + i`, others get
/// [`MASK_VALUE`].
pub fn causal_mask(x: &[f32], shape: &Shape) -> Vec<f32> {
    let r = shape.rank();
    let (s, t) = (shape.0[r - 2], shape.0[r - 1]);
    let past = t.saturating_sub(s);
    x.iter()
        .enumerate()
        .map(|(lin, &v)| {
            let lin = lin as u64;
            let (j, i) = (lin % t, (lin / t) % s);
            if super::ops::mask::visible(i, j, past) {
                v
            } else {
                MASK_VALUE
            }
        })
        .collect()
}

/// Evaluates one op on host tensors (the shapes must already have been inferred).
pub fn eval_op(op: &Op, inputs: &[(&Shape, &[f32])], out: &Shape) -> Vec<f32> {
    let x = |k: usize| inputs[k].1;
    let s = |k: usize| inputs[k].0;
    match op {
        Op::Input { .. } => Vec::new(),
        Op::Constant { data, .. } => data.to_vec(),
        Op::MatMul { transpose_b } => matmul(x(0), s(0), x(1), s(1), *transpose_b),
        Op::Binary(b) => broadcast_binary(x(0), s(0), x(1), s(1), out, |p, q| b.apply(p, q)),
        Op::Unary(u) => x(0).iter().map(|&v| u.apply(v)).collect(),
        Op::Softmax => softmax(x(0), s(0)),
        Op::LayerNorm { eps } => layer_norm(x(0), s(0), x(1), x(2), *eps),
        Op::RmsNorm { eps } => rms_norm(x(0), s(0), x(1), *eps),
        Op::Reshape { .. } | Op::ReshapeTo => x(0).to_vec(),
        Op::Transpose { perm } => transpose(x(0), s(0), perm),
        Op::Concat { axis } => {
            let xs: Vec<&[f32]> = inputs.iter().map(|i| i.1).collect();
            let ss: Vec<&Shape> = inputs.iter().map(|i| i.0).collect();
            concat(&xs, &ss, *axis)
        }
        Op::Slice {
            axes,
            starts,
            ends,
            steps,
        } => match movement::slice_ranges(s(0), axes, starts, ends, steps) {
            Ok(r) => slice(x(0), s(0), &r),
            Err(_) => Vec::new(),
        },
        Op::Gather => {
            let ids: Vec<i64> = x(1).iter().map(|&v| v as i64).collect();
            gather(x(0), s(0), &ids, s(1))
        }
        Op::Where => where_(x(0), s(0), x(1), s(1), x(2), s(2), out),
        Op::CausalMask => causal_mask(x(0), s(0)),
        Op::ShapeOf => s(0).dims().iter().map(|&d| d as f32).collect(),
    }
}

/// Evaluates every node; returns `(shape, values)` per node, indexed by `NodeId::index()`.
/// `inputs` gives each network input by label with its shape and row-major values.
///
/// # Errors
/// Unknown, missing or ill-shaped inputs, data of the wrong length, and any shape-inference
/// failure, each naming the node.
pub fn evaluate_all(
    graph: &Graph,
    inputs: &[(&str, Shape, Vec<f32>)],
) -> Result<Vec<HostTensor>, GraphError> {
    let given: Vec<(&str, &Shape)> = inputs.iter().map(|(l, s, _)| (*l, s)).collect();
    let bindings = graph.bind(&given)?;
    let inferred = graph.infer_shapes(&bindings)?;
    let mut values: Vec<Option<Vec<f32>>> = vec![None; graph.len()];
    for &id in graph.order() {
        let node = graph.node(id);
        let shape = &inferred.shapes[id.index()];
        let expected = shape.num_elements().map_err(|_| GraphError::Infer {
            node: node.label.clone(),
            op: node.op.name(),
            source: super::ops::InferError::Overflow {
                shape: shape.to_string(),
            },
        })?;
        let v = if let Op::Input { .. } = node.op {
            let (_, _, data) = inputs
                .iter()
                .find(|(l, _, _)| *l == node.label)
                .ok_or_else(|| GraphError::MissingInput {
                    label: node.label.clone(),
                })?;
            data.clone()
        } else {
            let ins: Vec<(&Shape, &[f32])> = node
                .inputs
                .iter()
                .map(|i| {
                    (
                        &inferred.shapes[i.index()],
                        values[i.index()].as_deref().unwrap_or(&[]),
                    )
                })
                .collect();
            eval_op(&node.op, &ins, shape)
        };
        if v.len() as u64 != expected {
            return Err(GraphError::DataLength {
                node: node.label.clone(),
                shape: shape.clone(),
                expected,
                got: v.len(),
            });
        }
        values[id.index()] = Some(v);
    }
    Ok(inferred
        .shapes
        .into_iter()
        .zip(values)
        .map(|(s, v)| (s, v.unwrap_or_default()))
        .collect())
}

/// Evaluates the graph and returns its outputs in the order they were marked.
///
/// # Errors
/// As [`evaluate_all`].
pub fn evaluate(
    graph: &Graph,
    inputs: &[(&str, Shape, Vec<f32>)],
) -> Result<Vec<HostTensor>, GraphError> {
    let mut all = evaluate_all(graph, inputs)?;
    Ok(graph
        .outputs()
        .iter()
        .map(|&o: &NodeId| std::mem::take(&mut all[o.index()]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: &[u64]) -> Shape {
        Shape(d.to_vec())
    }

    #[test]
    fn small_known_results() {
        assert_eq!(
            matmul(
                &[1., 2., 3., 4.],
                &s(&[2, 2]),
                &[5., 6., 7., 8.],
                &s(&[2, 2]),
                false
            ),
            vec![19., 22., 43., 50.]
        );
        assert_eq!(
            matmul(
                &[1., 2., 3., 4.],
                &s(&[2, 2]),
                &[5., 7., 6., 8.],
                &s(&[2, 2]),
                true
            ),
            vec![19., 22., 43., 50.]
        );
        assert_eq!(
            transpose(&[1, 2, 3, 4, 5, 6], &s(&[2, 3]), &[1, 0]),
            vec![1, 4, 2, 5, 3, 6]
        );
        assert_eq!(
            concat(&[&[1, 2][..], &[3][..]], &[&s(&[1, 2]), &s(&[1, 1])], 1),
            vec![1, 2, 3]
        );
        let r = movement::slice_ranges(&s(&[2, 3]), &[1], &[1], &[3], &[1]).unwrap();
        assert_eq!(
            slice(&[1, 2, 3, 4, 5, 6], &s(&[2, 3]), &r),
            vec![2, 3, 5, 6]
        );
        assert_eq!(
            gather(&[1, 2, 3, 4], &s(&[2, 2]), &[1, 5, -1], &s(&[3])),
            vec![3, 4, 0, 0, 0, 0]
        );
        let sm = softmax(&[0.0, 0.0, 1000.0, 1000.0], &s(&[2, 2]));
        assert!(sm.iter().all(|&v| (v - 0.5).abs() < 1e-6));
        // decode: past 2, one query, 3 keys: all visible; prefill 2 queries, 2 keys.
        assert_eq!(causal_mask(&[1., 1., 1.], &s(&[1, 3])), vec![1., 1., 1.]);
        assert_eq!(
            causal_mask(&[1., 1., 1., 1.], &s(&[2, 2])),
            vec![1., MASK_VALUE, 1., 1.]
        );
        assert_eq!(
            causal_mask(&[1.; 6], &s(&[2, 3])),
            vec![1., 1., MASK_VALUE, 1., 1., 1.]
        );
        let ln = layer_norm(&[1., 3.], &s(&[1, 2]), &[1., 1.], &[0., 0.], 0.0);
        assert!((ln[0] + 1.0).abs() < 1e-6 && (ln[1] - 1.0).abs() < 1e-6);
    }
}
