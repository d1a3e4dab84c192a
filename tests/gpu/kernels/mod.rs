//! Every op's WGSL kernel against the CPU reference on seeded random shapes, on every test
//! backend (Vulkan/lavapipe and GL/llvmpipe unless WGPU_BACKEND picks). Covers broadcasting
//! edge cases, size-1 and size-0 dimensions, sizes that are not multiples of the workgroup,
//! unaligned tensor offsets, 2-D dispatch grids, and several dispatches in one pass.
//!
//! One module per kernel family: [`elementwise`], [`matmul`], [`movement`] (with the mask),
//! [`transformer`] (norms, rotary embedding, attention), [`logic`] (the typed elementwise
//! kernels), [`quant`] (quantized weights) and [`fused`] (the fused projections and the graph
//! rewrite that makes them); [`dispatch`] covers how a kernel of any family
//! is dispatched and [`graph`] a decoder layer run node by node. This file holds the helpers
//! of the f32 tests (values carried as f32, typed on the way to the device).
//!
//! Tolerances (|gpu - ref| <= atol + rtol * |ref|, ref computed with f64 intermediates):
//! * add, sub, mul, relu, data movement, gather, where, causal mask, shape_of: exact
//! * div: rtol 1e-6 (WGSL allows 2.5 ULP)
//! * exp, gelu, silu, silu_mul (the SwiGLU gate), sqrt: atol 1e-6, rtol 1e-5
//! * rope: atol 1e-6, rtol 1e-5 (two products and a sum in f32, the table exact)
//! * attention (q, k, v in [-1, 1)): atol 2e-6, rtol 1e-4 (f32 dot products, an online
//!   softmax merged across 64 invocations)
//! * matmul (inputs in [-1, 1)): atol 1e-6 * K + 1e-5 (f32 accumulation over K terms)
//! * softmax: atol 2e-6, rtol 1e-4; layer_norm, rms_norm: atol 1e-4, rtol 1e-4

mod dispatch;
mod elementwise;
mod fused;
mod graph;
mod logic;
mod matmul;
mod movement;
mod quant;
mod sample;
mod subgroups;
mod transformer;

use crate::ops::{gpus, s, Tol, EXACT};
use dynrt::gpu::kernels::run::{run_op, RunOpError};
use dynrt::gpu::kernels::{KernelError, Kernels, Operand, TensorRef, UniformArena};
use dynrt::gpu::{testing, Buffer, BufferDesc, Engine, Gpu};
use dynrt::graph::ops::{self, MASK_VALUE};
use dynrt::graph::reference::{self, RefTensor};
use dynrt::graph::{BinaryOp, Op, UnaryOp};
use dynrt::memory::AllocKind;
use dynrt::rng::SplitMix64;
use dynrt::shape::{DType, Shape};
use dynrt::tensor::ConstData;

/// A test tensor: values carried as f32 (integers exact), typed on the way to the device and
/// the reference.
#[derive(Debug, Clone)]
struct HostTensor {
    shape: Shape,
    dtype: DType,
    values: Vec<f32>,
}

impl HostTensor {
    fn typed(&self) -> dynrt::tensor::HostTensor {
        dynrt::tensor::HostTensor::from_f32_values(self.shape.clone(), self.dtype, &self.values)
            .unwrap()
    }
    fn reference(&self) -> RefTensor {
        RefTensor::from_f32(self.shape.clone(), self.dtype, self.values.clone())
    }
}

/// `run_op` on the engine of `gpu`, returning f32 carriers.
fn run(
    gpu: &Gpu,
    k: &mut Kernels,
    op: &Op,
    inputs: &[HostTensor],
    out: &Shape,
    dtype: DType,
    skew: u64,
) -> Result<Vec<f32>, RunOpError> {
    let engine = Engine::new(gpu.clone());
    let typed: Vec<_> = inputs.iter().map(HostTensor::typed).collect();
    run_op(&engine, k, op, &typed, out, dtype, skew).map(|t| t.to_f32())
}

fn rand_values(rng: &mut SplitMix64, shape: &Shape) -> Vec<f32> {
    let n = shape.num_elements().unwrap() as usize;
    (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect()
}

fn f32_tensor(rng: &mut SplitMix64, dims: &[u64]) -> HostTensor {
    let shape = s(dims);
    HostTensor {
        values: rand_values(rng, &shape),
        shape,
        dtype: DType::F32,
    }
}

/// Runs `op` on the GPU (with a 4-byte skew every other call) and compares with the CPU
/// reference. Returns the GPU values.
fn check(
    gpu: &Gpu,
    k: &mut Kernels,
    op: &Op,
    inputs: &[HostTensor],
    tol: Tol,
    ctx: &str,
) -> Vec<f32> {
    let skew = (ctx.len() as u64 % 3) * 4;
    check_at(gpu, k, op, inputs, tol, ctx, skew)
}

/// [`check`] with every operand `skew` bytes past its buffer's aligned start.
fn check_at(
    gpu: &Gpu,
    k: &mut Kernels,
    op: &Op,
    inputs: &[HostTensor],
    tol: Tol,
    ctx: &str,
    skew: u64,
) -> Vec<f32> {
    let shapes: Vec<&Shape> = inputs.iter().map(|t| &t.shape).collect();
    let out_shape = op
        .infer(&shapes, &[])
        .unwrap_or_else(|e| panic!("{ctx}: {e}"));
    let refs: Vec<RefTensor> = inputs.iter().map(HostTensor::reference).collect();
    let ref_refs: Vec<&RefTensor> = refs.iter().collect();
    let want = reference::eval_op(op, &ref_refs, &out_shape)
        .unwrap_or_else(|e| panic!("{ctx}: reference: {e}"))
        .to_f32();
    let dtype = op
        .output_dtype(&inputs.iter().map(|t| t.dtype).collect::<Vec<_>>())
        .unwrap_or_else(|e| panic!("{ctx}: dtype {e:?}"));
    let got = run(gpu, k, op, inputs, &out_shape, dtype, skew)
        .unwrap_or_else(|e| panic!("{ctx} on {:?}: {e}", gpu.backend()));
    assert_eq!(got.len(), want.len(), "{ctx}: length");
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() || tol.atol == 0.0 && tol.rtol == 0.0 {
            g.to_bits() == w.to_bits() || g == w
        } else {
            (g - w).abs() <= tol.atol + tol.rtol * w.abs()
        };
        assert!(
            ok,
            "{ctx} ({} on {:?}, out {out_shape}): element {i}: gpu {g} vs ref {w} (tol {tol:?})",
            op.name(),
            gpu.backend()
        );
    }
    got
}

/// A random shape of rank 0..=4 with dims in 0..=max; zeros are rare.
fn rand_shape(rng: &mut SplitMix64, max_rank: u64, max: u64) -> Vec<u64> {
    let rank = rng.range(0, max_rank + 1);
    (0..rank)
        .map(|_| match rng.range(0, 12) {
            0 => 0,
            1 | 2 => 1,
            _ => rng.range(1, max + 1),
        })
        .collect()
}

/// A shape that broadcasts against `a`: some dims set to 1, some leading dims dropped.
fn broadcast_partner(rng: &mut SplitMix64, a: &[u64]) -> Vec<u64> {
    let drop = rng.range(0, a.len() as u64 + 1) as usize;
    a[drop..]
        .iter()
        .map(|&d| if rng.range(0, 3) == 0 { 1 } else { d })
        .collect()
}
