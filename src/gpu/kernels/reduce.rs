//! The `reduce` family (`shaders/reduce.wgsl`): softmax and log-softmax along any axis, layer
//! norm (with or without shift) and RMS norm over trailing axes, reductions over any set of
//! axes, cumulative sums. One 64-invocation workgroup per row with a tree reduction (the
//! cumulative sum: one invocation per line; softmax over many short rows on a software
//! adapter: one invocation per row).

use super::layout::{check_rank, numel, pack8, strides, u32_of, u32s, INPUT_NAMES};
use super::{f32_only, Encoder, Family, Kernel, KernelError, Operand};
use crate::gpu::QuantLayout;
use crate::graph::ops::norm::infer_norm;
use crate::graph::ops::{
    axis_index, CumSum, LayerNorm, Reduce, ReduceAxes, ReduceKind, RmsNorm, Softmax,
};
use crate::shape::{DType, Shape};
use bytemuck::{Pod, Zeroable};

/// `shaders/reduce.wgsl` after the prelude.
pub const WGSL: &str = crate::gpu::pipeline::with_prelude!("reduce");

/// The family: entry points and their storage bindings.
pub const FAMILY: Family = Family {
    name: "reduce",
    source: || WGSL,
    bindings: |entry| match entry {
        "reduce_layer_norm" => &[1, 2, 3, 4],
        "reduce_rms_norm" | "reduce_layer_norm_nobias" | "reduce_axes_input" => &[1, 2, 4],
        _ => &[1, 4],
    },
    unchecked: &[],
};

/// `RowParams` of `shaders/reduce.wgsl` (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct RowParams {
    /// Rows.
    pub rows: u32,
    /// Row length.
    pub d: u32,
    /// x element offset.
    pub x_offset: u32,
    /// Output element offset.
    pub out_offset: u32,
    /// gamma element offset.
    pub gamma_offset: u32,
    /// beta element offset.
    pub beta_offset: u32,
    /// Epsilon added to the variance / mean square.
    pub eps: f32,
    /// Elements between neighbours of a row (1: the last axis).
    pub inner: u32,
    /// Bit 0: log-softmax.
    pub flags: u32,
    /// Padding.
    pub _pad: [u32; 3],
}

/// `AxesParams` of `shaders/reduce.wgsl` (176 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct AxesParams {
    /// Output elements.
    pub rows: u32,
    /// Input elements per output element.
    pub d: u32,
    /// x element offset.
    pub x_offset: u32,
    /// Output element offset.
    pub out_offset: u32,
    /// Number of kept dimensions.
    pub kept_rank: u32,
    /// Number of reduced dimensions.
    pub red_rank: u32,
    /// Epsilon of the inverse standard deviation.
    pub eps: f32,
    /// Word offset of the axes (`reduce_axes_input`).
    pub axes_offset: u32,
    /// Words per axis (1: i32, 2: i64).
    pub axes_words: u32,
    /// Bit 0: noop_with_empty_axes.
    pub flags: u32,
    /// Padding.
    pub _pad: [u32; 2],
    /// Kept dimensions (`reduce_axes_input`: x's shape).
    pub kept_shape: [[u32; 4]; 2],
    /// Input strides of the kept dimensions.
    pub kept_strides: [[u32; 4]; 2],
    /// Reduced dimensions.
    pub red_shape: [[u32; 4]; 2],
    /// Input strides of the reduced dimensions.
    pub red_strides: [[u32; 4]; 2],
}

/// `CumParams` of `shaders/reduce.wgsl` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct CumParams {
    /// Lines (every element position off the axis).
    pub lines: u32,
    /// Elements per line.
    pub d: u32,
    /// Elements between neighbours of a line.
    pub inner: u32,
    /// x element offset.
    pub x_offset: u32,
    /// Output element offset.
    pub out_offset: u32,
    /// Bit 0: exclusive, bit 1: reverse.
    pub flags: u32,
    /// Padding.
    pub _pad: [u32; 2],
}

/// `(outer, d, inner)` of a tensor around `axis`.
fn around(shape: &Shape, axis: usize) -> (u64, u64, u64) {
    let dims = shape.dims();
    (
        dims[..axis].iter().product(),
        dims[axis],
        dims[axis + 1..].iter().product(),
    )
}

fn infer_err(op: &'static str) -> impl FnOnce(crate::graph::InferError) -> KernelError {
    move |source| KernelError::Infer { op, cause: source }
}

/// The longest rows [`Softmax`] runs one per invocation on a software adapter.
pub const ROWS_SOFTMAX_MAX_D: u64 = 2048;

/// One workgroup per row of `d` elements `inner` apart (`reduce_softmax_rows`: 64 rows per
/// workgroup): x, then the `[d]` parameters, then the output.
#[allow(clippy::too_many_arguments)]
fn encode_rows(
    e: &mut Encoder<'_, '_>,
    entry: &'static str,
    inputs: &[Operand<'_>],
    out: &Operand<'_>,
    rows: u64,
    d: u64,
    inner: u64,
    eps: f32,
    flags: u32,
) -> Result<usize, KernelError> {
    let n = numel("output", out.shape)?;
    let (bx, ox) = e.bind("input 0", &inputs[0].tensor, n * 4)?;
    let mut bound = vec![bx];
    let mut offs = [0u32; 2];
    for (k, inp) in inputs.iter().enumerate().skip(1) {
        let (bp, op) = e.bind(INPUT_NAMES[k.min(3)], &inp.tensor, d * 4)?;
        bound.push(bp);
        offs[k - 1] = op;
    }
    let (bo, oo) = e.bind("output", &out.tensor, n * 4)?;
    bound.push(bo);
    let p = RowParams {
        rows: u32_of("output", rows)?,
        d: u32_of("output", d)?,
        x_offset: ox,
        out_offset: oo,
        gamma_offset: offs[0],
        beta_offset: offs[1],
        eps,
        inner: u32_of("output", inner.max(1))?,
        flags,
        _pad: [0; 3],
    };
    let workgroups = if entry == "reduce_softmax_rows" {
        rows.div_ceil(64)
    } else {
        rows
    };
    e.dispatch(FAMILY.key(entry), &p, &bound, workgroups)?;
    Ok(1)
}

impl Kernel for Softmax {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        f32_only(inputs, output)
    }
    /// Rows along the axis, `inner` apart: no transpose for a middle axis.
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let axis = axis_index(self.axis, out.shape.rank()).map_err(infer_err("softmax"))?;
        let (outer, d, inner) = around(out.shape, axis);
        let flags = u32::from(self.log);
        let rows = outer * inner;
        // On a software adapter, where a workgroup runs on one thread, many short rows (the
        // attention scores of an encoder, dear in the workgroup-per-row kernel on lavapipe:
        // docs/benchmarks/2026-11-28-embeddings-lavapipe.md) go one per invocation; long rows
        // (a vocabulary) keep a workgroup's lanes.
        let software = matches!(e.kernels.quant_layout, QuantLayout::Cpu { .. });
        let entry = if software && d <= ROWS_SOFTMAX_MAX_D && rows >= 64 {
            "reduce_softmax_rows"
        } else {
            "reduce_softmax"
        };
        encode_rows(e, entry, inputs, out, rows, d, inner, 0.0, flags)
    }
}

/// Rows and row length of a normalisation over the dimensions from `axis` on.
fn norm_rows(
    op: &'static str,
    inputs: &[Operand<'_>],
    axis: i64,
) -> Result<(u64, u64), KernelError> {
    let shapes: Vec<&Shape> = inputs.iter().map(|o| o.shape).collect();
    let (_, d) = infer_norm(&shapes, axis).map_err(infer_err(op))?;
    let n = numel("input 0", inputs[0].shape)?;
    let d = d as u64;
    Ok((n.checked_div(d).unwrap_or(0), d))
}

impl Kernel for LayerNorm {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        f32_only(inputs, output)
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let (rows, d) = norm_rows("layer_norm", inputs, self.axis)?;
        let entry = if inputs.len() == 3 {
            "reduce_layer_norm"
        } else {
            "reduce_layer_norm_nobias"
        };
        encode_rows(e, entry, inputs, out, rows, d, 1, self.eps, 0)
    }
}

impl Kernel for RmsNorm {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        f32_only(inputs, output)
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let (rows, d) = norm_rows("rms_norm", inputs, self.axis)?;
        encode_rows(e, "reduce_rms_norm", inputs, out, rows, d, 1, self.eps, 0)
    }
}

impl Kernel for Reduce {
    /// f32 data on the device (integer reductions are shape data, evaluated on the host);
    /// i32 or i64 axes.
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        if super::movement::int_param(inputs, 1) && f32_only(&inputs[..1], output).is_ok() {
            Ok(())
        } else {
            Err("f32 data and i32 or i64 axes")
        }
    }
    /// One workgroup per output element; the kept and reduced coordinates walk the input
    /// through its own strides, so any axes work without a transpose. Axes given as a tensor
    /// are read on the device.
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let x = &inputs[0];
        let st = strides(x.shape);
        let rows = numel("output", out.shape)?;
        let (bx, ox) = e.bind(
            "input 0",
            &x.tensor,
            (numel("input 0", x.shape)? * 4).max(4),
        )?;
        let eps = match self.kind {
            ReduceKind::InvStdDev { eps } => eps,
            _ => 0.0,
        };
        let mut p = AxesParams {
            rows: u32_of("output", rows)?,
            d: 0,
            x_offset: ox,
            out_offset: 0,
            kept_rank: 0,
            red_rank: 0,
            eps,
            axes_offset: 0,
            axes_words: 1,
            flags: 0,
            _pad: [0; 2],
            kept_shape: [[0; 4]; 2],
            kept_strides: [[0; 4]; 2],
            red_shape: [[0; 4]; 2],
            red_strides: [[0; 4]; 2],
        };
        let mut key = FAMILY
            .key("reduce_axes")
            .with("REDUCE_OP", self.kind.code());
        let mut bound = vec![bx];
        if let ReduceAxes::Input {
            noop_with_empty_axes,
        } = self.axes
        {
            check_rank(x.shape)?;
            let axes = &inputs[1];
            let count = numel("input 1", axes.shape)?;
            let words = if axes.dtype == DType::I64 { 2 } else { 1 };
            let (ba, oa) = e.bind("input 1", &axes.tensor, (count * 4 * words).max(4))?;
            bound.push(ba);
            p.d = u32_of("input 1", count)?;
            p.kept_rank = x.shape.rank() as u32;
            p.kept_shape = pack8(&u32s("input 0", x.shape.dims())?);
            p.kept_strides = pack8(&u32s("input 0", &st)?);
            p.axes_offset = oa;
            p.axes_words = words as u32;
            p.flags = u32::from(noop_with_empty_axes);
            key.entry = "reduce_axes_input";
        } else {
            let axes = self
                .axes_of(x.shape, None)
                .map_err(infer_err(self.kind.name()))?;
            let (mut kept_shape, mut kept_st, mut red_shape, mut red_st) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for (a, (&dim, &s)) in x.shape.dims().iter().zip(&st).enumerate() {
                if axes.contains(&a) {
                    red_shape.push(dim);
                    red_st.push(s);
                } else {
                    kept_shape.push(dim);
                    kept_st.push(s);
                }
            }
            check_rank(&Shape::new(kept_shape.clone()))?;
            check_rank(&Shape::new(red_shape.clone()))?;
            p.d = u32_of("input 0", red_shape.iter().product())?;
            p.kept_rank = kept_shape.len() as u32;
            p.red_rank = red_shape.len() as u32;
            p.kept_shape = pack8(&u32s("input 0", &kept_shape)?);
            p.kept_strides = pack8(&u32s("input 0", &kept_st)?);
            p.red_shape = pack8(&u32s("input 0", &red_shape)?);
            p.red_strides = pack8(&u32s("input 0", &red_st)?);
        }
        let (bo, oo) = e.bind("output", &out.tensor, rows * 4)?;
        bound.push(bo);
        p.out_offset = oo;
        e.dispatch(key, &p, &bound, rows)?;
        Ok(1)
    }
}

impl Kernel for CumSum {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        let ok = matches!(output, DType::F32 | DType::I32) && inputs.iter().all(|&d| d == output);
        if ok {
            Ok(())
        } else {
            Err("f32 or i32, the same type in and out")
        }
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let axis = axis_index(self.axis, out.shape.rank()).map_err(infer_err("cumsum"))?;
        let (outer, d, inner) = around(out.shape, axis);
        let n = numel("output", out.shape)?;
        let (bx, ox) = e.bind("input 0", &inputs[0].tensor, n * 4)?;
        let (bo, oo) = e.bind("output", &out.tensor, n * 4)?;
        let lines = outer * inner;
        let p = CumParams {
            lines: u32_of("output", lines)?,
            d: u32_of("output", d)?,
            inner: u32_of("output", inner.max(1))?,
            x_offset: ox,
            out_offset: oo,
            flags: u32::from(self.exclusive) | (u32::from(self.reverse) << 1),
            _pad: [0; 2],
        };
        let entry = if out.dtype == DType::I32 {
            "reduce_cumsum_i32"
        } else {
            "reduce_cumsum"
        };
        e.dispatch(FAMILY.key(entry), &p, &[bx, bo], lines.div_ceil(64))?;
        Ok(1)
    }
}
