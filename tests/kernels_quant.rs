//! The `quant` kernels against the CPU reference: `linear` (`x · wᵀ`) with q4_1, q8_0, f16
//! and f32 weights, and the embedding `gather` from q8_0, q4_1 and f16 tables, on every test
//! backend (Vulkan/lavapipe and GL/llvmpipe unless WGPU_BACKEND picks), on seeded random
//! shapes: K multiples of 32 (any K for f16/f32, odd K included), odd N, M = 1, 3, 8 (the
//! matrix-vector kernel), 9, 64, 200 (the tiled kernel), batch dimensions, unaligned tensor
//! offsets. Then the same ops compiled into a `Network`, whose constants region holds the
//! weights in their file format.
//!
//! Weights are random values in [-1, 1) quantized with ggml's rounding
//! (`dynrt::gguf::quantize`); the reference dequantizes the same bytes on the host
//! (`tensor::decode_f32`) and accumulates in f64.
//!
//! Tolerances (|gpu - ref| <= atol + rtol * |ref|):
//! * linear: atol 2e-6 * K + 1e-5, rtol 1e-5 (f32 accumulation over K terms of |x| < 1 and
//!   |w| <= about 1; the kernels sum in a different order than the reference)
//! * gather: atol 1e-6, rtol 1e-6 (one dequantization per value: `d * q + m` may be fused
//!   into one rounding on the device and two on the host)

use dynrt::gguf::{quantize, GgmlType};
use dynrt::gpu::kernels::quant::QuantLayout;
use dynrt::gpu::kernels::run::{run_op, RunOpError};
use dynrt::gpu::kernels::{KernelError, Kernels};
use dynrt::gpu::{testing, Engine, Gpu};
use dynrt::graph::ops::{Gather, Linear};
use dynrt::graph::reference::{self, RefTensor};
use dynrt::graph::{Dim, GraphBuilder, GraphError, Op};
use dynrt::rng::SplitMix64;
use dynrt::shape::{DType, Shape};
use dynrt::tensor::HostTensor;

fn s(d: &[u64]) -> Shape {
    Shape::new(d.to_vec())
}

fn ggml(d: DType) -> GgmlType {
    match d {
        DType::Q4_1 => GgmlType::Q4_1,
        DType::Q8_0 => GgmlType::Q8_0,
        DType::F16 => GgmlType::F16,
        _ => GgmlType::F32,
    }
}

/// Random values in [-1, 1).
fn values(rng: &mut SplitMix64, n: u64) -> Vec<f32> {
    (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect()
}

/// A random `[rows, cols]` tensor of `dtype` (quantized row by row: every row is whole
/// blocks when cols is a multiple of the block).
fn weight(rng: &mut SplitMix64, dtype: DType, rows: u64, cols: u64) -> HostTensor {
    let v = values(rng, rows * cols);
    let bytes = quantize("w", ggml(dtype), &v).unwrap();
    HostTensor {
        shape: s(&[rows, cols]),
        dtype,
        bytes,
    }
}

#[derive(Debug, Clone, Copy)]
struct Tol {
    atol: f32,
    rtol: f32,
}

/// Runs `op` on `inputs` on the GPU (tensors at 256-byte multiples plus `skew` bytes) and
/// compares with the CPU reference. Returns the largest absolute error.
fn check(gpu: &Gpu, k: &mut Kernels, op: &Op, inputs: &[HostTensor], tol: Tol, ctx: &str) -> f32 {
    let shapes: Vec<&Shape> = inputs.iter().map(|t| &t.shape).collect();
    let out_shape = op
        .infer(&shapes, &[])
        .unwrap_or_else(|e| panic!("{ctx}: {e}"));
    let refs: Vec<RefTensor> = inputs
        .iter()
        .map(|t| RefTensor::from_host(t).unwrap())
        .collect();
    let ref_refs: Vec<&RefTensor> = refs.iter().collect();
    let want = reference::eval_op(op, &ref_refs, &out_shape)
        .unwrap_or_else(|e| panic!("{ctx}: reference: {e}"));
    assert_eq!(want.dtype, DType::F32, "{ctx}");
    let want = want.to_f32();
    let engine = Engine::new(gpu.clone());
    let skew = (ctx.len() as u64 % 3) * 4;
    let got = run_op(&engine, k, op, inputs, &out_shape, DType::F32, skew)
        .unwrap_or_else(|e| panic!("{ctx} on {:?}: {e}", gpu.backend()))
        .to_f32();
    assert_eq!(got.len(), want.len(), "{ctx}: length");
    let mut worst = 0f32;
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let err = (g - w).abs();
        assert!(
            err <= tol.atol + tol.rtol * w.abs(),
            "{ctx} ({} on {:?}, out {out_shape}): element {i}: gpu {g} vs ref {w} (tol {tol:?})",
            op.name(),
            gpu.backend()
        );
        worst = worst.max(err);
    }
    worst
}

fn linear_tol(k: u64) -> Tol {
    Tol {
        atol: 2e-6 * k as f32 + 1e-5,
        rtol: 1e-5,
    }
}

const GATHER_TOL: Tol = Tol {
    atol: 1e-6,
    rtol: 1e-6,
};

/// The layouts every shape runs under: the adapter's own, then both forced (a software
/// adapter with 2 and with 16 threads spreads rows differently; the hardware layout takes the
/// 64-invocation matrix-vector kernel and the workgroup-memory tiled kernel).
fn layouts(k: &Kernels) -> Vec<QuantLayout> {
    let mut v = vec![k.quant_layout()];
    for l in [
        QuantLayout::Cpu { threads: 2 },
        QuantLayout::Cpu { threads: 16 },
        QuantLayout::Gpu,
    ] {
        if !v.contains(&l) {
            v.push(l);
        }
    }
    v
}

#[test]
fn linear_matches_the_reference_for_every_weight_format_and_kernel() {
    for gpu in testing::gpus_or_skip("linear_matches_the_reference") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(12);
        let mut cases = 0;
        for layout in layouts(&k) {
            k.set_quant_layout(layout);
            for dtype in Linear::WEIGHT_TYPES {
                // (x dims, N): M = 1, 3, 8 (matrix-vector), 9, 64, 200 (prefill), batch
                // dims, odd N, a weight row count past one invocation's 64 rows.
                let shapes: [(&[u64], u64); 9] = [
                    (&[1, 64], 7),
                    (&[3, 96], 33),
                    (&[8, 32], 65),
                    (&[9, 128], 1),
                    (&[64, 64], 129),
                    (&[200, 96], 67),
                    (&[2, 3, 160], 19),
                    (&[2, 100, 32], 5),
                    (&[1, 32], 2100),
                ];
                for (i, (xd, n)) in shapes.into_iter().enumerate() {
                    let kd = *xd.last().unwrap();
                    let xv = values(&mut rng, s(xd).num_elements().unwrap());
                    let x = HostTensor::f32(s(xd), &xv);
                    let w = weight(&mut rng, dtype, n, kd);
                    check(
                        &gpu,
                        &mut k,
                        &Op::Linear(Linear),
                        &[x, w],
                        linear_tol(kd),
                        &format!("linear {layout:?} {dtype} #{i} x {xd:?} N {n}"),
                    );
                    cases += 1;
                }
            }
            // f32 and f16 take any K: odd K puts f16 rows at half-word offsets, and the last
            // partial block is read element by element (every kernel).
            for dtype in [DType::F16, DType::F32] {
                for (m, kd, n) in [(1, 45, 9), (3, 7, 5), (17, 45, 9), (70, 33, 3)] {
                    let x = HostTensor::f32(s(&[m, kd]), &values(&mut rng, m * kd));
                    let v = values(&mut rng, n * kd);
                    let bytes = quantize("w", ggml(dtype), &v).unwrap();
                    let w = HostTensor {
                        shape: s(&[n, kd]),
                        dtype,
                        bytes,
                    };
                    check(
                        &gpu,
                        &mut k,
                        &Op::Linear(Linear),
                        &[x, w],
                        linear_tol(kd),
                        &format!("linear {layout:?} {dtype} odd K M {m} K {kd} N {n}"),
                    );
                    cases += 1;
                }
            }
        }
        // Random shapes on the adapter's own layout: K a multiple of 32, N odd or not, M
        // across the kernels.
        k.set_quant_layout(QuantLayout::for_device(gpu.adapter_info().device_type));
        for dtype in Linear::WEIGHT_TYPES {
            for i in 0..6 {
                let kd = 32 * rng.range(1, 9);
                let n = rng.range(1, 150);
                let m = [1, 2, 5, 8, 9, 33, 70][rng.range(0, 7) as usize];
                let x = HostTensor::f32(s(&[m, kd]), &values(&mut rng, m * kd));
                let w = weight(&mut rng, dtype, n, kd);
                check(
                    &gpu,
                    &mut k,
                    &Op::Linear(Linear),
                    &[x, w],
                    linear_tol(kd),
                    &format!("linear {dtype} random #{i} M {m} K {kd} N {n}"),
                );
                cases += 1;
            }
        }
        assert!(cases >= 3 * (4 * 9 + 8) + 24, "{cases}");
        // One pipeline per (entry point, format) at most, every later dispatch a cache hit.
        let st = k.stats();
        assert!(st.misses <= 16, "{st:?}");
    }
}

#[test]
fn linear_refuses_partial_blocks_and_other_weight_types() {
    for gpu in testing::gpus_or_skip("linear_refuses_partial_blocks") {
        let mut k = Kernels::new(&gpu);
        let engine = Engine::new(gpu.clone());
        let mut rng = SplitMix64::new(5);
        // q4_1 rows of 48 elements: one and a half blocks.
        let x = HostTensor::f32(s(&[1, 48]), &values(&mut rng, 48));
        let w = HostTensor {
            shape: s(&[3, 48]),
            dtype: DType::Q4_1,
            bytes: vec![0; 3 * 2 * 20],
        };
        let err = run_op(
            &engine,
            &mut k,
            &Op::Linear(Linear),
            &[x.clone(), w],
            &s(&[1, 3]),
            DType::F32,
            0,
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                RunOpError::Kernel(KernelError::PartialBlock {
                    k: 48,
                    block: 32,
                    ..
                })
            ),
            "{err}"
        );
        let w = HostTensor::from_f32_values(s(&[3, 48]), DType::BF16, &[0.5; 144]).unwrap();
        let err = run_op(
            &engine,
            &mut k,
            &Op::Linear(Linear),
            &[x, w],
            &s(&[1, 3]),
            DType::F32,
            0,
        )
        .unwrap_err();
        assert!(
            matches!(err, RunOpError::Kernel(KernelError::DType { .. })),
            "{err}"
        );
    }
    // At build time: a bf16 weight, naming the node.
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[Dim::sym("seq"), Dim::Fixed(32)], DType::F32);
    let w = b.input("w", &[Dim::Fixed(4), Dim::Fixed(32)], DType::BF16);
    let y = b.linear("proj", x, w);
    b.output(y);
    let err = b.build().unwrap_err();
    assert!(
        matches!(&err, GraphError::DType { node, .. } if node == "proj"),
        "{err}"
    );
    assert!(err.to_string().contains("q4_1, q8_0, f16 or f32"), "{err}");
}

#[test]
fn gather_dequantizes_rows_of_q8_0_q4_1_and_f16_tables() {
    for gpu in testing::gpus_or_skip("gather_dequantizes_rows") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(21);
        for dtype in [DType::Q8_0, DType::Q4_1, DType::F16] {
            for (v, d, ids) in [
                (50u64, 64u64, vec![3i32, 0, 49]),
                (7, 32, vec![6, -1, 7, 2, 2]),
                (300, 576, vec![299, 1, 150]),
            ] {
                let table = weight(&mut rng, dtype, v, d);
                let ids = HostTensor::i32(s(&[ids.len() as u64]), &ids);
                check(
                    &gpu,
                    &mut k,
                    &Op::Gather(Gather),
                    &[table, ids],
                    GATHER_TOL,
                    &format!("gather {dtype} [{v}, {d}]"),
                );
            }
            // Ids with batch dimensions.
            let table = weight(&mut rng, dtype, 40, 96);
            let ids = HostTensor::i32(s(&[2, 3]), &[1, 39, 0, 5, 40, 12]);
            check(
                &gpu,
                &mut k,
                &Op::Gather(Gather),
                &[table, ids],
                GATHER_TOL,
                &format!("gather {dtype} batch ids"),
            );
        }
        // f16 rows of odd length start at half-word offsets.
        let v = values(&mut rng, 9 * 15);
        let table = HostTensor {
            shape: s(&[9, 15]),
            dtype: DType::F16,
            bytes: quantize("t", GgmlType::F16, &v).unwrap(),
        };
        let ids = HostTensor::i32(s(&[4]), &[8, 3, 0, 5]);
        check(
            &gpu,
            &mut k,
            &Op::Gather(Gather),
            &[table, ids],
            GATHER_TOL,
            "gather f16 odd rows",
        );
    }
}
