//! Views: new shapes over the same bytes in the same order — squeeze, unsqueeze, flatten (and
//! [`super::Reshape`], [`super::ReshapeTo`] in [`super::movement`]). The runtime copies the
//! bytes ([`OpDef::is_view`]); host values pass through unchanged.

use super::movement::shape_vector;
use super::{axes_indices, checked, is_index, same_plain_type, DTypeError, InferError, OpDef};
use crate::graph::reference::{RefError, RefTensor, Values};
use crate::shape::{DType, Shape};

/// Removes dimensions of extent 1: the listed axes (each must be 1), or every dimension of 1
/// when none are listed (ONNX `Squeeze`). The axes are `axes`, or the values of an optional
/// second input (a 1-D integer tensor known on the host, never read on the device). Inputs:
/// x (any plain type), optional axes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Squeeze {
    /// Axes to remove (negative count from the end), or `None` for every dimension of 1 (or
    /// the second input's).
    pub axes: Option<Vec<i64>>,
}

/// Inserts dimensions of extent 1 at `axes`, positions in the output (negative count from the
/// end of the output; ONNX `Unsqueeze`), or at the values of an optional second input (a 1-D
/// integer tensor known on the host). Inputs: x (any plain type), optional axes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsqueeze {
    /// Output positions of the new dimensions (empty when the second input holds them).
    pub axes: Vec<i64>,
}

/// Flattens to 2-D: `[prod(dims[..axis]), prod(dims[axis..])]`, `axis` in `[-rank, rank]`
/// (ONNX `Flatten`). Inputs: x (any plain type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flatten {
    /// Where the second dimension starts.
    pub axis: i64,
}

/// What every view op answers alike: input 0 of any plain type, the bytes unchanged; up to
/// `$max` inputs, those after the first being shape data.
macro_rules! view_def {
    ($name:literal, $max:literal) => {
        fn name(&self) -> &'static str {
            $name
        }
        fn arity(&self) -> (usize, usize) {
            (1, $max)
        }
        fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
            if inputs.len() > 1 && !is_index(inputs[1]) {
                return Err(DTypeError::at(1, "i32, u32 or i64 (axes)"));
            }
            same_plain_type(&inputs[..1])
        }
        fn shape_data_inputs(&self) -> &'static [usize] {
            &[1]
        }
        fn is_view(&self) -> bool {
            true
        }
        fn reference(
            &self,
            inputs: &[&RefTensor],
            _: &Shape,
            _: DType,
        ) -> Result<Values, RefError> {
            Ok(inputs[0].values.clone())
        }
        fn host_evaluable(&self) -> bool {
            true
        }
        fn host_value(&self, _: &[&Shape], values: &[&[i64]], _: &Shape) -> Option<Vec<i64>> {
            Some(values[0].to_vec())
        }
    };
}

/// The axes of a view: its own, or the values of its second input.
fn listed<'a>(
    own: Option<&'a [i64]>,
    inputs: &[&Shape],
    data: &[Option<&'a [i64]>],
) -> Result<Option<&'a [i64]>, InferError> {
    if inputs.len() < 2 {
        return Ok(own);
    }
    shape_vector(inputs, data, 1).map(Some)
}

impl OpDef for Squeeze {
    view_def!("squeeze", 2);
    fn infer(&self, inputs: &[&Shape], data: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        let x = inputs[0];
        let Some(axes) = listed(self.axes.as_deref(), inputs, data)? else {
            return Ok(Shape(x.0.iter().copied().filter(|&d| d != 1).collect()));
        };
        let drop = axes_indices(axes, x, x.rank())?;
        if drop.iter().any(|&a| x.0[a] != 1) {
            return Err(InferError::Axes {
                axes: axes.to_vec(),
                shape: x.clone(),
                reason: "a squeezed dimension is not 1",
            });
        }
        Ok(Shape(
            x.0.iter()
                .enumerate()
                .filter(|(i, _)| !drop.contains(i))
                .map(|(_, &d)| d)
                .collect(),
        ))
    }
}

impl OpDef for Unsqueeze {
    view_def!("unsqueeze", 2);
    fn infer(&self, inputs: &[&Shape], data: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        let x = inputs[0];
        let axes = listed(Some(&self.axes), inputs, data)?.unwrap_or_default();
        let rank = x.rank() + axes.len();
        let at = axes_indices(axes, x, rank)?;
        let mut src = x.0.iter();
        let out = (0..rank)
            .map(|i| {
                if at.contains(&i) {
                    1
                } else {
                    src.next().copied().unwrap_or(1)
                }
            })
            .collect();
        Ok(Shape(out))
    }
}

impl OpDef for Flatten {
    view_def!("flatten", 1);
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        let x = inputs[0];
        let r = x.rank() as i64;
        let a = if self.axis < 0 {
            self.axis + r
        } else {
            self.axis
        };
        if !(0..=r).contains(&a) {
            return Err(InferError::Axis {
                axis: self.axis,
                rank: x.rank(),
            });
        }
        let (outer, inner) = x.0.split_at(a as usize);
        let prod = |d: &[u64]| d.iter().try_fold(1u64, |acc, &v| acc.checked_mul(v));
        match (prod(outer), prod(inner)) {
            (Some(o), Some(i)) => checked(Shape(vec![o, i])),
            _ => Err(InferError::Overflow {
                shape: x.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: &[u64]) -> Shape {
        Shape(d.to_vec())
    }

    fn infer(op: &dyn OpDef, x: &[u64]) -> Result<Shape, InferError> {
        op.infer(&[&s(x)], &[])
    }

    #[test]
    fn squeeze_unsqueeze_flatten_rules() {
        let sq = |axes: Option<Vec<i64>>| Squeeze { axes };
        assert_eq!(infer(&sq(None), &[1, 3, 1, 5]).unwrap(), s(&[3, 5]));
        assert_eq!(
            infer(&sq(Some(vec![-2])), &[1, 3, 1, 5]).unwrap(),
            s(&[1, 3, 5])
        );
        let e = infer(&sq(Some(vec![1])), &[1, 3, 1, 5]).unwrap_err();
        assert!(e.to_string().contains("not 1"), "{e}");
        assert!(
            infer(&sq(Some(vec![0, -4])), &[1, 3, 1, 5]).is_err(),
            "repeated"
        );
        assert!(infer(&sq(Some(vec![4])), &[1, 3, 1, 5]).is_err());
        let un = |axes: &[i64]| Unsqueeze {
            axes: axes.to_vec(),
        };
        assert_eq!(infer(&un(&[0]), &[3, 4]).unwrap(), s(&[1, 3, 4]));
        assert_eq!(infer(&un(&[-1]), &[3, 4]).unwrap(), s(&[3, 4, 1]));
        assert_eq!(
            infer(&un(&[4, 0, 2]), &[3, 4]).unwrap(),
            s(&[1, 3, 1, 4, 1])
        );
        assert!(infer(&un(&[5]), &[3, 4]).is_err());
        assert!(infer(&un(&[1, 1]), &[3, 4]).is_err());
        // Axes held in a second input.
        let fed = |op: &dyn OpDef, axes: &[i64]| {
            op.infer(
                &[&s(&[1, 3, 1]), &s(&[axes.len() as u64])],
                &[None, Some(axes)],
            )
        };
        assert_eq!(fed(&sq(None), &[0]).unwrap(), s(&[3, 1]));
        assert_eq!(fed(&un(&[]), &[-1, 0]).unwrap(), s(&[1, 1, 3, 1, 1]));
        assert!(matches!(
            sq(None).infer(&[&s(&[1]), &s(&[1])], &[None, None]),
            Err(InferError::MissingShapeData { input: 1 })
        ));
        let fl = |axis| Flatten { axis };
        assert_eq!(infer(&fl(0), &[2, 3, 4]).unwrap(), s(&[1, 24]));
        assert_eq!(infer(&fl(2), &[2, 3, 4]).unwrap(), s(&[6, 4]));
        assert_eq!(infer(&fl(3), &[2, 3, 4]).unwrap(), s(&[24, 1]));
        assert_eq!(infer(&fl(-1), &[2, 3, 4]).unwrap(), s(&[6, 4]));
        assert!(infer(&fl(4), &[2, 3, 4]).is_err());
        assert!(infer(&fl(-4), &[2, 3, 4]).is_err());
    }
}
