//! Elementwise ops: binary with NumPy broadcasting, unary activations.

use super::{all_f32, checked, DTypeError, InferError, OpDef};
use crate::graph::reference::{index, wrap, RefError, RefTensor, Values};
use crate::graph::shape_data;
use crate::shape::{DType, Shape};

/// Binary elementwise operators. Inputs: a, b (broadcast).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// `a / b` (integers: truncated toward zero; division by zero gives 0)
    Div,
    /// `a ^ b` (floats: a negative base takes integer exponents, as NumPy; integers: exact
    /// wrapping powers, a negative exponent gives `1 / a^-b` truncated: 0 unless `|a| = 1`)
    Pow,
    /// `min(a, b)`
    Min,
    /// `max(a, b)`
    Max,
    /// `silu(a) * b = a / (1 + exp(-a)) * b`: the gated unit of a SwiGLU feed-forward
    /// (`a` the gate projection, `b` the up projection). f32 only.
    SiluMul,
}

impl BinaryOp {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::SiluMul => "silu_mul",
            BinaryOp::Pow => "pow",
            BinaryOp::Min => "min",
            BinaryOp::Max => "max",
        }
    }

    /// The code the WGSL kernel switches on (`shaders/elementwise.wgsl`, override `BINARY_OP`).
    pub fn code(self) -> u32 {
        self as u32
    }

    /// Applies the op in f32, as the GPU does (`silu_mul` with an f64 intermediate, as the
    /// reference computes activations).
    /// Applies the op in f32, as the GPU does (`pow` in f64, rounded once).
    pub fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::SiluMul => {
                let a = f64::from(a);
                (a / (1.0 + (-a).exp()) * f64::from(b)) as f32
            }
            BinaryOp::Pow => f64::from(a).powf(f64::from(b)) as f32,
            BinaryOp::Min => a.min(b),
            BinaryOp::Max => a.max(b),
        }
    }

    /// Applies the op to integers (wrapping; the caller wraps to the type's width).
    pub fn apply_int(self, a: i64, b: i64) -> i64 {
        match self {
            BinaryOp::Add => a.wrapping_add(b),
            BinaryOp::Sub => a.wrapping_sub(b),
            BinaryOp::Mul => a.wrapping_mul(b),
            BinaryOp::Div => a.checked_div(b).unwrap_or(0),
            // Never reached: the dtype rule refuses integers for silu_mul.
            BinaryOp::SiluMul => 0,
            BinaryOp::Pow => int_pow(a, b),
            BinaryOp::Min => a.min(b),
            BinaryOp::Max => a.max(b),
        }
    }
}

/// `a^b` in wrapping i64 by squaring; a negative exponent truncates `1 / a^-b` (0 unless
/// `|a| = 1`; `0^-b` gives 0 rather than a division by zero).
fn int_pow(a: i64, b: i64) -> i64 {
    if b < 0 {
        return match a {
            1 => 1,
            -1 => {
                if b % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    let (mut base, mut e, mut acc) = (a, b as u64, 1i64);
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        e >>= 1;
    }
    acc
}

impl OpDef for BinaryOp {
    fn name(&self) -> &'static str {
        BinaryOp::name(*self)
    }
    fn arity(&self) -> (usize, usize) {
        (2, 2)
    }
    /// f32 on both sides, or the same integer type (not bool) on both (shape arithmetic,
    /// integer tensors; whether a device kernel exists for it is the kernel's own dtype
    /// rule); `silu_mul` f32 only.
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        if *self == BinaryOp::SiluMul {
            return all_f32(inputs);
        }
        let int = |d: DType| d.is_int() && d != DType::Bool;
        let ok = inputs.len() == 2
            && inputs[0] == inputs[1]
            && (inputs[0] == DType::F32 || int(inputs[0]));
        if ok {
            Ok(inputs[0])
        } else {
            Err(DTypeError::at(
                1,
                "f32 on both sides (or the same integer type)",
            ))
        }
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        broadcast(inputs[0], inputs[1])
    }
    fn reference(
        &self,
        inputs: &[&RefTensor],
        out: &Shape,
        dtype: DType,
    ) -> Result<Values, RefError> {
        let (a, b) = (inputs[0], inputs[1]);
        let mut picks = Vec::new();
        index::for_each(out, |_, idx| {
            picks.push((
                index::broadcast(idx, &a.shape),
                index::broadcast(idx, &b.shape),
            ))
        });
        Ok(match (&a.values, &b.values) {
            (Values::F32(x), Values::F32(y)) => {
                Values::F32(picks.iter().map(|&(i, j)| self.apply(x[i], y[j])).collect())
            }
            (Values::Int(x), Values::Int(y)) => Values::Int(
                picks
                    .iter()
                    .map(|&(i, j)| wrap(dtype, self.apply_int(x[i], y[j])))
                    .collect(),
            ),
            _ => {
                return Err(RefError::Unsupported {
                    op: BinaryOp::name(*self),
                    dtype: b.dtype,
                })
            }
        })
    }
    fn host_evaluable(&self) -> bool {
        true
    }
    fn host_value(&self, shapes: &[&Shape], values: &[&[i64]], out: &Shape) -> Option<Vec<i64>> {
        shape_data::broadcast_zip(values[0], shapes[0], values[1], shapes[1], out, |x, y| {
            self.apply_int(x, y)
        })
    }
}

/// Unary elementwise operators. Inputs: x (f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `max(x, 0)`
    Relu,
    /// GELU, tanh form: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))` (GPT-2).
    Gelu,
    /// SiLU / swish: `x * sigmoid(x)`.
    Silu,
    /// `exp(x)`
    Exp,
    /// `sqrt(x)` (NaN below 0)
    Sqrt,
    /// `1 / x`
    Reciprocal,
    /// `-x`
    Neg,
    /// `ln(x)`
    Log,
    /// `tanh(x)`
    Tanh,
    /// The error function.
    Erf,
    /// `1 / (1 + exp(-x))`
    Sigmoid,
    /// GELU, exact form: `0.5 x (1 + erf(x / sqrt(2)))` (ONNX `Gelu` without approximation).
    GeluErf,
    /// `|x|`
    Abs,
    /// Round down.
    Floor,
    /// Round up.
    Ceil,
    /// Round to nearest, ties to even.
    Round,
    /// `sin(x)`
    Sin,
    /// `cos(x)`
    Cos,
    /// -1, 0 or 1 (0 for +-0).
    Sign,
}

impl UnaryOp {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Relu => "relu",
            UnaryOp::Gelu => "gelu",
            UnaryOp::Silu => "silu",
            UnaryOp::Exp => "exp",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Reciprocal => "reciprocal",
            UnaryOp::Neg => "neg",
            UnaryOp::Log => "log",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Erf => "erf",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::GeluErf => "gelu_erf",
            UnaryOp::Abs => "abs",
            UnaryOp::Floor => "floor",
            UnaryOp::Ceil => "ceil",
            UnaryOp::Round => "round",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Sign => "sign",
        }
    }

    /// The code the WGSL kernel switches on (`shaders/elementwise.wgsl`, override `UNARY_OP`).
    pub fn code(self) -> u32 {
        self as u32
    }

    /// Applies the op with f64 intermediates (the CPU reference).
    pub fn apply(self, x: f32) -> f32 {
        let x = x as f64;
        let y = match self {
            UnaryOp::Relu => x.max(0.0),
            UnaryOp::Gelu => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
            }
            UnaryOp::Silu => x / (1.0 + (-x).exp()),
            UnaryOp::Exp => x.exp(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Reciprocal => 1.0 / x,
            UnaryOp::Neg => -x,
            UnaryOp::Log => x.ln(),
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Erf => libm::erf(x),
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            UnaryOp::GeluErf => 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
            UnaryOp::Abs => x.abs(),
            UnaryOp::Floor => x.floor(),
            UnaryOp::Ceil => x.ceil(),
            UnaryOp::Round => x.round_ties_even(),
            UnaryOp::Sin => x.sin(),
            UnaryOp::Cos => x.cos(),
            UnaryOp::Sign => {
                if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    x
                }
            }
        };
        y as f32
    }
}

impl OpDef for UnaryOp {
    fn name(&self) -> &'static str {
        UnaryOp::name(*self)
    }
    fn arity(&self) -> (usize, usize) {
        (1, 1)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        all_f32(inputs)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        Ok(inputs[0].clone())
    }
    fn preserves_shape(&self) -> bool {
        true
    }
    fn reference(&self, inputs: &[&RefTensor], _: &Shape, _: DType) -> Result<Values, RefError> {
        let x = inputs[0].floats(UnaryOp::name(*self))?;
        Ok(Values::F32(x.iter().map(|&v| self.apply(v)).collect()))
    }
}

impl crate::graph::GraphBuilder {
    /// `silu(gate) * up` with broadcasting: the SwiGLU gate ([`BinaryOp::SiluMul`]).
    pub fn silu_mul(
        &mut self,
        label: impl Into<String>,
        gate: crate::graph::NodeId,
        up: crate::graph::NodeId,
    ) -> crate::graph::NodeId {
        self.binary(label, BinaryOp::SiluMul, gate, up)
    }

    /// `sqrt(x)` ([`UnaryOp::Sqrt`]).
    pub fn sqrt(
        &mut self,
        label: impl Into<String>,
        x: crate::graph::NodeId,
    ) -> crate::graph::NodeId {
        self.unary(label, UnaryOp::Sqrt, x)
    }
}

/// NumPy broadcasting of two shapes: align from the right; each pair of dimensions must be
/// equal or one of them 1 (a 0 broadcasts only against 0 or 1, giving 0).
///
/// # Errors
/// [`InferError::Broadcast`] with both shapes.
pub fn broadcast(a: &Shape, b: &Shape) -> Result<Shape, InferError> {
    let rank = a.rank().max(b.rank());
    let mut out = vec![0u64; rank];
    for (i, o) in out.iter_mut().enumerate() {
        let da = dim_from_right(a, rank - 1 - i);
        let db = dim_from_right(b, rank - 1 - i);
        *o = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(InferError::Broadcast {
                left: a.clone(),
                right: b.clone(),
            });
        };
    }
    checked(Shape(out))
}

/// Dimension `k` counted from the right (0 = last), 1 beyond the rank.
fn dim_from_right(s: &Shape, k: usize) -> u64 {
    if k < s.rank() {
        s.0[s.rank() - 1 - k]
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: &[u64]) -> Shape {
        Shape(d.to_vec())
    }

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast(&s(&[2, 3]), &s(&[3])).unwrap(), s(&[2, 3]));
        assert_eq!(
            broadcast(&s(&[4, 1, 5]), &s(&[3, 1])).unwrap(),
            s(&[4, 3, 5])
        );
        assert_eq!(broadcast(&s(&[]), &s(&[2])).unwrap(), s(&[2]));
        assert_eq!(broadcast(&s(&[0, 3]), &s(&[1, 3])).unwrap(), s(&[0, 3]));
        let e = broadcast(&s(&[2, 3]), &s(&[4])).unwrap_err();
        assert_eq!(e.to_string(), "cannot broadcast 2x3 with 4");
        assert!(broadcast(&s(&[0]), &s(&[2])).is_err());
    }

    #[test]
    fn gelu_matches_known_values() {
        assert!((UnaryOp::Gelu.apply(1.0) - 0.841_192).abs() < 1e-5);
        assert_eq!(UnaryOp::Relu.apply(-2.0), 0.0);
        assert!((UnaryOp::Silu.apply(1.0) - 0.731_058_6).abs() < 1e-6);
        assert_eq!(UnaryOp::Sqrt.apply(2.25), 1.5);
        assert!(UnaryOp::Sqrt.apply(-1.0).is_nan());
    }

    #[test]
    fn dtype_rule_refuses_mixed_and_small_types() {
        assert_eq!(
            BinaryOp::Add.output_dtype(&[DType::I64, DType::I64]),
            Ok(DType::I64)
        );
        assert!(BinaryOp::Add
            .output_dtype(&[DType::F32, DType::I32])
            .is_err());
        assert!(BinaryOp::Add
            .output_dtype(&[DType::F16, DType::F16])
            .is_err());
        assert!(UnaryOp::Exp.output_dtype(&[DType::I32]).is_err());
        assert_eq!(BinaryOp::Div.apply_int(7, 0), 0);
        assert_eq!(BinaryOp::Div.apply_int(-7, 2), -3);
        assert!(BinaryOp::SiluMul
            .output_dtype(&[DType::I32, DType::I32])
            .is_err());
    }

    #[test]
    fn silu_mul_is_the_swiglu_gate() {
        assert!((BinaryOp::SiluMul.apply(1.0, 2.0) - 2.0 * 0.731_058_6).abs() < 1e-6);
        assert_eq!(BinaryOp::SiluMul.apply(0.0, 5.0), 0.0);
        assert!((BinaryOp::SiluMul.apply(-100.0, 1.0)).abs() < 1e-30);
    }
}
