//! Weights as the kernels read them best, rewritten on a finished import ([`linear_weights`]).
//!
//! * **int8 weights dequantized in the graph.** An export that stores a weight as an `int8`
//!   initializer `q` and computes `Mul(Cast(q, to = float), scale)` at every run (the int8
//!   all-MiniLM-L6-v2 export does it for all 38 of its weights, a fixed cost at every call:
//!   docs/benchmarks/2026-11-28-embeddings-lavapipe.md) gets the product on the host once:
//!   - read only as the right operand of `MatMul` (`x [.., K] @ w [K, N]`) with one scale per
//!     output column: the `MatMul`s become `linear` over a `q8_nb` constant `[N, K]`, 32
//!     int8 values and their column's f32 scale per block, the graph's own values (`f32(q) *
//!     scale`, one rounding) in 1.125 bytes per weight;
//!   - otherwise (an embedding table with a scale per row, gathered): one f32 constant of the
//!     product, the values the graph computed.
//! * **f32 weights of `MatMul`** (with `transpose_f32`): a constant `w [K, N]` read only as
//!   the right operand of `MatMul`s becomes `linear` over its transpose `[N, K]` (a copy on
//!   the host): on a software adapter the `linear` kernels run these products faster than
//!   the general `matmul` one (docs/benchmarks/2026-11-28-embeddings-lavapipe.md).
//!
//! The nodes this leaves without a reader (the `Cast`, the int8 and scale constants) leave
//! the graph; nothing else is removed.

use super::{ImportError, ImportedGraph};
use crate::graph::ops::{BinaryOp, Cast, Constant, Linear, MatMul, Op};
use crate::graph::{Graph, Node, NodeId};
use crate::shape::{DType, Shape};
use crate::tensor::ConstData;

/// What [`linear_weights`] rewrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WeightsReport {
    /// Dequantized int8 weights that became `q8_nb` constants of `linear` nodes.
    pub q8_weights: usize,
    /// Dequantized int8 weights folded into f32 constants.
    pub folded: usize,
    /// f32 weights transposed for `linear` nodes.
    pub f32_weights: usize,
    /// `MatMul` nodes that became `linear`.
    pub linears: usize,
    /// Nodes removed for having no reader left.
    pub removed: usize,
}

/// `Mul(Cast(q: int8 constant, to = f32), scale: f32 constant)` (either operand order) at
/// node `id`, whose output has `q`'s shape: `(q, scale)`.
fn dequantized(nodes: &[Node], id: usize) -> Option<(&Constant, &Constant)> {
    let n = &nodes[id];
    if n.op != Op::Binary(BinaryOp::Mul) || n.inputs.len() != 2 || n.dtype != DType::F32 {
        return None;
    }
    let constant = |i: NodeId| match &nodes[i.index()].op {
        Op::Constant(c) => Some(c),
        _ => None,
    };
    for (c, s) in [(n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])] {
        let cast = &nodes[c.index()];
        if cast.op != Op::Cast(Cast { to: DType::F32 }) || cast.inputs.len() != 1 {
            continue;
        }
        let (Some(q), Some(scale)) = (constant(cast.inputs[0]), constant(s)) else {
            continue;
        };
        if q.dtype != DType::I8 || scale.dtype != DType::F32 {
            continue;
        }
        let (qd, sd) = (q.shape.dims(), scale.shape.dims());
        // The product has q's shape: the scale broadcasts into it.
        let fits = sd.len() <= qd.len()
            && sd
                .iter()
                .rev()
                .zip(qd.iter().rev())
                .all(|(&s, &q)| s == 1 || s == q);
        let sizes_ok = q.shape.checked_num_elements() == Some(q.data.bytes().len() as u64)
            && scale.shape.checked_num_elements().map(|e| e * 4)
                == Some(scale.data.bytes().len() as u64);
        if fits && sizes_ok {
            return Some((q, scale));
        }
    }
    None
}

/// The f32 values of a constant (its bytes little-endian f32).
fn floats(c: &Constant) -> Vec<f32> {
    c.data
        .bytes()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// For each element of `shape` (row-major), the index of the `scale` element it is
/// multiplied by (numpy broadcasting, `scale` right-aligned).
fn scale_index(shape: &[u64], scale: &[u64]) -> impl Fn(usize) -> usize {
    let rank = shape.len();
    let mut strides = vec![0usize; rank];
    let mut s = 1usize;
    for (k, &d) in scale.iter().enumerate().rev() {
        let axis = rank - scale.len() + k;
        strides[axis] = if d == 1 { 0 } else { s };
        s *= d as usize;
    }
    let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
    move |mut i| {
        let mut at = 0;
        for axis in (0..rank).rev() {
            at += (i % dims[axis]) * strides[axis];
            i /= dims[axis];
        }
        at
    }
}

/// `f32(q) * scale` element by element: what the graph's `Cast` and `Mul` compute.
fn dequantize(q: &Constant, scale: &Constant) -> Vec<f32> {
    let s = floats(scale);
    let at = scale_index(q.shape.dims(), scale.shape.dims());
    q.data
        .bytes()
        .iter()
        .enumerate()
        .map(|(i, &v)| f32::from(v as i8) * s[at(i)])
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `q [K, N]` with one scale per column as `q8_nb` `[N, K]`; `None` when K is not a
/// multiple of 32 or the scale varies along K.
fn q8_transposed(q: &Constant, scale: &Constant) -> Option<Vec<u8>> {
    let (qd, sd) = (q.shape.dims(), scale.shape.dims());
    let (k, n) = match *qd {
        [k, n] => (k as usize, n as usize),
        _ => return None,
    };
    // Per column: the scale's dimension along K (if it has one) is 1.
    if k % 32 != 0 || (sd.len() == 2 && sd[0] != 1) {
        return None;
    }
    let s = floats(scale);
    let at = scale_index(qd, sd);
    let bytes = q.data.bytes();
    let mut out = Vec::with_capacity(n * k / 32 * 36);
    let mut block = [0i8; 32];
    for col in 0..n {
        let d = s[at(col)];
        for kb in 0..k / 32 {
            for (j, v) in block.iter_mut().enumerate() {
                *v = bytes[(kb * 32 + j) * n + col] as i8;
            }
            crate::formats::push_q8_nb_block(d, &block, &mut out);
        }
    }
    Some(out)
}

/// `w [K, N]` f32 as `[N, K]`.
fn f32_transposed(w: &Constant) -> Option<Vec<u8>> {
    let (k, n) = match *w.shape.dims() {
        [k, n] => (k as usize, n as usize),
        _ => return None,
    };
    let v = floats(w);
    if v.len() != k * n {
        return None;
    }
    let mut t = Vec::with_capacity(k * n);
    for col in 0..n {
        t.extend((0..k).map(|row| v[row * n + col]));
    }
    Some(f32_bytes(&t))
}

/// Rewrites `imported`'s weights as the module docs say (the f32 ones only with
/// `transpose_f32`).
///
/// # Errors
/// [`ImportError::Graph`] if the rewritten graph is invalid (a bug of the rewrite).
pub fn linear_weights(
    imported: ImportedGraph,
    transpose_f32: bool,
) -> Result<(ImportedGraph, WeightsReport), ImportError> {
    let ImportedGraph {
        graph,
        mut inputs,
        mut outputs,
    } = imported;
    let mut nodes: Vec<Node> = graph.nodes().to_vec();
    let is_output: Vec<bool> = {
        let mut v = vec![false; nodes.len()];
        for &o in graph.outputs() {
            v[o.index()] = true;
        }
        v
    };
    let mut report = WeightsReport::default();
    // Readers of each node as (reader, input slot).
    let mut readers: Vec<Vec<(usize, usize)>> = vec![Vec::new(); nodes.len()];
    for (u, n) in nodes.iter().enumerate() {
        for (slot, &i) in n.inputs.iter().enumerate() {
            readers[i.index()].push((u, slot));
        }
    }
    // Every reader a MatMul taking the node as its weight, with an f32 x.
    let only_weight_of_matmuls = |nodes: &[Node], id: usize| {
        !is_output[id]
            && !readers[id].is_empty()
            && readers[id].iter().all(|&(u, slot)| {
                let r = &nodes[u];
                slot == 1
                    && r.op == Op::MatMul(MatMul { transpose_b: false })
                    && nodes[r.inputs[0].index()].dtype == DType::F32
            })
    };
    // Inputs of the nodes that became constants, once per input slot.
    let mut detached: Vec<NodeId> = Vec::new();
    for id in 0..nodes.len() {
        // An output keeps its node (the import gave it no copy of its own).
        if is_output[id] {
            continue;
        }
        let Some((q, scale)) = dequantized(&nodes, id) else {
            continue;
        };
        let as_linear = only_weight_of_matmuls(&nodes, id)
            .then(|| q8_transposed(q, scale))
            .flatten();
        let (op, dtype) = match as_linear {
            Some(bytes) => {
                let d = q.shape.dims();
                report.q8_weights += 1;
                (
                    Constant {
                        shape: Shape::new(vec![d[1], d[0]]),
                        dtype: DType::Q8_NB,
                        data: ConstData::from_vec(bytes),
                    },
                    DType::Q8_NB,
                )
            }
            None => {
                report.folded += 1;
                (
                    Constant {
                        shape: q.shape.clone(),
                        dtype: DType::F32,
                        data: ConstData::from_vec(f32_bytes(&dequantize(q, scale))),
                    },
                    DType::F32,
                )
            }
        };
        let linear = dtype == DType::Q8_NB;
        detached.extend(replace_with_constant(&mut nodes, id, op));
        if linear {
            report.linears += to_linear(&mut nodes, &readers[id]);
        }
    }
    if transpose_f32 {
        for id in 0..nodes.len() {
            let bytes = match &nodes[id].op {
                Op::Constant(c) if c.dtype == DType::F32 && c.shape.rank() == 2 => {
                    if !only_weight_of_matmuls(&nodes, id) {
                        continue;
                    }
                    match f32_transposed(c) {
                        Some(b) => (b, c.shape.dims().to_vec()),
                        None => continue,
                    }
                }
                _ => continue,
            };
            let (bytes, d) = bytes;
            detached.extend(replace_with_constant(
                &mut nodes,
                id,
                Constant {
                    shape: Shape::new(vec![d[1], d[0]]),
                    dtype: DType::F32,
                    data: ConstData::from_vec(bytes),
                },
            ));
            report.f32_weights += 1;
            report.linears += to_linear(&mut nodes, &readers[id]);
        }
    }
    if report == WeightsReport::default() {
        let graph = Graph::from_nodes(nodes, graph.outputs().to_vec())?;
        return Ok((
            ImportedGraph {
                graph,
                inputs,
                outputs,
            },
            report,
        ));
    }
    // The rewritten nodes' former inputs that no one reads any more leave, and theirs.
    let mut remaining: Vec<usize> = readers.iter().map(Vec::len).collect();
    let mut removed = vec![false; nodes.len()];
    let mut work: Vec<usize> = Vec::new();
    for i in detached {
        remaining[i.index()] -= 1;
        work.push(i.index());
    }
    while let Some(id) = work.pop() {
        if removed[id] || remaining[id] > 0 || is_output[id] || matches!(nodes[id].op, Op::Input(_))
        {
            continue;
        }
        removed[id] = true;
        report.removed += 1;
        for &i in &nodes[id].inputs {
            remaining[i.index()] -= 1;
            work.push(i.index());
        }
    }
    let mut index = vec![None; nodes.len()];
    let mut kept = Vec::with_capacity(nodes.len() - report.removed);
    for (id, n) in nodes.into_iter().enumerate() {
        if !removed[id] {
            index[id] = Some(NodeId(kept.len() as u32));
            kept.push(n);
        }
    }
    let at = |i: NodeId| {
        index[i.index()].ok_or(ImportError::Graph(
            crate::graph::GraphError::DanglingInput {
                node: "a rewritten weight".into(),
                input: i,
            },
        ))
    };
    for n in &mut kept {
        for i in &mut n.inputs {
            *i = at(*i)?;
        }
    }
    for v in inputs.iter_mut().chain(outputs.iter_mut()) {
        v.node = at(v.node)?;
    }
    let graph_outputs = graph
        .outputs()
        .iter()
        .map(|&o| at(o))
        .collect::<Result<Vec<_>, _>>()?;
    let graph = Graph::from_nodes(kept, graph_outputs)?;
    Ok((
        ImportedGraph {
            graph,
            inputs,
            outputs,
        },
        report,
    ))
}

/// Node `id` becomes `constant`, reading nothing (its label stays); returns what it read.
fn replace_with_constant(nodes: &mut [Node], id: usize, constant: Constant) -> Vec<NodeId> {
    let n = &mut nodes[id];
    n.dtype = constant.dtype;
    n.op = Op::Constant(constant);
    std::mem::take(&mut n.inputs)
}

/// The `MatMul` readers of a weight become `linear`; returns how many.
fn to_linear(nodes: &mut [Node], readers: &[(usize, usize)]) -> usize {
    for &(u, _) in readers {
        nodes[u].op = Op::Linear(Linear);
    }
    readers.len()
}
