//! Q4_K, 144 bytes per 256 elements: f16 `d`, f16 `dmin`, 12 bytes of eight 6-bit scales and
//! eight 6-bit minimums (one each per 32-element group, packed as [`scale_min`] reads them),
//! 128 bytes `qs`. Element `i` (`j = i / 32`, `l = i % 32`) is
//! `(d * sc[j]) * ((qs[32 * (j / 2) + l] >> 4 * (j % 2)) & 15) - dmin * m[j]`.

use super::{f16_at, f16_bytes, group_ranges, level, quantize_scales, Format};
use super::GgmlType;
use crate::shape::DType;

/// The table row.
pub const FORMAT: Format = Format {
    dtype: DType::Q4_K,
    ggml: Some(GgmlType::Q4_K),
    name: "q4_k",
    block_elements: 256,
    block_bytes: 144,
    decode,
    quantize,
    grouped: None,
    wgsl: format_wgsl!("q4_k"),
};

/// Scale and minimum of group `j` (0..8) from the 12 packed bytes `s`: groups 0..4 in the
/// low 6 bits of bytes `j` and `j + 4`; groups 4..8 in the nibbles of byte `j + 4` with their
/// top 2 bits in the top bits of bytes `j - 4` and `j`.
pub(super) fn scale_min(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// The inverse of [`scale_min`].
pub(super) fn pack_scale_min(sc: &[u8], m: &[u8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 15) | ((m[j + 4] & 15) << 4);
    }
    s
}

/// Super-block scales, per-group 6-bit scales and minimums, and the values on a grid of
/// `levels` steps per group of 32 (Q4_K: 15, Q5_K: 31).
pub(super) fn quantize_groups(x: &[f32], levels: u8) -> (f32, f32, Vec<u8>, Vec<u8>, Vec<u8>) {
    let ranges = group_ranges(x, 32, f32::from(levels));
    let (d, sc) = quantize_scales(ranges.iter().map(|r| r.0), 63);
    let (dmin, m) = quantize_scales(ranges.iter().map(|r| r.1), 63);
    let q = x
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let g = i / 32;
            level(v, d * f32::from(sc[g]), dmin * f32::from(m[g]), levels)
        })
        .collect();
    (d, dmin, sc, m, q)
}

fn decode(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    for (j, group) in o.chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min(&b[4..16], j);
        let dl = d * f32::from(sc);
        let ml = dmin * f32::from(m);
        for (l, v) in group.iter_mut().enumerate() {
            let q = (b[16 + 32 * (j / 2) + l] >> (4 * (j % 2))) & 15;
            *v = dl * f32::from(q) - ml;
        }
    }
}

fn quantize(x: &[f32], out: &mut Vec<u8>) {
    let (d, dmin, sc, m, q) = quantize_groups(x, 15);
    out.extend(f16_bytes(d));
    out.extend(f16_bytes(dmin));
    out.extend(pack_scale_min(&sc, &m));
    for c in 0..4 {
        out.extend((0..32).map(|l| q[64 * c + l] | (q[64 * c + 32 + l] << 4)));
    }
}
