//! The `movement` family (`shaders/movement.wgsl`): one strided copy serving the views
//! (reshape, squeeze, unsqueeze, flatten), transpose, slice, split parts, expand and each
//! input of a concat; the gather along an axis; the fill that writes `shape_of`'s values and
//! the splat of `constant_of_shape`. They move 32-bit words, so they run on any 4-byte type
//! and on 8-byte ones as word pairs; the views and the splat move whole words of any plain
//! type (a tensor starts on a 4-byte boundary, and the bytes after its end up to the next one
//! belong to nothing else). A gather from an f16 or block-quantized table is the `quant`
//! family's.

use super::layout::{
    batch_strides, check_rank, numel, operand_strides, pack8, span, strides, u32_of, u32s,
};
use super::{quant, Bound, Encoder, Family, Kernel, KernelError, Operand};
use crate::graph::ops::movement::slice_ranges;
use crate::graph::ops::{
    axis_index, Concat, ConstantOfShape, Expand, Flatten, Gather, Reshape, ReshapeTo, ShapeOf,
    SizeOf, Slice, SliceTo, SplitPart, Squeeze, Transpose, Unsqueeze,
};
use crate::shape::{DType, Shape};
use bytemuck::{Pod, Zeroable};

/// `shaders/movement.wgsl`.
pub const WGSL: &str = include_str!("../../../shaders/movement.wgsl");

/// The family: entry points and their storage bindings.
pub const FAMILY: Family = Family {
    name: "movement",
    source: || WGSL,
    bindings: |entry| match entry {
        "movement_copy" => &[1, 3],
        "movement_gather" | "movement_slice" | "movement_split_sized" => &[1, 2, 3],
        "movement_check_ids" => &[2, 3],
        "movement_slice_steps" => &[1, 2, 3, 4],
        "movement_slice_axes" => &[1, 2, 3, 4, 5],
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
    /// Source strides per iteration dimension (two's complement for negative ones).
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

/// `FillParams` of `shaders/movement.wgsl` (80 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct FillParams {
    /// Words written (<= 16).
    pub n: u32,
    /// Output word offset.
    pub out_offset: u32,
    /// Padding.
    pub _pad: [u32; 2],
    /// The words.
    pub values: [[u32; 4]; 4],
}

/// `SplatParams` of `shaders/movement.wgsl` (16 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct SplatParams {
    /// Words written.
    pub n: u32,
    /// Output word offset.
    pub out_offset: u32,
    /// Even words.
    pub lo: u32,
    /// Odd words.
    pub hi: u32,
}

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

/// 32-bit words per element of the types the strided kernels move: 1 for 4-byte types, 2 for
/// 8-byte ones.
pub(crate) fn element_words(dtype: DType) -> Option<u64> {
    match dtype.bits() {
        Some(32) => Some(1),
        Some(64) => Some(2),
        _ => None,
    }
}

/// The dtype rule of the strided movement kernels: one 32- or 64-bit type in and out.
pub(crate) fn strided_types(inputs: &[DType], output: DType) -> Result<(), &'static str> {
    if element_words(output).is_some() && inputs.iter().all(|&d| d == output) {
        Ok(())
    } else {
        Err("32- or 64-bit elements (f32, i32, u32, i64), the same type in and out")
    }
}

/// Whether input `at`, when given, is an i32 or i64 tensor (the counts, axes or offsets some
/// kernels take as a second input).
pub(crate) fn int_param(inputs: &[DType], at: usize) -> bool {
    inputs
        .get(at)
        .is_none_or(|&d| matches!(d, DType::I32 | DType::I64))
}

/// The dtype rule of the whole-word copies (views): input 0 and the output of one plain type.
fn view_types(inputs: &[DType], output: DType) -> Result<(), &'static str> {
    if output.bits().is_some() && inputs.first() == Some(&output) {
        Ok(())
    } else {
        Err("a plain (not block-quantized) type, the same in and out")
    }
}

/// Words a tensor occupies, its last one padded.
fn words_of(what: &'static str, t: &Operand<'_>) -> Result<u64, KernelError> {
    let n = numel(what, t.shape)?;
    let bits = u64::from(t.dtype.bits().unwrap_or(32));
    Ok((n * bits).div_ceil(32))
}

/// Strided copy of `shape` elements of `words` words each: `src[in_base + idx . in_strides]`
/// to `dst[out_base + idx . out_strides]` (element strides and offsets on top of the
/// operands' own; input strides may be negative).
#[allow(clippy::too_many_arguments)]
fn copy(
    e: &mut Encoder<'_, '_>,
    src: &Operand<'_>,
    shape: &Shape,
    in_strides: &[i64],
    in_base: u64,
    dst: &Operand<'_>,
    out_strides: &[u64],
    out_base: u64,
) -> Result<usize, KernelError> {
    let words = element_words(dst.dtype).unwrap_or(1);
    let mut it_shape = shape.dims().to_vec();
    let mut ins: Vec<i64> = in_strides.iter().map(|&s| s * words as i64).collect();
    let mut outs: Vec<u64> = out_strides.iter().map(|&s| s * words).collect();
    if words > 1 {
        it_shape.push(words);
        ins.push(1);
        outs.push(1);
    }
    let it_shape = Shape::new(it_shape);
    check_rank(&it_shape)?;
    let n = numel("copy", &it_shape)?;
    if n == 0 {
        return Ok(0);
    }
    let (bs, os) = e.bind("input 0", &src.tensor, span("input 0", src)? * 4 * words)?;
    let (bd, od) = e.bind(
        "output",
        &dst.tensor,
        numel("output", dst.shape)? * 4 * words,
    )?;
    // Negative strides travel as their two's complement; the kernel's u32 sums wrap back.
    let wrapped: Vec<u32> = ins
        .iter()
        .map(|&s| {
            i32::try_from(s)
                .map(|v| v as u32)
                .map_err(|_| KernelError::TooManyElements {
                    what: "input 0",
                    elements: s.unsigned_abs(),
                    max: i32::MAX as u64,
                })
        })
        .collect::<Result<_, _>>()?;
    let p = CopyParams {
        numel: n as u32,
        rank: it_shape.rank() as u32,
        in_offset: u32_of("input 0", u64::from(os) + in_base * words)?,
        out_offset: u32_of("output", u64::from(od) + out_base * words)?,
        shape: pack8(&u32s("copy", it_shape.dims())?),
        in_strides: pack8(&wrapped),
        out_strides: pack8(&u32s("output", &outs)?),
    };
    e.dispatch(FAMILY.key("movement_copy"), &p, &[bs, bd], n.div_ceil(256))?;
    Ok(1)
}

/// Contiguous strides as signed values.
fn signed(st: &[u64]) -> Vec<i64> {
    st.iter().map(|&s| s as i64).collect()
}

/// The element strides of an operand as signed values (a strided view's, or row-major).
fn signed_strides(o: &Operand<'_>) -> Vec<i64> {
    signed(&operand_strides(o))
}

/// A view moves the words in order (the last one padded), whatever the element type; a
/// strided input (a view of a padded KV cache) is walked element by element in its own
/// shape, row-major, which needs 32- or 64-bit elements.
fn flat_copy(
    e: &mut Encoder<'_, '_>,
    op: &'static str,
    x: &Operand<'_>,
    out: &Operand<'_>,
) -> Result<usize, KernelError> {
    if x.is_strided() {
        if element_words(out.dtype).is_none() {
            return Err(KernelError::Strided {
                op,
                input: 0,
                reason: "a strided view of elements narrower than 32 bits",
            });
        }
        let in_strides = signed_strides(x);
        return copy(e, x, x.shape, &in_strides, 0, out, &strides(x.shape), 0);
    }
    let n = words_of("output", out)?;
    if words_of("input 0", x)? != n {
        return Err(KernelError::OutputShape {
            op,
            expected: x.shape.clone(),
            got: out.shape.clone(),
        });
    }
    if n == 0 {
        return Ok(0);
    }
    let (bs, os) = e.bind("input 0", &x.tensor, n * 4)?;
    let (bd, od) = e.bind("output", &out.tensor, n * 4)?;
    let p = CopyParams {
        numel: u32_of("output", n)?,
        rank: 1,
        in_offset: os,
        out_offset: od,
        shape: pack8(&[u32_of("output", n)?]),
        in_strides: pack8(&[1]),
        out_strides: pack8(&[1]),
    };
    e.dispatch(FAMILY.key("movement_copy"), &p, &[bs, bd], n.div_ceil(256))?;
    Ok(1)
}

/// The kernel of a view op: a whole-word copy of input 0 (a `reshape_to`'s shape input is
/// shape data it never reads).
macro_rules! view_kernel {
    ($($ty:ty => $name:literal),* $(,)?) => {$(
        impl Kernel for $ty {
            fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
                view_types(inputs, output)
            }
            /// A strided input is copied element by element into the contiguous output.
            fn reads_strided(&self, input: usize) -> bool {
                input == 0
            }
            fn encode(
                &self,
                e: &mut Encoder<'_, '_>,
                inputs: &[Operand<'_>],
                out: &Operand<'_>,
            ) -> Result<usize, KernelError> {
                flat_copy(e, $name, &inputs[0], out)
            }
        }
    )*};
}

view_kernel! {
    Reshape => "reshape",
    ReshapeTo => "reshape_to",
    Squeeze => "squeeze",
    Unsqueeze => "unsqueeze",
    Flatten => "flatten",
}

impl Kernel for Transpose {
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
        let st = signed_strides(&inputs[0]);
        let perm = self.perm_for(inputs[0].shape.rank());
        let in_strides: Vec<i64> = perm.iter().map(|&p| st[p]).collect();
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

impl Kernel for Expand {
    /// Input 1 is shape data the kernel never reads.
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        strided_types(&inputs[..1.min(inputs.len())], output)
    }
    /// A strided copy with broadcast strides: any input layout.
    fn reads_strided(&self, input: usize) -> bool {
        input == 0
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let x = &inputs[0];
        let st = operand_strides(x);
        let in_strides = signed(&batch_strides(
            x.shape.dims(),
            &st,
            x.shape.rank(),
            out.shape,
        ));
        copy(
            e,
            &inputs[0],
            out.shape,
            &in_strides,
            0,
            out,
            &strides(out.shape),
            0,
        )
    }
}

impl Kernel for Concat {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        strided_types(inputs, output)
    }
    /// A strided copy per input: any input layout.
    fn reads_strided(&self, _input: usize) -> bool {
        true
    }
    /// One strided copy per input into its slab of the output.
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let axis =
            axis_index(self.axis, out.shape.rank()).map_err(|source| KernelError::Infer {
                op: "concat",
                cause: source,
            })?;
        let out_strides = strides(out.shape);
        let mut at = 0u64;
        let mut n = 0;
        for inp in inputs {
            let in_strides = signed_strides(inp);
            let base = at * out_strides[axis];
            n += copy(e, inp, inp.shape, &in_strides, 0, out, &out_strides, base)?;
            at += inp.shape.dims()[axis];
        }
        Ok(n)
    }
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

impl Kernel for ShapeOf {
    /// The input's data is never read (only its shape), so any layout will do: a shape of a
    /// padded KV cache's view needs no contiguous copy.
    fn reads_strided(&self, _input: usize) -> bool {
        true
    }
    /// Writes i32 or i64 dimensions.
    fn check_dtypes(&self, _: &[DType], output: DType) -> Result<(), &'static str> {
        if matches!(output, DType::I32 | DType::I64) {
            Ok(())
        } else {
            Err("an i32 or i64 output")
        }
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let dims = inputs[0].shape.dims();
        let (start, end) = self.bounds(dims.len());
        let mut v: Vec<u32> = Vec::new();
        for &d in &dims[start..end] {
            let d = d.min(i32::MAX as u64) as u32;
            v.push(d);
            if out.dtype == DType::I64 {
                v.push(0);
            }
        }
        if v.len() > 16 {
            return Err(KernelError::RankTooLarge {
                rank: end - start,
                max: if out.dtype == DType::I64 { 8 } else { 16 },
            });
        }
        let (bo, oo) = e.bind("output", &out.tensor, v.len() as u64 * 4)?;
        let mut values = [[0u32; 4]; 4];
        for (i, &w) in v.iter().enumerate() {
            values[i / 4][i % 4] = w;
        }
        let p = FillParams {
            n: v.len() as u32,
            out_offset: oo,
            _pad: [0; 2],
            values,
        };
        e.dispatch(FAMILY.key("movement_fill"), &p, &[bo], 1)?;
        Ok(1)
    }
}

impl Kernel for SizeOf {
    /// The input's data is never read (only its shape), so any layout will do: a shape of a
    /// padded KV cache's view needs no contiguous copy.
    fn reads_strided(&self, _input: usize) -> bool {
        true
    }
    /// Writes an i64.
    fn check_dtypes(&self, _: &[DType], output: DType) -> Result<(), &'static str> {
        if output == DType::I64 {
            Ok(())
        } else {
            Err("an i64 output")
        }
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let n = inputs[0].shape.checked_num_elements().unwrap_or(u64::MAX);
        let (bo, oo) = e.bind("output", &out.tensor, 8)?;
        let mut values = [[0u32; 4]; 4];
        values[0][0] = n as u32;
        values[0][1] = (n >> 32) as u32;
        let p = FillParams {
            n: 2,
            out_offset: oo,
            _pad: [0; 2],
            values,
        };
        e.dispatch(FAMILY.key("movement_fill"), &p, &[bo], 1)?;
        Ok(1)
    }
}

impl Kernel for ConstantOfShape {
    /// Any plain type; input 0 is shape data the kernel never reads.
    fn check_dtypes(&self, _: &[DType], output: DType) -> Result<(), &'static str> {
        if output.bits().is_some() && output == self.dtype {
            Ok(())
        } else {
            Err("a plain output type, the fill value's")
        }
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        _: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let n = words_of("output", out)?;
        let v = self.element();
        let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let (lo, hi) = match v.len() {
            1 => (u32::from_le_bytes([v[0]; 4]), u32::from_le_bytes([v[0]; 4])),
            2 => {
                let w = u32::from_le_bytes([v[0], v[1], v[0], v[1]]);
                (w, w)
            }
            4 => (word(v), word(v)),
            _ => (word(&v[..4]), word(&v[4..8])),
        };
        let (bo, oo) = e.bind("output", &out.tensor, n * 4)?;
        let p = SplatParams {
            n: u32_of("output", n)?,
            out_offset: oo,
            lo,
            hi,
        };
        e.dispatch(FAMILY.key("movement_splat"), &p, &[bo], n.div_ceil(256))?;
        Ok(1)
    }
}
