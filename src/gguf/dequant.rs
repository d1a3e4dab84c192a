//! CPU dequantization into `f32`: the reference the GPU kernels are checked against.
//!
//! Block layouts (ggml's, little-endian):
//! - `Q4_1`, 20 bytes per 32 elements: f16 scale `d`, f16 minimum `m`, 16 bytes `qs`;
//!   element `j < 16` is `d * (qs[j] & 15) + m`, element `j + 16` is `d * (qs[j] >> 4) + m`.
//! - `Q8_0`, 34 bytes per 32 elements: f16 scale `d`, 32 `i8` values `q`; element `j` is
//!   `d * q[j]`.
//! - `F16`: IEEE half floats; `F32`: floats.
//!
//! A test compares these with the Python `gguf` package's `dequantize` on every tensor of the
//! real model and on files that package writes.

use super::{GgmlType, Gguf, GgufError};
use half::f16;

/// The types [`dequantize`] handles, for messages.
pub const DEQUANTIZE_TYPES: &str = "F32, F16, Q4_1, Q8_0";

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

fn q4_1_block(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    let m = f16_at(block, 2);
    let (lo, hi) = out.split_at_mut(16);
    for (j, &q) in block[4..20].iter().enumerate() {
        lo[j] = d * f32::from(q & 0x0F) + m;
        hi[j] = d * f32::from(q >> 4) + m;
    }
}

fn q8_0_block(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    for (o, &q) in out.iter_mut().zip(&block[2..34]) {
        *o = d * f32::from(q as i8);
    }
}

/// Dequantizes `src`, the bytes of `dst.len()` elements of type `ty`, into `dst`.
///
/// `label` names what is dequantized (a tensor) in errors.
///
/// # Errors
/// [`GgufError::UnsupportedTensorType`] for a type outside [`DEQUANTIZE_TYPES`];
/// [`GgufError::PartialBlock`] when `dst.len()` is not a whole number of blocks;
/// [`GgufError::LengthMismatch`] when `src` is not exactly the bytes of `dst.len()` elements.
pub fn dequantize(label: &str, ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), GgufError> {
    let block_fn: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::F32 => |b, o| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        GgmlType::F16 => |b, o| o[0] = f16_at(b, 0),
        GgmlType::Q4_1 => q4_1_block,
        GgmlType::Q8_0 => q8_0_block,
        _ => {
            return Err(GgufError::UnsupportedTensorType {
                tensor: label.to_owned(),
                ty,
                supported: DEQUANTIZE_TYPES,
            })
        }
    };
    let n = dst.len() as u64;
    let Some(expected_bytes) = ty.size_bytes(n) else {
        return Err(GgufError::PartialBlock {
            tensor: label.to_owned(),
            ty,
            row_len: n,
            block_len: ty.block_len(),
        });
    };
    if src.len() as u64 != expected_bytes {
        return Err(GgufError::LengthMismatch {
            what: format!("{label} ({n} elements of {ty})"),
            expected_bytes,
            actual_bytes: src.len() as u64,
        });
    }
    let (bl, bb) = (ty.block_len() as usize, ty.block_bytes() as usize);
    for (block, out) in src.chunks_exact(bb).zip(dst.chunks_exact_mut(bl)) {
        block_fn(block, out);
    }
    Ok(())
}

/// Quantizes `src` to `ty` (`Q8_0`, `Q4_1`, `F16` or `F32`) with ggml's reference rounding,
/// for building test models and checking kernels; `src.len()` must be a whole number of
/// blocks. Returns the blocks' bytes.
///
/// # Errors
/// [`GgufError::UnsupportedTensorType`], [`GgufError::PartialBlock`].
pub fn quantize(label: &str, ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, GgufError> {
    let bl = ty.block_len() as usize;
    if src.len() % bl != 0 {
        return Err(GgufError::PartialBlock {
            tensor: label.to_owned(),
            ty,
            row_len: src.len() as u64,
            block_len: bl as u64,
        });
    }
    let mut out = Vec::with_capacity(src.len() / bl * ty.block_bytes() as usize);
    match ty {
        GgmlType::F32 => src.iter().for_each(|x| out.extend(x.to_le_bytes())),
        GgmlType::F16 => src
            .iter()
            .for_each(|&x| out.extend(f16::from_f32(x).to_le_bytes())),
        GgmlType::Q8_0 => {
            for block in src.chunks_exact(32) {
                let amax = block.iter().fold(0f32, |a, x| a.max(x.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(f16::from_f32(d).to_le_bytes());
                out.extend(block.iter().map(|&x| (x * id).round() as i8 as u8));
            }
        }
        GgmlType::Q4_1 => {
            for block in src.chunks_exact(32) {
                let min = block.iter().copied().fold(f32::INFINITY, f32::min);
                let max = block.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(f16::from_f32(d).to_le_bytes());
                out.extend(f16::from_f32(min).to_le_bytes());
                let q = |x: f32| (((x - min) * id + 0.5) as u8).min(15);
                out.extend((0..16).map(|j| q(block[j]) | (q(block[j + 16]) << 4)));
            }
        }
        _ => {
            return Err(GgufError::UnsupportedTensorType {
                tensor: label.to_owned(),
                ty,
                supported: DEQUANTIZE_TYPES,
            })
        }
    }
    Ok(out)
}

impl Gguf {
    /// The whole tensor `name` dequantized to `f32`, in file order (row-major, innermost dim
    /// contiguous). Allocates `4 * num_elements` bytes, freed when the `Vec` is dropped.
    ///
    /// # Errors
    /// [`GgufError::MissingTensor`], the errors of [`Gguf::tensor_bytes`] and of
    /// [`dequantize`].
    pub fn dequantize_tensor(&self, file: &[u8], name: &str) -> Result<Vec<f32>, GgufError> {
        let info = self.require_tensor(name)?;
        self.dequantize_rows(file, name, 0..info.num_rows())
    }

    /// Rows `rows` of tensor `name` dequantized to `f32` (a row is `dims()[0]` elements):
    /// an embedding lookup without expanding the whole table.
    ///
    /// # Errors
    /// As [`dequantize_tensor`](Self::dequantize_tensor); [`GgufError::ValueOutOfRange`]
    /// when `rows` is not inside `0..num_rows`.
    pub fn dequantize_rows(
        &self,
        file: &[u8],
        name: &str,
        rows: std::ops::Range<u64>,
    ) -> Result<Vec<f32>, GgufError> {
        let info = self.require_tensor(name)?;
        let bytes = self.tensor_bytes(file, name)?;
        let ty = info.ggml_type();
        if rows.start > rows.end || rows.end > info.num_rows() {
            return Err(GgufError::ValueOutOfRange {
                key: format!("rows of tensor `{name}`"),
                value: format!("{rows:?}"),
                reason: format!("the tensor has {} rows", info.num_rows()),
            });
        }
        // Parsing checked that whole rows are whole blocks and that the sizes fit.
        let row_bytes = ty.size_bytes(info.row_len()).unwrap_or(0);
        let start = (rows.start * row_bytes) as usize;
        let end = (rows.end * row_bytes) as usize;
        let mut out = vec![0.0f32; ((rows.end - rows.start) * info.row_len()) as usize];
        dequantize(name, ty, &bytes[start..end], &mut out)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn q4_1_block_puts_low_nibbles_first() {
        let mut block = Vec::new();
        block.extend(h(0.5));
        block.extend(h(-1.0));
        for j in 0..16u8 {
            block.push(j | ((15 - j) << 4));
        }
        let mut out = [0f32; 32];
        dequantize("t", GgmlType::Q4_1, &block, &mut out).unwrap();
        for j in 0..16 {
            assert_eq!(out[j], 0.5 * j as f32 - 1.0, "low nibble {j}");
            assert_eq!(out[j + 16], 0.5 * (15 - j) as f32 - 1.0, "high nibble {j}");
        }
    }

    #[test]
    fn q8_0_block_is_signed() {
        let mut block = Vec::new();
        block.extend(h(0.25));
        block.extend((0..32).map(|j| (j as i8 - 16) as u8));
        let mut out = [0f32; 32];
        dequantize("t", GgmlType::Q8_0, &block, &mut out).unwrap();
        for (j, o) in out.iter().enumerate() {
            assert_eq!(*o, 0.25 * (j as f32 - 16.0));
        }
    }

    #[test]
    fn quantize_then_dequantize_is_close() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 64) as f32 - 31.5) / 8.0)
            .collect();
        // Half a quantization step (amax/127 and range/15 over 2), plus the f16 rounding of
        // the scale and the minimum.
        for (ty, tol) in [(GgmlType::Q8_0, 0.02), (GgmlType::Q4_1, 0.27)] {
            let q = quantize("x", ty, &x).unwrap();
            let mut y = vec![0f32; 64];
            dequantize("x", ty, &q, &mut y).unwrap();
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() <= tol, "{ty}: {a} vs {b}");
            }
        }
        assert!(matches!(
            quantize("x", GgmlType::Q4_1, &x[..33]),
            Err(GgufError::PartialBlock { .. })
        ));
    }

    #[test]
    fn wrong_lengths_and_types_are_errors() {
        let mut out = [0f32; 32];
        assert!(matches!(
            dequantize("t", GgmlType::Q8_0, &[0; 33], &mut out),
            Err(GgufError::LengthMismatch {
                expected_bytes: 34,
                actual_bytes: 33,
                ..
            })
        ));
        assert!(matches!(
            dequantize("t", GgmlType::Q4_1, &[0; 20], &mut out[..31]),
            Err(GgufError::PartialBlock { .. })
        ));
        assert!(matches!(
            dequantize("t", GgmlType::Q6_K, &[], &mut []),
            Err(GgufError::UnsupportedTensorType {
                ty: GgmlType::Q6_K,
                ..
            })
        ));
        let mut f = [0f32; 2];
        dequantize("t", GgmlType::F16, &[h(1.5), h(-2.0)].concat(), &mut f).unwrap();
        assert_eq!(f, [1.5, -2.0]);
    }
}
