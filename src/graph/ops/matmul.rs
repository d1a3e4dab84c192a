//! Batched matrix multiplication.

use super::{all_f32, checked, elementwise::broadcast, DTypeError, InferError, OpDef};
use crate::graph::reference::{index, RefError, RefTensor, Values};
use crate::shape::{DType, Shape};

/// `[..., M, K] x [..., K, N] -> [..., M, N]`, batch dimensions broadcast (NumPy). With
/// `transpose_b` the right side is `[..., N, K]`. Inputs: a, b (f32).
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
        let batch_a = Shape(sa.0[..sa.rank() - 2].to_vec());
        let batch_b = Shape(sb.0[..sb.rank() - 2].to_vec());
        let mut v = vec![0f32; out.checked_num_elements().unwrap_or(0) as usize];
        index::for_each(&d.batch, |bi, idx| {
            let oa = index::broadcast(idx, &batch_a) * m * k;
            let ob = index::broadcast(idx, &batch_b) * k * n;
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

/// The dimensions of one matmul: batch shape (broadcast), `m`, `k`, `n`.
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
}

/// Splits `a [..., M, K]` and `b [..., K, N]` (`[..., N, K]` when `transpose_b`) into the
/// matmul dimensions.
///
/// # Errors
/// [`InferError::Rank`] for rank < 2, [`InferError::Mismatch`] when the inner dimensions
/// differ, [`InferError::Broadcast`] when the batch dimensions do not broadcast.
pub fn dims(a: &Shape, b: &Shape, transpose_b: bool) -> Result<MatMulDims, InferError> {
    for (i, s) in [a, b].into_iter().enumerate() {
        if s.rank() < 2 {
            return Err(InferError::Rank {
                input: i,
                shape: s.clone(),
                expected: "rank >= 2 for matmul",
            });
        }
    }
    let (ra, rb) = (a.rank(), b.rank());
    let (m, ka) = (a.0[ra - 2], a.0[ra - 1]);
    let (kb, n) = if transpose_b {
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
    let batch = broadcast(
        &Shape(a.0[..ra - 2].to_vec()),
        &Shape(b.0[..rb - 2].to_vec()),
    )
    .map_err(|_| InferError::Broadcast {
        left: a.clone(),
        right: b.clone(),
    })?;
    Ok(MatMulDims { batch, m, k: ka, n })
}

/// Output shape of a matmul.
///
/// # Errors
/// As [`dims`].
pub fn infer(inputs: &[&Shape], transpose_b: bool) -> Result<Shape, InferError> {
    let d = dims(inputs[0], inputs[1], transpose_b)?;
    let mut out = d.batch.0;
    out.push(d.m);
    out.push(d.n);
    checked(Shape(out))
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
            infer(&[&s(&[3]), &s(&[3, 4])], false),
            Err(InferError::Rank { input: 0, .. })
        ));
        assert!(matches!(
            infer(&[&s(&[2, 2, 3]), &s(&[3, 3, 4])], false),
            Err(InferError::Broadcast { .. })
        ));
    }
}
