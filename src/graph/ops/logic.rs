//! Comparisons, boolean logic, casts and the identity copy: the elementwise ops whose inputs
//! or outputs are not f32 (bool results, integer and bool inputs).

use super::elementwise::broadcast;
use super::{DTypeError, InferError, OpDef};
use crate::graph::reference::{index, wrap, RefError, RefTensor, Values};
use crate::graph::shape_data;
use crate::shape::{DType, Shape};

/// Comparisons with NumPy broadcasting; the result is bool. Inputs: a, b of one type (f32,
/// any integer type, bool).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompareOp {
    /// `a == b`
    Equal,
    /// `a < b`
    Less,
    /// `a <= b`
    LessOrEqual,
    /// `a > b`
    Greater,
    /// `a >= b`
    GreaterOrEqual,
}

/// Boolean logic with NumPy broadcasting. Inputs: a, b (bool); output bool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogicOp {
    /// `a && b`
    And,
    /// `a || b`
    Or,
    /// `a != b`
    Xor,
}

/// Boolean negation. Inputs: x (bool); output bool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Not;

/// Element type conversion (ONNX `Cast`): floats to integers truncate toward zero, integers
/// to narrower integers wrap, anything to bool is `x != 0`. Inputs: x (any plain type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cast {
    /// The output element type (a plain type, not block-quantized).
    pub to: DType,
}

/// A copy of its input (any plain type): a graph output that must have a buffer of its own.
/// Inputs: x.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity;

impl CompareOp {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            CompareOp::Equal => "equal",
            CompareOp::Less => "less",
            CompareOp::LessOrEqual => "less_or_equal",
            CompareOp::Greater => "greater",
            CompareOp::GreaterOrEqual => "greater_or_equal",
        }
    }

    /// Compares two values of one ordering.
    pub fn holds<T: PartialOrd>(self, a: T, b: T) -> bool {
        match self {
            CompareOp::Equal => a == b,
            CompareOp::Less => a < b,
            CompareOp::LessOrEqual => a <= b,
            CompareOp::Greater => a > b,
            CompareOp::GreaterOrEqual => a >= b,
        }
    }
}

impl LogicOp {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            LogicOp::And => "and",
            LogicOp::Or => "or",
            LogicOp::Xor => "xor",
        }
    }

    /// Applies the op to two truth values.
    pub fn apply(self, a: bool, b: bool) -> bool {
        match self {
            LogicOp::And => a && b,
            LogicOp::Or => a || b,
            LogicOp::Xor => a != b,
        }
    }
}

/// `(index into a, index into b)` of every output element under broadcasting: the
/// reference's own index walk.
fn broadcast_picks(a: &Shape, b: &Shape, out: &Shape) -> Vec<(usize, usize)> {
    let mut picks = Vec::new();
    index::for_each(out, |_, idx| {
        picks.push((index::broadcast(idx, a), index::broadcast(idx, b)))
    });
    picks
}

impl OpDef for CompareOp {
    fn name(&self) -> &'static str {
        CompareOp::name(*self)
    }
    fn arity(&self) -> (usize, usize) {
        (2, 2)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        if inputs[0].block().is_some() {
            return Err(DTypeError::at(0, "a plain (not block-quantized) type"));
        }
        if inputs[1] != inputs[0] {
            return Err(DTypeError::at(1, "the same type as input 0"));
        }
        Ok(DType::Bool)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        broadcast(inputs[0], inputs[1])
    }
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let (a, b) = (inputs[0], inputs[1]);
        let picks = broadcast_picks(&a.shape, &b.shape, out);
        let v: Vec<i64> = match (&a.values, &b.values) {
            (Values::F32(x), Values::F32(y)) => picks
                .iter()
                .map(|&(i, j)| i64::from(self.holds(x[i], y[j])))
                .collect(),
            (Values::Int(x), Values::Int(y)) => picks
                .iter()
                .map(|&(i, j)| i64::from(self.holds(x[i], y[j])))
                .collect(),
            _ => {
                return Err(RefError::Unsupported {
                    op: CompareOp::name(*self),
                    dtype: b.dtype,
                })
            }
        };
        Ok(Values::Int(v))
    }
    fn host_evaluable(&self) -> bool {
        true
    }
    fn host_value(&self, shapes: &[&Shape], values: &[&[i64]], out: &Shape) -> Option<Vec<i64>> {
        shape_data::broadcast_zip(values[0], shapes[0], values[1], shapes[1], out, |x, y| {
            i64::from(self.holds(x, y))
        })
    }
}

/// Bool on every input, else which input is not.
fn all_bool(inputs: &[DType]) -> Result<DType, DTypeError> {
    match inputs.iter().position(|&d| d != DType::Bool) {
        Some(i) => Err(DTypeError::at(i, "bool")),
        None => Ok(DType::Bool),
    }
}

impl OpDef for LogicOp {
    fn name(&self) -> &'static str {
        LogicOp::name(*self)
    }
    fn arity(&self) -> (usize, usize) {
        (2, 2)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        all_bool(inputs)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        broadcast(inputs[0], inputs[1])
    }
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let (a, b) = (inputs[0], inputs[1]);
        let picks = broadcast_picks(&a.shape, &b.shape, out);
        Ok(Values::Int(
            picks
                .iter()
                .map(|&(i, j)| i64::from(self.apply(a.is_true(i), b.is_true(j))))
                .collect(),
        ))
    }
    fn host_evaluable(&self) -> bool {
        true
    }
    fn host_value(&self, shapes: &[&Shape], values: &[&[i64]], out: &Shape) -> Option<Vec<i64>> {
        shape_data::broadcast_zip(values[0], shapes[0], values[1], shapes[1], out, |x, y| {
            i64::from(self.apply(x != 0, y != 0))
        })
    }
}

impl OpDef for Not {
    fn name(&self) -> &'static str {
        "not"
    }
    fn arity(&self) -> (usize, usize) {
        (1, 1)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        all_bool(inputs)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        Ok(inputs[0].clone())
    }
    fn preserves_shape(&self) -> bool {
        true
    }
    fn reference(&self, inputs: &[&RefTensor], _: &Shape, _: DType) -> Result<Values, RefError> {
        let x = inputs[0];
        Ok(Values::Int(
            (0..x.values.len())
                .map(|i| i64::from(!x.is_true(i)))
                .collect(),
        ))
    }
    fn host_evaluable(&self) -> bool {
        true
    }
    fn host_value(&self, _: &[&Shape], values: &[&[i64]], _: &Shape) -> Option<Vec<i64>> {
        Some(values[0].iter().map(|&v| i64::from(v == 0)).collect())
    }
}

/// A plain (not block-quantized) type at input `i`.
fn plain(inputs: &[DType], i: usize) -> Result<(), DTypeError> {
    match inputs.get(i) {
        Some(d) if d.block().is_none() => Ok(()),
        _ => Err(DTypeError::at(i, "a plain (not block-quantized) type")),
    }
}

/// f32 `v` as an integer of `to`: truncated toward zero, saturated to i64 (NaN gives 0), then
/// wrapped to the type's width; bool is `v != 0`.
pub fn float_to_int(v: f32, to: DType) -> i64 {
    if to == DType::Bool {
        return i64::from(v != 0.0);
    }
    wrap(to, v as i64)
}

impl OpDef for Cast {
    fn name(&self) -> &'static str {
        "cast"
    }
    fn arity(&self) -> (usize, usize) {
        (1, 1)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        plain(inputs, 0)?;
        if self.to.block().is_some() {
            return Err(DTypeError::at(0, "a cast to a plain type"));
        }
        Ok(self.to)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        Ok(inputs[0].clone())
    }
    fn preserves_shape(&self) -> bool {
        true
    }
    fn reference(&self, inputs: &[&RefTensor], _: &Shape, _: DType) -> Result<Values, RefError> {
        let to = self.to;
        Ok(match (&inputs[0].values, to.is_int()) {
            (Values::F32(v), true) => Values::Int(v.iter().map(|&x| float_to_int(x, to)).collect()),
            // Floats to floats: through the target's bits (f16 and bf16 round).
            (Values::F32(v), false) => {
                let bytes = crate::tensor::encode_f32(to, v)?;
                Values::F32(crate::tensor::decode_f32(to, &bytes)?)
            }
            (Values::Int(v), true) => Values::Int(v.iter().map(|&x| wrap(to, x)).collect()),
            (Values::Int(v), false) => {
                let f: Vec<f32> = v.iter().map(|&x| x as f32).collect();
                let bytes = crate::tensor::encode_f32(to, &f)?;
                Values::F32(crate::tensor::decode_f32(to, &bytes)?)
            }
        })
    }
    fn host_evaluable(&self) -> bool {
        true
    }
    fn host_value(&self, _: &[&Shape], values: &[&[i64]], _: &Shape) -> Option<Vec<i64>> {
        if !self.to.is_int() {
            return None;
        }
        // Host values are integers already; the evaluator wraps them to the target's width.
        Some(values[0].to_vec())
    }
}

impl OpDef for Identity {
    fn name(&self) -> &'static str {
        "identity"
    }
    fn arity(&self) -> (usize, usize) {
        (1, 1)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        plain(inputs, 0)?;
        Ok(inputs[0])
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        Ok(inputs[0].clone())
    }
    fn preserves_shape(&self) -> bool {
        true
    }
    fn reference(&self, inputs: &[&RefTensor], _: &Shape, _: DType) -> Result<Values, RefError> {
        Ok(inputs[0].values.clone())
    }
    fn host_evaluable(&self) -> bool {
        true
    }
    fn host_value(&self, _: &[&Shape], values: &[&[i64]], _: &Shape) -> Option<Vec<i64>> {
        Some(values[0].to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[u64], dtype: DType, v: Values) -> RefTensor {
        RefTensor {
            shape: Shape(shape.to_vec()),
            dtype,
            values: v,
        }
    }

    #[test]
    fn comparisons_broadcast_and_give_bools() {
        let a = t(&[2, 1], DType::F32, Values::F32(vec![1.0, 3.0]));
        let b = t(&[3], DType::F32, Values::F32(vec![0.0, 1.0, 2.0]));
        let out = Shape(vec![2, 3]);
        assert_eq!(
            CompareOp::Less.reference(&[&a, &b], &out, DType::Bool),
            Ok(Values::Int(vec![0, 0, 1, 0, 0, 0]))
        );
        assert_eq!(
            CompareOp::GreaterOrEqual.reference(&[&a, &b], &out, DType::Bool),
            Ok(Values::Int(vec![1, 1, 0, 1, 1, 1]))
        );
        assert_eq!(
            CompareOp::Equal.output_dtype(&[DType::I64, DType::I64]),
            Ok(DType::Bool)
        );
        assert!(CompareOp::Equal
            .output_dtype(&[DType::I64, DType::I32])
            .is_err());
        assert_eq!(
            CompareOp::Equal.host_value(
                &[&Shape(vec![3]), &Shape(vec![])],
                &[&[1, 2, 1], &[1]],
                &Shape(vec![3])
            ),
            Some(vec![1, 0, 1])
        );
    }

    #[test]
    fn logic_not_and_casts() {
        let a = t(&[4], DType::Bool, Values::Int(vec![0, 0, 1, 1]));
        let b = t(&[4], DType::Bool, Values::Int(vec![0, 1, 0, 1]));
        let out = Shape(vec![4]);
        assert_eq!(
            LogicOp::Xor.reference(&[&a, &b], &out, DType::Bool),
            Ok(Values::Int(vec![0, 1, 1, 0]))
        );
        assert_eq!(
            Not.reference(&[&a], &out, DType::Bool),
            Ok(Values::Int(vec![1, 1, 0, 0]))
        );
        assert!(LogicOp::And
            .output_dtype(&[DType::Bool, DType::I32])
            .is_err());
        let f = t(&[4], DType::F32, Values::F32(vec![-1.7, 2.9, 300.0, 0.0]));
        assert_eq!(
            Cast { to: DType::I8 }.reference(&[&f], &out, DType::I8),
            Ok(Values::Int(vec![-1, 2, 44, 0]))
        );
        assert_eq!(
            Cast { to: DType::Bool }.reference(&[&f], &out, DType::Bool),
            Ok(Values::Int(vec![1, 1, 1, 0]))
        );
        let big = t(&[1], DType::I64, Values::Int(vec![(1 << 40) + 5]));
        assert_eq!(
            Cast { to: DType::I32 }.reference(&[&big], &Shape(vec![1]), DType::I32),
            Ok(Values::Int(vec![5]))
        );
        assert!(Cast { to: DType::Q8_0 }
            .output_dtype(&[DType::F32])
            .is_err());
    }
}
