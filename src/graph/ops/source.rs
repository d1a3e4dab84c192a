//! Where values come from: network inputs and constants.

use super::{DTypeError, InferError, OpDef};
use crate::graph::reference::{RefError, RefTensor, Values};
use crate::graph::Dim;
use crate::shape::{DType, Shape};
use crate::tensor::ConstData;

/// A network input; its dimensions may be symbolic and are bound per run. No inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    /// Declared dimensions.
    pub dims: Vec<Dim>,
    /// Element type the caller gives.
    pub dtype: DType,
}

impl Input {
    /// An input of `dtype` with `dims`.
    pub fn new(dims: Vec<Dim>, dtype: DType) -> Input {
        Input { dims, dtype }
    }
}

impl OpDef for Input {
    fn name(&self) -> &'static str {
        "input"
    }
    fn arity(&self) -> (usize, usize) {
        (0, 0)
    }
    fn output_dtype(&self, _: &[DType]) -> Result<DType, DTypeError> {
        Ok(self.dtype)
    }
    /// Only when every dimension is fixed; the graph binds symbols per run
    /// ([`crate::graph::Graph::input_shape`]).
    fn infer(&self, _: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        self.dims
            .iter()
            .map(|d| match d {
                Dim::Fixed(n) => Ok(*n),
                Dim::Sym(_) => Err(InferError::MissingShapeData { input: 0 }),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Shape)
    }
    /// Inputs are given, never computed: the evaluator takes them from the caller.
    fn reference(&self, _: &[&RefTensor], _: &Shape, dtype: DType) -> Result<Values, RefError> {
        Err(RefError::Unsupported { op: "input", dtype })
    }
}

/// A constant (weights, biases, integer tables): typed little-endian bytes, possibly a range
/// of a file every constant of a model shares ([`ConstData`]). No inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct Constant {
    /// Its shape.
    pub shape: Shape,
    /// Its element type (any, block formats included: a weight stays in its block format).
    pub dtype: DType,
    /// `shape.size_bytes(dtype)` bytes (checked when the graph is built).
    pub data: ConstData,
}

impl OpDef for Constant {
    fn name(&self) -> &'static str {
        "constant"
    }
    fn arity(&self) -> (usize, usize) {
        (0, 0)
    }
    fn output_dtype(&self, _: &[DType]) -> Result<DType, DTypeError> {
        Ok(self.dtype)
    }
    fn infer(&self, _: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        Ok(self.shape.clone())
    }
    fn reference(&self, _: &[&RefTensor], _: &Shape, _: DType) -> Result<Values, RefError> {
        RefTensor::from_bytes(self.shape.clone(), self.dtype, self.data.bytes()).map(|t| t.values)
    }
    fn host_evaluable(&self) -> bool {
        self.dtype.is_int()
    }
    fn host_value(&self, _: &[&Shape], _: &[&[i64]], _: &Shape) -> Option<Vec<i64>> {
        crate::graph::shape_data::decode_constant(self.dtype, self.data.bytes())
    }
}
