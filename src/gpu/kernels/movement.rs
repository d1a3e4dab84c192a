//! The `movement` family (`shaders/movement.wgsl`): one strided copy serving reshape,
//! transpose, slice and each input of a concat; the gather of embedding rows; and the fill
//! that writes `shape_of`'s values. They move 32-bit words, so they run on any 4-byte type
//! (a gather from an f16 or block-quantized table is the `quant` family's).

use super::layout::{check_rank, numel, pack8, strides, u32_of, u32s, MAX_RANK};
use super::{quant, words_only, Encoder, Family, Kernel, KernelError, Operand};
use crate::graph::ops::movement::slice_ranges;
use crate::graph::ops::{Concat, Gather, Reshape, ReshapeTo, ShapeOf, Slice, Transpose};
use crate::shape::{DType, Shape};
use bytemuck::{Pod, Zeroable};

/// `shaders/movement.wgsl`.
pub const WGSL: &str = include_str!("../../../shaders/movement.wgsl");

/// The family: entry points and their storage bindings.
pub const FAMILY: Family = Family {
    name: "movement",
    source: WGSL,
    bindings: |entry| match entry {
        "movement_copy" => &[1, 3],
        "movement_gather" => &[1, 2, 3],
        _ => &[3],
    },
    unchecked: &[],
};

/// `CopyParams` of `shaders/movement.wgsl` (112 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct CopyParams {
    /// Elements copied.
    pub numel: u32,
    /// Rank of the iteration shape.
    pub rank: u32,
    /// Source word offset.
    pub in_offset: u32,
    /// Destination word offset.
    pub out_offset: u32,
    /// Iteration shape.
    pub shape: [[u32; 4]; 2],
    /// Source strides per iteration dimension.
    pub in_strides: [[u32; 4]; 2],
    /// Destination strides per iteration dimension.
    pub out_strides: [[u32; 4]; 2],
}

/// `GatherParams` of `shaders/movement.wgsl` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct GatherParams {
    /// Number of ids.
    pub num_ids: u32,
    /// Words per table row.
    pub row: u32,
    /// Rows in the table.
    pub rows: u32,
    /// Table word offset.
    pub table_offset: u32,
    /// Ids word offset.
    pub ids_offset: u32,
    /// Output word offset.
    pub out_offset: u32,
    /// Padding.
    pub _pad: [u32; 2],
}

/// `FillParams` of `shaders/movement.wgsl` (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct FillParams {
    /// Words written (<= 8).
    pub n: u32,
    /// Output word offset.
    pub out_offset: u32,
    /// Padding.
    pub _pad: [u32; 2],
    /// The words.
    pub values: [[u32; 4]; 2],
}

/// Strided copy of `shape` elements: `src[in_base + idx . in_strides]` to
/// `dst[out_base + idx . out_strides]` (word offsets on top of the operands' own).
#[allow(clippy::too_many_arguments)]
fn copy(
    e: &mut Encoder<'_, '_>,
    src: &Operand<'_>,
    shape: &Shape,
    in_strides: &[u64],
    in_base: u64,
    dst: &Operand<'_>,
    out_strides: &[u64],
    out_base: u64,
) -> Result<usize, KernelError> {
    check_rank(shape)?;
    let n = numel("copy", shape)?;
    if n == 0 {
        return Ok(0);
    }
    let (bs, os) = e.bind("input 0", &src.tensor, numel("input 0", src.shape)? * 4)?;
    let (bd, od) = e.bind("output", &dst.tensor, numel("output", dst.shape)? * 4)?;
    let p = CopyParams {
        numel: n as u32,
        rank: shape.rank() as u32,
        in_offset: u32_of("input 0", u64::from(os) + in_base)?,
        out_offset: u32_of("output", u64::from(od) + out_base)?,
        shape: pack8(&u32s("copy", shape.dims())?),
        in_strides: pack8(&u32s("input 0", in_strides)?),
        out_strides: pack8(&u32s("output", out_strides)?),
    };
    e.dispatch(FAMILY.key("movement_copy"), &p, &[bs, bd], n.div_ceil(256))?;
    Ok(1)
}

/// A reshape moves the words in order.
fn flat_copy(
    e: &mut Encoder<'_, '_>,
    op: &'static str,
    x: &Operand<'_>,
    out: &Operand<'_>,
) -> Result<usize, KernelError> {
    let n = numel("output", out.shape)?;
    if numel("input 0", x.shape)? != n {
        return Err(KernelError::OutputShape {
            op,
            expected: x.shape.clone(),
            got: out.shape.clone(),
        });
    }
    let flat = Shape::new(vec![n]);
    copy(e, x, &flat, &[1], 0, out, &[1], 0)
}

impl Kernel for Reshape {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        words_only(inputs, output)
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        flat_copy(e, "reshape", &inputs[0], out)
    }
}

impl Kernel for ReshapeTo {
    /// Input 1 is shape data the kernel never reads.
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        words_only(&inputs[..1.min(inputs.len())], output)
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        flat_copy(e, "reshape_to", &inputs[0], out)
    }
}

impl Kernel for Transpose {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        words_only(inputs, output)
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let st = strides(inputs[0].shape);
        let in_strides: Vec<u64> = self.perm.iter().map(|&p| st[p]).collect();
        let out_strides = strides(out.shape);
        copy(
            e,
            &inputs[0],
            out.shape,
            &in_strides,
            0,
            out,
            &out_strides,
            0,
        )
    }
}

impl Kernel for Slice {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        words_only(inputs, output)
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
            source,
        })?;
        let st = strides(inputs[0].shape);
        let base: u64 = ranges.iter().zip(&st).map(|(r, s)| r.start * s).sum();
        let in_strides: Vec<u64> = ranges.iter().zip(&st).map(|(r, s)| r.step * s).collect();
        let out_strides = strides(out.shape);
        copy(
            e,
            &inputs[0],
            out.shape,
            &in_strides,
            base,
            out,
            &out_strides,
            0,
        )
    }
}

impl Kernel for Concat {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        words_only(inputs, output)
    }
    /// One strided copy per input into its slab of the output.
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let out_strides = strides(out.shape);
        let mut at = 0u64;
        let mut n = 0;
        for inp in inputs {
            let in_strides = strides(inp.shape);
            let base = at * out_strides[self.axis];
            n += copy(e, inp, inp.shape, &in_strides, 0, out, &out_strides, base)?;
            at += inp.shape.dims()[self.axis];
        }
        Ok(n)
    }
}

impl Kernel for Gather {
    /// A table of 32-bit words (copied as bits), or an f16/q4_1/q8_0 table dequantized to
    /// f32 rows ([`quant::encode_gather`]); i32 or u32 ids (out-of-range and negative ids give
    /// zeros).
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        let ids_ok = matches!(inputs.get(1), Some(DType::I32 | DType::U32));
        let table = inputs.first().copied().unwrap_or(output);
        let dequantized = quant::is_gather_table(table) && output == DType::F32;
        if ids_ok && (dequantized || words_only(&[table], output).is_ok()) {
            Ok(())
        } else {
            Err("a table of 32-bit elements (or f16, q4_1, q8_0 giving f32) and i32 or u32 ids")
        }
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let (table, ids) = (&inputs[0], &inputs[1]);
        if quant::is_gather_table(table.dtype) {
            return quant::encode_gather(e, table, ids, out);
        }
        let n = numel("output", out.shape)?;
        let num_ids = numel("input 1", ids.shape)?;
        let rows = table.shape.dims().first().copied().unwrap_or(0);
        let row: u64 = table.shape.dims()[1..].iter().product();
        let (bt, ot) = e.bind(
            "input 0",
            &table.tensor,
            (numel("input 0", table.shape)? * 4).max(4),
        )?;
        let (bi, oi) = e.bind("input 1", &ids.tensor, num_ids * 4)?;
        let (bo, oo) = e.bind("output", &out.tensor, n * 4)?;
        let p = GatherParams {
            num_ids: num_ids as u32,
            row: u32_of("input 0", row)?,
            rows: u32_of("input 0", rows)?,
            table_offset: ot,
            ids_offset: oi,
            out_offset: oo,
            _pad: [0; 2],
        };
        e.dispatch(
            FAMILY.key("movement_gather"),
            &p,
            &[bt, bi, bo],
            n.div_ceil(256),
        )?;
        Ok(1)
    }
}

impl Kernel for ShapeOf {
    /// Writes i32 dimensions.
    fn check_dtypes(&self, _: &[DType], output: DType) -> Result<(), &'static str> {
        if output == DType::I32 {
            Ok(())
        } else {
            Err("an i32 output")
        }
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let values = inputs[0].shape.dims();
        if values.len() > MAX_RANK {
            return Err(KernelError::RankTooLarge {
                rank: values.len(),
                max: MAX_RANK,
            });
        }
        let (bo, oo) = e.bind("output", &out.tensor, values.len() as u64 * 4)?;
        let v: Vec<u32> = values
            .iter()
            .map(|&d| d.min(i32::MAX as u64) as u32)
            .collect();
        let p = FillParams {
            n: v.len() as u32,
            out_offset: oo,
            _pad: [0; 2],
            values: pack8(&v),
        };
        e.dispatch(FAMILY.key("movement_fill"), &p, &[bo], 1)?;
        Ok(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_structs_match_the_wgsl_layouts() {
        assert_eq!(std::mem::size_of::<CopyParams>(), 112);
        assert_eq!(std::mem::size_of::<GatherParams>(), 32);
        assert_eq!(std::mem::size_of::<FillParams>(), 48);
    }
}
