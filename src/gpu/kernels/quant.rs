//! The `quant` family (`shaders/quant.wgsl`): kernels that read weights in their stored
//! format (q4_1, q8_0, f16, f32; GGUF row layout) and dequantize as they read, so a model's
//! weights stay as compact on the device as in its file. The `linear` op (`y = x · wᵀ`) has a
//! matrix-vector kernel for decode (M <= [`MATVEC_M_MAX`] rows of x) and a tiled kernel for
//! prefill that dequantizes weight blocks into workgroup memory; the embedding `gather` from
//! an f16 or block-quantized table ([`encode_gather`]) dequantizes the rows it picks. The
//! weight format is the pipeline's specialisation constant.

use super::layout::{numel, rows, u32_of};
use super::{Encoder, Family, Kernel, KernelError, Operand, PipelineKey};
use crate::graph::ops::linear::infer;
use crate::graph::ops::Linear;
use crate::shape::DType;
use bytemuck::{Pod, Zeroable};

/// `shaders/quant.wgsl`.
pub const WGSL: &str = include_str!("../../../shaders/quant.wgsl");

/// The family: entry points and their storage bindings.
pub const FAMILY: Family = Family {
    name: "quant",
    source: WGSL,
    bindings: |entry| match entry {
        "quant_gather" => &[2, 3, 4],
        _ => &[1, 2, 3],
    },
};

/// Largest M (rows of x) served by the matrix-vector kernel; more rows take the tiled one.
pub const MATVEC_M_MAX: u64 = 8;

/// Output rows per invocation of `quant_matvec` (`ROWS` in the WGSL).
const MATVEC_ROWS: u64 = 4;

/// `LinearParams` of `shaders/quant.wgsl` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct LinearParams {
    /// Rows of x (the product of its leading dimensions).
    pub m: u32,
    /// Inner dimension.
    pub k: u32,
    /// Output columns (weight rows).
    pub n: u32,
    /// Whole 32-element blocks per weight row (`K / 32`).
    pub blocks: u32,
    /// x element offset.
    pub x_offset: u32,
    /// Weight word offset.
    pub w_offset: u32,
    /// Output element offset.
    pub out_offset: u32,
    /// 64-column tiles (`quant_tiled`).
    pub tiles_n: u32,
}

/// `GatherParams` of `shaders/quant.wgsl` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct GatherParams {
    /// Number of ids.
    pub num_ids: u32,
    /// Elements per table row.
    pub row: u32,
    /// Rows in the table.
    pub rows: u32,
    /// Table word offset.
    pub table_offset: u32,
    /// Ids word offset.
    pub ids_offset: u32,
    /// Output element offset.
    pub out_offset: u32,
    /// Padding.
    pub _pad: [u32; 2],
}

/// The `WEIGHT_FORMAT` constant of the WGSL for a weight type, `None` for types the kernels
/// do not read.
pub fn weight_format(dtype: DType) -> Option<u32> {
    match dtype {
        DType::F32 => Some(0),
        DType::F16 => Some(1),
        DType::Q4_1 => Some(2),
        DType::Q8_0 => Some(3),
        _ => None,
    }
}

impl Kernel for Linear {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        let ok = inputs.first() == Some(&DType::F32)
            && inputs.get(1).and_then(|&w| weight_format(w)).is_some()
            && output == DType::F32;
        if ok {
            Ok(())
        } else {
            Err("f32 x, q4_1/q8_0/f16/f32 weights and an f32 output")
        }
    }

    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let (x, w) = (&inputs[0], &inputs[1]);
        infer(x.shape, w.shape).map_err(|source| KernelError::Infer {
            op: "linear",
            source,
        })?;
        let format = weight_format(w.dtype).ok_or(KernelError::DType {
            op: "linear",
            inputs: vec![x.dtype, w.dtype],
            output: out.dtype,
            expected: "q4_1/q8_0/f16/f32 weights",
        })?;
        let (m, k) = rows(x.shape);
        let n = w.shape.dims()[0];
        if let Some(block) = w.dtype.block() {
            if k % u64::from(block.elements) != 0 {
                return Err(KernelError::PartialBlock {
                    what: "input 1",
                    dtype: w.dtype,
                    k,
                    block: block.elements,
                });
            }
        }
        let w_bytes = w
            .shape
            .size_bytes(w.dtype)
            .map_err(|_| KernelError::TooManyElements {
                what: "input 1",
                elements: u64::MAX,
                max: u64::from(u32::MAX),
            })?;
        let (bx, ox) = e.bind("input 0", &x.tensor, numel("input 0", x.shape)? * 4)?;
        // Whole words: the last q8_0 block may end halfway through one.
        let (bw, ow) = e.bind("input 1", &w.tensor, w_bytes.div_ceil(4) * 4)?;
        let (bo, oo) = e.bind("output", &out.tensor, numel("output", out.shape)? * 4)?;
        let mut p = LinearParams {
            m: u32_of("input 0", m)?,
            k: u32_of("input 0", k)?,
            n: u32_of("input 1", n)?,
            blocks: u32_of("input 0", k / 32)?,
            x_offset: ox,
            w_offset: ow,
            out_offset: oo,
            tiles_n: u32_of("output", n.div_ceil(64))?,
        };
        // Decode steps (a few rows of x) stream the weight once per x row with no workgroup
        // memory; prefill shares each dequantized weight block across 64 rows of x.
        let (entry, workgroups) = if m <= MATVEC_M_MAX {
            ("quant_matvec", (m * n.div_ceil(MATVEC_ROWS)).div_ceil(64))
        } else {
            p.tiles_n = u32_of("output", n.div_ceil(64))?;
            ("quant_tiled", m.div_ceil(64) * n.div_ceil(64))
        };
        let key = PipelineKey {
            family: &FAMILY,
            entry,
            constant: Some(("WEIGHT_FORMAT", format)),
        };
        e.dispatch(key, &p, &[bx, bw, bo], workgroups)?;
        Ok(1)
    }
}

/// The types of table [`encode_gather`] dequantizes.
pub fn is_gather_table(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::Q4_1 | DType::Q8_0)
}

/// Records the embedding lookup of `ids` (i32 or u32, shape checked by the caller) in an f16
/// or block-quantized `table` `[V, ...]` into the f32 `out`: each picked row dequantized,
/// zeros for ids outside `0..V`. Block tables need their last dimension to hold whole blocks.
///
/// # Errors
/// [`KernelError::DType`] for another table type, [`KernelError::PartialBlock`], and the
/// binding and size errors of [`Encoder::bind`].
pub fn encode_gather(
    e: &mut Encoder<'_, '_>,
    table: &Operand<'_>,
    ids: &Operand<'_>,
    out: &Operand<'_>,
) -> Result<usize, KernelError> {
    let format = weight_format(table.dtype)
        .filter(|_| is_gather_table(table.dtype))
        .ok_or(KernelError::DType {
            op: "gather",
            inputs: vec![table.dtype, ids.dtype],
            output: out.dtype,
            expected: "an f16, q4_1 or q8_0 table",
        })?;
    let dims = table.shape.dims();
    let rows_in_table = dims.first().copied().unwrap_or(0);
    let row: u64 = dims.iter().skip(1).product();
    if let Some(block) = table.dtype.block() {
        let last = dims.last().copied().unwrap_or(1);
        if dims.len() < 2 || last % u64::from(block.elements) != 0 {
            return Err(KernelError::PartialBlock {
                what: "input 0",
                dtype: table.dtype,
                k: last,
                block: block.elements,
            });
        }
    }
    let table_bytes =
        table
            .shape
            .size_bytes(table.dtype)
            .map_err(|_| KernelError::TooManyElements {
                what: "input 0",
                elements: u64::MAX,
                max: u64::from(u32::MAX),
            })?;
    let n = numel("output", out.shape)?;
    let num_ids = numel("input 1", ids.shape)?;
    let (bt, ot) = e.bind(
        "input 0",
        &table.tensor,
        (table_bytes.div_ceil(4) * 4).max(4),
    )?;
    let (bi, oi) = e.bind("input 1", &ids.tensor, num_ids * 4)?;
    let (bo, oo) = e.bind("output", &out.tensor, n * 4)?;
    let p = GatherParams {
        num_ids: u32_of("input 1", num_ids)?,
        row: u32_of("input 0", row)?,
        rows: u32_of("input 0", rows_in_table)?,
        table_offset: ot,
        ids_offset: oi,
        out_offset: oo,
        _pad: [0; 2],
    };
    // One invocation per block of 32 output values (block tables) or per value (f16).
    let lanes = if table.dtype.block().is_some() {
        n / 32
    } else {
        n
    };
    let key = PipelineKey {
        family: &FAMILY,
        entry: "quant_gather",
        constant: Some(("WEIGHT_FORMAT", format)),
    };
    e.dispatch(key, &p, &[bt, bo, bi], lanes.div_ceil(64))?;
    Ok(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_struct_matches_the_wgsl_layout() {
        assert_eq!(std::mem::size_of::<LinearParams>(), 32);
        assert_eq!(std::mem::size_of::<GatherParams>(), 32);
        for d in Linear::WEIGHT_TYPES {
            assert!(weight_format(d).is_some(), "{d}");
        }
        assert_eq!(weight_format(DType::BF16), None);
    }
}
