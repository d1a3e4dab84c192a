//! The kernels' own index arithmetic: strides, broadcast strides, 32-bit conversions and the
//! `array<vec4<u32>, 2>` packing of the uniform blocks. Kept apart from the CPU reference
//! (`crate::graph::reference` walks multi-indices with its own code) so that a wrong stride
//! here shows up as a wrong answer in the kernel tests instead of being shared by both sides.

use super::KernelError;
use crate::shape::Shape;

/// Highest rank the strided kernels (broadcast, copy, where) address: 8 (two `vec4<u32>`).
pub const MAX_RANK: usize = 8;

/// Row-major strides of a shape, in elements.
pub fn strides(s: &Shape) -> Vec<u64> {
    let mut st = vec![1u64; s.rank()];
    for i in (0..s.rank().saturating_sub(1)).rev() {
        st[i] = st[i + 1].saturating_mul(s.dims()[i + 1]);
    }
    st
}

/// Whether `strides` are the row-major strides of `s` (dimensions of extent 1 may have any
/// stride: they are never stepped over).
pub fn is_row_major(s: &Shape, strides: &[u64]) -> bool {
    let mut expect = 1u64;
    for (&d, &st) in s.dims().iter().zip(strides).rev() {
        if d != 1 && st != expect {
            return false;
        }
        expect = expect.saturating_mul(d);
    }
    strides.len() == s.rank()
}

/// An operand's element strides: its explicit ones for a strided view, else row-major.
pub fn operand_strides(o: &super::Operand<'_>) -> Vec<u64> {
    match o.strides {
        Some(s) => s.to_vec(),
        None => strides(o.shape),
    }
}

/// Elements from an operand's first to one past its last addressed element (its element
/// count when contiguous; `1 + sum((d - 1) * stride)` for a strided view; 0 when empty): what
/// a kernel must bind.
///
/// # Errors
/// [`KernelError::TooManyElements`] naming `what` when it does not fit a kernel index.
pub fn span(what: &'static str, o: &super::Operand<'_>) -> Result<u64, KernelError> {
    let Some(st) = o.strides else {
        return numel(what, o.shape);
    };
    if o.shape.dims().contains(&0) {
        return Ok(0);
    }
    let mut last = 0u64;
    for (&d, &s) in o.shape.dims().iter().zip(st) {
        last = (d - 1)
            .checked_mul(s)
            .and_then(|x| x.checked_add(last))
            .ok_or(KernelError::TooManyElements {
                what,
                elements: u64::MAX,
                max: u64::from(u32::MAX),
            })?;
    }
    u32_of(what, last + 1)?;
    Ok(last + 1)
}

/// Strides of an operand's leading (batch) dimensions `dims[..batch_rank]` with element strides
/// `strides`, as seen from the output batch shape `batch` under broadcasting: 0 where the
/// operand's dimension is 1 (or missing), its stride otherwise.
pub fn batch_strides(dims: &[u64], strides: &[u64], batch_rank: usize, batch: &Shape) -> Vec<u64> {
    let out_rank = batch.rank();
    let mut st = vec![0u64; out_rank];
    for k in 0..batch_rank.min(out_rank) {
        let i = batch_rank - 1 - k;
        let pos = out_rank - 1 - k;
        if dims[i] != 1 || batch.dims()[pos] == 1 {
            st[pos] = strides[i];
        }
    }
    st
}

/// Row-major strides (in elements) of `input` as seen from an output of shape `out` under
/// broadcasting: 0 where the input dimension is 1 (or missing), its ordinary stride otherwise.
pub fn broadcast_strides(input: &Shape, out: &Shape) -> Vec<u64> {
    let out_rank = out.rank();
    let mut st = vec![0u64; out_rank];
    let mut stride = 1u64;
    for k in 0..input.rank() {
        let d = input.dims()[input.rank() - 1 - k];
        let pos = out_rank - 1 - k;
        st[pos] = if d == 1 && out.dims()[pos] != 1 {
            0
        } else {
            stride
        };
        stride = stride.saturating_mul(d);
    }
    st
}

/// `(rows, row length)` of a last-axis reduction.
pub fn rows(x: &Shape) -> (u64, u64) {
    let d = x.dims().last().copied().unwrap_or(1);
    let rows = x.dims()[..x.rank().saturating_sub(1)].iter().product();
    (rows, d)
}

/// Packs up to [`MAX_RANK`] values into the `array<vec4<u32>, 2>` layout.
pub fn pack8(v: &[u32]) -> [[u32; 4]; 2] {
    let mut out = [[0u32; 4]; 2];
    for (i, &x) in v.iter().take(MAX_RANK).enumerate() {
        out[i / 4][i % 4] = x;
    }
    out
}

/// `v` as a kernel index (u32).
///
/// # Errors
/// [`KernelError::TooManyElements`] naming `what`.
pub fn u32_of(what: &'static str, v: u64) -> Result<u32, KernelError> {
    u32::try_from(v).map_err(|_| KernelError::TooManyElements {
        what,
        elements: v,
        max: u64::from(u32::MAX),
    })
}

/// Every value as a kernel index.
///
/// # Errors
/// As [`u32_of`].
pub fn u32s(what: &'static str, v: &[u64]) -> Result<Vec<u32>, KernelError> {
    v.iter().map(|&x| u32_of(what, x)).collect()
}

/// Element count of `s`, which must fit a kernel index.
///
/// # Errors
/// [`KernelError::TooManyElements`] naming `what`.
pub fn numel(what: &'static str, s: &Shape) -> Result<u64, KernelError> {
    let n = s
        .checked_num_elements()
        .ok_or(KernelError::TooManyElements {
            what,
            elements: u64::MAX,
            max: u64::from(u32::MAX),
        })?;
    u32_of(what, n)?;
    Ok(n)
}

/// Checks a rank against [`MAX_RANK`].
///
/// # Errors
/// [`KernelError::RankTooLarge`].
pub fn check_rank(s: &Shape) -> Result<(), KernelError> {
    if s.rank() > MAX_RANK {
        return Err(KernelError::RankTooLarge {
            rank: s.rank(),
            max: MAX_RANK,
        });
    }
    Ok(())
}

/// Names of input operands in errors, by position.
pub const INPUT_NAMES: [&str; 4] = ["input 0", "input 1", "input 2", "input 3+"];

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: &[u64]) -> Shape {
        Shape(d.to_vec())
    }

    #[test]
    fn strides_and_broadcast_strides() {
        assert_eq!(strides(&s(&[2, 3, 4])), vec![12, 4, 1]);
        assert_eq!(
            broadcast_strides(&s(&[3, 1]), &s(&[2, 3, 4])),
            vec![0, 1, 0]
        );
        assert_eq!(
            broadcast_strides(&s(&[2, 3, 4]), &s(&[2, 3, 4])),
            vec![12, 4, 1]
        );
        assert_eq!(rows(&s(&[2, 3, 5])), (6, 5));
        assert_eq!(pack8(&[1, 2, 3, 4, 5]), [[1, 2, 3, 4], [5, 0, 0, 0]]);
        assert!(u32_of("x", 1 << 32).is_err());
        assert!(is_row_major(&s(&[2, 1, 4]), &[4, 99, 1]));
        assert!(!is_row_major(&s(&[2, 3, 4]), &[24, 4, 1]));
        assert_eq!(
            batch_strides(&[1, 3, 5, 7], &[105, 35, 7, 1], 2, &s(&[2, 3])),
            vec![0, 35]
        );
    }
}
