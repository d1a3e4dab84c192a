//! The CNN set: convolution (1 to 3 spatial dimensions, groups, strides, dilations, padding,
//! bias), max and average pooling, and batch normalisation with running statistics. Tensors
//! are `[N, C, spatial...]` (ONNX's layout).

use super::{all_f32, checked, DTypeError, InferError, OpDef};
use crate::graph::reference::{index, RefError, RefTensor, Values};
use crate::shape::{DType, Shape};

/// Most spatial dimensions the convolution and pooling kernels address.
pub const MAX_SPATIAL: usize = 3;

/// How padding is chosen (ONNX `auto_pad`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AutoPad {
    /// The explicit `pads`.
    #[default]
    NotSet,
    /// Output `ceil(in / stride)`, the odd padding at the end.
    SameUpper,
    /// Output `ceil(in / stride)`, the odd padding at the start.
    SameLower,
    /// No padding.
    Valid,
}

/// The sliding window of a convolution or pooling: per spatial dimension the stride,
/// dilation and padding (ONNX attributes; empty lists mean 1s and 0s).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Window {
    /// Strides per spatial dimension (empty: 1).
    pub strides: Vec<u64>,
    /// `[begin..., end...]` padding (empty: 0); ignored unless `auto_pad` is `NotSet`.
    pub pads: Vec<u64>,
    /// Dilations per spatial dimension (empty: 1).
    pub dilations: Vec<u64>,
    /// How padding is chosen.
    pub auto_pad: AutoPad,
    /// Round the output size up (pooling): a last window that would start in the end
    /// padding is dropped (ONNX and PyTorch).
    pub ceil_mode: bool,
}

/// One spatial dimension of a window laid over a concrete input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Axis {
    /// Input extent.
    pub input: u64,
    /// Kernel extent.
    pub kernel: u64,
    /// Stride.
    pub stride: u64,
    /// Dilation.
    pub dilation: u64,
    /// Padding before the first element.
    pub pad_begin: u64,
    /// Padding after the last element.
    pub pad_end: u64,
    /// Output extent.
    pub output: u64,
}

impl Window {
    /// The window over an input's spatial extents with a kernel's.
    ///
    /// # Errors
    /// [`InferError::Param`] for attribute lists of the wrong length, a zero stride or
    /// dilation, or a dilated kernel larger than the padded input.
    pub fn resolve(&self, input: &[u64], kernel: &[u64]) -> Result<Vec<Axis>, InferError> {
        let n = input.len();
        let bad = |what, detail: String| InferError::Param { what, detail };
        let list = |v: &[u64], len: usize, default: u64, what| -> Result<Vec<u64>, InferError> {
            match v.len() {
                0 => Ok(vec![default; len]),
                l if l == len => Ok(v.to_vec()),
                l => Err(bad(what, format!("{l} values for {n} spatial dimensions"))),
            }
        };
        if kernel.len() != n || n == 0 {
            return Err(bad(
                "kernel and input spatial ranks differ",
                format!("kernel {kernel:?}, input {input:?}"),
            ));
        }
        let strides = list(&self.strides, n, 1, "strides")?;
        let dilations = list(&self.dilations, n, 1, "dilations")?;
        let pads = list(&self.pads, 2 * n, 0, "pads")?;
        if strides.contains(&0) || dilations.contains(&0) {
            return Err(bad(
                "strides and dilations must be at least 1",
                format!("strides {strides:?}, dilations {dilations:?}"),
            ));
        }
        (0..n)
            .map(|i| {
                let (x, k, s, d) = (input[i], kernel[i], strides[i], dilations[i]);
                let span = k.saturating_sub(1).saturating_mul(d).saturating_add(1);
                let (pad_begin, pad_end, output) = match self.auto_pad {
                    AutoPad::SameUpper | AutoPad::SameLower => {
                        let out = x.div_ceil(s);
                        let total = (out.saturating_sub(1) * s + span).saturating_sub(x);
                        let small = total / 2;
                        if self.auto_pad == AutoPad::SameUpper {
                            (small, total - small, out)
                        } else {
                            (total - small, small, out)
                        }
                    }
                    AutoPad::Valid | AutoPad::NotSet => {
                        let (pb, pe) = if self.auto_pad == AutoPad::Valid {
                            (0, 0)
                        } else {
                            (pads[i], pads[n + i])
                        };
                        let padded = x.saturating_add(pb).saturating_add(pe);
                        if padded < span {
                            return Err(bad(
                                "the window is larger than the padded input",
                                format!(
                                    "dimension {i}: input {x} + pads {pb}+{pe} < window {span}"
                                ),
                            ));
                        }
                        let mut out = if self.ceil_mode {
                            (padded - span).div_ceil(s) + 1
                        } else {
                            (padded - span) / s + 1
                        };
                        if self.ceil_mode && (out - 1) * s >= x + pb {
                            out -= 1;
                        }
                        (pb, pe, out)
                    }
                };
                Ok(Axis {
                    input: x,
                    kernel: k,
                    stride: s,
                    dilation: d,
                    pad_begin,
                    pad_end,
                    output,
                })
            })
            .collect()
    }
}

/// Convolution of `x [N, C, spatial...]` with `w [OC, C / group, kernel...]` plus `bias
/// [OC]` (ONNX `Conv`; the importer gives a zero bias when the model has none), 1 to 3
/// spatial dimensions. Inputs: x, w, bias (f32).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conv {
    /// Strides, dilations, padding.
    pub window: Window,
    /// Channel groups (input and output channels both divide into them).
    pub group: u64,
}

/// What a [`Pool`] computes over its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolKind {
    /// The maximum of the input elements in the window.
    Max,
    /// The mean of the window: over its input elements, or, with `count_include_pad`, over
    /// everything inside the explicit padding too (zeros).
    Avg {
        /// Count padding positions in the divisor.
        count_include_pad: bool,
    },
}

/// Max or average pooling of `x [N, C, spatial...]` over windows of `kernel` (ONNX
/// `MaxPool` / `AveragePool`), 1 to 3 spatial dimensions. Inputs: x (f32).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    /// Max or average.
    pub kind: PoolKind,
    /// Window extent per spatial dimension.
    pub kernel: Vec<u64>,
    /// Strides, dilations, padding, rounding.
    pub window: Window,
}

/// Batch normalisation with running statistics (ONNX `BatchNormalization`, inference):
/// `(x - mean[c]) / sqrt(var[c] + eps) * scale[c] + bias[c]` on channel axis 1. Inputs: x
/// `[N, C, ...]`, scale, bias, mean, var (each `[C]`, f32).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchNorm {
    /// Added to the variance.
    pub eps: f32,
}

/// `x`'s spatial extents, checked against the kernels' limit.
fn spatial(x: &Shape, input: usize) -> Result<&[u64], InferError> {
    if x.rank() < 3 || x.rank() > 2 + MAX_SPATIAL {
        return Err(InferError::Rank {
            input,
            shape: x.clone(),
            expected: "[N, C, spatial...] with 1 to 3 spatial dimensions",
        });
    }
    Ok(&x.0[2..])
}

impl Conv {
    /// The window over `x` with `w`'s kernel, channels checked.
    ///
    /// # Errors
    /// [`InferError::Rank`], [`InferError::Mismatch`] for channels or bias that do not fit,
    /// [`InferError::Param`] as [`Window::resolve`] and for groups that do not divide the
    /// channels.
    pub fn axes(&self, inputs: &[&Shape]) -> Result<Vec<Axis>, InferError> {
        let (x, w) = (inputs[0], inputs[1]);
        let sp = spatial(x, 0)?;
        if w.rank() != x.rank() {
            return Err(InferError::Mismatch {
                what: "conv weights must be [OC, C / group, kernel...] of x's rank",
                left: x.clone(),
                right: w.clone(),
            });
        }
        let (oc, icg) = (w.0[0], w.0[1]);
        let g = self.group;
        if g == 0 || oc % g != 0 || icg.checked_mul(g) != Some(x.0[1]) {
            return Err(InferError::Param {
                what: "conv channels do not fit the groups",
                detail: format!("x {x}, w {w}, group {g}"),
            });
        }
        if let Some(b) = inputs.get(2) {
            if b.0 != [oc] {
                return Err(InferError::Mismatch {
                    what: "conv bias must be [OC]",
                    left: w.clone(),
                    right: (*b).clone(),
                });
            }
        }
        self.window.resolve(sp, &w.0[2..])
    }
}

impl OpDef for Conv {
    fn name(&self) -> &'static str {
        "conv"
    }
    fn arity(&self) -> (usize, usize) {
        (3, 3)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        all_f32(inputs)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        let axes = self.axes(inputs)?;
        let mut out = vec![inputs[0].0[0], inputs[1].0[0]];
        out.extend(axes.iter().map(|a| a.output));
        checked(Shape(out))
    }
    /// Direct loops over every output, channel of its group and kernel position (f64).
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let (x, w, b) = (
            inputs[0].floats("conv")?,
            inputs[1].floats("conv")?,
            inputs[2].floats("conv")?,
        );
        let shapes: Vec<&Shape> = inputs.iter().map(|t| &t.shape).collect();
        let Ok(axes) = self.axes(&shapes) else {
            return Ok(Values::F32(Vec::new()));
        };
        let (xs, ws) = (&inputs[0].shape, &inputs[1].shape);
        let icg = ws.0[1];
        let ocg = ws.0[0] / self.group;
        let kernel = Shape(ws.0[2..].to_vec());
        let mut v = Vec::new();
        index::for_each(out, |_, o| {
            let (n, oc) = (o[0], o[1]);
            let g = oc / ocg;
            let mut acc = f64::from(b[oc as usize]);
            for c in 0..icg {
                index::for_each(&kernel, |_, k| {
                    let mut at = vec![n, g * icg + c];
                    for (i, a) in axes.iter().enumerate() {
                        let p =
                            (o[2 + i] * a.stride + k[i] * a.dilation) as i64 - a.pad_begin as i64;
                        if p < 0 || p >= a.input as i64 {
                            return;
                        }
                        at.push(p as u64);
                    }
                    let mut wi = vec![oc, c];
                    wi.extend_from_slice(k);
                    acc +=
                        f64::from(x[index::linear(&at, xs)]) * f64::from(w[index::linear(&wi, ws)]);
                });
            }
            v.push(acc as f32);
        });
        Ok(Values::F32(v))
    }
}

impl Pool {
    /// The window over `x`.
    ///
    /// # Errors
    /// As [`Window::resolve`]; [`InferError::Rank`] for an `x` that is not `[N, C, spatial...]`.
    pub fn axes(&self, x: &Shape) -> Result<Vec<Axis>, InferError> {
        self.window.resolve(spatial(x, 0)?, &self.kernel)
    }
}

impl OpDef for Pool {
    fn name(&self) -> &'static str {
        match self.kind {
            PoolKind::Max => "max_pool",
            PoolKind::Avg { .. } => "average_pool",
        }
    }
    fn arity(&self) -> (usize, usize) {
        (1, 1)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        all_f32(inputs)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        let axes = self.axes(inputs[0])?;
        let mut out = inputs[0].0[..2].to_vec();
        out.extend(axes.iter().map(|a| a.output));
        checked(Shape(out))
    }
    /// Direct loops over every window position (f64); padding positions are skipped, and
    /// counted in the average's divisor when `count_include_pad` and inside the explicit
    /// padding.
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let x = inputs[0].floats(self.name())?;
        let xs = &inputs[0].shape;
        let Ok(axes) = self.axes(xs) else {
            return Ok(Values::F32(Vec::new()));
        };
        let kernel = Shape(self.kernel.clone());
        let mut v = Vec::new();
        index::for_each(out, |_, o| {
            let (mut max, mut sum, mut count) = (f64::NEG_INFINITY, 0f64, 0u64);
            index::for_each(&kernel, |_, k| {
                let mut at = vec![o[0], o[1]];
                let (mut inside, mut in_pads) = (true, true);
                for (i, a) in axes.iter().enumerate() {
                    let p = (o[2 + i] * a.stride + k[i] * a.dilation) as i64 - a.pad_begin as i64;
                    inside &= p >= 0 && p < a.input as i64;
                    in_pads &= p < (a.input + a.pad_end) as i64;
                    at.push(p.max(0) as u64);
                }
                if inside {
                    let val = f64::from(x[index::linear(&at, xs)]);
                    max = max.max(val);
                    sum += val;
                }
                let include_pad = matches!(
                    self.kind,
                    PoolKind::Avg {
                        count_include_pad: true
                    }
                );
                if inside || (include_pad && in_pads) {
                    count += 1;
                }
            });
            v.push(match self.kind {
                PoolKind::Max => max as f32,
                PoolKind::Avg { .. } => (sum / count as f64) as f32,
            });
        });
        Ok(Values::F32(v))
    }
}

impl OpDef for BatchNorm {
    fn name(&self) -> &'static str {
        "batch_norm"
    }
    fn arity(&self) -> (usize, usize) {
        (5, 5)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        all_f32(inputs)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        let x = inputs[0];
        if x.rank() < 2 {
            return Err(InferError::Rank {
                input: 0,
                shape: x.clone(),
                expected: "[N, C, ...]",
            });
        }
        for p in &inputs[1..] {
            if p.0 != [x.0[1]] {
                return Err(InferError::Mismatch {
                    what: "batch norm parameters must be [C]",
                    left: x.clone(),
                    right: (*p).clone(),
                });
            }
        }
        Ok(x.clone())
    }
    fn preserves_shape(&self) -> bool {
        true
    }
    /// Per element with its channel's statistics (f64).
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let x = inputs[0].floats("batch_norm")?;
        let p: Vec<&[f32]> = inputs[1..]
            .iter()
            .map(|t| t.floats("batch_norm"))
            .collect::<Result<_, _>>()?;
        let mut v = Vec::with_capacity(x.len());
        index::for_each(out, |lin, idx| {
            let c = idx[1] as usize;
            let (scale, bias, mean, var) = (p[0][c], p[1][c], p[2][c], p[3][c]);
            let inv = 1.0 / (f64::from(var) + f64::from(self.eps)).sqrt();
            v.push(
                ((f64::from(x[lin]) - f64::from(mean)) * inv * f64::from(scale) + f64::from(bias))
                    as f32,
            );
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
    fn window_output_sizes() {
        let w = |pads: &[u64], strides: &[u64], auto_pad, ceil_mode| Window {
            strides: strides.to_vec(),
            pads: pads.to_vec(),
            dilations: vec![],
            auto_pad,
            ceil_mode,
        };
        let out = |w: Window, x: u64, k: u64| w.resolve(&[x], &[k]).map(|a| a[0].output);
        assert_eq!(out(w(&[], &[], AutoPad::NotSet, false), 5, 3).unwrap(), 3);
        assert_eq!(
            out(w(&[1, 1], &[], AutoPad::NotSet, false), 5, 3).unwrap(),
            5
        );
        assert_eq!(out(w(&[], &[2], AutoPad::NotSet, false), 5, 2).unwrap(), 2);
        assert_eq!(out(w(&[], &[2], AutoPad::NotSet, true), 5, 2).unwrap(), 3);
        // ceil: a last window starting in the end padding is dropped.
        assert_eq!(
            out(w(&[0, 1], &[2], AutoPad::NotSet, true), 4, 2).unwrap(),
            2
        );
        let same = w(&[], &[2], AutoPad::SameUpper, false)
            .resolve(&[5], &[3])
            .unwrap()[0];
        assert_eq!((same.output, same.pad_begin, same.pad_end), (3, 1, 1));
        let same = w(&[], &[1], AutoPad::SameLower, false)
            .resolve(&[4], &[2])
            .unwrap()[0];
        assert_eq!((same.output, same.pad_begin, same.pad_end), (4, 1, 0));
        assert_eq!(
            out(w(&[3, 3], &[], AutoPad::Valid, false), 5, 3).unwrap(),
            3
        );
        assert!(out(w(&[], &[], AutoPad::NotSet, false), 2, 3).is_err());
        assert!(out(w(&[], &[0], AutoPad::NotSet, false), 5, 3).is_err());
        assert!(
            out(w(&[1], &[], AutoPad::NotSet, false), 5, 3).is_err(),
            "pads length"
        );
    }

    #[test]
    fn conv_pool_batchnorm_shapes() {
        let conv = Conv {
            window: Window {
                pads: vec![1, 1, 1, 1],
                ..Window::default()
            },
            group: 2,
        };
        let x = s(&[1, 4, 5, 5]);
        assert_eq!(
            conv.infer(&[&x, &s(&[6, 2, 3, 3]), &s(&[6])], &[]).unwrap(),
            s(&[1, 6, 5, 5])
        );
        assert!(
            conv.infer(&[&x, &s(&[6, 4, 3, 3]), &s(&[6])], &[]).is_err(),
            "groups"
        );
        assert!(
            conv.infer(&[&x, &s(&[6, 2, 3, 3]), &s(&[3])], &[]).is_err(),
            "bias"
        );
        assert!(conv
            .infer(&[&s(&[1, 4, 5]), &s(&[6, 2, 3, 3]), &s(&[6])], &[])
            .is_err());
        assert!(conv
            .infer(
                &[&s(&[1, 4, 2, 2, 2, 2]), &s(&[6, 2, 1, 1, 1, 1]), &s(&[6])],
                &[]
            )
            .is_err());
        let pool = Pool {
            kind: PoolKind::Max,
            kernel: vec![2, 2],
            window: Window {
                strides: vec![2, 2],
                ..Window::default()
            },
        };
        assert_eq!(pool.infer(&[&x], &[]).unwrap(), s(&[1, 4, 2, 2]));
        let bn = BatchNorm { eps: 1e-5 };
        let c = s(&[4]);
        assert_eq!(bn.infer(&[&x, &c, &c, &c, &c], &[]).unwrap(), x);
        assert!(bn.infer(&[&x, &c, &c, &s(&[3]), &c], &[]).is_err());
    }
}
