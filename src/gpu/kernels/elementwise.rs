//! The `elementwise` family (`shaders/elementwise.wgsl`): binary ops with NumPy broadcasting
//! (a strided entry point, and flat / vec4 entry points for same-shape operands) and the
//! unary activations. The operator is a pipeline-overridable constant, so each op gets its
//! own pipeline with the switch folded away; so is `ALIGNED`, set when every operand starts at
//! its binding, which makes the flat and unary pipelines read no offsets.
//!
//! **The flat and unary entry points run without wgpu's bounds checks** ([`Family::unchecked`]).
//! Every index they compute is in bounds by construction: for an output of `n` elements each
//! operand is bound by [`Encoder::bind`] with `needed_bytes = 4 n`, which binds from an aligned
//! base `skew` bytes before the tensor, `skew + 4 n` bytes or more, and returns `skew / 4` as the
//! element offset `off` (vec4 entry points: `skew % 16 == 0` and `n % 4 == 0`, so the binding
//! holds `off / 4 + n / 4` vec4s; the `ALIGNED` pipelines, chosen when every `off` is 0,
//! use 0); the shader touches `off + i` only for `i < n`, its first statement
//! (`if i >= fp.numel { return; }`) makes sure of that, and `off + i < 2^31` because a binding
//! holds at most `max_storage_buffer_binding_size` bytes. So the clamp wgpu would add
//! to each access on adapters without robustBufferAccess2 can never change an index; it only
//! costs, on SwiftShader much of the add's CPU time
//! (docs/benchmarks/2026-11-22-elementwise-swiftshader.md; ONNX Runtime's native WebGPU EP runs
//! Dawn with its robustness off, docs/onnx.md). A replayed [`super::DispatchPlan`] binds the
//! same ranges it recorded.
//! The broadcasting entry point, whose index arithmetic goes through strides, keeps the checks.

use super::layout::{broadcast_strides, check_rank, numel, pack8, u32s};
use super::uniforms::BroadcastParams;
use super::{f32_only, Encoder, Family, Kernel, KernelError, Operand};
use crate::graph::{BinaryOp, UnaryOp};
use crate::shape::DType;
use bytemuck::{Pod, Zeroable};

/// `shaders/elementwise.wgsl` after the prelude.
pub const WGSL: &str = crate::gpu::pipeline::with_prelude!("elementwise");

/// The family: entry points and their storage bindings.
pub const FAMILY: Family = Family {
    name: "elementwise",
    source: || WGSL,
    bindings: |entry| {
        if entry.starts_with("elementwise_unary") {
            &[1, 2]
        } else {
            &[1, 2, 3]
        }
    },
    // In bounds by construction: see the module docs.
    unchecked: &[
        "elementwise_binary_flat",
        "elementwise_binary_flat4",
        "elementwise_unary",
        "elementwise_unary4",
    ],
};

/// `FlatParams` of `shaders/elementwise.wgsl`: contiguous operands of one shape (16 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct FlatParams {
    /// Elements (vec4 elements for the `*4` entry points).
    pub numel: u32,
    /// Input 0 offset, in elements of the entry point's array type.
    pub in0_offset: u32,
    /// Input 1 offset.
    pub in1_offset: u32,
    /// Output offset.
    pub out_offset: u32,
}

impl Kernel for BinaryOp {
    /// f32 here; integer types (i32, u32, i8, u8, i64 but no i64 division) in the typed
    /// kernel of the `logic` family, in their real bytes.
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        if output == DType::F32 {
            f32_only(inputs, output)
        } else {
            super::logic::check_int_binary(*self, inputs, output)
        }
    }

    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        if out.dtype != DType::F32 {
            return super::logic::encode_typed(e, self.code(), inputs, out);
        }
        let (a, b) = (&inputs[0], &inputs[1]);
        let n = numel("output", out.shape)?;
        let (ba, oa) = e.bind("input 0", &a.tensor, numel("input 0", a.shape)? * 4)?;
        let (bb, ob) = e.bind("input 1", &b.tensor, numel("input 1", b.shape)? * 4)?;
        let (bo, oo) = e.bind("output", &out.tensor, n * 4)?;
        if a.shape == out.shape && b.shape == out.shape {
            let vec4 = n % 4 == 0 && oa % 4 == 0 && ob % 4 == 0 && oo % 4 == 0;
            let (entry, k) = if vec4 {
                ("elementwise_binary_flat4", 4)
            } else {
                ("elementwise_binary_flat", 1)
            };
            let p = FlatParams {
                numel: (n / k) as u32,
                in0_offset: oa / k as u32,
                in1_offset: ob / k as u32,
                out_offset: oo / k as u32,
            };
            let aligned = oa == 0 && ob == 0 && oo == 0;
            let key = FAMILY
                .key(entry)
                .with("BINARY_OP", self.code())
                .with("ALIGNED", u32::from(aligned));
            e.dispatch(key, &p, &[ba, bb, bo], (n / k).div_ceil(256))?;
            return Ok(1);
        }
        check_rank(out.shape)?;
        let p = BroadcastParams {
            numel: n as u32,
            rank: out.shape.rank() as u32,
            out_offset: oo,
            flags: 0,
            offsets: [oa, ob, 0, 0],
            shape: pack8(&u32s("output", out.shape.dims())?),
            strides0: pack8(&u32s("input 0", &broadcast_strides(a.shape, out.shape))?),
            strides1: pack8(&u32s("input 1", &broadcast_strides(b.shape, out.shape))?),
            strides2: [[0; 4]; 2],
        };
        let key = FAMILY
            .key("elementwise_binary")
            .with("BINARY_OP", self.code());
        e.dispatch(key, &p, &[ba, bb, bo], n.div_ceil(256))?;
        Ok(1)
    }
}

impl Kernel for UnaryOp {
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
        let (bx, ox) = e.bind("input 0", &inputs[0].tensor, n * 4)?;
        let (bo, oo) = e.bind("output", &out.tensor, n * 4)?;
        let vec4 = n % 4 == 0 && ox % 4 == 0 && oo % 4 == 0;
        let (entry, k) = if vec4 {
            ("elementwise_unary4", 4)
        } else {
            ("elementwise_unary", 1)
        };
        let p = FlatParams {
            numel: (n / k) as u32,
            in0_offset: ox / k as u32,
            in1_offset: 0,
            out_offset: oo / k as u32,
        };
        let key = FAMILY
            .key(entry)
            .with("UNARY_OP", self.code())
            .with("ALIGNED", u32::from(ox == 0 && oo == 0));
        e.dispatch(key, &p, &[bx, bo], (n / k).div_ceil(256))?;
        Ok(1)
    }
}
