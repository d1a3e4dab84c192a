//! Batched matrix multiplication (NumPy `matmul` rules) and ONNX `Gemm`.

use super::{all_f32, checked, elementwise::broadcast, DTypeError, InferError, OpDef};
use crate::graph::reference::{index, RefError, RefTensor, Values};
use crate::shape::{DType, Shape};

/// `[..., M, K] x [..., K, N] -> [..., M, N]`, batch dimensions broadcast (NumPy). With
/// `transpose_b` the right side is `[..., N, K]`. A 1-D operand is a vector (NumPy and ONNX
/// `MatMul`): `[K]` on the left is one row whose dimension the output drops, `[K]` on the
/// right one column, likewise dropped. Inputs: a, b (f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatMul {
    /// Right operand is stored transposed (`[..., N, K]`).
    pub transpose_b: bool,
}

impl OpDef for MatMul {
    fn name(&self) -> &'static str {
        "matmul"
    }
    fn arity(&self) -> (usize, usize) {
        (2, 2)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        all_f32(inputs)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        infer(inputs, self.transpose_b)
    }
    /// Nested loops over the output with f64 accumulation; batch indices broadcast with the
    /// reference's index helpers.
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let (a, b) = (inputs[0].floats("matmul")?, inputs[1].floats("matmul")?);
        let (sa, sb) = (&inputs[0].shape, &inputs[1].shape);
        let Ok(d) = dims(sa, sb, self.transpose_b) else {
            return Ok(Values::F32(Vec::new()));
        };
        let (m, k, n) = (d.m as usize, d.k as usize, d.n as usize);
        let mut v = vec![0f32; out.checked_num_elements().unwrap_or(0) as usize];
        index::for_each(&d.batch, |bi, idx| {
            let oa = index::broadcast(idx, &d.a_batch) * m * k;
            let ob = index::broadcast(idx, &d.b_batch) * k * n;
            for i in 0..m {
                for j in 0..n {
                    let mut acc = 0f64;
                    for p in 0..k {
                        let bv = if self.transpose_b {
                            b[ob + j * k + p]
                        } else {
                            b[ob + p * n + j]
                        };
                        acc += f64::from(a[oa + i * k + p]) * f64::from(bv);
                    }
                    v[bi * m * n + i * n + j] = acc as f32;
                }
            }
        });
        Ok(Values::F32(v))
    }
}

/// The dimensions of one matmul: batch shape (broadcast), `m`, `k`, `n`, each operand's own
/// batch dimensions, and whether an operand was a vector (its dimension is not in the
/// output).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatMulDims {
    /// Broadcast batch dimensions of the output.
    pub batch: Shape,
    /// Rows of the output.
    pub m: u64,
    /// Inner dimension.
    pub k: u64,
    /// Columns of the output.
    pub n: u64,
    /// The left operand's batch dimensions.
    pub a_batch: Shape,
    /// The right operand's batch dimensions.
    pub b_batch: Shape,
    /// The left operand was 1-D: the output has no M dimension.
    pub a_vector: bool,
    /// The right operand was 1-D: the output has no N dimension.
    pub b_vector: bool,
}

/// Splits `a [..., M, K]` and `b [..., K, N]` (`[..., N, K]` when `transpose_b`) into the
/// matmul dimensions; a 1-D `a` is `[1, K]`, a 1-D `b` is `[K, 1]`.
///
/// # Errors
/// [`InferError::Rank`] for a scalar, [`InferError::Mismatch`] when the inner dimensions
/// differ, [`InferError::Broadcast`] when the batch dimensions do not broadcast.
pub fn dims(a: &Shape, b: &Shape, transpose_b: bool) -> Result<MatMulDims, InferError> {
    for (i, s) in [a, b].into_iter().enumerate() {
        if s.rank() < 1 {
            return Err(InferError::Rank {
                input: i,
                shape: s.clone(),
                expected: "rank >= 1 for matmul",
            });
        }
    }
    let (ra, rb) = (a.rank(), b.rank());
    let (a_vector, b_vector) = (ra == 1, rb == 1);
    let (m, ka) = if a_vector {
        (1, a.0[0])
    } else {
        (a.0[ra - 2], a.0[ra - 1])
    };
    let (kb, n) = if b_vector {
        (b.0[0], 1)
    } else if transpose_b {
        (b.0[rb - 1], b.0[rb - 2])
    } else {
        (b.0[rb - 2], b.0[rb - 1])
    };
    if ka != kb {
        return Err(InferError::Mismatch {
            what: "matmul inner dimensions differ",
            left: a.clone(),
            right: b.clone(),
        });
    }
    let a_batch = Shape(a.0[..ra.saturating_sub(2)].to_vec());
    let b_batch = Shape(b.0[..rb.saturating_sub(2)].to_vec());
    let batch = broadcast(&a_batch, &b_batch).map_err(|_| InferError::Broadcast {
        left: a.clone(),
        right: b.clone(),
    })?;
    Ok(MatMulDims {
        batch,
        m,
        k: ka,
        n,
        a_batch,
        b_batch,
        a_vector,
        b_vector,
    })
}

/// Output shape of a matmul.
///
/// # Errors
/// As [`dims`].
pub fn infer(inputs: &[&Shape], transpose_b: bool) -> Result<Shape, InferError> {
    let d = dims(inputs[0], inputs[1], transpose_b)?;
    let mut out = d.batch.0;
    if !d.a_vector {
        out.push(d.m);
    }
    if !d.b_vector {
        out.push(d.n);
    }
    checked(Shape(out))
}

/// ONNX `Gemm`: `alpha * A' @ B' + beta * C` with `A' = A` or `A^T` (`[M, K]`), `B' = B` or
/// `B^T` (`[K, N]`), and the optional `C` broadcast to `[M, N]` one way. Inputs: a, b,
/// optional c (f32, 2-D a and b).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemm {
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of `C`.
    pub beta: f32,
    /// A is stored `[K, M]`.
    pub trans_a: bool,
    /// B is stored `[N, K]`.
    pub trans_b: bool,
}

impl Gemm {
    /// `(m, k, n)` of a gemm, C checked to broadcast to `[M, N]`.
    ///
    /// # Errors
    /// [`InferError::Rank`] for operands that are not 2-D, [`InferError::Mismatch`] for inner
    /// dimensions that differ, [`InferError::Broadcast`] for a C that does not broadcast.
    pub fn dims(&self, inputs: &[&Shape]) -> Result<(u64, u64, u64), InferError> {
        for (i, s) in inputs.iter().take(2).enumerate() {
            if s.rank() != 2 {
                return Err(InferError::Rank {
                    input: i,
                    shape: (*s).clone(),
                    expected: "a 2-D matrix for gemm",
                });
            }
        }
        let (a, b) = (inputs[0], inputs[1]);
        let (m, ka) = if self.trans_a {
            (a.0[1], a.0[0])
        } else {
            (a.0[0], a.0[1])
        };
        let (kb, n) = if self.trans_b {
            (b.0[1], b.0[0])
        } else {
            (b.0[0], b.0[1])
        };
        if ka != kb {
            return Err(InferError::Mismatch {
                what: "gemm inner dimensions differ",
                left: a.clone(),
                right: b.clone(),
            });
        }
        if let Some(c) = inputs.get(2) {
            let out = Shape(vec![m, n]);
            if broadcast(c, &out).ok().as_ref() != Some(&out) {
                return Err(InferError::Broadcast {
                    left: (*c).clone(),
                    right: out,
                });
            }
        }
        Ok((m, ka, n))
    }
}

impl OpDef for Gemm {
    fn name(&self) -> &'static str {
        "gemm"
    }
    fn arity(&self) -> (usize, usize) {
        (2, 3)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        all_f32(inputs)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        let (m, _, n) = self.dims(inputs)?;
        checked(Shape(vec![m, n]))
    }
    /// Nested loops with f64 accumulation; C read through the reference's broadcast.
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let (a, b) = (inputs[0].floats("gemm")?, inputs[1].floats("gemm")?);
        let shapes: Vec<&Shape> = inputs.iter().map(|t| &t.shape).collect();
        let Ok((m, k, n)) = self.dims(&shapes) else {
            return Ok(Values::F32(Vec::new()));
        };
        let (m, k, n) = (m as usize, k as usize, n as usize);
        let c = match inputs.get(2) {
            Some(t) => Some((t.floats("gemm")?, &t.shape)),
            None => None,
        };
        let mut v = Vec::with_capacity(m * n);
        index::for_each(out, |_, idx| {
            let (i, j) = (idx[0] as usize, idx[1] as usize);
            let mut acc = 0f64;
            for p in 0..k {
                let av = if self.trans_a {
                    a[p * m + i]
                } else {
                    a[i * k + p]
                };
                let bv = if self.trans_b {
                    b[j * k + p]
                } else {
                    b[p * n + j]
                };
                acc += f64::from(av) * f64::from(bv);
            }
            let mut r = f64::from(self.alpha) * acc;
            if let Some((c, cs)) = c {
                r += f64::from(self.beta) * f64::from(c[index::broadcast(idx, cs)]);
            }
            v.push(r as f32);
        });
        Ok(Values::F32(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: &[u64]) -> Shape {
        Shape(d.to_vec())
    }

    #[test]
    fn batched_broadcast_and_transpose() {
        assert_eq!(
            infer(&[&s(&[2, 3]), &s(&[3, 4])], false).unwrap(),
            s(&[2, 4])
        );
        assert_eq!(
            infer(&[&s(&[5, 1, 2, 3]), &s(&[4, 3, 7])], false).unwrap(),
            s(&[5, 4, 2, 7])
        );
        assert_eq!(
            infer(&[&s(&[2, 3]), &s(&[4, 3])], true).unwrap(),
            s(&[2, 4])
        );
        let e = infer(&[&s(&[2, 3]), &s(&[4, 5])], false).unwrap_err();
        assert_eq!(e.to_string(), "matmul inner dimensions differ: 2x3 vs 4x5");
        assert!(matches!(
            infer(&[&s(&[]), &s(&[3, 4])], false),
            Err(InferError::Rank { input: 0, .. })
        ));
        // Vectors: their dimension leaves the output.
        assert_eq!(infer(&[&s(&[3]), &s(&[3, 4])], false).unwrap(), s(&[4]));
        assert_eq!(
            infer(&[&s(&[2, 5, 3]), &s(&[3])], false).unwrap(),
            s(&[2, 5])
        );
        assert_eq!(infer(&[&s(&[3]), &s(&[3])], false).unwrap(), s(&[]));
        assert_eq!(
            infer(&[&s(&[3]), &s(&[2, 3, 4])], false).unwrap(),
            s(&[2, 4])
        );
        assert!(infer(&[&s(&[3]), &s(&[4])], false).is_err());
        assert!(matches!(
            infer(&[&s(&[2, 2, 3]), &s(&[3, 3, 4])], false),
            Err(InferError::Broadcast { .. })
        ));
    }

    #[test]
    fn gemm_shapes() {
        let g = |trans_a, trans_b| Gemm {
            alpha: 1.0,
            beta: 1.0,
            trans_a,
            trans_b,
        };
        let infer = |g: Gemm, shapes: &[&[u64]]| {
            let sh: Vec<Shape> = shapes.iter().map(|d| s(d)).collect();
            let refs: Vec<&Shape> = sh.iter().collect();
            g.infer(&refs, &[])
        };
        assert_eq!(
            infer(g(false, false), &[&[2, 3], &[3, 4]]).unwrap(),
            s(&[2, 4])
        );
        assert_eq!(
            infer(g(true, true), &[&[3, 2], &[4, 3], &[4]]).unwrap(),
            s(&[2, 4])
        );
        assert_eq!(
            infer(g(false, false), &[&[2, 3], &[3, 4], &[2, 1]]).unwrap(),
            s(&[2, 4])
        );
        assert!(infer(g(false, false), &[&[2, 3], &[3, 4], &[3]]).is_err());
        assert!(infer(g(false, false), &[&[2, 3], &[3, 4], &[1, 2, 4]]).is_err());
        assert!(infer(g(false, false), &[&[2, 3], &[4, 3]]).is_err());
        assert!(infer(g(false, false), &[&[3], &[3, 4]]).is_err());
    }
}
