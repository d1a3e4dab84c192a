//! The gather along an axis (`movement_gather`) and the device check of indices that a
//! kernel computed (`movement_check_ids`).

use super::{element_words, strided_types, FAMILY};
use crate::gpu::kernels::layout::{numel, u32_of};
use crate::gpu::kernels::{quant, Encoder, Kernel, KernelError, Operand};
use crate::graph::ops::{axis_index, Gather};
use crate::shape::DType;
use bytemuck::{Pod, Zeroable};

/// `GatherParams` of `shaders/movement.wgsl` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct GatherParams {
    /// Number of ids.
    pub num_ids: u32,
    /// Words after the gathered axis (per index).
    pub row: u32,
    /// Extent of the gathered axis.
    pub rows: u32,
    /// Table word offset.
    pub table_offset: u32,
    /// Ids word offset.
    pub ids_offset: u32,
    /// Output word offset.
    pub out_offset: u32,
    /// Product of the dimensions before the gathered axis.
    pub outer: u32,
    /// 0: u32 ids, 1: i32, 2: i64 (word pairs).
    pub ids_kind: u32,
}

/// `CheckIdsParams` of `shaders/movement.wgsl` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct CheckIdsParams {
    /// Number of ids.
    pub num_ids: u32,
    /// Extent of the gathered axis.
    pub rows: u32,
    /// Ids word offset.
    pub ids_offset: u32,
    /// Word offset of the fault record.
    pub fault_offset: u32,
    /// 0: u32 ids, 1: i32, 2: i64 (word pairs).
    pub ids_kind: u32,
    /// Padding.
    pub _pad: [u32; 3],
}

/// Bytes of the fault record [`encode_index_check`] writes: four words, `(1, position, low,
/// high)` of the first index out of range (the index sign-extended to 64 bits), untouched
/// when there is none.
pub const FAULT_RECORD_BYTES: u64 = 16;

/// Records the check of a gather's indices computed on the device (ONNX calls an index
/// outside `[-rows, rows)` an error, and a dispatch cannot fail): one workgroup finds the
/// first such index of `ids` (i32, u32 or i64) and writes its record at `fault`
/// ([`FAULT_RECORD_BYTES`], which the caller zeroes before the submit and reads after).
/// Returns the dispatch count (0 for no ids).
///
/// # Errors
/// [`KernelError::DType`] for ids of another type; binding errors naming the operand.
pub fn encode_index_check(
    e: &mut Encoder<'_, '_>,
    ids: &Operand<'_>,
    rows: u64,
    fault: &Operand<'_>,
) -> Result<usize, KernelError> {
    let num_ids = numel("input 1", ids.shape)?;
    if num_ids == 0 {
        return Ok(0);
    }
    let (ids_kind, id_words) = match ids.dtype {
        DType::I64 => (2, 2),
        DType::I32 => (1, 1),
        DType::U32 => (0, 1),
        other => {
            return Err(KernelError::DType {
                op: "gather",
                inputs: vec![other],
                output: DType::U32,
                expected: "i32, u32 or i64 ids",
            })
        }
    };
    let (bi, oi) = e.bind("input 1", &ids.tensor, num_ids * 4 * id_words)?;
    let (bf, of) = e.bind("output", &fault.tensor, FAULT_RECORD_BYTES)?;
    let p = CheckIdsParams {
        num_ids: u32_of("input 1", num_ids)?,
        rows: u32_of("input 0", rows)?,
        ids_offset: oi,
        fault_offset: of,
        ids_kind,
        _pad: [0; 3],
    };
    e.dispatch(FAMILY.key("movement_check_ids"), &p, &[bi, bf], 1)?;
    Ok(1)
}

impl Kernel for Gather {
    /// Data of 32- or 64-bit elements; i32, u32 or i64 ids (negative ones count from the
    /// end, others out of range give zeros: the runtime checks them, on the host or with
    /// [`encode_index_check`], and reports them as errors). Or an f16, bf16 or block-quantized
    /// table gathered on axis 0
    /// and dequantized to f32 rows ([`quant::encode_gather`]) with i32 or u32 ids (negative
    /// ones count from the end there too).
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        let table = inputs.first().copied().unwrap_or(output);
        if quant::is_gather_table(table) {
            let ids_ok = matches!(inputs.get(1), Some(DType::I32 | DType::U32));
            return if ids_ok && self.axis == 0 && output == DType::F32 {
                Ok(())
            } else {
                Err("a table of a weight format gathered on axis 0 into f32, with i32 or u32 ids")
            };
        }
        let ids_ok = matches!(inputs.get(1), Some(DType::I32 | DType::U32 | DType::I64));
        if ids_ok && strided_types(&inputs[..1], output).is_ok() {
            Ok(())
        } else {
            Err("data of 32- or 64-bit elements and i32, u32 or i64 ids")
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
        let words = element_words(table.dtype).unwrap_or(1);
        let dims = table.shape.dims();
        let axis = axis_index(self.axis, dims.len()).map_err(|source| KernelError::Infer {
            op: "gather",
            cause: source,
        })?;
        let n = numel("output", out.shape)? * words;
        let num_ids = numel("input 1", ids.shape)?;
        let outer: u64 = dims[..axis].iter().product();
        let row: u64 = dims[axis + 1..].iter().product::<u64>() * words;
        let (ids_kind, id_words) = match ids.dtype {
            DType::I64 => (2, 2),
            DType::I32 => (1, 1),
            _ => (0, 1),
        };
        let (bt, ot) = e.bind(
            "input 0",
            &table.tensor,
            (numel("input 0", table.shape)? * 4 * words).max(4),
        )?;
        let (bi, oi) = e.bind("input 1", &ids.tensor, (num_ids * 4 * id_words).max(4))?;
        let (bo, oo) = e.bind("output", &out.tensor, n * 4)?;
        let p = GatherParams {
            num_ids: u32_of("input 1", num_ids)?,
            row: u32_of("input 0", row)?,
            rows: u32_of("input 0", dims[axis])?,
            table_offset: ot,
            ids_offset: oi,
            out_offset: oo,
            outer: u32_of("input 0", outer)?,
            ids_kind,
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
