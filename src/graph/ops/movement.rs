//! Data movement: reshape, transpose, concat, slice, gather.

use super::{checked, InferError};
use crate::shape::Shape;

/// Output shape of a reshape. `0` copies the input dimension at the same position, `-1` is
/// inferred from the element count (at most one).
///
/// # Errors
/// [`InferError::Reshape`] when the target is malformed or the element counts differ.
pub fn infer_reshape(x: &Shape, target: &[i64]) -> Result<Shape, InferError> {
    let err = |reason| InferError::Reshape {
        from: x.clone(),
        target: target.to_vec(),
        reason,
    };
    let total = x
        .checked_num_elements()
        .ok_or_else(|| err("input overflows"))?;
    let mut out = Vec::with_capacity(target.len());
    let mut infer_at = None;
    for (i, &t) in target.iter().enumerate() {
        match t {
            -1 => {
                if infer_at.replace(i).is_some() {
                    return Err(err("more than one -1"));
                }
                out.push(1);
            }
            0 => out.push(*x.0.get(i).ok_or_else(|| err("0 beyond the input rank"))?),
            t if t > 0 => out.push(t as u64),
            _ => return Err(err("negative dimension other than -1")),
        }
    }
    let known = out
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .ok_or_else(|| err("target overflows"))?;
    if let Some(i) = infer_at {
        if known == 0 || total % known != 0 {
            return Err(err("element count not divisible by the known dimensions"));
        }
        out[i] = total / known;
    } else if known != total {
        return Err(err("element counts differ"));
    }
    Ok(Shape(out))
}

/// Output shape of a transpose: output dimension `i` is input dimension `perm[i]`.
///
/// # Errors
/// [`InferError::Permutation`] when `perm` is not a permutation of `0..rank`.
pub fn infer_transpose(x: &Shape, perm: &[usize]) -> Result<Shape, InferError> {
    let mut seen = vec![false; x.rank()];
    if perm.len() != x.rank() {
        return Err(InferError::Permutation {
            perm: perm.to_vec(),
            rank: x.rank(),
        });
    }
    for &p in perm {
        if p >= x.rank() || std::mem::replace(&mut seen[p], true) {
            return Err(InferError::Permutation {
                perm: perm.to_vec(),
                rank: x.rank(),
            });
        }
    }
    Ok(Shape(perm.iter().map(|&p| x.0[p]).collect()))
}

/// Output shape of a concat along `axis`.
///
/// # Errors
/// [`InferError::NoInputs`], [`InferError::Axis`], or [`InferError::Mismatch`] naming the first
/// input and the one that differs.
pub fn infer_concat(inputs: &[&Shape], axis: usize) -> Result<Shape, InferError> {
    let first = *inputs.first().ok_or(InferError::NoInputs)?;
    if axis >= first.rank() {
        return Err(InferError::Axis {
            axis: axis as i64,
            rank: first.rank(),
        });
    }
    let mut out = first.clone();
    for s in &inputs[1..] {
        let same_elsewhere = s.rank() == first.rank()
            && (0..first.rank()).all(|i| i == axis || s.0[i] == first.0[i]);
        if !same_elsewhere {
            return Err(InferError::Mismatch {
                what: "concat inputs differ outside the concat axis",
                left: first.clone(),
                right: (*s).clone(),
            });
        }
        out.0[axis] = out.0[axis]
            .checked_add(s.0[axis])
            .ok_or(InferError::Overflow {
                shape: out.to_string(),
            })?;
    }
    checked(out)
}

/// The elements a slice keeps along one axis: `start, start + step, ...`, `len` of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AxisRange {
    /// First index kept.
    pub start: u64,
    /// Stride between kept indices, at least 1.
    pub step: u64,
    /// Number of indices kept.
    pub len: u64,
}

/// Per-axis ranges of a slice (every axis of `x`; unlisted axes are kept whole). ONNX rules:
/// negative start/end count from the end, then clamp to `[0, dim]`.
///
/// # Errors
/// [`InferError::Slice`] for lists of different lengths or a step < 1, [`InferError::Axis`] for
/// an axis out of range or listed twice.
pub fn slice_ranges(
    x: &Shape,
    axes: &[usize],
    starts: &[i64],
    ends: &[i64],
    steps: &[i64],
) -> Result<Vec<AxisRange>, InferError> {
    if axes.len() != starts.len() || axes.len() != ends.len() || axes.len() != steps.len() {
        return Err(InferError::Slice {
            reason: "axes, starts, ends and steps must have the same length",
        });
    }
    let mut out: Vec<AxisRange> =
        x.0.iter()
            .map(|&d| AxisRange {
                start: 0,
                step: 1,
                len: d,
            })
            .collect();
    let mut seen = vec![false; x.rank()];
    for (((&axis, &start), &end), &step) in axes.iter().zip(starts).zip(ends).zip(steps) {
        if axis >= x.rank() || std::mem::replace(&mut seen[axis], true) {
            return Err(InferError::Axis {
                axis: axis as i64,
                rank: x.rank(),
            });
        }
        if step < 1 {
            return Err(InferError::Slice {
                reason: "steps must be at least 1",
            });
        }
        let d = x.0[axis].min(i64::MAX as u64) as i64;
        let clamp = |v: i64| -> i64 {
            let v = if v < 0 { v.saturating_add(d) } else { v };
            v.clamp(0, d)
        };
        let (s, e) = (clamp(start), clamp(end));
        let len = if e > s { (e - s + step - 1) / step } else { 0 };
        out[axis] = AxisRange {
            start: s as u64,
            step: step as u64,
            len: len as u64,
        };
    }
    Ok(out)
}

/// Output shape of a gather along axis 0: `ids.shape ++ table.shape[1..]`.
///
/// # Errors
/// [`InferError::Rank`] for a scalar table.
pub fn infer_gather(table: &Shape, ids: &Shape) -> Result<Shape, InferError> {
    if table.rank() == 0 {
        return Err(InferError::Rank {
            input: 0,
            shape: table.clone(),
            expected: "rank >= 1 for the gathered table",
        });
    }
    let mut out = ids.0.clone();
    out.extend_from_slice(&table.0[1..]);
    checked(Shape(out))
}

/// Row-major strides of a shape, in elements.
pub fn strides(s: &Shape) -> Vec<u64> {
    let mut st = vec![1u64; s.rank()];
    for i in (0..s.rank().saturating_sub(1)).rev() {
        st[i] = st[i + 1].saturating_mul(s.0[i + 1]);
    }
    st
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: &[u64]) -> Shape {
        Shape(d.to_vec())
    }

    #[test]
    fn reshape_rules() {
        assert_eq!(
            infer_reshape(&s(&[2, 3, 4]), &[0, -1]).unwrap(),
            s(&[2, 12])
        );
        assert_eq!(infer_reshape(&s(&[2, 3, 4]), &[4, 6]).unwrap(), s(&[4, 6]));
        assert!(infer_reshape(&s(&[2, 3]), &[-1, -1]).is_err());
        assert!(infer_reshape(&s(&[2, 3]), &[4, 2]).is_err());
        assert!(infer_reshape(&s(&[2, 3]), &[-2, 3]).is_err());
        assert!(infer_reshape(&s(&[2, 3]), &[0, 0, 0]).is_err());
        assert_eq!(infer_reshape(&s(&[0, 3]), &[3, -1]).unwrap(), s(&[3, 0]));
    }

    #[test]
    fn transpose_concat_slice_gather() {
        assert_eq!(
            infer_transpose(&s(&[2, 3, 4]), &[2, 0, 1]).unwrap(),
            s(&[4, 2, 3])
        );
        assert!(infer_transpose(&s(&[2, 3]), &[0, 0]).is_err());
        assert!(infer_transpose(&s(&[2, 3]), &[0]).is_err());
        assert_eq!(
            infer_concat(&[&s(&[1, 2, 4]), &s(&[1, 3, 4])], 1).unwrap(),
            s(&[1, 5, 4])
        );
        let e = infer_concat(&[&s(&[1, 2, 4]), &s(&[1, 3, 5])], 1).unwrap_err();
        assert!(e.to_string().contains("1x2x4 vs 1x3x5"), "{e}");
        assert!(infer_concat(&[&s(&[2])], 1).is_err());
        let r = slice_ranges(&s(&[10, 4]), &[0], &[-3], &[i64::MAX], &[1]).unwrap();
        assert_eq!(
            r[0],
            AxisRange {
                start: 7,
                step: 1,
                len: 3
            }
        );
        assert_eq!(r[1].len, 4);
        let r = slice_ranges(&s(&[10]), &[0], &[1], &[8], &[3]).unwrap();
        assert_eq!(
            r[0],
            AxisRange {
                start: 1,
                step: 3,
                len: 3
            }
        );
        assert_eq!(
            slice_ranges(&s(&[10]), &[0], &[5], &[2], &[1]).unwrap()[0].len,
            0
        );
        assert!(slice_ranges(&s(&[10]), &[0], &[0], &[2], &[0]).is_err());
        assert!(slice_ranges(&s(&[10]), &[1], &[0], &[2], &[1]).is_err());
        assert_eq!(
            infer_gather(&s(&[50, 8]), &s(&[2, 3])).unwrap(),
            s(&[2, 3, 8])
        );
        assert!(infer_gather(&s(&[]), &s(&[2])).is_err());
        assert_eq!(strides(&s(&[2, 3, 4])), vec![12, 4, 1]);
    }
}
