//! Q5_K, 176 bytes per 256 elements: f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales and
//! minimums (as Q4_K), 32 bytes `qh` (the fifth bits: element `i`'s is bit `i / 32` of
//! `qh[i % 32]`), 128 bytes `qs` (the low nibbles, as Q4_K). Element `i` is
//! `(d * sc[i/32]) * (nibble | fifth bit << 4) - dmin * m[i/32]`.

use super::q4_k::{pack_scale_min, quantize_groups, scale_min};
use super::{f16_at, f16_bytes, Format};
use super::GgmlType;
use crate::shape::DType;

/// The table row.
pub const FORMAT: Format = Format {
    dtype: DType::Q5_K,
    ggml: Some(GgmlType::Q5_K),
    name: "q5_k",
    block_elements: 256,
    block_bytes: 176,
    decode,
    quantize,
    grouped: None,
    wgsl: format_wgsl!("q5_k"),
};

fn decode(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    for (j, group) in o.chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min(&b[4..16], j);
        let dl = d * f32::from(sc);
        let ml = dmin * f32::from(m);
        for (l, v) in group.iter_mut().enumerate() {
            let lo = (b[48 + 32 * (j / 2) + l] >> (4 * (j % 2))) & 15;
            let hi = (b[16 + l] >> j) & 1;
            *v = dl * f32::from(lo | (hi << 4)) - ml;
        }
    }
}

fn quantize(x: &[f32], out: &mut Vec<u8>) {
    let (d, dmin, sc, m, q) = quantize_groups(x, 31);
    out.extend(f16_bytes(d));
    out.extend(f16_bytes(dmin));
    out.extend(pack_scale_min(&sc, &m));
    out.extend((0..32).map(|l| (0..8).fold(0u8, |a, j| a | ((q[32 * j + l] >> 4) << j))));
    for c in 0..4 {
        out.extend((0..32).map(|l| (q[64 * c + l] & 15) | ((q[64 * c + 32 + l] & 15) << 4)));
    }
}
