//! Reductions over the last axis: softmax, layer norm, RMS norm.

use super::{InferError, Op};
use crate::shape::Shape;

/// Shape rule of ops that keep the shape of a rank >= 1 input (softmax over the last axis; the
/// unary activations accept any rank, scalars included).
///
/// # Errors
/// [`InferError::Rank`] for a scalar input to softmax.
pub fn infer_rank_at_least_1(x: &Shape, op: &Op) -> Result<Shape, InferError> {
    if matches!(op, Op::Softmax) && x.rank() == 0 {
        return Err(InferError::Rank {
            input: 0,
            shape: x.clone(),
            expected: "rank >= 1 (softmax runs over the last axis)",
        });
    }
    Ok(x.clone())
}

/// Shape rule of layer norm (`x, gamma, beta`) and RMS norm (`x, gamma`): the output has x's
/// shape; every parameter must be `[D]` with `D` the last dimension of x.
///
/// # Errors
/// [`InferError::Rank`] for a scalar x, [`InferError::Mismatch`] for a parameter of the wrong
/// shape.
pub fn infer_norm(inputs: &[&Shape]) -> Result<Shape, InferError> {
    let x = inputs[0];
    let Some(&d) = x.0.last() else {
        return Err(InferError::Rank {
            input: 0,
            shape: x.clone(),
            expected: "rank >= 1 (normalisation runs over the last axis)",
        });
    };
    for p in &inputs[1..] {
        if p.0 != [d] {
            return Err(InferError::Mismatch {
                what: "norm parameter must be [D] with D the last dimension of x",
                left: x.clone(),
                right: (*p).clone(),
            });
        }
    }
    Ok(x.clone())
}

/// Splits a shape into `(rows, row_len)` for a last-axis reduction.
pub fn rows(x: &Shape) -> (u64, u64) {
    let d = x.0.last().copied().unwrap_or(1);
    let rows = x.0[..x.rank().saturating_sub(1)].iter().product();
    (rows, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: &[u64]) -> Shape {
        Shape(d.to_vec())
    }

    #[test]
    fn norm_parameters_must_match_last_dim() {
        assert_eq!(
            infer_norm(&[&s(&[2, 8]), &s(&[8]), &s(&[8])]).unwrap(),
            s(&[2, 8])
        );
        let e = infer_norm(&[&s(&[2, 8]), &s(&[4])]).unwrap_err();
        assert!(e.to_string().contains("2x8 vs 4"), "{e}");
        assert!(infer_norm(&[&s(&[]), &s(&[1])]).is_err());
        assert!(infer_rank_at_least_1(&s(&[]), &Op::Softmax).is_err());
        assert_eq!(rows(&s(&[2, 3, 5])), (6, 5));
    }
}
