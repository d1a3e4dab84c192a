//! `linear`: `y = x · wᵀ` with the weight in its stored format (GGUF row layout), the
//! projection of a language model whose weights stay quantized on the device.

use super::{checked, DTypeError, InferError, OpDef};
use crate::graph::reference::{RefError, RefTensor, Values};
use crate::graph::{GraphBuilder, NodeId};
use crate::shape::{DType, Shape};

/// `y[..., n] = sum_k x[..., k] * w[n, k]`: x f32 `[..., K]`, w `[N, K]` — the GGUF row
/// layout, each of the N output rows K contiguous elements (in blocks of 32 or 256 for the
/// block formats) — output f32 `[..., N]`. Inputs: x (f32), w (any format of
/// [`crate::formats`], [`Linear::accepts_weight`]).
///
/// The weight keeps its format in device memory: the kernels (`src/gpu/kernels/quant.rs`)
/// dequantize blocks and widen `f16`/`bf16` as they read them. Block weights need K to be a
/// multiple of the block on the device (every GGUF tensor is); the CPU reference also takes a
/// partial last block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Linear;

impl Linear {
    /// Whether the op accepts weights of `dtype`: every format of [`crate::formats`].
    pub fn accepts_weight(dtype: DType) -> bool {
        crate::formats::of_dtype(dtype).is_some()
    }
}

impl OpDef for Linear {
    fn name(&self) -> &'static str {
        "linear"
    }
    fn arity(&self) -> (usize, usize) {
        (2, 2)
    }
    /// x f32, w any format ([`Linear::accepts_weight`]); output f32.
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        if inputs.first() != Some(&DType::F32) {
            return Err(DTypeError::at(0, "f32"));
        }
        match inputs.get(1) {
            Some(&w) if Linear::accepts_weight(w) => Ok(DType::F32),
            _ => Err(DTypeError::at(1, crate::formats::dtype_names())),
        }
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        infer(inputs[0], inputs[1])
    }
    /// Plain loops over the rows of x and of w with f64 accumulation; the weight's values
    /// are what [`RefTensor::from_bytes`] made of its bytes (`tensor::decode_f32`, row by
    /// row).
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let (x, w) = (inputs[0].floats("linear")?, inputs[1].floats("linear")?);
        let wd = inputs[1].shape.dims();
        let (n, k) = (wd[0] as usize, wd[1] as usize);
        let rows = out.checked_num_elements().unwrap_or(0) as usize / n.max(1);
        let mut y = Vec::with_capacity(rows * n);
        for r in 0..rows {
            let xr = &x[r * k..(r + 1) * k];
            for j in 0..n {
                let wr = &w[j * k..(j + 1) * k];
                let acc: f64 = xr
                    .iter()
                    .zip(wr)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                y.push(acc as f32);
            }
        }
        Ok(Values::F32(y))
    }
}

/// Output shape of a linear: x `[..., K]` and w `[N, K]` give `[..., N]`.
///
/// # Errors
/// [`InferError::Rank`] for a scalar x or a w that is not 2-D, [`InferError::Mismatch`] when
/// x's last dimension is not w's second.
pub fn infer(x: &Shape, w: &Shape) -> Result<Shape, InferError> {
    if x.rank() == 0 {
        return Err(InferError::Rank {
            input: 0,
            shape: x.clone(),
            expected: "rank >= 1 (x is [..., K])",
        });
    }
    if w.rank() != 2 {
        return Err(InferError::Rank {
            input: 1,
            shape: w.clone(),
            expected: "a 2-D weight [N, K]",
        });
    }
    let (k, wk) = (x.dims()[x.rank() - 1], w.dims()[1]);
    if k != wk {
        return Err(InferError::Mismatch {
            what: "linear: x's last dimension is not the weight's K ([N, K])",
            left: x.clone(),
            right: w.clone(),
        });
    }
    let mut out = x.dims().to_vec();
    out[x.rank() - 1] = w.dims()[0];
    checked(Shape(out))
}

impl GraphBuilder {
    /// `x · wᵀ` ([`Linear`]): x f32 `[..., K]`, w `[N, K]` in q4_1, q8_0, f16 or f32 (a
    /// constant from a GGUF keeps its blocks), output f32 `[..., N]`.
    pub fn linear(&mut self, label: impl Into<String>, x: NodeId, w: NodeId) -> NodeId {
        self.node(label, Linear, &[x, w])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::reference::eval_op;
    use crate::graph::Op;

    fn s(d: &[u64]) -> Shape {
        Shape(d.to_vec())
    }

    #[test]
    fn shape_and_dtype_rules() {
        assert_eq!(infer(&s(&[2, 3, 64]), &s(&[5, 64])).unwrap(), s(&[2, 3, 5]));
        assert_eq!(infer(&s(&[64]), &s(&[7, 64])).unwrap(), s(&[7]));
        assert_eq!(infer(&s(&[0, 64]), &s(&[7, 64])).unwrap(), s(&[0, 7]));
        let e = infer(&s(&[2, 32]), &s(&[5, 64])).unwrap_err();
        assert!(e.to_string().contains("2x32 vs 5x64"), "{e}");
        assert!(matches!(
            infer(&s(&[]), &s(&[5, 64])),
            Err(InferError::Rank { input: 0, .. })
        ));
        assert!(matches!(
            infer(&s(&[2, 64]), &s(&[1, 5, 64])),
            Err(InferError::Rank { input: 1, .. })
        ));
        for f in crate::formats::FORMATS {
            assert_eq!(Linear.output_dtype(&[DType::F32, f.dtype]), Ok(DType::F32));
        }
        assert_eq!(
            Linear.output_dtype(&[DType::F32, DType::I8]),
            Err(DTypeError::at(1, crate::formats::dtype_names()))
        );
        assert_eq!(
            Linear.output_dtype(&[DType::F16, DType::Q4_1]),
            Err(DTypeError::at(0, "f32"))
        );
    }

    #[test]
    fn reference_dequantizes_the_weight_rows() {
        // w = [[1, 2, ..., 32], [-1, ..., -1]] in q8_0 with scale 1: exact values.
        let mut bytes = Vec::new();
        for row in 0..2 {
            bytes.extend(half::f16::from_f32(1.0).to_bits().to_le_bytes());
            bytes.extend((0..32).map(|i| if row == 0 { i as u8 + 1 } else { 0xFF }));
        }
        let w = RefTensor::from_bytes(s(&[2, 32]), DType::Q8_0, &bytes).unwrap();
        let x = RefTensor::from_f32(s(&[1, 32]), DType::F32, vec![1.0; 32]);
        let y = eval_op(&Op::Linear(Linear), &[&x, &w], &s(&[1, 2])).unwrap();
        assert_eq!(y.to_f32(), vec![528.0, -32.0]);
        assert_eq!(y.dtype, DType::F32);
    }
}
