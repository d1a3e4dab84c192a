//! The `sample` family (`shaders/sample.wgsl`): the next token from rows of logits, greedy or
//! sampled by each row's parameters ([`crate::graph::ops::sample`]), in three dispatches
//! whatever the rows ask for: per (row, chunk of 4096 logits) the chunk's maximum and, for
//! top-k rows, its k best; per (row, chunk) the Gumbel keys of full-vocabulary rows; per row
//! the pick. A 262,144-token vocabulary is 64 workgroups per row in the first two passes.

use super::layout::u32_of;
use super::{Encoder, Family, Kernel, KernelError, Operand};
use crate::graph::ops::sample::{Sample, PARAM_WORDS, TOP_K_MAX};
use crate::shape::DType;
use bytemuck::{Pod, Zeroable};

/// `shaders/sample.wgsl` after the prelude.
pub const WGSL: &str = crate::gpu::pipeline::with_prelude!("sample");

/// The family: entry points and their storage bindings.
pub const FAMILY: Family = Family {
    name: "sample",
    source: || WGSL,
    bindings: |entry| match entry {
        "sample_pick" => &[2, 3, 4],
        _ => &[1, 2, 3],
    },
    unchecked: &[],
};

/// Logits one workgroup of the first two passes covers (`CHUNK` of the shader).
pub const CHUNK: u64 = 4096;

/// `SampleParams` of `shaders/sample.wgsl` (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct SampleParams {
    /// Rows (sequences).
    pub rows: u32,
    /// Logits per row.
    pub vocab: u32,
    /// Chunks per row.
    pub chunks: u32,
    /// Element offset of the logits in their binding.
    pub logits_offset: u32,
    /// Word offset of the parameters in their binding.
    pub params_offset: u32,
    /// Element offset of the tokens in their binding.
    pub out_offset: u32,
    /// Word offset of region A (chunk maxima) in the workspace.
    pub ws_max: u32,
    /// Word offset of region B (chunk Gumbel keys).
    pub ws_key: u32,
    /// Word offset of region C (chunk top-k lists).
    pub ws_top: u32,
    /// Padding.
    pub _pad: [u32; 3],
}

impl Kernel for Sample {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        if inputs == [DType::F32, DType::U32] && output == DType::I32 {
            Ok(())
        } else {
            Err("f32 logits, u32 parameters, i32 tokens")
        }
    }

    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let (logits, params) = (&inputs[0], &inputs[1]);
        let dims = logits.shape.dims();
        let (rows, vocab) = (dims[0], dims[1]);
        if rows == 0 || vocab == 0 {
            return Ok(0);
        }
        let chunks = vocab.div_ceil(CHUNK);
        let (bl, ol) = e.bind("input 0", &logits.tensor, rows * vocab * 4)?;
        let (bp, op) = e.bind("input 1", &params.tensor, rows * PARAM_WORDS as u64 * 4)?;
        let (bo, oo) = e.bind("output", &out.tensor, rows * 4)?;
        let pairs = rows * chunks * 2;
        let ws_words = pairs * 2 + pairs * u64::from(TOP_K_MAX);
        let p = SampleParams {
            rows: u32_of("rows", rows)?,
            vocab: u32_of("vocab", vocab)?,
            chunks: u32_of("chunks", chunks)?,
            logits_offset: ol,
            params_offset: op,
            out_offset: oo,
            ws_max: 0,
            ws_key: u32_of("workspace", pairs)?,
            ws_top: u32_of("workspace", pairs * 2)?,
            _pad: [0; 3],
        };
        let groups = rows * chunks;
        let ws = e.workspace("output", ws_words * 4)?;
        e.dispatch(FAMILY.key("sample_chunks"), &p, &[bl, bp, ws], groups)?;
        let ws = e.workspace("output", ws_words * 4)?;
        e.dispatch(FAMILY.key("sample_gumbel"), &p, &[bl, bp, ws], groups)?;
        let ws = e.workspace("output", ws_words * 4)?;
        e.dispatch(FAMILY.key("sample_pick"), &p, &[bp, ws, bo], rows)?;
        Ok(3)
    }
}
