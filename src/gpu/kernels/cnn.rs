//! The `cnn` family (`shaders/cnn.wgsl`): max and average pooling over 1 to 3 spatial
//! dimensions, and batch normalisation with running statistics. (Convolution is an implicit
//! GEMM in [`super::matmul`].)

use super::layout::{numel, u32_of};
use super::{f32_only, Encoder, Family, Kernel, KernelError, Operand};
use crate::graph::ops::conv::Axis;
use crate::graph::ops::{BatchNorm, Pool, PoolKind};
use crate::graph::OpDef;
use crate::shape::DType;
use bytemuck::{Pod, Zeroable};

/// `shaders/cnn.wgsl` after the prelude.
pub const WGSL: &str = crate::gpu::pipeline::with_prelude!("cnn");

/// The family: entry points and their storage bindings.
pub const FAMILY: Family = Family {
    name: "cnn",
    source: || WGSL,
    bindings: |entry| match entry {
        "cnn_batch_norm" => &[1, 2, 3, 4, 5, 6],
        _ => &[1, 6],
    },
    unchecked: &[],
};

/// `PoolParams` of `shaders/cnn.wgsl` (128 bytes); spatial vectors are `(d, h, w, 0)`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct PoolParams {
    /// Output elements.
    pub numel: u32,
    /// x element offset.
    pub x_offset: u32,
    /// Output element offset.
    pub out_offset: u32,
    /// 1: the average counts positions in the explicit padding.
    pub count_include_pad: u32,
    /// Input spatial extents.
    pub in_dims: [u32; 4],
    /// Output spatial extents.
    pub out_dims: [u32; 4],
    /// Window extents.
    pub kernel: [u32; 4],
    /// Strides.
    pub strides: [u32; 4],
    /// Dilations.
    pub dilations: [u32; 4],
    /// Padding before.
    pub pads_begin: [u32; 4],
    /// Padding after.
    pub pads_end: [u32; 4],
}

/// `BnParams` of `shaders/cnn.wgsl` (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct BnParams {
    /// Elements.
    pub numel: u32,
    /// Channels.
    pub channels: u32,
    /// Elements per channel plane.
    pub inner: u32,
    /// x element offset.
    pub x_offset: u32,
    /// scale element offset.
    pub scale_offset: u32,
    /// bias element offset.
    pub bias_offset: u32,
    /// mean element offset.
    pub mean_offset: u32,
    /// var element offset.
    pub var_offset: u32,
    /// Output element offset.
    pub out_offset: u32,
    /// Added to the variance.
    pub eps: f32,
    /// Padding.
    pub _pad: [u32; 2],
}

/// `(d, h, w, 0)` of one field of up to three axes, leading ones `fill`.
pub(crate) fn per_axis(
    what: &'static str,
    axes: &[Axis],
    fill: u64,
    f: fn(&Axis) -> u64,
) -> Result<[u32; 4], KernelError> {
    let mut out = [
        u32_of(what, fill)?,
        u32_of(what, fill)?,
        u32_of(what, fill)?,
        0,
    ];
    let skip = 3usize.saturating_sub(axes.len());
    for (i, a) in axes.iter().take(3).enumerate() {
        out[skip + i] = u32_of(what, f(a))?;
    }
    Ok(out)
}

impl Kernel for Pool {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        f32_only(inputs, output)
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let x = &inputs[0];
        let axes = self.axes(x.shape).map_err(|source| KernelError::Infer {
            op: OpDef::name(self),
            cause: source,
        })?;
        let n = numel("output", out.shape)?;
        let (bx, ox) = e.bind("input 0", &x.tensor, numel("input 0", x.shape)? * 4)?;
        let (bo, oo) = e.bind("output", &out.tensor, n * 4)?;
        let (max, include) = match self.kind {
            PoolKind::Max => (true, false),
            PoolKind::Avg { count_include_pad } => (false, count_include_pad),
        };
        let p = PoolParams {
            numel: u32_of("output", n)?,
            x_offset: ox,
            out_offset: oo,
            count_include_pad: u32::from(include),
            in_dims: per_axis("input 0", &axes, 1, |a| a.input)?,
            out_dims: per_axis("output", &axes, 1, |a| a.output)?,
            kernel: per_axis("input 0", &axes, 1, |a| a.kernel)?,
            strides: per_axis("input 0", &axes, 1, |a| a.stride)?,
            dilations: per_axis("input 0", &axes, 1, |a| a.dilation)?,
            pads_begin: per_axis("input 0", &axes, 0, |a| a.pad_begin)?,
            pads_end: per_axis("input 0", &axes, 0, |a| a.pad_end)?,
        };
        let key = FAMILY.key("cnn_pool").with("POOL_MAX", u32::from(max));
        e.dispatch(key, &p, &[bx, bo], n.div_ceil(256))?;
        Ok(1)
    }
}

impl Kernel for BatchNorm {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        f32_only(inputs, output)
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let x = &inputs[0];
        let n = numel("output", out.shape)?;
        let channels = x.shape.dims()[1];
        let inner: u64 = x.shape.dims()[2..].iter().product();
        let (bx, ox) = e.bind("input 0", &x.tensor, n * 4)?;
        let mut bound = vec![bx];
        let mut offs = [0u32; 4];
        for (k, (slot, name)) in offs
            .iter_mut()
            .zip(["input 1", "input 2", "input 3", "input 4"])
            .enumerate()
        {
            let (b, o) = e.bind(name, &inputs[k + 1].tensor, channels * 4)?;
            bound.push(b);
            *slot = o;
        }
        let (bo, oo) = e.bind("output", &out.tensor, n * 4)?;
        bound.push(bo);
        let p = BnParams {
            numel: u32_of("output", n)?,
            channels: u32_of("input 0", channels.max(1))?,
            inner: u32_of("input 0", inner.max(1))?,
            x_offset: ox,
            scale_offset: offs[0],
            bias_offset: offs[1],
            mean_offset: offs[2],
            var_offset: offs[3],
            out_offset: oo,
            eps: self.eps,
            _pad: [0; 2],
        };
        e.dispatch(FAMILY.key("cnn_batch_norm"), &p, &bound, n.div_ceil(256))?;
        Ok(1)
    }
}
