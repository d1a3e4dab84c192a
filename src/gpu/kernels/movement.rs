//! The `movement` family (`shaders/movement.wgsl`): one strided copy serving the views
//! (reshape, squeeze, unsqueeze, flatten), transpose, slice, split parts, expand and each
//! input of a concat; the gather along an axis; the fill that writes `shape_of`'s values and
//! the splat of `constant_of_shape`. They move 32-bit words, so they run on any 4-byte type
//! and on 8-byte ones as word pairs; the views and the splat move whole words of any plain
//! type (a tensor starts on a 4-byte boundary, and the bytes after its end up to the next one
//! belong to nothing else). A gather from an f16 or block-quantized table is the `quant`
//! family's. The gather and its index check are in `movement/gather.rs`, the slices in
//! `movement/slice.rs`.

use super::layout::{
    batch_strides, check_rank, numel, operand_strides, pack8, span, strides, u32_of, u32s,
};
use super::{Encoder, Family, Kernel, KernelError, Operand};
use crate::graph::ops::{
    axis_index, Concat, ConstantOfShape, Expand, Flatten, Reshape, ReshapeTo, ShapeOf, SizeOf,
    Squeeze, Transpose, Unsqueeze,
};
use crate::shape::{DType, Shape};
use bytemuck::{Pod, Zeroable};

mod gather;
mod slice;

pub use gather::{encode_index_check, CheckIdsParams, GatherParams, FAULT_RECORD_BYTES};
pub use slice::SliceParams;

/// `shaders/movement.wgsl` after the prelude.
pub const WGSL: &str = crate::gpu::pipeline::with_prelude!("movement");

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
