//! The `matmul` family (`shaders/matmul.wgsl`): a tiled kernel (64x64 output tile per 8x8
//! workgroup, an 8x8 register block per invocation, K staged 16 at a time in workgroup
//! memory) and, for M <= [`SMALL_M_MAX`] (decode steps), a small-M kernel where one
//! 64-invocation workgroup covers one row and 256 columns.

use super::layout::{broadcast_strides, numel, u32_of};
use super::{f32_only, Encoder, Family, Kernel, KernelError, Operand};
use crate::graph::ops::matmul::dims;
use crate::graph::ops::MatMul;
use crate::shape::{DType, Shape};
use bytemuck::{Pod, Zeroable};

/// `shaders/matmul.wgsl`.
pub const WGSL: &str = include_str!("../../../shaders/matmul.wgsl");

/// The family: entry points and their storage bindings.
pub const FAMILY: Family = Family {
    name: "matmul",
    source: WGSL,
    bindings: |_| &[1, 2, 3],
    unchecked: &[],
};

/// Largest M for which the small-M kernel is used instead of the tiled one.
pub const SMALL_M_MAX: u64 = 8;

/// `MatMulParams` of `shaders/matmul.wgsl` (112 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct MatMulParams {
    /// Output rows.
    pub m: u32,
    /// Inner dimension.
    pub k: u32,
    /// Output columns.
    pub n: u32,
    /// Product of the batch dimensions.
    pub batch: u32,
    /// 64-row tiles.
    pub tiles_m: u32,
    /// 64-column tiles.
    pub tiles_n: u32,
    /// Number of batch dimensions (<= 4).
    pub batch_rank: u32,
    /// Padding.
    pub _pad0: u32,
    /// A element offset.
    pub a_offset: u32,
    /// B element offset.
    pub b_offset: u32,
    /// Output element offset.
    pub out_offset: u32,
    /// Padding.
    pub _pad1: u32,
    /// A stride between rows.
    pub a_stride_m: u32,
    /// A stride along K.
    pub a_stride_k: u32,
    /// B stride along K.
    pub b_stride_k: u32,
    /// B stride along N.
    pub b_stride_n: u32,
    /// Batch dimensions of the output.
    pub batch_shape: [u32; 4],
    /// A strides per batch dimension (0 where broadcast).
    pub a_batch_strides: [u32; 4],
    /// B strides per batch dimension (0 where broadcast).
    pub b_batch_strides: [u32; 4],
}

impl Kernel for MatMul {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        f32_only(inputs, output)
    }

    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let (a, b) = (&inputs[0], &inputs[1]);
        let d = dims(a.shape, b.shape, self.transpose_b).map_err(|source| KernelError::Infer {
            op: "matmul",
            source,
        })?;
        if d.batch.rank() > 4 {
            return Err(KernelError::RankTooLarge {
                rank: d.batch.rank() + 2,
                max: 6,
            });
        }
        let n_out = numel("output", out.shape)?;
        let (ba, oa) = e.bind("input 0", &a.tensor, numel("input 0", a.shape)? * 4)?;
        let (bb, ob) = e.bind("input 1", &b.tensor, numel("input 1", b.shape)? * 4)?;
        let (bo, oo) = e.bind("output", &out.tensor, n_out * 4)?;
        let batch_a = Shape::new(a.shape.dims()[..a.shape.rank() - 2].to_vec());
        let batch_b = Shape::new(b.shape.dims()[..b.shape.rank() - 2].to_vec());
        let sa: Vec<u64> = broadcast_strides(&batch_a, &d.batch)
            .iter()
            .map(|s| s * d.m * d.k)
            .collect();
        let sb: Vec<u64> = broadcast_strides(&batch_b, &d.batch)
            .iter()
            .map(|s| s * d.k * d.n)
            .collect();
        let mut p = MatMulParams {
            m: u32_of("output", d.m)?,
            k: u32_of("input 0", d.k)?,
            n: u32_of("output", d.n)?,
            batch: u32_of("output", d.batch.checked_num_elements().unwrap_or(0))?,
            tiles_m: u32_of("output", d.m.div_ceil(64))?,
            tiles_n: u32_of("output", d.n.div_ceil(64))?,
            batch_rank: d.batch.rank() as u32,
            _pad0: 0,
            a_offset: oa,
            b_offset: ob,
            out_offset: oo,
            _pad1: 0,
            a_stride_m: d.k as u32,
            a_stride_k: 1,
            b_stride_k: if self.transpose_b { 1 } else { d.n as u32 },
            b_stride_n: if self.transpose_b { d.k as u32 } else { 1 },
            batch_shape: [1; 4],
            a_batch_strides: [0; 4],
            b_batch_strides: [0; 4],
        };
        for i in 0..d.batch.rank() {
            p.batch_shape[i] = d.batch.dims()[i] as u32;
            p.a_batch_strides[i] = u32_of("input 0", sa[i])?;
            p.b_batch_strides[i] = u32_of("input 1", sb[i])?;
        }
        // Specialisation by shape: below 9 rows (decode steps) a 64-row tile would mostly
        // compute padding, so one workgroup covers one row and 256 columns instead.
        let entry = if d.m <= SMALL_M_MAX {
            p.tiles_m = p.m;
            p.tiles_n = u32_of("output", d.n.div_ceil(256))?;
            "matmul_small_m"
        } else {
            "matmul_tiled"
        };
        let workgroups = u64::from(p.batch) * u64::from(p.tiles_m) * u64::from(p.tiles_n);
        e.dispatch(FAMILY.key(entry), &p, &[ba, bb, bo], workgroups)?;
        Ok(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_struct_matches_the_wgsl_layout() {
        assert_eq!(std::mem::size_of::<MatMulParams>(), 112);
    }
}
