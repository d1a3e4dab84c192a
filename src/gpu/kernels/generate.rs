//! The `generate` family (`shaders/generate.wgsl`): ranges (start and delta read on the
//! device) and triangle masks (trilu).

use super::layout::{numel, u32_of};
use super::movement::{element_words, strided_types};
use super::{Encoder, Family, Kernel, KernelError, Operand};
use crate::graph::ops::{Range, Trilu};
use crate::shape::DType;
use bytemuck::{Pod, Zeroable};

/// `shaders/generate.wgsl` after the prelude.
pub const WGSL: &str = crate::gpu::pipeline::with_prelude!("generate");

/// The family: entry points and their storage bindings.
pub const FAMILY: Family = Family {
    name: "generate",
    source: || WGSL,
    bindings: |entry| match entry {
        "generate_trilu" => &[1, 3],
        _ => &[1, 2, 3],
    },
    unchecked: &[],
};

/// `RangeParams` of `shaders/generate.wgsl` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct RangeParams {
    /// Elements.
    pub n: u32,
    /// 0: f32, 1: i32, 2: i64.
    pub kind: u32,
    /// Word offset of start.
    pub start_offset: u32,
    /// Word offset of delta.
    pub delta_offset: u32,
    /// Output word offset.
    pub out_offset: u32,
    /// Padding.
    pub _pad: [u32; 3],
}

/// `TriluParams` of `shaders/generate.wgsl` (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct TriluParams {
    /// Elements.
    pub numel: u32,
    /// Second-to-last dimension.
    pub rows: u32,
    /// Last dimension.
    pub cols: u32,
    /// Words per element.
    pub words: u32,
    /// x word offset.
    pub x_offset: u32,
    /// Output word offset.
    pub out_offset: u32,
    /// k word offset (`generate_trilu_k`).
    pub k_offset: u32,
    /// k (`generate_trilu`).
    pub k: i32,
    /// 1: keep the upper triangle.
    pub upper: u32,
    /// Words of k (1: i32, 2: i64).
    pub k_words: u32,
    /// Padding.
    pub _pad: [u32; 2],
}

impl Kernel for Range {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        let ok = matches!(output, DType::F32 | DType::I32 | DType::I64)
            && inputs.iter().all(|&d| d == output);
        if ok {
            Ok(())
        } else {
            Err("f32, i32 or i64, one type for every input and the output")
        }
    }
    /// Input 1 (limit) is shape data; start and delta are read from their buffers.
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let n = numel("output", out.shape)?;
        let words = element_words(out.dtype).unwrap_or(1);
        let (bs, os) = e.bind("input 0", &inputs[0].tensor, 4 * words)?;
        let (bd, od) = e.bind("input 2", &inputs[2].tensor, 4 * words)?;
        let (bo, oo) = e.bind("output", &out.tensor, n * 4 * words)?;
        let p = RangeParams {
            n: u32_of("output", n)?,
            kind: match out.dtype {
                DType::I32 => 1,
                DType::I64 => 2,
                _ => 0,
            },
            start_offset: os,
            delta_offset: od,
            out_offset: oo,
            _pad: [0; 3],
        };
        e.dispatch(
            FAMILY.key("generate_range"),
            &p,
            &[bs, bd, bo],
            n.div_ceil(256),
        )?;
        Ok(1)
    }
}

impl Kernel for Trilu {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        if super::movement::int_param(inputs, 1) && strided_types(&inputs[..1], output).is_ok() {
            Ok(())
        } else {
            Err("x of 32- or 64-bit elements and an i32 or i64 k")
        }
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let n = numel("output", out.shape)?;
        let words = element_words(out.dtype).unwrap_or(1);
        let r = out.shape.rank();
        let (rows, cols) = (out.shape.dims()[r - 2], out.shape.dims()[r - 1]);
        let (bx, ox) = e.bind("input 0", &inputs[0].tensor, n * 4 * words)?;
        let (bo, oo) = e.bind("output", &out.tensor, n * 4 * words)?;
        let mut p = TriluParams {
            numel: u32_of("output", n)?,
            rows: u32_of("output", rows)?,
            cols: u32_of("output", cols)?,
            words: words as u32,
            x_offset: ox,
            out_offset: oo,
            k_offset: 0,
            k: 0,
            upper: u32::from(self.upper),
            k_words: 1,
            _pad: [0; 2],
        };
        match inputs.get(1) {
            Some(k) => {
                let k_words = element_words(k.dtype).unwrap_or(1);
                let (bk, ok) = e.bind("input 1", &k.tensor, 4 * k_words)?;
                p.k_offset = ok;
                p.k_words = k_words as u32;
                e.dispatch(
                    FAMILY.key("generate_trilu_k"),
                    &p,
                    &[bx, bk, bo],
                    n.div_ceil(256),
                )?;
            }
            None => e.dispatch(FAMILY.key("generate_trilu"), &p, &[bx, bo], n.div_ceil(256))?,
        }
        Ok(1)
    }
}
