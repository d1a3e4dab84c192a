//! The slices: `slice` with its parameters on the host (a strided copy), and `slice_to` and a
//! sized `split_part`, whose parameters are read on the device (`movement_slice*`,
//! `movement_split_sized`).

use super::{copy, element_words, int_param, strided_types, FAMILY};
use crate::gpu::kernels::layout::{
    check_rank, numel, operand_strides, pack8, strides, u32_of, u32s,
};
use crate::gpu::kernels::{Bound, Encoder, Kernel, KernelError, Operand};
use crate::graph::ops::movement::slice_ranges;
use crate::graph::ops::{axis_index, Slice, SliceTo, SplitPart};
use crate::shape::{DType, Shape};
use bytemuck::{Pod, Zeroable};

/// `SliceParams` of `shaders/movement.wgsl` (160 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct SliceParams {
    /// Words copied.
    pub numel: u32,
    /// Rank of the iteration shape.
    pub rank: u32,
    /// Source word offset.
    pub in_offset: u32,
    /// Destination word offset.
    pub out_offset: u32,
    /// Number of sliced axes (parameters per tensor).
    pub n_axes: u32,
    /// Word offset of the starts.
    pub starts_offset: u32,
    /// Word offset of the steps.
    pub steps_offset: u32,
    /// Words per parameter (1: i32, 2: i64).
    pub param_words: u32,
    /// Iteration (output) shape.
    pub shape: [[u32; 4]; 2],
    /// Contiguous input strides per iteration dimension.
    pub in_strides: [[u32; 4]; 2],
    /// Input extents per iteration dimension.
    pub dims: [[u32; 4]; 2],
    /// The iteration dimension of each parameter.
    pub axis_of: [[u32; 4]; 2],
}

/// A slice (per-axis start and signed step) of input 0 into the whole output.
fn slice_copy(
    e: &mut Encoder<'_, '_>,
    x: &Operand<'_>,
    out: &Operand<'_>,
    starts: impl Iterator<Item = u64>,
    steps: impl Iterator<Item = i64>,
) -> Result<usize, KernelError> {
    let st = operand_strides(x);
    let base: u64 = starts.zip(&st).map(|(s, st)| s * st).sum();
    let in_strides: Vec<i64> = steps.zip(&st).map(|(s, &st)| s * st as i64).collect();
    copy(
        e,
        x,
        out.shape,
        &in_strides,
        base,
        out,
        &strides(out.shape),
        0,
    )
}

impl Kernel for Slice {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        strided_types(inputs, output)
    }
    /// A strided copy: any input layout.
    fn reads_strided(&self, input: usize) -> bool {
        input == 0
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let ranges = slice_ranges(
            inputs[0].shape,
            &self.axes,
            &self.starts,
            &self.ends,
            &self.steps,
        )
        .map_err(|source| KernelError::Infer {
            op: "slice",
            cause: source,
        })?;
        slice_copy(
            e,
            &inputs[0],
            out,
            ranges.iter().map(|r| r.start),
            ranges.iter().map(|r| r.step),
        )
    }
}

/// What the device-parameter slices (`slice_to`, a sized `split_part`) share: the
/// [`SliceParams`] of a copy from `x` into all of `out` (iterated over `out`, with a word
/// dimension for 64-bit elements), the parameters read from `params` (`count` of them), `x`,
/// `params` and `out` bound in that order, and the words copied.
fn device_slice<'t>(
    e: &Encoder<'_, '_>,
    x: &Operand<'t>,
    params: &Operand<'t>,
    count: u64,
    out: &Operand<'t>,
    axis_of: &[u32],
) -> Result<(SliceParams, Vec<Bound<'t>>, u64), KernelError> {
    let words = element_words(out.dtype).unwrap_or(1);
    let mut shape = out.shape.dims().to_vec();
    let mut dims = x.shape.dims().to_vec();
    let mut in_strides: Vec<u64> = strides(x.shape).iter().map(|s| s * words).collect();
    if words > 1 {
        shape.push(words);
        dims.push(words);
        in_strides.push(1);
    }
    let it = Shape::new(shape);
    check_rank(&it)?;
    let n = numel("output", &it)?;
    let param_words = element_words(params.dtype).unwrap_or(1);
    let (bx, ox) = e.bind("input 0", &x.tensor, numel("input 0", x.shape)? * 4 * words)?;
    let (bs, os) = e.bind("input 1", &params.tensor, (count * 4 * param_words).max(4))?;
    let (bo, oo) = e.bind("output", &out.tensor, n * 4)?;
    let p = SliceParams {
        numel: u32_of("output", n)?,
        rank: it.rank() as u32,
        in_offset: ox,
        out_offset: oo,
        n_axes: u32_of("input 1", count)?,
        starts_offset: os,
        steps_offset: 0,
        param_words: param_words as u32,
        shape: pack8(&u32s("output", it.dims())?),
        in_strides: pack8(&u32s("input 0", &in_strides)?),
        dims: pack8(&u32s("input 0", &dims)?),
        axis_of: pack8(axis_of),
    };
    Ok((p, vec![bx, bs, bo], n))
}

impl Kernel for SliceTo {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        let params = inputs.get(1).copied();
        let same = inputs[1..].iter().all(|&d| Some(d) == params);
        let ok = matches!(params, Some(DType::I32 | DType::I64)) && same;
        if ok && strided_types(&inputs[..1], output).is_ok() {
            Ok(())
        } else {
            Err("data of 32- or 64-bit elements and i32 or i64 parameters of one type")
        }
    }
    /// Starts and steps are read on the device (the ends only shape the output).
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let x = &inputs[0];
        let words = element_words(out.dtype).unwrap_or(1);
        let rank = x.shape.rank();
        let n_axes = numel("input 1", inputs[1].shape)? as usize;
        let axes_input = inputs.get(4);
        let axes: Vec<usize> = match (&self.axes, axes_input) {
            (_, Some(_)) => Vec::new(),
            (Some(a), None) => a
                .iter()
                .map(|&v| axis_index(v, rank))
                .collect::<Result<_, _>>()
                .map_err(|source| KernelError::Infer {
                    op: "slice_to",
                    cause: source,
                })?,
            (None, None) => (0..n_axes).collect(),
        };
        if axes_input.is_none() && (axes.len() != n_axes || axes.iter().any(|&a| a >= rank)) {
            return Err(KernelError::Infer {
                op: "slice_to",
                cause: crate::graph::InferError::Slice {
                    reason: "axes and starts must have the same length",
                },
            });
        }
        let axis_of: Vec<u32> = axes.iter().map(|&a| a as u32).collect();
        let (mut p, mut bound, n) = device_slice(e, x, &inputs[1], n_axes as u64, out, &axis_of)?;
        let param_words = u64::from(p.param_words);
        let param_bytes = (n_axes as u64 * 4 * param_words).max(4);
        match (inputs.get(3), axes_input) {
            (Some(steps), Some(axes)) => {
                let (bt, ot) = e.bind("input 3", &steps.tensor, param_bytes)?;
                let (ba, oa) = e.bind("input 4", &axes.tensor, param_bytes)?;
                p.steps_offset = ot;
                p.axis_of[0][0] = oa;
                p.axis_of[1][3] = u32::from(words > 1);
                bound.extend([bt, ba]);
                e.dispatch(
                    FAMILY.key("movement_slice_axes"),
                    &p,
                    &bound,
                    n.div_ceil(256),
                )?;
            }
            (Some(steps), None) => {
                let (bt, ot) = e.bind("input 3", &steps.tensor, param_bytes)?;
                p.steps_offset = ot;
                bound.push(bt);
                e.dispatch(
                    FAMILY.key("movement_slice_steps"),
                    &p,
                    &bound,
                    n.div_ceil(256),
                )?;
            }
            (None, _) => e.dispatch(FAMILY.key("movement_slice"), &p, &bound, n.div_ceil(256))?,
        }
        Ok(1)
    }
}

impl Kernel for SplitPart {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        if int_param(inputs, 1) && strided_types(&inputs[..1], output).is_ok() {
            Ok(())
        } else {
            Err("data of 32- or 64-bit elements and i32 or i64 sizes")
        }
    }
    /// A strided copy from the part's start; with sizes given as a tensor the start is summed
    /// on the device from the sizes before the part.
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let x = &inputs[0];
        let infer = |source| KernelError::Infer {
            op: "split_part",
            cause: source,
        };
        let Some(sizes) = inputs.get(1) else {
            let (axis, start, _) = self.range(x.shape).map_err(infer)?;
            let rank = x.shape.rank();
            return slice_copy(
                e,
                x,
                out,
                (0..rank).map(|a| if a == axis { start } else { 0 }),
                std::iter::repeat_n(1, rank),
            );
        };
        let axis = axis_index(self.axis, x.shape.rank()).map_err(infer)?;
        let count = numel("input 1", sizes.shape)?;
        let (mut p, bound, n) = device_slice(e, x, sizes, count, out, &[axis as u32])?;
        // One parameter applies (the split axis): the part's start, summed from the sizes
        // before it, whose number travels in steps_offset.
        p.n_axes = 1;
        p.steps_offset = u32_of("input 1", (self.index as u64).min(count))?;
        e.dispatch(
            FAMILY.key("movement_split_sized"),
            &p,
            &bound,
            n.div_ceil(256),
        )?;
        Ok(1)
    }
}
