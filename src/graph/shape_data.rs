//! The host evaluator of shape data: integer tensors derived from shapes (`shape_of` and
//! what integer constants, slices, concats, gathers and arithmetic make of it), computed on
//! the host while shapes are inferred so a shape rule that needs values
//! ([`crate::graph::ops::OpDef::shape_data_inputs`], a reshape to a computed target) never
//! waits for the GPU (as the OpenVINO GPU plugin's update_shape reads shape inputs on the host).
//!
//! Written apart from the CPU reference ([`crate::graph::reference`]): its own index code
//! (stride tables over i64 vectors) and its own per-op code, reached through
//! [`crate::graph::ops::OpDef::host_value`]. The reference recomputes the same nodes its own
//! way and [`crate::graph::reference::evaluate_tensors`] compares the two.

use super::ops::{movement::AxisRange, InferError, Op};
use super::reference::wrap;
use crate::shape::{DType, Shape};

/// Largest integer tensor computed on the host: shape data is small; anything larger is data
/// for the GPU.
pub const MAX_HOST_ELEMENTS: u64 = 4096;

/// The host value of a node of `dtype` computed by `op` from its inputs' shapes and host
/// values, or `None` when the op has no host evaluation, the output is not an integer tensor,
/// is larger than [`MAX_HOST_ELEMENTS`], or an input's values are not known on the host.
///
/// # Errors
/// None today; the `Result` leaves room for ops whose host evaluation can fail.
pub fn evaluate(
    op: &Op,
    dtype: DType,
    shapes: &[&Shape],
    data: &[Option<&[i64]>],
    out: &Shape,
) -> Result<Option<Vec<i64>>, InferError> {
    let def = op.def();
    if !dtype.is_int() || !def.host_evaluable() {
        return Ok(None);
    }
    if out
        .checked_num_elements()
        .is_none_or(|n| n > MAX_HOST_ELEMENTS)
    {
        return Ok(None);
    }
    let values: Vec<&[i64]> = if def.reads_values() {
        match data.iter().copied().collect::<Option<Vec<&[i64]>>>() {
            Some(v) => v,
            None => return Ok(None),
        }
    } else {
        Vec::new()
    };
    Ok(def
        .host_value(shapes, &values, out)
        .map(|v| v.into_iter().map(|x| wrap(dtype, x)).collect()))
}

/// The values of an integer tensor (a constant, or an input fed for a run) small enough to be
/// shape data.
pub(crate) fn decode_constant(dtype: DType, bytes: &[u8]) -> Option<Vec<i64>> {
    let n = bytes.len() as u64 * 8 / u64::from(dtype.bits()?);
    if !dtype.is_int() || n > MAX_HOST_ELEMENTS {
        return None;
    }
    crate::tensor::decode_i64(dtype, bytes).ok()
}

/// Row-major element strides of `shape`.
fn strides_of(shape: &Shape) -> Vec<u64> {
    let mut st = vec![0u64; shape.rank()];
    let mut acc = 1u64;
    for (s, &d) in st.iter_mut().zip(shape.dims()).rev() {
        *s = acc;
        acc = acc.saturating_mul(d);
    }
    st
}

/// Element-wise `f(a, b)` with NumPy broadcasting into `out` (strides of 0 on broadcast
/// dimensions).
pub(crate) fn broadcast_zip(
    a: &[i64],
    sa: &Shape,
    b: &[i64],
    sb: &Shape,
    out: &Shape,
    f: impl Fn(i64, i64) -> i64,
) -> Option<Vec<i64>> {
    broadcast_map(&[(a, sa), (b, sb)], out, |v| f(v[0], v[1]))
}

/// Element-wise `f(values)` over any number of inputs broadcast into `out`.
pub(crate) fn broadcast_map(
    inputs: &[(&[i64], &Shape)],
    out: &Shape,
    f: impl Fn(&[i64]) -> i64,
) -> Option<Vec<i64>> {
    let n = out.checked_num_elements()? as usize;
    let rank = out.rank();
    let aligned = |s: &Shape| -> Option<Vec<u64>> {
        let mut v = vec![0u64; rank.checked_sub(s.rank())?];
        v.extend(
            strides_of(s)
                .iter()
                .zip(s.dims())
                .map(|(&st, &d)| if d == 1 { 0 } else { st }),
        );
        Some(v)
    };
    let tables: Vec<Vec<u64>> = inputs
        .iter()
        .map(|(_, s)| aligned(s))
        .collect::<Option<_>>()?;
    let ost = strides_of(out);
    let mut v = Vec::with_capacity(n);
    let mut at = vec![0u64; inputs.len()];
    let mut picked = vec![0i64; inputs.len()];
    for lin in 0..n as u64 {
        at.iter_mut().for_each(|a| *a = 0);
        let mut rest = lin;
        for k in 0..rank {
            let i = rest / ost[k];
            rest %= ost[k];
            for (a, t) in at.iter_mut().zip(&tables) {
                *a += i * t[k];
            }
        }
        for ((p, a), (x, _)) in picked.iter_mut().zip(&at).zip(inputs) {
            *p = *x.get(*a as usize)?;
        }
        v.push(f(&picked));
    }
    Some(v)
}

/// Concatenation along `axis`.
pub(crate) fn concat(vals: &[&[i64]], shapes: &[&Shape], axis: usize) -> Option<Vec<i64>> {
    let outer: u64 = shapes.first()?.dims().get(..axis)?.iter().product();
    let mut v = Vec::new();
    for o in 0..outer as usize {
        for (x, s) in vals.iter().zip(shapes) {
            let chunk = s.dims().get(axis..)?.iter().product::<u64>() as usize;
            v.extend_from_slice(x.get(o * chunk..(o + 1) * chunk)?);
        }
    }
    Some(v)
}

/// The elements the shape rule's ranges keep (steps may be negative).
pub(crate) fn slice(x: &[i64], shape: &Shape, ranges: &[AxisRange]) -> Option<Vec<i64>> {
    let st = strides_of(shape);
    let out = Shape(ranges.iter().map(|r| r.len).collect());
    let n = out.checked_num_elements()? as usize;
    let ost = strides_of(&out);
    let mut v = Vec::with_capacity(n);
    for lin in 0..n as u64 {
        let mut rest = lin;
        let mut src = 0i128;
        for k in 0..ranges.len() {
            let i = rest / ost[k];
            rest %= ost[k];
            let at = i128::from(ranges[k].start) + i128::from(i) * i128::from(ranges[k].step);
            src += at * i128::from(st[k]);
        }
        v.push(*x.get(usize::try_from(src).ok()?)?);
    }
    Some(v)
}

/// `table` gathered along `axis` by `ids`: negative ids count from the end; `None` for one
/// out of range.
pub(crate) fn gather(table: &[i64], tshape: &Shape, ids: &[i64], axis: usize) -> Option<Vec<i64>> {
    let dims = tshape.dims();
    let extent = *dims.get(axis)?;
    let outer = dims[..axis].iter().product::<u64>() as usize;
    let inner = dims[axis + 1..].iter().product::<u64>() as usize;
    let mut v = Vec::with_capacity(outer * ids.len() * inner);
    for o in 0..outer {
        for &id in ids {
            // Out of range is an error of the gather's shape rule, never a value.
            let id = super::ops::movement::gather_index(id, extent)? as usize;
            let at = (o * extent as usize + id) * inner;
            v.extend_from_slice(table.get(at..at + inner)?);
        }
    }
    Some(v)
}

/// `x` with its dimensions permuted (`out[k] = x.dims[perm[k]]`).
pub(crate) fn transpose(x: &[i64], shape: &Shape, perm: &[usize], out: &Shape) -> Option<Vec<i64>> {
    let st = strides_of(shape);
    let ost = strides_of(out);
    let n = out.checked_num_elements()?;
    let mut v = Vec::with_capacity(n as usize);
    for lin in 0..n {
        let mut rest = lin;
        let mut src = 0u64;
        for (k, &p) in perm.iter().enumerate() {
            let i = rest / ost[k];
            rest %= ost[k];
            src += i * st.get(p)?;
        }
        v.push(*x.get(src as usize)?);
    }
    Some(v)
}

/// `x` reduced over `axes` by `f` into `out` (whose element order is the input's with the
/// reduced axes dropped); an output with nothing to reduce gets `empty`, or the whole
/// evaluation gives `None`.
pub(crate) fn reduce(
    x: &[i64],
    shape: &Shape,
    axes: &[usize],
    out: &Shape,
    empty: Option<i64>,
    f: impl Fn(i64, i64) -> i64,
) -> Option<Vec<i64>> {
    let st = strides_of(shape);
    // Output strides laid over the input's axes, 0 on reduced ones.
    let mut kept_stride = vec![0u64; shape.rank()];
    let mut acc = 1u64;
    for a in (0..shape.rank()).rev() {
        if !axes.contains(&a) {
            kept_stride[a] = acc;
            acc = acc.saturating_mul(shape.dims()[a]);
        }
    }
    let mut res: Vec<Option<i64>> = vec![None; out.checked_num_elements()? as usize];
    for (lin, &v) in x.iter().enumerate() {
        let mut rest = lin as u64;
        let mut o = 0u64;
        for a in 0..shape.rank() {
            let i = rest / st[a];
            rest %= st[a];
            o += i * kept_stride[a];
        }
        let slot = res.get_mut(o as usize)?;
        *slot = Some(slot.map_or(v, |a| f(a, v)));
    }
    res.into_iter().map(|r| r.or(empty)).collect()
}

/// Cumulative sums of `x` along `axis`.
pub(crate) fn cumsum(
    x: &[i64],
    shape: &Shape,
    axis: usize,
    exclusive: bool,
    reverse: bool,
) -> Option<Vec<i64>> {
    let d = *shape.dims().get(axis)? as usize;
    let inner = shape.dims()[axis + 1..].iter().product::<u64>() as usize;
    let outer = shape.dims()[..axis].iter().product::<u64>() as usize;
    let mut v = vec![0i64; x.len()];
    for o in 0..outer {
        for c in 0..inner {
            let mut run = 0i64;
            for step in 0..d {
                let j = if reverse { d - 1 - step } else { step };
                let at = (o * d + j) * inner + c;
                let here = *x.get(at)?;
                if exclusive {
                    v[at] = run;
                    run = run.wrapping_add(here);
                } else {
                    run = run.wrapping_add(here);
                    v[at] = run;
                }
            }
        }
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::ops::{movement::slice_ranges, BinaryOp, Concat, Gather, ShapeOf, Slice};

    fn s(d: &[u64]) -> Shape {
        Shape(d.to_vec())
    }

    #[test]
    fn shape_chains_evaluate_on_the_host() {
        let x = s(&[5, 8]);
        let shp = evaluate(
            &Op::ShapeOf(ShapeOf::default()),
            DType::I32,
            &[&x],
            &[None],
            &s(&[2]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(shp, vec![5, 8]);
        let sl = Slice {
            axes: vec![0],
            starts: vec![0],
            ends: vec![1],
            steps: vec![1],
        };
        let first = evaluate(
            &Op::Slice(sl),
            DType::I32,
            &[&s(&[2])],
            &[Some(&shp)],
            &s(&[1]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(first, vec![5]);
        let cat = evaluate(
            &Op::Concat(Concat { axis: 0 }),
            DType::I32,
            &[&s(&[1]), &s(&[2])],
            &[Some(&first), Some(&[2, 4])],
            &s(&[3]),
        )
        .unwrap();
        assert_eq!(cat, Some(vec![5, 2, 4]));
        let prod = evaluate(
            &Op::Binary(BinaryOp::Mul),
            DType::I32,
            &[&s(&[3]), &s(&[])],
            &[Some(&[5, 2, 4]), Some(&[3])],
            &s(&[3]),
        )
        .unwrap();
        assert_eq!(prod, Some(vec![15, 6, 12]));
        // Missing values, float outputs and large tensors are not host values.
        let none = evaluate(
            &Op::Gather(Gather::default()),
            DType::I32,
            &[&s(&[3]), &s(&[1])],
            &[None, Some(&[0])],
            &s(&[1]),
        )
        .unwrap();
        assert_eq!(none, None);
        let float = evaluate(
            &Op::ShapeOf(ShapeOf::default()),
            DType::F32,
            &[&x],
            &[None],
            &s(&[2]),
        );
        assert_eq!(float.unwrap(), None);
        assert_eq!(
            gather(&[1, 2, 3, 4], &s(&[2, 2]), &[1, -1, -2], 0),
            Some(vec![3, 4, 3, 4, 1, 2])
        );
        // Out of range (2, -3, a huge one) is no value: the shape rule reports it.
        for bad in [2, -3, i64::MIN] {
            assert_eq!(gather(&[1, 2, 3, 4], &s(&[2, 2]), &[0, bad], 0), None);
        }
        assert_eq!(
            gather(&[1, 2, 3, 4, 5, 6], &s(&[2, 3]), &[2, 0], 1),
            Some(vec![3, 1, 6, 4])
        );
        assert_eq!(
            transpose(&[1, 2, 3, 4, 5, 6], &s(&[2, 3]), &[1, 0], &s(&[3, 2])),
            Some(vec![1, 4, 2, 5, 3, 6])
        );
        let x = [1, 2, 3, 4, 5, 6];
        let sum = |a: i64, b: i64| a + b;
        assert_eq!(
            reduce(&x, &s(&[2, 3]), &[1], &s(&[2]), Some(0), sum),
            Some(vec![6, 15])
        );
        assert_eq!(
            reduce(&x, &s(&[2, 3]), &[0], &s(&[1, 3]), Some(0), sum),
            Some(vec![5, 7, 9])
        );
        assert_eq!(
            reduce(&[], &s(&[0, 2]), &[0], &s(&[2]), None, sum),
            None,
            "an empty max has no host value"
        );
        assert_eq!(
            cumsum(&x, &s(&[2, 3]), 1, false, false),
            Some(vec![1, 3, 6, 4, 9, 15])
        );
        assert_eq!(
            cumsum(&x, &s(&[2, 3]), 0, true, true),
            Some(vec![4, 5, 6, 0, 0, 0])
        );
        let r = slice_ranges(&s(&[2, 3]), &[1], &[1], &[3], &[1]).unwrap();
        assert_eq!(
            slice(&[1, 2, 3, 4, 5, 6], &s(&[2, 3]), &r),
            Some(vec![2, 3, 5, 6])
        );
    }
}
