//! Rotary position embedding (ONNX opset 23 `RotaryEmbedding`).

use super::{all_f32, is_index, DTypeError, InferError, OpDef};
use crate::graph::reference::{index, RefError, RefTensor, Values};
use crate::shape::{DType, Shape};

/// Rotates pairs of each head's first `rotary_dim` features by position-dependent angles:
/// `(x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos)`, pairs `(2i, 2i + 1)` when `interleaved`,
/// else `(i, i + rotary_dim / 2)`; the features past `rotary_dim` pass through. `x` is `[B,
/// H, S, D]`, or `[B, S, H * D]` with `num_heads` given. With position ids `[B, S]` the
/// caches are tables `[max_position, rotary_dim / 2]` indexed by them; without, they are `[B,
/// S, rotary_dim / 2]`. Inputs: x, cos, sin (f32), optional position ids (integers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotaryEmbedding {
    /// Pairs are adjacent features instead of the two halves.
    pub interleaved: bool,
    /// Features rotated per head (0: all of them).
    pub rotary_dim: u64,
    /// Heads of a 3-D input (0 for a 4-D one).
    pub num_heads: u64,
}

/// The dimensions of a rotary embedding over concrete shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotaryDims {
    /// Batch.
    pub batch: u64,
    /// Heads.
    pub heads: u64,
    /// Sequence.
    pub seq: u64,
    /// Features per head.
    pub head_dim: u64,
    /// Rotated features per head (even).
    pub rotary_dim: u64,
    /// `x` is `[B, S, H * D]` (else `[B, H, S, D]`).
    pub packed: bool,
}

impl RotaryDims {
    /// The linear position in x of `(b, h, s, d)`.
    pub fn x_index(&self, b: u64, h: u64, s: u64, d: u64) -> u64 {
        if self.packed {
            ((b * self.seq + s) * self.heads + h) * self.head_dim + d
        } else {
            ((b * self.heads + h) * self.seq + s) * self.head_dim + d
        }
    }
}

impl RotaryEmbedding {
    /// The dimensions for these inputs, checked.
    ///
    /// # Errors
    /// [`InferError::Rank`] for an `x` that is neither 3-D nor 4-D or a position ids tensor
    /// that is not `[B, S]`, [`InferError::Param`] for heads or a rotary width that do not
    /// divide, [`InferError::Mismatch`] for caches of the wrong shape.
    pub fn dims(&self, inputs: &[&Shape]) -> Result<RotaryDims, InferError> {
        let x = inputs[0];
        let param = |detail: String| InferError::Param {
            what: "rotary embedding",
            detail,
        };
        let (batch, heads, seq, head_dim, packed) = match x.0[..] {
            [b, h, s, d] => (b, h, s, d, false),
            [b, s, hidden] => {
                let h = self.num_heads;
                if h == 0 || hidden % h != 0 {
                    return Err(param(format!(
                        "a 3-D input needs num_heads dividing its hidden size ({hidden}), got {h}"
                    )));
                }
                (b, h, s, hidden / h, true)
            }
            _ => {
                return Err(InferError::Rank {
                    input: 0,
                    shape: x.clone(),
                    expected: "[B, H, S, D] or [B, S, H * D]",
                })
            }
        };
        let rotary_dim = if self.rotary_dim == 0 {
            head_dim
        } else {
            self.rotary_dim
        };
        if rotary_dim % 2 != 0 || rotary_dim > head_dim {
            return Err(param(format!(
                "rotary dimension {rotary_dim} must be even and at most the head size {head_dim}"
            )));
        }
        let half = rotary_dim / 2;
        let positions = inputs.get(3);
        if let Some(p) = positions {
            if p.0 != [batch, seq] {
                return Err(InferError::Rank {
                    input: 3,
                    shape: (*p).clone(),
                    expected: "[B, S] position ids",
                });
            }
        }
        for c in &inputs[1..3] {
            let ok = match positions {
                Some(_) => c.rank() == 2 && c.0[1] == half,
                None => c.0 == [batch, seq, half],
            };
            if !ok {
                return Err(InferError::Mismatch {
                    what: "rotary caches must be [positions, rotary_dim / 2] with position ids, else [B, S, rotary_dim / 2]",
                    left: x.clone(),
                    right: (*c).clone(),
                });
            }
        }
        if inputs[1] != inputs[2] {
            return Err(InferError::Mismatch {
                what: "cos and sin caches differ",
                left: inputs[1].clone(),
                right: inputs[2].clone(),
            });
        }
        Ok(RotaryDims {
            batch,
            heads,
            seq,
            head_dim,
            rotary_dim,
            packed,
        })
    }
}

impl OpDef for RotaryEmbedding {
    fn name(&self) -> &'static str {
        "rotary_embedding"
    }
    fn arity(&self) -> (usize, usize) {
        (3, 4)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        all_f32(&inputs[..3])?;
        if inputs.len() == 4 && !is_index(inputs[3]) {
            return Err(DTypeError::at(3, "i32, u32 or i64 (position ids)"));
        }
        Ok(DType::F32)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        self.dims(inputs)?;
        Ok(inputs[0].clone())
    }
    fn preserves_shape(&self) -> bool {
        true
    }
    /// Per `(b, h, s)` and pair, with the cache row picked by the position id (or by
    /// `(b, s)`); f64 products.
    fn reference(&self, inputs: &[&RefTensor], _: &Shape, _: DType) -> Result<Values, RefError> {
        let x = inputs[0].floats("rotary_embedding")?;
        let (cos, sin) = (
            inputs[1].floats("rotary_embedding")?,
            inputs[2].floats("rotary_embedding")?,
        );
        let pos = match inputs.get(3) {
            Some(p) => Some(p.ints("rotary_embedding")?),
            None => None,
        };
        let shapes: Vec<&Shape> = inputs.iter().map(|t| &t.shape).collect();
        let Ok(d) = self.dims(&shapes) else {
            return Ok(Values::F32(Vec::new()));
        };
        let half = d.rotary_dim / 2;
        let mut v = x.to_vec();
        let heads = Shape(vec![d.batch, d.heads, d.seq]);
        index::for_each(&heads, |_, i| {
            let (b, h, s) = (i[0], i[1], i[2]);
            let row = match pos {
                Some(p) => p[index::linear(&[b, s], &Shape(vec![d.batch, d.seq]))] as u64,
                None => b * d.seq + s,
            };
            for j in 0..half {
                let (c, sn) = (
                    f64::from(cos[(row * half + j) as usize]),
                    f64::from(sin[(row * half + j) as usize]),
                );
                let (a1, a2) = if self.interleaved {
                    (2 * j, 2 * j + 1)
                } else {
                    (j, j + half)
                };
                let (i1, i2) = (d.x_index(b, h, s, a1), d.x_index(b, h, s, a2));
                let (x1, x2) = (f64::from(x[i1 as usize]), f64::from(x[i2 as usize]));
                v[i1 as usize] = (x1 * c - x2 * sn) as f32;
                v[i2 as usize] = (x1 * sn + x2 * c) as f32;
            }
        });
        Ok(Values::F32(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: &[u64]) -> Shape {
        Shape(d.to_vec())
    }

    #[test]
    fn rotary_shapes() {
        let r = |rotary_dim, num_heads| RotaryEmbedding {
            interleaved: false,
            rotary_dim,
            num_heads,
        };
        let x4 = s(&[2, 3, 5, 8]);
        let ok = r(0, 0)
            .dims(&[&x4, &s(&[10, 4]), &s(&[10, 4]), &s(&[2, 5])])
            .unwrap();
        assert_eq!((ok.heads, ok.seq, ok.head_dim, ok.packed), (3, 5, 8, false));
        assert!(r(0, 0).dims(&[&x4, &s(&[2, 5, 4]), &s(&[2, 5, 4])]).is_ok());
        assert!(r(4, 0)
            .dims(&[&x4, &s(&[10, 2]), &s(&[10, 2]), &s(&[2, 5])])
            .is_ok());
        assert!(
            r(3, 0).dims(&[&x4, &s(&[10, 1]), &s(&[10, 1])]).is_err(),
            "odd"
        );
        assert!(r(0, 0)
            .dims(&[&x4, &s(&[10, 3]), &s(&[10, 3]), &s(&[2, 5])])
            .is_err());
        let x3 = s(&[2, 5, 24]);
        let p = r(0, 3)
            .dims(&[&x3, &s(&[2, 5, 4]), &s(&[2, 5, 4])])
            .unwrap();
        assert!(p.packed && p.head_dim == 8);
        assert!(r(0, 5)
            .dims(&[&x3, &s(&[2, 5, 4]), &s(&[2, 5, 4])])
            .is_err());
        assert_eq!(p.x_index(1, 2, 3, 4), ((5 + 3) * 3 + 2) * 8 + 4);
    }
}
