//! The `mask` family (`shaders/mask.wgsl`): the causal attention mask over a growing past,
//! and `where` with three-way broadcasting on f32 values (its uniform is the prelude's
//! [`BroadcastParams`], shared with `elementwise` and `logic`); `where` on other types runs in the `logic` family.

use super::layout::{broadcast_strides, check_rank, numel, pack8, u32s, INPUT_NAMES};
use super::uniforms::BroadcastParams;
use super::{f32_only, Encoder, Family, Kernel, KernelError, Operand};
use crate::graph::ops::{CausalMask, Where};
use crate::shape::DType;
use bytemuck::{Pod, Zeroable};

/// `shaders/mask.wgsl` after the prelude.
pub const WGSL: &str = crate::gpu::pipeline::with_prelude!("mask");

/// The family: entry points and their storage bindings.
pub const FAMILY: Family = Family {
    name: "mask",
    source: || WGSL,
    bindings: |entry| match entry {
        "mask_causal" => &[1, 4],
        _ => &[1, 2, 3, 4],
    },
    unchecked: &[],
};

/// `CausalParams` of `shaders/mask.wgsl` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct CausalParams {
    /// Elements.
    pub numel: u32,
    /// Queries (second-to-last dimension).
    pub s: u32,
    /// Keys (last dimension).
    pub t: u32,
    /// Past length `t - s`.
    pub past: u32,
    /// x element offset.
    pub x_offset: u32,
    /// Output element offset.
    pub out_offset: u32,
    /// Padding.
    pub _pad: [u32; 2],
}

/// Whether `mask_where` runs a `where`: a 32-bit condition (f32, i32, u32) and f32 values.
/// Every other combination (bool conditions, integer or bool values) runs in the typed
/// kernel of the `logic` family, which moves values as their bits.
fn where_in_mask(inputs: &[DType], output: DType) -> bool {
    matches!(inputs.first(), Some(DType::F32 | DType::I32 | DType::U32))
        && f32_only(&inputs[1..], output).is_ok()
}

impl Kernel for Where {
    /// Any condition and values of a type of the typed kernel (f32, f16, bf16, i32, u32, i8,
    /// u8, bool, i64), the values of one type.
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        let family = &super::logic::FAMILY_TYPES;
        let typed = family.contains(&output)
            && inputs.iter().all(|d| family.contains(d))
            && inputs.get(1) == Some(&output)
            && inputs.get(2) == Some(&output);
        if where_in_mask(inputs, output) || typed {
            Ok(())
        } else {
            Err("a condition and values of f32, f16, bf16, i32, u32, i8, u8, bool or i64")
        }
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let types: Vec<DType> = inputs.iter().map(|o| o.dtype).collect();
        if !where_in_mask(&types, out.dtype) {
            return super::logic::encode_typed(e, super::logic::OP_WHERE, inputs, out);
        }
        check_rank(out.shape)?;
        let n = numel("output", out.shape)?;
        let mut bound = Vec::new();
        let mut offs = [0u32; 4];
        let mut strides = [[[0u32; 4]; 2]; 3];
        for (k, inp) in inputs.iter().enumerate() {
            let (b, o) = e.bind(
                INPUT_NAMES[k],
                &inp.tensor,
                numel(INPUT_NAMES[k], inp.shape)? * 4,
            )?;
            bound.push(b);
            offs[k] = o;
            strides[k] = pack8(&u32s(
                INPUT_NAMES[k],
                &broadcast_strides(inp.shape, out.shape),
            )?);
        }
        let (bo, oo) = e.bind("output", &out.tensor, n * 4)?;
        bound.push(bo);
        let p = BroadcastParams {
            numel: n as u32,
            rank: out.shape.rank() as u32,
            out_offset: oo,
            flags: u32::from(inputs[0].dtype == DType::F32),
            offsets: offs,
            shape: pack8(&u32s("output", out.shape.dims())?),
            strides0: strides[0],
            strides1: strides[1],
            strides2: strides[2],
        };
        e.dispatch(FAMILY.key("mask_where"), &p, &bound, n.div_ceil(256))?;
        Ok(1)
    }
}

impl Kernel for CausalMask {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        f32_only(inputs, output)
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let n = numel("output", out.shape)?;
        let r = out.shape.rank();
        let (s, t) = (out.shape.dims()[r - 2], out.shape.dims()[r - 1]);
        let (bx, ox) = e.bind("input 0", &inputs[0].tensor, n * 4)?;
        let (bo, oo) = e.bind("output", &out.tensor, n * 4)?;
        let p = CausalParams {
            numel: n as u32,
            s: s as u32,
            t: t as u32,
            past: (t - s) as u32,
            x_offset: ox,
            out_offset: oo,
            _pad: [0; 2],
        };
        e.dispatch(FAMILY.key("mask_causal"), &p, &[bx, bo], n.div_ceil(256))?;
        Ok(1)
    }
}
