//! The CPU reference: every op in plain loops on host values, and a whole-graph evaluator.
//! Used by the kernel tests, the runtime tests and the decode demo's self-check.
//!
//! Independent of the GPU path on purpose: the kernels compute their parameters (strides,
//! offsets, slice starts) with their own helpers in `src/gpu/kernels`, while the reference
//! walks output multi-indices with the helpers of [`index`] (nested loops, no strides), so a
//! bug in one index computation cannot hide by being shared. Integer shape data that the
//! graph computes on the host for shape inference comes from yet another evaluator
//! ([`crate::graph::shape_data`]); [`evaluate_tensors`] checks that the reference's values of
//! those nodes agree with it.
//!
//! Values are typed ([`Values`]): floats (f32, f16/bf16 widened, block formats dequantized)
//! as f32 with f64 accumulation in reductions and matmul, integers (i64, i32, u32, i8, u8,
//! bool) as i64 wrapped to their type's width. The f32-carrier entry points ([`evaluate`],
//! [`evaluate_all`]) take and return integers as exact f32 values (exact below 2^24) for the
//! tests and the demo.

use super::{Graph, GraphError, NodeId, Op};
use crate::shape::{DType, Shape};
use crate::tensor::{decode_f32, decode_i64, encode_f32, encode_i64, HostTensor, TensorError};

/// Host values of a tensor.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    /// Float values (f32; wider types widened, block formats dequantized).
    F32(Vec<f32>),
    /// Integer values (every integer type and bool), exact.
    Int(Vec<i64>),
}

impl Values {
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            Values::F32(v) => v.len(),
            Values::Int(v) => v.len(),
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values at `picks` (`None` gives zero), keeping the kind: what every data-movement
    /// op does once it knows which source element each output element comes from.
    pub fn pick(&self, picks: &[Option<usize>]) -> Values {
        match self {
            Values::F32(v) => Values::F32(
                picks
                    .iter()
                    .map(|p| p.and_then(|i| v.get(i).copied()).unwrap_or(0.0))
                    .collect(),
            ),
            Values::Int(v) => Values::Int(
                picks
                    .iter()
                    .map(|p| p.and_then(|i| v.get(i).copied()).unwrap_or(0))
                    .collect(),
            ),
        }
    }
}

/// A tensor of the reference: shape, element type and values.
#[derive(Debug, Clone, PartialEq)]
pub struct RefTensor {
    /// Shape.
    pub shape: Shape,
    /// Element type (decides the integer wrap width and the byte encoding).
    pub dtype: DType,
    /// Values, row-major.
    pub values: Values,
}

/// Why the reference could not evaluate an op.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RefError {
    /// The op has no reference for values of this type.
    #[error("the reference has no {op} for {dtype} values")]
    Unsupported {
        /// The op name.
        op: &'static str,
        /// The input type.
        dtype: DType,
    },
    /// Bytes could not be converted.
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// An op whose values come from the node that produces it ([`crate::graph::ops::KvRows`]),
    /// evaluated by the graph evaluator, not on its own.
    #[error("{op} is evaluated with the node that produces it, by the graph evaluator")]
    Producer {
        /// The op name.
        op: &'static str,
    },
    /// An index outside `[-bound, bound)` (a gather's): an error, as in ONNX.
    #[error("index {index} at position {position} is outside [-{bound}, {bound})")]
    IndexOutOfRange {
        /// Position of the index in the indices, row-major.
        position: u64,
        /// The index as given.
        index: i64,
        /// Extent of the indexed axis.
        bound: u64,
    },
}

impl RefTensor {
    /// From values carried as f32 (integers exact below 2^24), typed as `dtype`.
    pub fn from_f32(shape: Shape, dtype: DType, values: Vec<f32>) -> RefTensor {
        let values = if dtype.is_int() {
            Values::Int(values.into_iter().map(|v| wrap(dtype, v as i64)).collect())
        } else {
            Values::F32(values)
        };
        RefTensor {
            shape,
            dtype,
            values,
        }
    }

    /// From typed bytes (block formats dequantized row by row).
    ///
    /// # Errors
    /// [`RefError::Tensor`] when the bytes do not fit the shape.
    pub fn from_bytes(shape: Shape, dtype: DType, bytes: &[u8]) -> Result<RefTensor, RefError> {
        crate::tensor::check_len("reference input", &shape, dtype, bytes.len())?;
        let values = if dtype.is_int() {
            Values::Int(decode_i64(dtype, bytes)?)
        } else if let Some(block) = dtype.block() {
            // Each row holds whole blocks; drop the padding of a partial last block.
            let last = shape.dims().last().copied().unwrap_or(1) as usize;
            let row_bytes = last.div_ceil(block.elements as usize) * block.bytes as usize;
            let mut v = Vec::new();
            if row_bytes > 0 {
                for row in bytes.chunks(row_bytes) {
                    v.extend(decode_f32(dtype, row)?.into_iter().take(last));
                }
            }
            Values::F32(v)
        } else {
            Values::F32(decode_f32(dtype, bytes)?)
        };
        Ok(RefTensor {
            shape,
            dtype,
            values,
        })
    }

    /// From a host tensor.
    ///
    /// # Errors
    /// As [`RefTensor::from_bytes`].
    pub fn from_host(t: &HostTensor) -> Result<RefTensor, RefError> {
        RefTensor::from_bytes(t.shape.clone(), t.dtype, &t.bytes)
    }

    /// As typed bytes.
    ///
    /// # Errors
    /// [`RefError::Tensor`] for block formats (the reference does not quantize).
    pub fn to_host(&self) -> Result<HostTensor, RefError> {
        let bytes = match &self.values {
            Values::F32(v) => encode_f32(self.dtype, v)?,
            Values::Int(v) => encode_i64(self.dtype, v)?,
        };
        Ok(HostTensor {
            shape: self.shape.clone(),
            dtype: self.dtype,
            bytes,
        })
    }

    /// The values as f32 (integers converted).
    pub fn to_f32(&self) -> Vec<f32> {
        match &self.values {
            Values::F32(v) => v.clone(),
            Values::Int(v) => v.iter().map(|&x| x as f32).collect(),
        }
    }

    /// The float values, or [`RefError::Unsupported`] naming `op`.
    ///
    /// # Errors
    /// [`RefError::Unsupported`] for integer values.
    pub fn floats(&self, op: &'static str) -> Result<&[f32], RefError> {
        match &self.values {
            Values::F32(v) => Ok(v),
            Values::Int(_) => Err(RefError::Unsupported {
                op,
                dtype: self.dtype,
            }),
        }
    }

    /// The integer values, or [`RefError::Unsupported`] naming `op`.
    ///
    /// # Errors
    /// [`RefError::Unsupported`] for float values.
    pub fn ints(&self, op: &'static str) -> Result<&[i64], RefError> {
        match &self.values {
            Values::Int(v) => Ok(v),
            Values::F32(_) => Err(RefError::Unsupported {
                op,
                dtype: self.dtype,
            }),
        }
    }

    /// Whether element `i` is nonzero (a condition).
    pub fn is_true(&self, i: usize) -> bool {
        match &self.values {
            Values::F32(v) => v.get(i).is_some_and(|&x| x != 0.0),
            Values::Int(v) => v.get(i).is_some_and(|&x| x != 0),
        }
    }
}

/// `v` wrapped to the width of integer type `dtype`, as the device would store it.
pub fn wrap(dtype: DType, v: i64) -> i64 {
    match dtype {
        DType::I32 => i64::from(v as i32),
        DType::U32 => i64::from(v as u32),
        DType::I8 => i64::from(v as i8),
        DType::U8 => i64::from(v as u8),
        DType::Bool => i64::from(v != 0),
        _ => v,
    }
}

/// The reference's own index helpers: multi-indices walked in row-major order and mapped
/// back to linear positions one dimension at a time (no stride tables).
pub mod index {
    use crate::shape::Shape;

    /// Calls `f(linear, index)` for every multi-index of `shape`, row-major.
    pub fn for_each(shape: &Shape, mut f: impl FnMut(usize, &[u64])) {
        let Some(n) = shape.checked_num_elements() else {
            return;
        };
        let mut idx = vec![0u64; shape.rank()];
        for lin in 0..n as usize {
            f(lin, &idx);
            for k in (0..idx.len()).rev() {
                idx[k] += 1;
                if idx[k] < shape.dims()[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
    }

    /// Linear position of `idx` in `shape` (row-major): Horner's rule over the dimensions.
    pub fn linear(idx: &[u64], shape: &Shape) -> usize {
        idx.iter()
            .zip(shape.dims())
            .fold(0u64, |acc, (&i, &d)| acc * d + i) as usize
    }

    /// Linear position in `input` of the element that broadcasts to output index `out_idx`
    /// (NumPy: align from the right, a dimension of 1 always reads index 0).
    pub fn broadcast(out_idx: &[u64], input: &Shape) -> usize {
        let skip = out_idx.len() - input.rank();
        let mut acc = 0u64;
        for (k, &d) in input.dims().iter().enumerate() {
            let i = if d == 1 { 0 } else { out_idx[skip + k] };
            acc = acc * d + i;
        }
        acc as usize
    }
}

/// Evaluates one op on reference tensors (the shapes must fit the op; `out` is the inferred
/// output shape).
///
/// # Errors
/// [`RefError`] when the op has no reference for these values.
pub fn eval_op(op: &Op, inputs: &[&RefTensor], out: &Shape) -> Result<RefTensor, RefError> {
    let dtypes: Vec<DType> = inputs.iter().map(|t| t.dtype).collect();
    let dtype = op
        .output_dtype(&dtypes)
        .map_err(|e| RefError::Unsupported {
            op: op.name(),
            dtype: dtypes.get(e.input).copied().unwrap_or(DType::F32),
        })?;
    let values = op.def().reference(inputs, out, dtype)?;
    Ok(RefTensor {
        shape: out.clone(),
        dtype,
        values,
    })
}

/// Evaluates every node with typed inputs; returns every node's tensor, indexed by
/// `NodeId::index()`. Nodes whose values the graph also computes on the host for shape
/// inference are checked against that independent evaluation.
///
/// # Errors
/// Unknown, missing or ill-shaped inputs, data of the wrong length or type, shape-inference
/// failures, and a host value that disagrees with the reference, each naming the node.
pub fn evaluate_tensors(
    graph: &Graph,
    inputs: &[(&str, RefTensor)],
) -> Result<Vec<RefTensor>, GraphError> {
    let given: Vec<(&str, &Shape)> = inputs.iter().map(|(l, t)| (*l, &t.shape)).collect();
    let bindings = graph.bind(&given)?;
    // Small integer inputs are shape data too (a reshape target fed as an input).
    let fed: Vec<(NodeId, Vec<i64>)> = inputs
        .iter()
        .filter_map(|(label, t)| match &t.values {
            Values::Int(v) if v.len() as u64 <= super::shape_data::MAX_HOST_ELEMENTS => {
                Some((graph.find(label)?, v.clone()))
            }
            _ => None,
        })
        .collect();
    let inferred = graph.infer_shapes_fed(&bindings, &fed)?;
    let mut values: Vec<Option<RefTensor>> = vec![None; graph.len()];
    for &id in graph.order() {
        let node = graph.node(id);
        let shape = &inferred.shapes[id.index()];
        let expected = shape.num_elements().map_err(|_| GraphError::Infer {
            node: node.label.clone(),
            op: node.op.name(),
            cause: super::ops::InferError::Overflow {
                shape: shape.to_string(),
            },
        })?;
        let t = match &node.op {
            Op::Input(_) => {
                let (_, t) = inputs
                    .iter()
                    .find(|(l, _)| *l == node.label)
                    .ok_or_else(|| GraphError::MissingInput {
                        label: node.label.clone(),
                    })?;
                if t.dtype != node.dtype {
                    return Err(GraphError::InputDType {
                        node: node.label.clone(),
                        declared: node.dtype,
                        got: t.dtype,
                    });
                }
                t.clone()
            }
            Op::Constant(c) => RefTensor::from_bytes(c.shape.clone(), c.dtype, c.data.bytes())
                .map_err(|source| GraphError::Reference {
                    node: node.label.clone(),
                    op: "constant",
                    cause: source,
                })?,
            _ => {
                let ins: Vec<&RefTensor> = node
                    .inputs
                    .iter()
                    .map(|i| values[i.index()].as_ref())
                    .collect::<Option<_>>()
                    .ok_or_else(|| GraphError::MissingInput {
                        label: node.label.clone(),
                    })?;
                let producer = node.inputs.first().map(|&i| graph.node(i));
                let v = match (&node.op, producer.map(|p| &p.op)) {
                    // Rows the producer's kernel writes elsewhere: from its inputs.
                    (Op::KvRows(kr), Some(Op::FusedLinear(f))) => {
                        let producer: Vec<&RefTensor> = producer
                            .map_or(&[][..], |p| &p.inputs[..])
                            .iter()
                            .map(|i| values[i.index()].as_ref())
                            .collect::<Option<_>>()
                            .ok_or_else(|| GraphError::MissingInput {
                                label: node.label.clone(),
                            })?;
                        f.reference_kv(&producer, kr.values)
                    }
                    _ => node.op.def().reference(&ins, shape, node.dtype),
                }
                .map_err(|source| GraphError::Reference {
                    node: node.label.clone(),
                    op: node.op.name(),
                    cause: source,
                })?;
                RefTensor {
                    shape: shape.clone(),
                    dtype: node.dtype,
                    values: v,
                }
            }
        };
        if t.values.len() as u64 != expected {
            return Err(GraphError::DataLength {
                node: node.label.clone(),
                shape: shape.clone(),
                expected,
                got: t.values.len(),
            });
        }
        if let (Some(host), Values::Int(mine)) = (&inferred.values[id.index()], &t.values) {
            if host != mine {
                return Err(GraphError::HostValueMismatch {
                    node: node.label.clone(),
                    host: host.clone(),
                    reference: mine.clone(),
                });
            }
        }
        values[id.index()] = Some(t);
    }
    Ok(values
        .into_iter()
        .zip(inferred.shapes)
        .map(|(v, shape)| {
            v.unwrap_or(RefTensor {
                shape,
                dtype: DType::F32,
                values: Values::F32(Vec::new()),
            })
        })
        .collect())
}

/// [`evaluate_tensors`] with f32 carriers: each input by label with its shape and values
/// (integers as exact f32, typed by the input's declared dtype); returns `(shape, values)`
/// per node, indexed by `NodeId::index()`.
///
/// # Errors
/// As [`evaluate_tensors`].
pub fn evaluate_all(
    graph: &Graph,
    inputs: &[(&str, Shape, Vec<f32>)],
) -> Result<Vec<(Shape, Vec<f32>)>, GraphError> {
    let mut typed = Vec::with_capacity(inputs.len());
    for (label, shape, values) in inputs {
        let dtype = graph
            .find(label)
            .map(|id| graph.node(id).dtype)
            .ok_or_else(|| GraphError::UnknownInput {
                label: label.to_string(),
            })?;
        let expected = shape.num_elements().unwrap_or(u64::MAX);
        if expected != values.len() as u64 {
            return Err(GraphError::DataLength {
                node: label.to_string(),
                shape: shape.clone(),
                expected,
                got: values.len(),
            });
        }
        typed.push((
            *label,
            RefTensor::from_f32(shape.clone(), dtype, values.clone()),
        ));
    }
    Ok(evaluate_tensors(graph, &typed)?
        .into_iter()
        .map(|t| {
            let v = t.to_f32();
            (t.shape, v)
        })
        .collect())
}

/// Evaluates the graph and returns its outputs in the order they were marked, as
/// `(shape, values)` with f32 carriers.
///
/// # Errors
/// As [`evaluate_all`].
pub fn evaluate(
    graph: &Graph,
    inputs: &[(&str, Shape, Vec<f32>)],
) -> Result<Vec<(Shape, Vec<f32>)>, GraphError> {
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
    use crate::graph::ops::movement::infer_gather;
    use crate::graph::ops::{
        BinaryOp, CausalMask, Concat, Gather, LayerNorm, MatMul, Slice, Softmax, Transpose,
        MASK_VALUE,
    };

    fn s(d: &[u64]) -> Shape {
        Shape(d.to_vec())
    }

    fn f(d: &[u64], v: &[f32]) -> RefTensor {
        RefTensor::from_f32(s(d), DType::F32, v.to_vec())
    }

    fn i(d: &[u64], v: &[i64]) -> RefTensor {
        RefTensor {
            shape: s(d),
            dtype: DType::I32,
            values: Values::Int(v.to_vec()),
        }
    }

    fn run(op: impl Into<Op>, ins: &[&RefTensor]) -> Vec<f32> {
        let op = op.into();
        let shapes: Vec<&Shape> = ins.iter().map(|t| &t.shape).collect();
        let out = op.infer(&shapes, &[]).unwrap();
        eval_op(&op, ins, &out).unwrap().to_f32()
    }

    #[test]
    fn small_known_results() {
        let a = f(&[2, 2], &[1., 2., 3., 4.]);
        assert_eq!(
            run(
                MatMul { transpose_b: false },
                &[&a, &f(&[2, 2], &[5., 6., 7., 8.])]
            ),
            vec![19., 22., 43., 50.]
        );
        assert_eq!(
            run(
                MatMul { transpose_b: true },
                &[&a, &f(&[2, 2], &[5., 7., 6., 8.])]
            ),
            vec![19., 22., 43., 50.]
        );
        let x = f(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
        assert_eq!(
            run(Transpose { perm: vec![1, 0] }, &[&x]),
            vec![1., 4., 2., 5., 3., 6.]
        );
        assert_eq!(
            run(
                Concat { axis: 1 },
                &[&f(&[1, 2], &[1., 2.]), &f(&[1, 1], &[3.])]
            ),
            vec![1., 2., 3.]
        );
        let sl = Slice {
            axes: vec![1],
            starts: vec![1],
            ends: vec![3],
            steps: vec![1],
        };
        assert_eq!(run(sl, &[&x]), vec![2., 3., 5., 6.]);
        let neg = Slice {
            axes: vec![0, 1],
            starts: vec![-1, 0],
            ends: vec![i64::MAX, 3],
            steps: vec![1, 2],
        };
        assert_eq!(run(neg, &[&x]), vec![4., 6.]);
        let backwards = Slice {
            axes: vec![-1],
            starts: vec![-1],
            ends: vec![i64::MIN],
            steps: vec![-2],
        };
        assert_eq!(run(backwards, &[&x]), vec![3., 1., 6., 4.]);
        // ONNX gather: -1 is the last row, -2 the first; 2 and -3 are out of range, an error.
        assert_eq!(
            run(
                Gather::default(),
                &[&f(&[2, 2], &[1., 2., 3., 4.]), &i(&[3], &[1, -1, -2])]
            ),
            vec![3., 4., 3., 4., 1., 2.]
        );
        let table = f(&[2, 2], &[1., 2., 3., 4.]);
        for (ids, position, index) in [(&[1, 2][..], 1, 2), (&[-3, 0][..], 0, -3)] {
            let ids = i(&[2], ids);
            let out = infer_gather(&table.shape, &ids.shape, 0).unwrap();
            let err = eval_op(&Op::Gather(Gather::default()), &[&table, &ids], &out);
            assert!(
                matches!(
                    err,
                    Err(RefError::IndexOutOfRange { position: p, index: x, bound: 2 })
                        if p == position && x == index
                ),
                "{err:?}"
            );
        }
        let sm = run(Softmax::LAST, &[&f(&[2, 2], &[0.0, 0.0, 1000.0, 1000.0])]);
        assert!(sm.iter().all(|&v| (v - 0.5).abs() < 1e-6));
        // decode: past 2, one query, 3 keys: all visible; prefill 2 queries, 2 keys.
        assert_eq!(run(CausalMask, &[&f(&[1, 3], &[1.; 3])]), vec![1., 1., 1.]);
        assert_eq!(
            run(CausalMask, &[&f(&[2, 2], &[1.; 4])]),
            vec![1., MASK_VALUE, 1., 1.]
        );
        assert_eq!(
            run(CausalMask, &[&f(&[2, 3], &[1.; 6])]),
            vec![1., 1., MASK_VALUE, 1., 1., 1.]
        );
        let ln = run(
            LayerNorm { eps: 0.0, axis: -1 },
            &[
                &f(&[1, 2], &[1., 3.]),
                &f(&[2], &[1., 1.]),
                &f(&[2], &[0., 0.]),
            ],
        );
        assert!((ln[0] + 1.0).abs() < 1e-6 && (ln[1] - 1.0).abs() < 1e-6);
        // Broadcasting reads index 0 of size-1 dimensions.
        assert_eq!(
            run(
                BinaryOp::Add,
                &[&f(&[2, 1], &[10., 20.]), &f(&[3], &[1., 2., 3.])]
            ),
            vec![11., 12., 13., 21., 22., 23.]
        );
    }

    #[test]
    fn integers_wrap_at_their_width_and_floats_are_refused_where_integers_are_needed() {
        let a = i(&[2], &[i64::from(i32::MAX), 7]);
        let b = i(&[1], &[1]);
        let out = eval_op(&Op::Binary(BinaryOp::Add), &[&a, &b], &s(&[2])).unwrap();
        assert_eq!(
            out.values,
            Values::Int(vec![i64::from(i32::MIN), 8]),
            "i32 wraps like the device"
        );
        let big = RefTensor {
            shape: s(&[1]),
            dtype: DType::I64,
            values: Values::Int(vec![1 << 40]),
        };
        let out = eval_op(&Op::Binary(BinaryOp::Mul), &[&big, &big.clone()], &s(&[1]));
        assert_eq!(
            out.unwrap().values,
            Values::Int(vec![0]),
            "i64 wraps at 64 bits"
        );
        let err = eval_op(
            &Op::Gather(Gather::default()),
            &[&a, &f(&[1], &[0.0])],
            &s(&[1]),
        );
        assert!(err.is_err());
        assert_eq!(wrap(DType::U8, 257), 1);
    }

    #[test]
    fn index_helpers_walk_row_major() {
        let mut seen = Vec::new();
        index::for_each(&s(&[2, 3]), |lin, idx| {
            seen.push((lin, index::linear(idx, &s(&[2, 3]))))
        });
        assert!(seen.iter().all(|(a, b)| a == b) && seen.len() == 6);
        assert_eq!(index::broadcast(&[1, 2, 3], &s(&[3, 1])), 2);
        assert_eq!(index::broadcast(&[1, 2, 3], &s(&[4])), 3);
    }

    #[test]
    fn block_constants_dequantize_row_by_row() {
        // One row of 33 Q8_0 values: two blocks, the second holding one real value.
        let mut bytes = Vec::new();
        for scale in [1.0f32, 2.0] {
            bytes.extend(half::f16::from_f32(scale).to_bits().to_le_bytes());
            bytes.extend((0..32).map(|q| q as u8));
        }
        let t = RefTensor::from_bytes(s(&[1, 33]), DType::Q8_0, &bytes).unwrap();
        let v = t.to_f32();
        assert_eq!(v.len(), 33);
        assert_eq!((v[31], v[32]), (31.0, 0.0));
    }
}
