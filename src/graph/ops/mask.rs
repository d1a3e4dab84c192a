//! Masks for attention: the causal mask over a growing past (and `Where`, whose shape rule is
//! three-way broadcasting, in [`super::Op::infer`]).

use super::InferError;
use crate::shape::Shape;

/// Shape rule of the causal mask: `[..., S, T]` with `T >= S`; the past length is `T - S`.
///
/// # Errors
/// [`InferError::Rank`] below rank 2, [`InferError::CausalMask`] when `T < S`.
pub fn infer_causal(x: &Shape) -> Result<Shape, InferError> {
    if x.rank() < 2 {
        return Err(InferError::Rank {
            input: 0,
            shape: x.clone(),
            expected: "rank >= 2 ([..., queries, keys])",
        });
    }
    let (s, t) = (x.0[x.rank() - 2], x.0[x.rank() - 1]);
    if t < s {
        return Err(InferError::CausalMask { shape: x.clone() });
    }
    Ok(x.clone())
}

/// Whether query `i` may see key `j` with `past` keys before the first query.
pub fn visible(i: u64, j: u64, past: u64) -> bool {
    j <= past + i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causal_mask_needs_keys_at_least_queries() {
        assert!(infer_causal(&Shape(vec![2, 3, 5])).is_ok());
        assert!(infer_causal(&Shape(vec![2, 5, 3])).is_err());
        assert!(infer_causal(&Shape(vec![5])).is_err());
        assert!(visible(0, 4, 4) && !visible(0, 5, 4) && visible(1, 5, 4));
    }
}
