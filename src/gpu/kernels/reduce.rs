//! The `reduce` family (`shaders/reduce.wgsl`): softmax, layer norm and RMS norm over the
//! last axis, one 64-invocation workgroup per row with a tree reduction.

use super::layout::{numel, rows, u32_of, INPUT_NAMES};
use super::{f32_only, Encoder, Family, Kernel, KernelError, Operand};
use crate::graph::ops::{LayerNorm, RmsNorm, Softmax};
use crate::shape::DType;
use bytemuck::{Pod, Zeroable};

/// `shaders/reduce.wgsl`.
pub const WGSL: &str = include_str!("../../../shaders/reduce.wgsl");

/// The family: entry points and their storage bindings.
pub const FAMILY: Family = Family {
    name: "reduce",
    source: WGSL,
    bindings: |entry| match entry {
        "reduce_softmax" => &[1, 4],
        "reduce_rms_norm" => &[1, 2, 4],
        _ => &[1, 2, 3, 4],
    },
    unchecked: &[],
};

/// `RowParams` of `shaders/reduce.wgsl` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct RowParams {
    /// Rows (product of all but the last dimension).
    pub rows: u32,
    /// Row length (last dimension).
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
    /// Padding.
    pub _pad: u32,
}

/// One workgroup per row of `out`: x, then the `[D]` parameters, then the output.
fn encode_rows(
    e: &mut Encoder<'_, '_>,
    entry: &'static str,
    inputs: &[Operand<'_>],
    out: &Operand<'_>,
    eps: f32,
) -> Result<usize, KernelError> {
    let (rows, d) = rows(out.shape);
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
        _pad: 0,
    };
    e.dispatch(FAMILY.key(entry), &p, &bound, rows)?;
    Ok(1)
}

impl Kernel for Softmax {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        f32_only(inputs, output)
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        encode_rows(e, "reduce_softmax", inputs, out, 0.0)
    }
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
        encode_rows(e, "reduce_layer_norm", inputs, out, self.eps)
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
        encode_rows(e, "reduce_rms_norm", inputs, out, self.eps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_struct_matches_the_wgsl_layout() {
        assert_eq!(std::mem::size_of::<RowParams>(), 32);
    }
}
