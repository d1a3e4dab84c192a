//! Q2_K, 84 bytes per 256 elements: 16 bytes `scales` (per 16-element group: low nibble a
//! scale, high nibble a minimum), 64 bytes `qs` of 2-bit values, f16 `d`, f16 `dmin`.
//! Element `i` (`h = i / 128`, `s = i % 128 / 32`, `l = i % 32`) is
//! `(d * (scales[i/16] & 15)) * ((qs[32h + l] >> 2s) & 3) - dmin * (scales[i/16] >> 4)`.

use super::{f16_at, f16_bytes, group_ranges, level, quantize_scales, Format};
use super::GgmlType;
use crate::shape::DType;

/// The table row.
pub const FORMAT: Format = Format {
    dtype: DType::Q2_K,
    ggml: Some(GgmlType::Q2_K),
    name: "q2_k",
    block_elements: 256,
    block_bytes: 84,
    decode,
    quantize,
    grouped: None,
    wgsl: format_wgsl!("q2_k"),
};

fn decode(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 80);
    let dmin = f16_at(b, 82);
    for (i, v) in o.iter_mut().enumerate() {
        let (h, s, l) = (i / 128, i % 128 / 32, i % 32);
        let q = (b[16 + 32 * h + l] >> (2 * s)) & 3;
        let sc = b[i / 16];
        let dl = d * f32::from(sc & 15);
        let ml = dmin * f32::from(sc >> 4);
        *v = dl * f32::from(q) - ml;
    }
}

fn quantize(x: &[f32], out: &mut Vec<u8>) {
    let ranges = group_ranges(x, 16, 3.0);
    let (d, sc) = quantize_scales(ranges.iter().map(|r| r.0), 15);
    let (dmin, m) = quantize_scales(ranges.iter().map(|r| r.1), 15);
    let q: Vec<u8> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let g = i / 16;
            level(v, d * f32::from(sc[g]), dmin * f32::from(m[g]), 3)
        })
        .collect();
    out.extend((0..16).map(|g| sc[g] | (m[g] << 4)));
    for h in 0..2 {
        for l in 0..32 {
            out.push((0..4).fold(0u8, |a, s| a | (q[128 * h + 32 * s + l] << (2 * s))));
        }
    }
    out.extend(f16_bytes(d));
    out.extend(f16_bytes(dmin));
}
