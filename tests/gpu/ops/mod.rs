//! The op families against the CPU reference, typed ([`movement`], [`nn`], [`reduce`]). What
//! they share: run one op on every test backend through `run_op` (twice: tensors at 256-byte
//! boundaries and 4 bytes past them) and compare with the CPU reference, typed (integers
//! exactly, floats within a stated tolerance). The tolerance type and the GPU list serve the
//! [`kernels`](crate::kernels) tests too.

mod movement;
mod nn;
mod reduce;

use dynrt::gpu::kernels::run::run_op;
use dynrt::gpu::kernels::Kernels;
use dynrt::gpu::{testing, Engine, Gpu};
use dynrt::graph::reference::{self, RefTensor, Values};
use dynrt::graph::Op;
use dynrt::rng::SplitMix64;
use dynrt::shape::{DType, Shape};

/// `|gpu - ref| <= atol + rtol * |ref|` (ref computed with f64 intermediates).
#[derive(Clone, Copy, Debug)]
pub struct Tol {
    pub atol: f32,
    pub rtol: f32,
}

/// Bit-exact (data movement, integers).
pub const EXACT: Tol = Tol {
    atol: 0.0,
    rtol: 0.0,
};

pub fn s(d: &[u64]) -> Shape {
    Shape::new(d.to_vec())
}

/// Every test backend's GPU (skips, or fails under `DYNRT_REQUIRE_GPU=1`, when none).
pub fn gpus(test: &str) -> Vec<Gpu> {
    testing::gpus_or_skip(test)
}

/// f32 values uniform in `[-1, 1)`.
pub fn f32s(rng: &mut SplitMix64, dims: &[u64]) -> RefTensor {
    let n = dims.iter().product::<u64>() as usize;
    RefTensor::from_f32(
        s(dims),
        DType::F32,
        (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect(),
    )
}

/// Integers of `dtype` (wrapped to its width).
pub fn ints(dtype: DType, dims: &[u64], values: &[i64]) -> RefTensor {
    assert_eq!(values.len() as u64, dims.iter().product::<u64>());
    RefTensor {
        shape: s(dims),
        dtype,
        values: Values::Int(values.iter().map(|&v| reference::wrap(dtype, v)).collect()),
    }
}

/// Random integers in `[lo, hi)` of `dtype`.
pub fn rand_ints(rng: &mut SplitMix64, dtype: DType, dims: &[u64], lo: i64, hi: i64) -> RefTensor {
    let n = dims.iter().product::<u64>() as usize;
    let v: Vec<i64> = (0..n)
        .map(|_| lo + rng.range(0, (hi - lo) as u64) as i64)
        .collect();
    ints(dtype, dims, &v)
}

/// A random shape of rank `lo..=hi` with dims in 1..=max (a 0 now and then when `zeros`).
pub fn rand_dims(rng: &mut SplitMix64, lo: u64, hi: u64, max: u64, zeros: bool) -> Vec<u64> {
    let rank = rng.range(lo, hi + 1);
    (0..rank)
        .map(|_| match rng.range(0, 14) {
            0 if zeros => 0,
            1 | 2 => 1,
            _ => rng.range(1, max + 1),
        })
        .collect()
}

/// `n` distinct axes of a rank in random order, each negative (counted from the end) half the
/// time.
pub fn rand_axes(rng: &mut SplitMix64, rank: usize, n: usize) -> Vec<i64> {
    let mut axes: Vec<i64> = (0..rank as i64).collect();
    for j in 0..axes.len() {
        let o = rng.range(0, rank as u64) as usize;
        axes.swap(j, o);
    }
    axes.truncate(n);
    for a in axes.iter_mut() {
        if rng.range(0, 2) == 0 {
            *a -= rank as i64;
        }
    }
    axes
}

/// The output shape and type `op` infers for `inputs` (integer inputs give their values as
/// shape data).
pub fn infer(op: &Op, inputs: &[&RefTensor]) -> (Shape, DType) {
    let shapes: Vec<&Shape> = inputs.iter().map(|t| &t.shape).collect();
    let data: Vec<Option<&[i64]>> = inputs
        .iter()
        .map(|t| match &t.values {
            Values::Int(v) => Some(v.as_slice()),
            Values::F32(_) => None,
        })
        .collect();
    let out = op
        .infer(&shapes, &data)
        .unwrap_or_else(|e| panic!("{}: {e}", op.name()));
    let dtypes: Vec<DType> = inputs.iter().map(|t| t.dtype).collect();
    let dtype = op
        .output_dtype(&dtypes)
        .unwrap_or_else(|e| panic!("{}: dtype {e:?}", op.name()));
    (out, dtype)
}

/// Runs `op` on the GPU at two skews and compares with the CPU reference; returns the GPU
/// output.
pub fn check(
    gpu: &Gpu,
    k: &mut Kernels,
    op: &Op,
    inputs: &[&RefTensor],
    tol: Tol,
    ctx: &str,
) -> RefTensor {
    let (out, dtype) = infer(op, inputs);
    check_out(gpu, k, op, inputs, &out, dtype, tol, ctx)
}

/// [`check`] with the output shape and type given (an op whose shape needs float values).
#[allow(clippy::too_many_arguments)]
pub fn check_out(
    gpu: &Gpu,
    k: &mut Kernels,
    op: &Op,
    inputs: &[&RefTensor],
    out: &Shape,
    dtype: DType,
    tol: Tol,
    ctx: &str,
) -> RefTensor {
    let want =
        reference::eval_op(op, inputs, out).unwrap_or_else(|e| panic!("{ctx}: reference: {e}"));
    // As stored in its type (an f16 reference value rounded as the device's would be).
    let want = want
        .to_host()
        .and_then(|h| RefTensor::from_host(&h))
        .unwrap_or_else(|e| panic!("{ctx}: reference bytes: {e}"));
    assert_eq!(want.dtype, dtype, "{ctx}: reference dtype");
    let hosts: Vec<_> = inputs
        .iter()
        .map(|t| t.to_host().unwrap_or_else(|e| panic!("{ctx}: {e}")))
        .collect();
    let engine = Engine::new(gpu.clone());
    let mut last = None;
    for skew in [0, 4] {
        let got = run_op(&engine, k, op, &hosts, out, dtype, skew)
            .unwrap_or_else(|e| panic!("{ctx} on {:?}: {e}", gpu.backend()));
        let got = RefTensor::from_host(&got).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        compare(
            &got,
            &want,
            tol,
            &format!(
                "{ctx} ({} on {:?}, skew {skew}, out {out})",
                op.name(),
                gpu.backend()
            ),
        );
        last = Some(got);
    }
    last.unwrap_or(want)
}

/// Asserts `got` matches `want` within `tol` (integers exactly; NaN matches NaN).
pub fn compare(got: &RefTensor, want: &RefTensor, tol: Tol, ctx: &str) {
    assert_eq!(got.shape, want.shape, "{ctx}: shape");
    match (&got.values, &want.values) {
        (Values::Int(g), Values::Int(w)) => assert_eq!(g, w, "{ctx}"),
        (Values::F32(g), Values::F32(w)) => {
            assert_eq!(g.len(), w.len(), "{ctx}: length");
            for (i, (&g, &w)) in g.iter().zip(w).enumerate() {
                let ok = if w.is_nan() {
                    g.is_nan()
                } else if w.is_infinite() || (tol.atol == 0.0 && tol.rtol == 0.0) {
                    g == w
                } else {
                    (g - w).abs() <= tol.atol + tol.rtol * w.abs()
                };
                assert!(ok, "{ctx}: element {i}: gpu {g} vs ref {w} (tol {tol:?})");
            }
        }
        _ => panic!("{ctx}: value kinds differ"),
    }
}
