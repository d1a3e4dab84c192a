//! CPU dequantization into `f32`: the reference the GPU kernels are checked against.
//!
//! The block layouts and decoders are the rows of [`crate::formats`]; this module applies
//! them to whole tensors with GGUF's checks. A test compares every decoder bit for bit with
//! the Python `gguf` package's `dequantize` on random blocks (`tests/host/quant_formats.rs`), and
//! the real model's tensors and files that package writes with it (`src/gguf/tests.rs`).

use super::{GgmlType, Gguf, GgufError};
use crate::formats::{self, Format};

/// The types [`dequantize`] handles, for messages (`"F32, F16, BF16, Q4_0, ..."`).
pub fn dequantize_types() -> &'static str {
    formats::ggml_names()
}

fn format_of(label: &str, ty: GgmlType) -> Result<&'static Format, GgufError> {
    formats::of_ggml(ty).ok_or_else(|| GgufError::UnsupportedTensorType {
        tensor: label.to_owned(),
        ty,
        supported: dequantize_types(),
    })
}

/// Dequantizes `src`, the bytes of `dst.len()` elements of type `ty`, into `dst`.
///
/// `label` names what is dequantized (a tensor) in errors.
///
/// # Errors
/// [`GgufError::UnsupportedTensorType`] for a type outside [`dequantize_types`];
/// [`GgufError::PartialBlock`] when `dst.len()` is not a whole number of blocks;
/// [`GgufError::LengthMismatch`] when `src` is not exactly the bytes of `dst.len()` elements.
pub fn dequantize(label: &str, ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), GgufError> {
    let format = format_of(label, ty)?;
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
    let (bl, bb) = (format.block_elements as usize, format.block_bytes as usize);
    for (block, out) in src.chunks_exact(bb).zip(dst.chunks_exact_mut(bl)) {
        (format.decode)(block, out);
    }
    Ok(())
}

/// Quantizes `src` to `ty` (any type of [`dequantize_types`]) with each format's simple
/// quantizer ([`Format::quantize`]: ggml's reference rounding for the 32-element formats, a
/// min/max fit for the k-quants), for building test models and checking kernels;
/// `src.len()` must be a whole number of blocks. Returns the blocks' bytes.
///
/// # Errors
/// [`GgufError::UnsupportedTensorType`], [`GgufError::PartialBlock`].
pub fn quantize(label: &str, ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, GgufError> {
    let format = format_of(label, ty)?;
    format
        .quantize_all(src)
        .ok_or_else(|| GgufError::PartialBlock {
            tensor: label.to_owned(),
            ty,
            row_len: src.len() as u64,
            block_len: u64::from(format.block_elements),
        })
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
    use half::f16;

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
    fn quantize_then_dequantize_is_close_for_the_32_element_formats() {
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
            dequantize("t", GgmlType::IQ2_XXS, &[], &mut []),
            Err(GgufError::UnsupportedTensorType {
                ty: GgmlType::IQ2_XXS,
                ..
            })
        ));
        let mut f = [0f32; 2];
        dequantize("t", GgmlType::F16, &[h(1.5), h(-2.0)].concat(), &mut f).unwrap();
        assert_eq!(f, [1.5, -2.0]);
    }
}
