//! Elementwise ops: binary with NumPy broadcasting, unary activations.

use super::{checked, InferError};
use crate::shape::Shape;

/// Binary elementwise operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// `a / b`
    Div,
}

impl BinaryOp {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
        }
    }

    /// The code the WGSL kernel switches on (`shaders/elementwise.wgsl`, override `BINARY_OP`).
    pub fn code(self) -> u32 {
        self as u32
    }

    /// Applies the op in f32, as the GPU does.
    pub fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
        }
    }
}

/// Unary elementwise operators.
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
}

impl UnaryOp {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Relu => "relu",
            UnaryOp::Gelu => "gelu",
            UnaryOp::Silu => "silu",
            UnaryOp::Exp => "exp",
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
        };
        y as f32
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

/// Row-major strides (in elements) of `input` as seen from an output of rank `out_rank` under
/// broadcasting: 0 where the input dimension is 1 (or missing), its ordinary stride otherwise.
pub fn broadcast_strides(input: &Shape, out: &Shape) -> Vec<u64> {
    let out_rank = out.rank();
    let mut strides = vec![0u64; out_rank];
    let mut stride = 1u64;
    for k in 0..input.rank() {
        let d = input.0[input.rank() - 1 - k];
        let pos = out_rank - 1 - k;
        strides[pos] = if d == 1 && out.0[pos] != 1 { 0 } else { stride };
        stride = stride.saturating_mul(d);
    }
    strides
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
    fn broadcast_strides_zero_on_size_one() {
        assert_eq!(
            broadcast_strides(&s(&[3, 1]), &s(&[2, 3, 4])),
            vec![0, 1, 0]
        );
        assert_eq!(
            broadcast_strides(&s(&[2, 3, 4]), &s(&[2, 3, 4])),
            vec![12, 4, 1]
        );
    }

    #[test]
    fn gelu_matches_known_values() {
        assert!((UnaryOp::Gelu.apply(1.0) - 0.841_192).abs() < 1e-5);
        assert_eq!(UnaryOp::Relu.apply(-2.0), 0.0);
        assert!((UnaryOp::Silu.apply(1.0) - 0.731_058_6).abs() < 1e-6);
    }
}
