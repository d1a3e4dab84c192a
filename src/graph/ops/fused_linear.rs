//! `fused_linear`: a [`super::Linear`] with the work of its neighbours folded in — an RMSNorm
//! of x before the product, a gated activation of two projections or a RoPE rotation after
//! it, a residual added to the result. The graph rewrite of [`crate::graph::fuse`] makes
//! these nodes out of `rms_norm`, `linear`, `silu_mul` / `gelu` + `mul`, `rope` and `add`
//! nodes, so a decoder layer runs
//! fewer, fuller dispatches; the kernels are the `linear` ones of `src/gpu/kernels/quant.rs`
//! with a prologue and an epilogue.

use super::attention::Rope;
use super::linear::{self, Linear};
use super::{DTypeError, InferError, OpDef};
use crate::graph::reference::{RefError, RefTensor, Values};
use crate::shape::{DType, Shape};

/// The activation of a gated projection: `act(x · gateᵀ) * (x · upᵀ)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateAct {
    /// `silu(g) * u` (SwiGLU), as the `silu_mul` op computes it.
    Silu,
    /// `gelu_tanh(g) * u` (GeGLU, Gemma), as the `gelu` and `mul` ops compute it.
    GeluTanh,
}

impl GateAct {
    /// `act(g) * u` in f64, as the references of the unfused ops compute it.
    pub fn apply(self, g: f64, u: f64) -> f64 {
        match self {
            GateAct::Silu => g / (1.0 + (-g).exp()) * u,
            GateAct::GeluTanh => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * g * (1.0 + (c * (g + 0.044715 * g * g * g)).tanh()) * u
            }
        }
    }

    /// The code of the kernel's `EPILOGUE` constant (bits 2 and 3, `shaders/quant.wgsl`).
    pub fn code(self) -> u32 {
        match self {
            GateAct::Silu => 1,
            GateAct::GeluTanh => 2,
        }
    }
}

/// `y = rope?(act?( norm?(x) · wᵀ )) + residual?`. Inputs, in this order: x f32 `[..., K]`; w
/// `[N', K]` in any format of [`crate::formats`] (as [`Linear`]); with `norm`, gamma f32 of
/// `K` elements; with `residual`, r f32 of the output's shape; with `rope`, positions i32
/// `[S]` and the cos/sin table (the inputs of the `rope` op). Output f32 `[..., N]`.
///
/// * `norm = Some(eps)`: x is first RMS-normalised over its last dimension, `x / sqrt(mean(x²)
///   + eps) * gamma` (the `rms_norm` op on the last axis).
/// * `gate = Some(act)`: w holds the gate rows then the up rows (`N' = 2N`, one weight of both,
///   same format and K) and `y[..., n] = act(g_n) * u_n` with `g_n = x · w[n]`, `u_n = x ·
///   w[N + n]`. Without it `N = N'`.
/// * `rope = Some(r)`: the product (x `[S, K]`, so `[S, N]`) is rotated as the `rope` op `r`
///   rotates its input; not with a gate.
/// * `residual`: `y += r` elementwise (same shape, no broadcasting).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FusedLinear {
    /// RMSNorm of x with this epsilon (and the gamma input) before the product.
    pub norm: Option<f32>,
    /// Gated activation of the two halves of the weight.
    pub gate: Option<GateAct>,
    /// A residual input added to the output.
    pub residual: bool,
    /// RoPE of the product, with the positions and table inputs.
    pub rope: Option<Rope>,
}

impl FusedLinear {
    /// Input position of gamma (with `norm`).
    pub fn gamma_input(&self) -> Option<usize> {
        self.norm.map(|_| 2)
    }

    /// Input position of the residual (with `residual`).
    pub fn residual_input(&self) -> Option<usize> {
        self.residual
            .then_some(2 + usize::from(self.norm.is_some()))
    }

    /// Input position of the positions (with `rope`; the table follows).
    pub fn rope_inputs(&self) -> Option<usize> {
        self.rope
            .map(|_| 2 + usize::from(self.norm.is_some()) + usize::from(self.residual))
    }

    fn inputs(&self) -> usize {
        2 + usize::from(self.norm.is_some())
            + usize::from(self.residual)
            + 2 * usize::from(self.rope.is_some())
    }
}

impl OpDef for FusedLinear {
    fn name(&self) -> &'static str {
        "fused_linear"
    }
    fn arity(&self) -> (usize, usize) {
        let n = self.inputs();
        (n, n)
    }
    /// x f32, w any format of [`crate::formats`], gamma, residual and table f32, positions
    /// i32; output f32.
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        Linear.output_dtype(&inputs[..inputs.len().min(2)])?;
        let positions = self.rope_inputs();
        for (i, &d) in inputs.iter().enumerate().skip(2) {
            if Some(i) == positions {
                if d != DType::I32 {
                    return Err(DTypeError::at(i, "i32 (positions)"));
                }
            } else if d != DType::F32 {
                return Err(DTypeError::at(i, "f32"));
            }
        }
        Ok(DType::F32)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        infer(self, inputs)
    }
    /// The unfused ops' references in a row: RMSNorm in f64, the product with f64
    /// accumulation, the activation, the `rope` op's reference and the residual.
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let x = inputs[0].floats("fused_linear")?;
        let w = inputs[1].floats("fused_linear")?;
        let wd = inputs[1].shape.dims();
        let (rows_w, k) = (wd[0] as usize, wd[1] as usize);
        let n = out.dims().last().copied().unwrap_or(0) as usize;
        let rows = out.checked_num_elements().unwrap_or(0) as usize / n.max(1);
        let gamma = match self.gamma_input() {
            Some(i) => Some(inputs[i].floats("fused_linear")?),
            None => None,
        };
        let residual = match self.residual_input() {
            Some(i) => Some(inputs[i].floats("fused_linear")?),
            None => None,
        };
        let dot = |xr: &[f64], j: usize| -> f64 {
            let wr = &w[j * k..(j + 1) * k];
            xr.iter().zip(wr).map(|(&a, &b)| a * f64::from(b)).sum()
        };
        let mut y = Vec::with_capacity(rows * n);
        let mut products = Vec::with_capacity(rows * n);
        for r in 0..rows {
            let raw = &x[r * k..(r + 1) * k];
            let xr: Vec<f64> = match (self.norm, gamma) {
                (Some(eps), Some(g)) => {
                    let ms = raw.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / k as f64;
                    let inv = 1.0 / (ms + f64::from(eps)).sqrt();
                    // Rounded to f32 as the rms_norm op's output is.
                    raw.iter()
                        .zip(g)
                        .map(|(&v, &g)| f64::from((f64::from(v) * inv * f64::from(g)) as f32))
                        .collect()
                }
                _ => raw.iter().map(|&v| f64::from(v)).collect(),
            };
            for j in 0..n {
                let v = match self.gate {
                    Some(act) => {
                        let (g, u) = (dot(&xr, j) as f32, dot(&xr, rows_w / 2 + j) as f32);
                        act.apply(f64::from(g), f64::from(u)) as f32
                    }
                    None => dot(&xr, j) as f32,
                };
                products.push(v);
            }
        }
        if let (Some(rope), Some(at)) = (self.rope, self.rope_inputs()) {
            let t = RefTensor::from_f32(out.clone(), DType::F32, products);
            let rope_inputs = [&t, inputs[at], inputs[at + 1]];
            let rotated = rope.reference(&rope_inputs, out, DType::F32)?;
            products = RefTensor {
                shape: out.clone(),
                dtype: DType::F32,
                values: rotated,
            }
            .floats("fused_linear")?
            .to_vec();
        }
        for (i, v) in products.into_iter().enumerate() {
            y.push(match residual {
                Some(res) => res[i] + v,
                None => v,
            });
        }
        Ok(Values::F32(y))
    }
}

/// The shape rule: [`linear::infer`] of x and w, the last dimension halved for a gated
/// projection (whose weight rows must then be even); gamma must hold K elements (its last
/// dimension K), the residual must have the output's shape.
///
/// # Errors
/// [`linear::infer`]'s errors; [`InferError::Mismatch`] for an odd gated weight, a gamma or a
/// residual of the wrong shape.
pub fn infer(op: &FusedLinear, inputs: &[&Shape]) -> Result<Shape, InferError> {
    let (x, w) = (inputs[0], inputs[1]);
    let mut out = linear::infer(x, w)?;
    if op.gate.is_some() {
        let n = w.dims()[0];
        if n % 2 != 0 {
            return Err(InferError::Mismatch {
                what: "fused_linear: a gated weight holds gate and up rows, an even count",
                left: x.clone(),
                right: w.clone(),
            });
        }
        let last = out.rank() - 1;
        out.0[last] = n / 2;
    }
    if let Some(g) = op.gamma_input().map(|i| inputs[i]) {
        let k = w.dims()[1];
        if g.checked_num_elements() != Some(k) || g.dims().last() != Some(&k) {
            return Err(InferError::Mismatch {
                what: "fused_linear: gamma must hold K elements (x's last dimension)",
                left: x.clone(),
                right: g.clone(),
            });
        }
    }
    if let (Some(rope), Some(at)) = (op.rope, op.rope_inputs()) {
        if op.gate.is_some() {
            return Err(InferError::Invalid {
                op: "fused_linear",
                reason: "a RoPE epilogue does not follow a gate".into(),
            });
        }
        out = rope.infer(&[&out, inputs[at], inputs[at + 1]], &[])?;
    }
    if let Some(r) = op.residual_input().map(|i| inputs[i]) {
        if *r != out {
            return Err(InferError::Mismatch {
                what: "fused_linear: the residual must have the output's shape",
                left: out,
                right: r.clone(),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::reference::eval_op;
    use crate::graph::Op;

    fn s(d: &[u64]) -> Shape {
        Shape(d.to_vec())
    }

    const ALL: FusedLinear = FusedLinear {
        norm: Some(1e-5),
        gate: Some(GateAct::Silu),
        residual: true,
        rope: None,
    };

    #[test]
    fn shape_and_dtype_rules() {
        let i = |op: &FusedLinear, shapes: &[&[u64]]| {
            let v: Vec<Shape> = shapes.iter().map(|d| s(d)).collect();
            let r: Vec<&Shape> = v.iter().collect();
            infer(op, &r)
        };
        assert_eq!(
            i(&ALL, &[&[3, 64], &[10, 64], &[64], &[3, 5]]).unwrap(),
            s(&[3, 5])
        );
        assert!(i(&ALL, &[&[3, 64], &[9, 64], &[64], &[3, 4]]).is_err());
        assert!(i(&ALL, &[&[3, 64], &[10, 64], &[32], &[3, 5]]).is_err());
        assert!(i(&ALL, &[&[3, 64], &[10, 64], &[64], &[1, 5]]).is_err());
        let plain_res = FusedLinear {
            norm: None,
            gate: None,
            residual: true,
            rope: None,
        };
        assert_eq!(
            i(&plain_res, &[&[2, 32], &[7, 32], &[2, 7]]).unwrap(),
            s(&[2, 7])
        );
        assert_eq!(ALL.arity(), (4, 4));
        assert_eq!(plain_res.residual_input(), Some(2));
        assert_eq!(
            ALL.output_dtype(&[DType::F32, DType::Q4_1, DType::F32, DType::F32]),
            Ok(DType::F32)
        );
        assert_eq!(
            ALL.output_dtype(&[DType::F32, DType::Q4_1, DType::F16, DType::F32]),
            Err(DTypeError::at(2, "f32"))
        );
    }

    #[test]
    fn reference_is_the_unfused_chain() {
        // x = [3, 4] (rms 3.5355), gamma = [2, 1]; w rows: gate [1, 0], up [0, 1].
        let x = RefTensor::from_f32(s(&[1, 2]), DType::F32, vec![3.0, 4.0]);
        let w = RefTensor::from_f32(s(&[2, 2]), DType::F32, vec![1.0, 0.0, 0.0, 1.0]);
        let g = RefTensor::from_f32(s(&[2]), DType::F32, vec![2.0, 1.0]);
        let r = RefTensor::from_f32(s(&[1, 1]), DType::F32, vec![0.5]);
        let y = eval_op(&Op::FusedLinear(ALL), &[&x, &w, &g, &r], &s(&[1, 1])).unwrap();
        let inv = 1.0 / (12.5f64 + 1e-5).sqrt();
        let (gv, uv) = (3.0 * inv * 2.0, 4.0 * inv);
        let want = (gv / (1.0 + (-gv).exp()) * uv + 0.5) as f32;
        assert!(
            (y.to_f32()[0] - want).abs() < 1e-6,
            "{:?} vs {want}",
            y.to_f32()
        );
    }
}
