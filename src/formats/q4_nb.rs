//! Q4_NB, 24 bytes per 32 elements: the 4-bit weights of ONNX Runtime's `MatMulNBits`
//! (`com.microsoft`, bits 4) one block of 32 at a time, as dynrt's ONNX importer lays them
//! out (`src/onnx/import/contrib.rs`): f32 scale `d`, f32 zero point `z`, then 16 bytes whose
//! byte `j` holds element `2j` in its low nibble and element `2j + 1` in its high one (the
//! operator's own order); element `i` is `d * (q[i] - z)`, the operator's dequantization.
//! The scale and the zero point stay f32 as the file has them (ggml's Q4_1 would round both to
//! f16), so the values are exactly the ones ONNX Runtime dequantizes. No GGUF file holds this
//! format.

use super::Format;
use crate::shape::DType;

/// The table row.
pub const FORMAT: Format = Format {
    dtype: DType::Q4_NB,
    ggml: None,
    name: "q4_nb",
    block_elements: 32,
    block_bytes: 24,
    decode,
    quantize,
    grouped: None,
    wgsl: format_wgsl!("q4_nb"),
};

/// The f32 at byte `at` of `b`.
fn f32_at(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn decode(b: &[u8], o: &mut [f32]) {
    let (d, z) = (f32_at(b, 0), f32_at(b, 4));
    for (j, &q) in b[8..24].iter().enumerate() {
        o[2 * j] = d * (f32::from(q & 15) - z);
        o[2 * j + 1] = d * (f32::from(q >> 4) - z);
    }
}

/// An asymmetric grid of 15 steps over the block's range and 0 (the form of ONNX Runtime's
/// asymmetric quantizer): `d = (max - min) / 15`, `z = round(-min / d)`.
fn quantize(x: &[f32], out: &mut Vec<u8>) {
    let min = x.iter().copied().fold(0f32, f32::min);
    let max = x.iter().copied().fold(0f32, f32::max);
    let d = (max - min) / 15.0;
    let id = super::inverse(d);
    let z = (-min * id).round().clamp(0.0, 15.0);
    out.extend(d.to_le_bytes());
    out.extend(z.to_le_bytes());
    let q: Vec<u8> = x
        .iter()
        .map(|&v| (v * id + z).round().clamp(0.0, 15.0) as u8)
        .collect();
    out.extend(q.chunks_exact(2).map(|p| p[0] | (p[1] << 4)));
}

/// Appends the q4_nb block of 32 elements of one `MatMulNBits` block: its scale, its zero
/// point and its 16 bytes of nibbles as the operator stores them.
pub fn push_block(scale: f32, zero_point: f32, nibbles: &[u8; 16], out: &mut Vec<u8>) {
    out.extend(scale.to_le_bytes());
    out.extend(zero_point.to_le_bytes());
    out.extend_from_slice(nibbles);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_is_the_operators_dequantization() {
        // Nibbles 0..15 then 15..0, scale 0.5, zero point 8: element i = 0.5 * (q_i - 8).
        let q: Vec<u8> = (0..16).chain((0..16).rev()).collect();
        let nibbles: Vec<u8> = q.chunks_exact(2).map(|p| p[0] | (p[1] << 4)).collect();
        let mut block = Vec::new();
        push_block(0.5, 8.0, nibbles.as_slice().try_into().unwrap(), &mut block);
        assert_eq!(block.len(), 24);
        let mut out = [0f32; 32];
        decode(&block, &mut out);
        let want: Vec<f32> = q.iter().map(|&v| 0.5 * (f32::from(v) - 8.0)).collect();
        assert_eq!(out.to_vec(), want);
    }
}
