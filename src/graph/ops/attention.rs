//! The attention ops of a llama-style decoder: rotary position embedding on adjacent pairs or
//! on halves ([`Rope`]) and causal grouped-query attention over a sequence-major KV cache
//! ([`Attention`]).

use super::{DTypeError, InferError, OpDef};
use crate::graph::reference::{RefError, RefTensor, Values};
use crate::shape::{DType, Shape};

/// Rotary position embedding of every head, on **adjacent pairs** `(x[2i], x[2i+1])` when
/// [`Rope::interleaved`] (GGUF's llama Q/K rows: llama.cpp permutes the Hugging Face rows so
/// that the pairs are adjacent) or on **halves** `(x[i], x[i + R/2])` otherwise (the
/// Hugging Face layout that GGUF keeps for qwen2 and gemma, llama.cpp's "NEOX" mode); the
/// same flag as ONNX's `RotaryEmbedding`.
///
/// Inputs: x `[S, N * head_dim]` (f32, N heads side by side), positions `[S]` (i32, the
/// absolute position of each row), and a two-level cos/sin table `[B + H, R]` (f32, see
/// [`rope_table`]): row `l < B` holds `cos(l θ_i), sin(l θ_i)` and row `B + h` holds
/// `cos(h B θ_i), sin(h B θ_i)` for `i < R / 2`, where `B` is [`Rope::block`]. Position
/// `p = h B + l` takes the angle sum of rows `l` and `B + h`. The first `R` elements of each
/// head are rotated, pair `(a, b)` of frequency `i` (`a = 2i, b = 2i + 1` interleaved, `a = i,
/// b = i + R/2` on halves) becoming `(x[a] cos - x[b] sin, x[a] sin + x[b] cos)`; elements
/// from `R` on pass through. A row whose position is outside `0..B * H` is
/// written as zeros (a caller's bug shows instead of wrapping around).
///
/// The table carries the angles instead of the kernel computing `p θ_i` in f32: positions up
/// to the context length times frequencies near 1 give angles of thousands of radians,
/// where an f32 product is off by about 5e-4 radians; the table is computed in f64 on the
/// host and rounded once per level. Two levels keep it at about `2 sqrt(P)` rows for `P`
/// positions (a model that claims a context of a million tokens needs 2,048 rows, not a
/// million), for an angle error of about 2e-7 instead of 6e-8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rope {
    /// Elements per head (even).
    pub head_dim: u32,
    /// Rows of the table's first level `B` ([`rope_block`]), at least 1.
    pub block: u32,
    /// Adjacent pairs (`true`) or halves (`false`).
    pub interleaved: bool,
}

/// Causal grouped-query attention over a KV cache laid out sequence-major.
///
/// Inputs: q `[S, H * D]`, k `[T, KVH * D]`, v `[T, KVH * D]` (f32) with `T >= S`: the keys
/// and values of the `T - S` past tokens followed by the `S` new ones, exactly the rows a KV
/// cache appended in place holds. Output `[S, H * D]`: for query row `s` and head `h`,
/// `softmax_j(q·k_j / sqrt(D))` over keys `j <= T - S + s` of KV head `h / (H / KVH)`,
/// times `v_j`. One op serves prefill (`T = S` with no past, or on top of a past) and
/// decode (`S = 1`).
///
/// With a [`Attention::window`] `W > 0` a query sees only the last `W` keys up to its own
/// (sliding-window attention: keys `j` with `T - S + s - j < W`). Positions are relative to
/// the rows given, so a cache whose oldest rows were dropped still masks correctly as long
/// as it keeps the `W - 1` rows before the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attention {
    /// Query heads `H`.
    pub num_heads: u32,
    /// Key/value heads `KVH` (divides `H`).
    pub num_kv_heads: u32,
    /// Keys a query sees, its own included; 0: every key up to its own.
    pub window: u32,
}

impl Attention {
    /// The first key query row `s` of `S` sees among `T` keys (the last is `T - S + s`).
    pub fn first_key(&self, t: u64, s_rows: u64, s: u64) -> u64 {
        let last = t - s_rows + s;
        match self.window {
            0 => 0,
            w => (last + 1).saturating_sub(u64::from(w)),
        }
    }
}

/// The first level's rows of [`rope_table`] for `positions` positions: the power of two at
/// or above `sqrt(positions)` (at least 1).
pub fn rope_block(positions: u32) -> u32 {
    let mut b = 1u32;
    while u64::from(b) * u64::from(b) < u64::from(positions) {
        b *= 2;
    }
    b
}

/// Rows of [`rope_table`] for `positions` positions: `B + ceil(positions / B)` with
/// `B = rope_block(positions)`.
pub fn rope_table_rows(positions: u32) -> u32 {
    let b = rope_block(positions);
    b + positions.div_ceil(b)
}

/// The two-level cos/sin table of [`Rope`] covering positions `0..positions` (see [`Rope`]
/// for its layout): [`rope_table_rows`] rows of `rope_dim` values, `θ_i = base^(-2i /
/// rope_dim)`, each angle computed in f64 and rounded to f32. The op's `block` is
/// [`rope_block`]`(positions)`.
pub fn rope_table(base: f64, rope_dim: u32, positions: u32) -> Vec<f32> {
    rope_table_scaled(base, rope_dim, positions, 1.0, &[])
}

/// [`rope_table`] with scaled angles: position `p` takes the angle `p * scale * θ_i /
/// factors[i]` (`scale` is 1 / the linear scaling factor; `factors` are per-frequency
/// divisors such as Llama 3.1's `rope_freqs.weight`, empty for none, else `rope_dim / 2` of
/// them).
pub fn rope_table_scaled(
    base: f64,
    rope_dim: u32,
    positions: u32,
    scale: f64,
    factors: &[f32],
) -> Vec<f32> {
    let half = rope_dim / 2;
    let b = rope_block(positions);
    let rows = rope_table_rows(positions);
    let mut out = Vec::with_capacity(rows as usize * rope_dim as usize);
    for row in 0..rows {
        let p = if row < b {
            f64::from(row)
        } else {
            f64::from(row - b) * f64::from(b)
        };
        for i in 0..half {
            let factor = factors.get(i as usize).map_or(1.0, |&f| f64::from(f));
            let theta = base.powf(-2.0 * f64::from(i) / f64::from(rope_dim)) / factor;
            let angle = p * scale * theta;
            out.push(angle.cos() as f32);
            out.push(angle.sin() as f32);
        }
    }
    out
}

pub(super) fn invalid(op: &'static str, reason: String) -> InferError {
    InferError::Invalid { op, reason }
}

/// `[rows, cols]` of a rank-2 input, or the rank error naming it.
pub(super) fn matrix(
    shape: &Shape,
    input: usize,
    expected: &'static str,
) -> Result<(u64, u64), InferError> {
    match shape.dims() {
        &[r, c] => Ok((r, c)),
        _ => Err(InferError::Rank {
            input,
            shape: shape.clone(),
            expected,
        }),
    }
}

impl OpDef for Rope {
    fn name(&self) -> &'static str {
        "rope"
    }
    fn arity(&self) -> (usize, usize) {
        (3, 3)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        if inputs[0] != DType::F32 {
            return Err(DTypeError::at(0, "f32"));
        }
        if inputs[1] != DType::I32 {
            return Err(DTypeError::at(1, "i32 (positions)"));
        }
        if inputs[2] != DType::F32 {
            return Err(DTypeError::at(2, "f32 (the cos/sin table)"));
        }
        Ok(DType::F32)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        let (s, w) = matrix(inputs[0], 0, "[S, heads * head_dim]")?;
        if inputs[1].dims() != [s] {
            return Err(InferError::Mismatch {
                what: "rope positions must be [S] for x [S, W]",
                left: inputs[0].clone(),
                right: inputs[1].clone(),
            });
        }
        let (t, r) = matrix(
            inputs[2],
            2,
            "[block + blocks, rope_dim] (the cos/sin table)",
        )?;
        if self.block == 0 || t <= u64::from(self.block) {
            return Err(invalid(
                "rope",
                format!(
                    "the table has {t} rows: it needs more than the first level's {} rows",
                    self.block
                ),
            ));
        }
        let d = u64::from(self.head_dim);
        if d == 0 || d % 2 != 0 || w % d != 0 {
            return Err(invalid(
                "rope",
                format!("head_dim {d} must be even, positive and divide the width {w}"),
            ));
        }
        if r == 0 || r % 2 != 0 || r > d {
            return Err(invalid(
                "rope",
                format!(
                    "the table's row length (rope_dim) {r} must be even, positive and at most \
                     head_dim {d}"
                ),
            ));
        }
        Ok(inputs[0].clone())
    }
    fn preserves_shape(&self) -> bool {
        true
    }
    /// Plain loops over rows, heads and pairs, the rotation in f64.
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let x = inputs[0].floats("rope")?;
        let pos = inputs[1].ints("rope")?;
        let table = inputs[2].floats("rope")?;
        let (s, w) = (out.dims()[0] as usize, out.dims()[1] as usize);
        let (t_rows, r) = (
            inputs[2].shape.dims()[0] as usize,
            inputs[2].shape.dims()[1] as usize,
        );
        let b = self.block as usize;
        let d = self.head_dim as usize;
        let mut y = vec![0f32; s * w];
        for (row, &p) in pos.iter().enumerate().take(s) {
            if p < 0 || p as usize / b >= t_rows - b {
                continue; // zeros
            }
            let (lo, hi) = (p as usize % b, b + p as usize / b);
            for head in 0..w / d {
                let base = row * w + head * d;
                y[base..base + d].copy_from_slice(&x[base..base + d]);
                for i in 0..r / 2 {
                    let at = |row: usize, k: usize| f64::from(table[row * r + 2 * i + k]);
                    // cos(a + b), sin(a + b) of the two levels' angles.
                    let c = at(lo, 0) * at(hi, 0) - at(lo, 1) * at(hi, 1);
                    let sn = at(lo, 1) * at(hi, 0) + at(lo, 0) * at(hi, 1);
                    let (a, b) = if self.interleaved {
                        (base + 2 * i, base + 2 * i + 1)
                    } else {
                        (base + i, base + i + r / 2)
                    };
                    let (x0, x1) = (f64::from(x[a]), f64::from(x[b]));
                    y[a] = (x0 * c - x1 * sn) as f32;
                    y[b] = (x0 * sn + x1 * c) as f32;
                }
            }
        }
        Ok(Values::F32(y))
    }
}

/// The dtype rule of the attention ops' first three inputs: f32 queries, keys and values
/// both f32 or both f16; the output is f32.
pub(crate) fn kv_dtypes(inputs: &[DType]) -> Result<DType, DTypeError> {
    if inputs[0] != DType::F32 {
        return Err(DTypeError::at(0, "f32 (queries)"));
    }
    if !matches!(inputs[1], DType::F32 | DType::F16) {
        return Err(DTypeError::at(1, "f32 or f16 (keys)"));
    }
    if inputs[2] != inputs[1] {
        return Err(DTypeError::at(2, "the keys' type (values)"));
    }
    Ok(DType::F32)
}

impl OpDef for Attention {
    fn name(&self) -> &'static str {
        "attention"
    }
    fn arity(&self) -> (usize, usize) {
        (3, 3)
    }
    /// f32 queries; keys and values both f32 or both f16 (a KV cache stored as f16); f32 out.
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        kv_dtypes(inputs)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        let (h, kvh) = (u64::from(self.num_heads), u64::from(self.num_kv_heads));
        if h == 0 || kvh == 0 || h % kvh != 0 {
            return Err(invalid(
                "attention",
                format!("{h} query heads must be a positive multiple of {kvh} key/value heads"),
            ));
        }
        let (s, qw) = matrix(inputs[0], 0, "[S, heads * head_dim] (queries)")?;
        let (t, kw) = matrix(inputs[1], 1, "[T, kv_heads * head_dim] (keys)")?;
        matrix(inputs[2], 2, "[T, kv_heads * head_dim] (values)")?;
        if qw == 0 || qw % h != 0 {
            return Err(invalid(
                "attention",
                format!("query width {qw} is not a positive multiple of {h} heads"),
            ));
        }
        let d = qw / h;
        if kw != kvh * d {
            return Err(InferError::Mismatch {
                what: "attention keys must be [T, kv_heads * head_dim]",
                left: inputs[0].clone(),
                right: inputs[1].clone(),
            });
        }
        if inputs[2] != inputs[1] {
            return Err(InferError::Mismatch {
                what: "attention values must have the keys' shape",
                left: inputs[1].clone(),
                right: inputs[2].clone(),
            });
        }
        if t < s {
            return Err(InferError::Mismatch {
                what: "attention needs at least as many keys as queries (keys = past + queries)",
                left: inputs[0].clone(),
                right: inputs[1].clone(),
            });
        }
        Ok(inputs[0].clone())
    }
    /// Per query row and head: scores in f64, max-subtracted softmax over the visible keys,
    /// the weighted sum of values in f64.
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let q = inputs[0].floats("attention")?;
        let k = inputs[1].floats("attention")?;
        let v = inputs[2].floats("attention")?;
        let (s, qw) = (out.dims()[0] as usize, out.dims()[1] as usize);
        let (t, kw) = (
            inputs[1].shape.dims()[0] as usize,
            inputs[1].shape.dims()[1] as usize,
        );
        let h = self.num_heads as usize;
        let group = h / self.num_kv_heads as usize;
        let past = t - s;
        let mut y = vec![0f32; s * qw];
        for row in 0..s {
            let visible = past + row + 1;
            let first = self.first_key(t as u64, s as u64, row as u64) as usize;
            let at: Vec<usize> = (first..visible).collect();
            let rows = row * qw..(row + 1) * qw;
            attend_row(&q[rows.clone()], &at, [k, v], kw, [h, group], &mut y[rows]);
        }
        Ok(Values::F32(y))
    }
}

/// One query row `q` of `heads` heads over the key rows `at` of keys `k` and values `v`
/// (rows of `kw` floats; query head `h` reads KV head `h / group`), in f64: scores scaled by
/// `1 / sqrt(head_dim)`, a max-subtracted softmax, the weighted sum of values into `out`.
pub(super) fn attend_row(
    q: &[f32],
    at: &[usize],
    [k, v]: [&[f32]; 2],
    kw: usize,
    [heads, group]: [usize; 2],
    out: &mut [f32],
) {
    let d = q.len() / heads.max(1);
    let scale = 1.0 / (d as f64).sqrt();
    for head in 0..heads {
        let off = (head / group) * d;
        let qh = &q[head * d..][..d];
        let scores: Vec<f64> = at
            .iter()
            .map(|&j| {
                let krow = &k[j * kw + off..][..d];
                qh.iter()
                    .zip(krow)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = scores.iter().map(|&x| (x - max).exp()).collect();
        let sum: f64 = weights.iter().sum();
        for (e, o) in out[head * d..][..d].iter_mut().enumerate() {
            let acc: f64 = weights
                .iter()
                .zip(at)
                .map(|(&wt, &j)| wt * f64::from(v[j * kw + off + e]))
                .sum();
            *o = (acc / sum) as f32;
        }
    }
}

impl crate::graph::GraphBuilder {
    /// Rotary position embedding of `x` `[S, N * head_dim]` at `positions` `[S]` (i32) with
    /// the two-level cos/sin `table` of [`rope_table`]; see [`Rope`] (`rope` its fields).
    pub fn rope(
        &mut self,
        label: impl Into<String>,
        x: crate::graph::NodeId,
        positions: crate::graph::NodeId,
        table: crate::graph::NodeId,
        rope: Rope,
    ) -> crate::graph::NodeId {
        self.node(label, rope, &[x, positions, table])
    }

    /// Causal grouped-query attention of `q` `[S, H * D]` over `k`, `v` `[T, KVH * D]`; see
    /// [`Attention`] (`attention` its heads and window).
    pub fn attention(
        &mut self,
        label: impl Into<String>,
        q: crate::graph::NodeId,
        k: crate::graph::NodeId,
        v: crate::graph::NodeId,
        attention: Attention,
    ) -> crate::graph::NodeId {
        self.node(label, attention, &[q, k, v])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: &[u64]) -> Shape {
        Shape(d.to_vec())
    }

    #[test]
    fn rope_shape_rule_checks_positions_table_and_heads() {
        let r = Rope {
            head_dim: 8,
            block: 4,
            interleaved: true,
        };
        assert_eq!(
            r.infer(&[&s(&[3, 16]), &s(&[3]), &s(&[10, 8])], &[]),
            Ok(s(&[3, 16]))
        );
        assert!(r
            .infer(&[&s(&[3, 16]), &s(&[2]), &s(&[10, 8])], &[])
            .is_err());
        assert!(r
            .infer(&[&s(&[3, 12]), &s(&[3]), &s(&[10, 8])], &[])
            .is_err());
        assert!(r
            .infer(&[&s(&[3, 16]), &s(&[3]), &s(&[10, 10])], &[])
            .is_err());
        let e = Rope {
            head_dim: 0,
            block: 4,
            interleaved: false,
        }
        .infer(&[&s(&[3, 16]), &s(&[3]), &s(&[10, 8])], &[])
        .unwrap_err();
        assert!(e.to_string().contains("head_dim 0"), "{e}");
        // The table must hold both levels.
        assert!(r
            .infer(&[&s(&[3, 16]), &s(&[3]), &s(&[4, 8])], &[])
            .is_err());
        assert!(r
            .output_dtype(&[DType::F32, DType::F32, DType::F32])
            .is_err());
    }

    #[test]
    fn rope_table_holds_cos_and_sin_of_position_times_frequency() {
        // 3 positions: a first level of 2 rows (angles 0, 1), a second of 2 (0, 2).
        assert_eq!((rope_block(3), rope_table_rows(3)), (2, 4));
        let t = rope_table(10_000.0, 4, 3);
        assert_eq!(t.len(), 16);
        assert_eq!(&t[..4], &[1.0, 0.0, 1.0, 0.0]);
        assert!((t[4] - 1f32.cos()).abs() < 1e-7 && (t[5] - 1f32.sin()).abs() < 1e-7);
        let theta1 = 10_000f64.powf(-0.5);
        assert!((f64::from(t[14]) - (2.0 * theta1).cos()).abs() < 1e-7);
        // A million positions: 1024 + 1024 rows; a claimed 2^32 - 1: 65536 + 65536.
        assert_eq!(rope_table_rows(1 << 20), 2048);
        assert_eq!(rope_table_rows(u32::MAX), 131_072);
        assert_eq!((rope_block(1), rope_table_rows(1)), (1, 2));
    }

    #[test]
    fn rope_reference_adds_the_two_levels_angles() {
        // A head of 6 whose first 4 elements rotate: pairs (0, 1), (2, 3) interleaved,
        // (0, 2), (1, 3) on halves; elements 4 and 5 pass through either way.
        let (base, r, d, positions) = (10_000.0, 4u32, 6usize, 100u32);
        let b = rope_block(positions);
        let rows = u64::from(rope_table_rows(positions));
        let table = rope_table(base, r, positions);
        let pos: Vec<i32> = vec![0, 1, 37, 99, 100 + 20, -1];
        let x: Vec<f32> = (0..pos.len() * d).map(|i| 1.0 + i as f32 * 0.25).collect();
        let n = pos.len() as u64;
        for interleaved in [true, false] {
            let op = Rope {
                head_dim: d as u32,
                block: b,
                interleaved,
            };
            let out = op
                .reference(
                    &[
                        &RefTensor::from_f32(s(&[n, d as u64]), DType::F32, x.clone()),
                        &RefTensor::from_f32(
                            s(&[n]),
                            DType::I32,
                            pos.iter().map(|&p| p as f32).collect(),
                        ),
                        &RefTensor::from_f32(s(&[rows, 4]), DType::F32, table.clone()),
                    ],
                    &s(&[n, d as u64]),
                    DType::F32,
                )
                .unwrap();
            let Values::F32(y) = out else { panic!() };
            for (row, &p) in pos.iter().enumerate() {
                let (got, xs) = (&y[row * d..row * d + d], &x[row * d..row * d + d]);
                if p < 0 || p as u32 >= b * (rows as u32 - b) {
                    assert!(got.iter().all(|&v| v == 0.0), "position {p}");
                    continue;
                }
                assert_eq!(&got[4..], &xs[4..], "pass-through");
                for i in 0..2 {
                    let theta = base.powf(-2.0 * i as f64 / f64::from(r));
                    let (sn, c) = (f64::from(p) * theta).sin_cos();
                    let (a, b) = if interleaved {
                        (2 * i, 2 * i + 1)
                    } else {
                        (i, i + 2)
                    };
                    let (x0, x1) = (f64::from(xs[a]), f64::from(xs[b]));
                    let ctx = format!("position {p} interleaved {interleaved}");
                    assert!(
                        (f64::from(got[a]) - (x0 * c - x1 * sn)).abs() < 1e-5,
                        "{ctx}"
                    );
                    assert!(
                        (f64::from(got[b]) - (x0 * sn + x1 * c)).abs() < 1e-5,
                        "{ctx}"
                    );
                }
            }
        }
    }

    #[test]
    fn scaled_rope_table_divides_the_angles() {
        // Linear scaling by 4 and a factor of 2 on the second frequency: position 8 of the
        // scaled table is position 2 of the plain one, and its second frequency position 1.
        let plain = rope_table(10_000.0, 4, 64);
        let scaled = rope_table_scaled(10_000.0, 4, 64, 0.25, &[1.0, 2.0]);
        let angle = |t: &[f32], p: u32, i: usize| {
            let b = rope_block(64);
            let (lo, hi) = ((p % b) as usize, (b + p / b) as usize);
            let at = |row: usize, k: usize| f64::from(t[row * 4 + 2 * i + k]);
            (at(lo, 1) * at(hi, 0) + at(lo, 0) * at(hi, 1)).asin()
        };
        assert!((angle(&scaled, 8, 0) - angle(&plain, 2, 0)).abs() < 1e-6);
        assert!((angle(&scaled, 8, 1) - angle(&plain, 1, 1)).abs() < 1e-6);
    }

    #[test]
    fn attention_shape_rule_checks_heads_and_cache() {
        let a = Attention {
            num_heads: 4,
            num_kv_heads: 2,
            window: 0,
        };
        assert_eq!(
            a.infer(&[&s(&[2, 32]), &s(&[5, 16]), &s(&[5, 16])], &[]),
            Ok(s(&[2, 32]))
        );
        // Fewer keys than queries, values unlike keys, a key width that is not KVH * D.
        assert!(a
            .infer(&[&s(&[6, 32]), &s(&[5, 16]), &s(&[5, 16])], &[])
            .is_err());
        assert!(a
            .infer(&[&s(&[2, 32]), &s(&[5, 16]), &s(&[4, 16])], &[])
            .is_err());
        assert!(a
            .infer(&[&s(&[2, 32]), &s(&[5, 8]), &s(&[5, 8])], &[])
            .is_err());
        let bad = Attention {
            num_heads: 3,
            num_kv_heads: 2,
            window: 0,
        };
        assert!(bad
            .infer(&[&s(&[2, 30]), &s(&[5, 20]), &s(&[5, 20])], &[])
            .is_err());
    }

    #[test]
    fn attention_reference_of_one_key_is_its_value() {
        // One query over one key: softmax of a single score is 1, the output is the value.
        let a = Attention {
            num_heads: 2,
            num_kv_heads: 1,
            window: 0,
        };
        let q = RefTensor::from_f32(s(&[1, 4]), DType::F32, vec![1.0, 2.0, 3.0, 4.0]);
        let k = RefTensor::from_f32(s(&[1, 2]), DType::F32, vec![0.5, -1.0]);
        let v = RefTensor::from_f32(s(&[1, 2]), DType::F32, vec![7.0, -3.0]);
        let out = a.reference(&[&q, &k, &v], &s(&[1, 4]), DType::F32).unwrap();
        assert_eq!(out, Values::F32(vec![7.0, -3.0, 7.0, -3.0]));
    }
}
