//! Q8_NB, 36 bytes per 32 elements: the 8-bit weights of an ONNX export that stores them as
//! `int8` initializers dequantized in the graph (`Cast` to f32, then `Mul` by an f32 scale
//! per output channel or per row), as dynrt's ONNX importer lays them out
//! (`src/onnx/import/weights.rs`): f32 scale `d`, then 32 `i8` values `q`; element `j` is
//! `d * q[j]`, the graph's own dequantization. The scale stays f32 as the file has it
//! (ggml's Q8_0 would round it to f16), so the values are exactly the ones ONNX Runtime
//! computes, and the blocks are whole words. No GGUF file holds this format.

use super::Format;
use crate::shape::DType;

/// The table row.
pub const FORMAT: Format = Format {
    dtype: DType::Q8_NB,
    ggml: None,
    name: "q8_nb",
    block_elements: 32,
    block_bytes: 36,
    decode,
    quantize,
    grouped: None,
    wgsl: format_wgsl!("q8_nb"),
};

fn decode(b: &[u8], o: &mut [f32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (out, &q) in o.iter_mut().zip(&b[4..36]) {
        *out = d * f32::from(q as i8);
    }
}

/// Symmetric, as ONNX Runtime's 8-bit weight quantizer: `d = max |x| / 127`.
fn quantize(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = super::inverse(d);
    out.extend(d.to_le_bytes());
    out.extend(x.iter().map(|&v| (v * id).round().clamp(-127.0, 127.0) as i8 as u8));
}

/// Appends the q8_nb block of 32 weights that share `scale`.
pub fn push_block(scale: f32, q: &[i8; 32], out: &mut Vec<u8>) {
    out.extend(scale.to_le_bytes());
    out.extend(q.iter().map(|&v| v as u8));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_is_the_graphs_dequantization() {
        // -128..127 in steps of 8, scale 0.25: element j = f32(q_j) * 0.25, as Cast then Mul.
        let q: Vec<i8> = (0..32).map(|j| (j * 8 - 128) as i8).collect();
        let mut block = Vec::new();
        push_block(0.25, q.as_slice().try_into().unwrap(), &mut block);
        assert_eq!(block.len(), 36);
        let mut out = [0f32; 32];
        decode(&block, &mut out);
        let want: Vec<f32> = q.iter().map(|&v| f32::from(v) * 0.25).collect();
        assert_eq!(out.to_vec(), want);
    }
}
