//! Masks: the causal mask over a growing past, `where`, and `trilu` (a triangle of the last
//! two dimensions).

use super::elementwise::broadcast;
use super::{all_f32, is_index, DTypeError, InferError, OpDef, MASK_VALUE};
use crate::graph::reference::{index, RefError, RefTensor, Values};
use crate::graph::shape_data;
use crate::shape::{DType, Shape};

/// `cond ? a : b` elementwise with three-way broadcasting; `cond` is true where nonzero.
/// Inputs: cond (any plain type), a, b (one type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Where;

/// Causal attention mask over a growing past: for scores `[..., S, T]` with `T = P + S`
/// (P past keys), query `i` sees keys `j <= P + i`; the others become [`MASK_VALUE`]. The
/// past length comes from the shape, so one node serves prefill and decode. Inputs: x (f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CausalMask;

impl OpDef for Where {
    fn name(&self) -> &'static str {
        "where"
    }
    fn arity(&self) -> (usize, usize) {
        (3, 3)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        if inputs[0].block().is_some() {
            return Err(DTypeError::at(0, "a plain (not block-quantized) condition"));
        }
        if inputs[1].block().is_some() {
            return Err(DTypeError::at(1, "a plain (not block-quantized) type"));
        }
        if inputs[2] != inputs[1] {
            return Err(DTypeError::at(2, "the same type as input 1"));
        }
        Ok(inputs[1])
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        let ab = broadcast(inputs[1], inputs[2])?;
        broadcast(inputs[0], &ab)
    }
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let (c, a, b) = (inputs[0], inputs[1], inputs[2]);
        let mut from_a = Vec::new();
        let mut from_b = Vec::new();
        index::for_each(out, |_, idx| {
            let take_a = c.is_true(index::broadcast(idx, &c.shape));
            from_a.push(take_a.then(|| index::broadcast(idx, &a.shape)));
            from_b.push((!take_a).then(|| index::broadcast(idx, &b.shape)));
        });
        Ok(match (a.values.pick(&from_a), b.values.pick(&from_b)) {
            (Values::F32(x), Values::F32(y)) => Values::F32(
                from_a
                    .iter()
                    .zip(x.iter().zip(y))
                    .map(|(pa, (&va, vb))| if pa.is_some() { va } else { vb })
                    .collect(),
            ),
            (Values::Int(x), Values::Int(y)) => Values::Int(
                from_a
                    .iter()
                    .zip(x.iter().zip(y))
                    .map(|(pa, (&va, vb))| if pa.is_some() { va } else { vb })
                    .collect(),
            ),
            _ => {
                return Err(RefError::Unsupported {
                    op: "where",
                    dtype: b.dtype,
                })
            }
        })
    }
    fn host_evaluable(&self) -> bool {
        true
    }
    fn host_value(&self, shapes: &[&Shape], values: &[&[i64]], out: &Shape) -> Option<Vec<i64>> {
        let ins = [
            (values[0], shapes[0]),
            (values[1], shapes[1]),
            (values[2], shapes[2]),
        ];
        shape_data::broadcast_map(&ins, out, |v| if v[0] != 0 { v[1] } else { v[2] })
    }
}

/// Keeps the upper (`j - i >= k`) or lower (`j - i <= k`) triangle of the last two
/// dimensions and zeroes the rest (ONNX `Trilu`). `k` is the optional scalar second input
/// (read on the device), 0 without it. Inputs: x (32- or 64-bit elements), optional k (i32
/// or i64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trilu {
    /// Keep the upper triangle (else the lower).
    pub upper: bool,
}

impl Trilu {
    /// Whether element `(i, j)` is kept for diagonal offset `k`.
    pub fn keeps(&self, i: u64, j: u64, k: i64) -> bool {
        let d = i128::from(j) - i128::from(i);
        if self.upper {
            d >= i128::from(k)
        } else {
            d <= i128::from(k)
        }
    }
}

impl OpDef for Trilu {
    fn name(&self) -> &'static str {
        "trilu"
    }
    fn arity(&self) -> (usize, usize) {
        (1, 2)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        if inputs[0].block().is_some() {
            return Err(DTypeError::at(0, "a plain (not block-quantized) type"));
        }
        if inputs.len() == 2 && !is_index(inputs[1]) {
            return Err(DTypeError::at(1, "i32, u32 or i64 (the diagonal offset)"));
        }
        Ok(inputs[0])
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        if inputs[0].rank() < 2 {
            return Err(InferError::Rank {
                input: 0,
                shape: inputs[0].clone(),
                expected: "rank >= 2",
            });
        }
        if let Some(k) = inputs.get(1) {
            if k.checked_num_elements() != Some(1) {
                return Err(InferError::Rank {
                    input: 1,
                    shape: (*k).clone(),
                    expected: "a scalar diagonal offset",
                });
            }
        }
        Ok(inputs[0].clone())
    }
    fn preserves_shape(&self) -> bool {
        true
    }
    /// Element `(.., i, j)` kept by [`Trilu::keeps`], zero otherwise.
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let k = match inputs.get(1) {
            Some(t) => t.ints("trilu")?.first().copied().unwrap_or(0),
            None => 0,
        };
        let r = out.rank();
        let mut picks = Vec::new();
        index::for_each(out, |lin, idx| {
            picks.push(self.keeps(idx[r - 2], idx[r - 1], k).then_some(lin));
        });
        Ok(inputs[0].values.pick(&picks))
    }
}

impl OpDef for CausalMask {
    fn name(&self) -> &'static str {
        "causal_mask"
    }
    fn arity(&self) -> (usize, usize) {
        (1, 1)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        all_f32(inputs)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        infer_causal(inputs[0])
    }
    fn preserves_shape(&self) -> bool {
        true
    }
    /// Element `(.., i, j)` keeps its value when `j <= (T - S) + i`.
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let x = inputs[0].floats("causal_mask")?;
        let r = out.rank();
        let (s, t) = (out.dims()[r - 2], out.dims()[r - 1]);
        let past = t.saturating_sub(s);
        let mut v = Vec::with_capacity(x.len());
        index::for_each(out, |lin, idx| {
            let (i, j) = (idx[r - 2], idx[r - 1]);
            v.push(if visible(i, j, past) {
                x[lin]
            } else {
                MASK_VALUE
            });
        });
        Ok(Values::F32(v))
    }
}

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

    #[test]
    fn trilu_triangles() {
        let up = Trilu { upper: true };
        let low = Trilu { upper: false };
        assert!(up.keeps(0, 0, 0) && !up.keeps(1, 0, 0) && up.keeps(1, 0, -1));
        assert!(low.keeps(1, 0, 0) && !low.keeps(0, 1, 0) && low.keeps(0, 1, 1));
        let s = |d: &[u64]| Shape(d.to_vec());
        assert!(up.infer(&[&s(&[3])], &[]).is_err());
        assert!(up.infer(&[&s(&[3, 4]), &s(&[2])], &[]).is_err());
        assert_eq!(
            up.infer(&[&s(&[2, 3, 4]), &s(&[])], &[]).unwrap(),
            s(&[2, 3, 4])
        );
    }

    #[test]
    fn where_wants_one_value_type() {
        assert_eq!(
            Where.output_dtype(&[DType::Bool, DType::F32, DType::F32]),
            Ok(DType::F32)
        );
        assert!(Where
            .output_dtype(&[DType::I32, DType::F32, DType::I32])
            .is_err());
    }
}
