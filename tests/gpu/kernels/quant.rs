//! The `quant` kernels against the CPU reference: `linear` (`x · wᵀ`) with weights in every
//! format of `dynrt::formats` (f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k .. q6_k, q4_nb),
//! and the embedding `gather` from tables in every format but f32, on every test
//! backend (Vulkan/lavapipe and GL/llvmpipe unless WGPU_BACKEND picks), on seeded random
//! shapes: K multiples of the format's block (32 or 256; any K for f16/bf16/f32, odd K
//! included), odd N, M = 1, 3, 8, 9, 64,
//! 200 and batch dimensions (so the matrix-vector kernel and both prefill kernels), unaligned
//! tensor offsets, under every `QuantLayout` (the adapter's own, then the software and the
//! hardware layouts forced). Then the same ops compiled into a `Network`, whose constants
//! region holds the weights in their file format, and the real model's tensors when it is
//! fetched (`dynrt fetch`; skipped otherwise unless `DYNRT_REQUIRE_MODEL=1`).
//!
//! Weights are random values in [-1, 1) quantized by each format's quantizer
//! (`Format::quantize_all`); the reference dequantizes the same bytes on the host
//! (`tensor::decode_f32`) and accumulates in f64.
//!
//! Tolerances (|gpu - ref| <= atol + rtol * |ref|):
//! * linear: atol 2e-6 * K + 1e-5, rtol 1e-5 (f32 accumulation over K terms of |x| < 1 and
//!   |w| <= about 1; the kernels sum in a different order than the reference)
//! * gather: atol 1e-6, rtol 1e-6 (one dequantization per value: `d * q + m` may be fused
//!   into one rounding on the device and two on the host)

use dynrt::formats::FORMATS;
use dynrt::gguf::GgmlType;
use dynrt::gpu::kernels::quant::QuantLayout;
use dynrt::gpu::kernels::run::{run_op, run_op_in, RunOpError};
use dynrt::gpu::kernels::{KernelError, Kernels, WeightLayout};
use dynrt::gpu::{testing, Engine, Gpu};
use dynrt::graph::ops::{Gather, Linear};
use dynrt::graph::reference::{self, RefTensor};
use dynrt::graph::{Dim, GraphBuilder, GraphError, Op};
use dynrt::rng::SplitMix64;
use dynrt::shape::{DType, Shape};
use dynrt::tensor::HostTensor;

pub(super) fn s(d: &[u64]) -> Shape {
    Shape::new(d.to_vec())
}

/// `v` quantized to `d` by the format's quantizer (whole blocks).
fn quantize(d: DType, v: &[f32]) -> Vec<u8> {
    dynrt::formats::of_dtype(d)
        .unwrap_or_else(|| panic!("{d} is no weight format"))
        .quantize_all(v)
        .unwrap_or_else(|| panic!("{} values are not whole {d} blocks", v.len()))
}

/// Elements per block of `d` (1 for plain formats).
pub(super) fn block_len(d: DType) -> u64 {
    d.block().map_or(1, |b| u64::from(b.elements))
}

/// Random values in [-1, 1).
pub(super) fn values(rng: &mut SplitMix64, n: u64) -> Vec<f32> {
    (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect()
}

/// A random `[rows, cols]` tensor of `dtype` (quantized row by row: every row is whole
/// blocks when cols is a multiple of the block).
pub(super) fn weight(rng: &mut SplitMix64, dtype: DType, rows: u64, cols: u64) -> HostTensor {
    let v = values(rng, rows * cols);
    let bytes = quantize(dtype, &v);
    HostTensor {
        shape: s(&[rows, cols]),
        dtype,
        bytes,
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Tol {
    pub(super) atol: f32,
    pub(super) rtol: f32,
}

/// Runs `op` on `inputs` on the GPU (tensors at 256-byte multiples plus `skew` bytes) and
/// compares with the CPU reference. Returns the largest absolute error.
pub(super) fn check(
    gpu: &Gpu,
    k: &mut Kernels,
    op: &Op,
    inputs: &[HostTensor],
    tol: Tol,
    ctx: &str,
) -> f32 {
    check_grouped(gpu, k, op, inputs, None, tol, ctx)
}

/// [`check`], with input `grouped` (when given) handed to the kernel in its format's grouped
/// layout (`dynrt::formats::regroup` of its bytes) while the reference reads the file's.
fn check_grouped(
    gpu: &Gpu,
    k: &mut Kernels,
    op: &Op,
    inputs: &[HostTensor],
    grouped: Option<usize>,
    tol: Tol,
    ctx: &str,
) -> f32 {
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
    let mut on_device = inputs.to_vec();
    let mut layouts = vec![WeightLayout::File; inputs.len()];
    if let Some(i) = grouped {
        let f = dynrt::formats::of_dtype(inputs[i].dtype).unwrap();
        on_device[i].bytes = dynrt::formats::regroup(f, &inputs[i].bytes)
            .unwrap_or_else(|| panic!("{ctx}: no grouped layout"));
        layouts[i] = WeightLayout::Grouped;
    }
    let got = run_op_in(
        &engine,
        k,
        op,
        &on_device,
        &layouts,
        &out_shape,
        DType::F32,
        skew,
    )
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

pub(super) fn linear_tol(k: u64) -> Tol {
    Tol {
        atol: 2e-6 * k as f32 + 1e-5,
        rtol: 1e-5,
    }
}

const GATHER_TOL: Tol = Tol {
    atol: 1e-6,
    rtol: 1e-6,
};

/// The layouts every shape runs under: the adapter's own, then the others forced (a software
/// adapter with 2 and with 16 threads spreads rows differently; the hardware layout with the
/// adapter's subgroups: on lavapipe (8) the subgroup matrix-vector kernel, on GL (none) the
/// 64-invocation one; both with the prefill GEMM).
pub(super) fn layouts(gpu: &Gpu, k: &Kernels) -> Vec<QuantLayout> {
    let mut v = vec![k.quant_layout()];
    for l in [
        QuantLayout::Cpu { threads: 2 },
        QuantLayout::Cpu { threads: 16 },
        QuantLayout::gpu_class(gpu),
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
        for layout in layouts(&gpu, &k) {
            k.set_quant_layout(layout);
            for dtype in FORMATS.iter().map(|f| f.dtype) {
                // (x dims with K in blocks of 32 elements, N): M = 1, 3, 8 (matrix-vector),
                // 9, 64, 200 (prefill), batch dims, odd N, a weight row count past one
                // invocation's 64 rows. K counts blocks of 32, or of 256 for the k-quants
                // (rows of 1 to 5 super-blocks).
                let shapes: [(&[u64], u64); 9] = [
                    (&[1, 2], 7),
                    (&[3, 3], 33),
                    (&[8, 1], 65),
                    (&[9, 4], 1),
                    (&[64, 2], 129),
                    (&[200, 3], 67),
                    (&[2, 3, 5], 19),
                    (&[2, 100, 1], 5),
                    (&[1, 1], 2100),
                ];
                for (i, (xd, n)) in shapes.into_iter().enumerate() {
                    let kd = *xd.last().unwrap() * block_len(dtype).max(32);
                    let xd = [&xd[..xd.len() - 1], &[kd][..]].concat();
                    let xd = &xd[..];
                    let xv = values(&mut rng, s(xd).num_elements().unwrap());
                    let x = HostTensor::f32(s(xd), &xv);
                    let w = weight(&mut rng, dtype, n, kd);
                    // Shapes 0, 3 and 6 (matrix-vector and prefill) place x on a vec4 (the
                    // kernels read it as vec4s), the others 1 or 2 elements past one.
                    let mut ctx = format!("linear {layout:?} {dtype} #{i} x {xd:?} N {n}");
                    while ctx.len() % 3 != i % 3 {
                        ctx.push(' ');
                    }
                    check(
                        &gpu,
                        &mut k,
                        &Op::Linear(Linear),
                        &[x, w],
                        linear_tol(kd),
                        &ctx,
                    );
                    cases += 1;
                }
            }
            // f32 and f16 take any K: odd K puts f16 rows at half-word offsets, and the last
            // partial block is read element by element (every kernel).
            for dtype in [DType::F16, DType::BF16, DType::F32] {
                for (m, kd, n) in [(1, 45, 9), (3, 7, 5), (17, 45, 9), (70, 33, 3)] {
                    let x = HostTensor::f32(s(&[m, kd]), &values(&mut rng, m * kd));
                    let v = values(&mut rng, n * kd);
                    let bytes = quantize(dtype, &v);
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
        k.set_quant_layout(QuantLayout::of(&gpu));
        for dtype in FORMATS.iter().map(|f| f.dtype) {
            for i in 0..6 {
                let kd = block_len(dtype).max(32) * rng.range(1, 9);
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
        assert!(
            cases >= 3 * (FORMATS.len() * 9 + 12) + 6 * FORMATS.len(),
            "{cases}"
        );
        // One pipeline per (entry point, format, x as f32s or vec4s, rows of x of the
        // subgroup kernel) at most, every later dispatch a cache hit.
        let st = k.stats();
        assert!(st.misses <= 12 * FORMATS.len() as u64, "{st:?}");
        // The GPU class's kernels ran: the GEMM, and the subgroup kernel where the adapter
        // has subgroups (lavapipe).
        assert!(k.has_pipeline("quantx4_mm") && k.has_pipeline("quant_mm"));
        let sg = matches!(
            QuantLayout::gpu_class(&gpu),
            QuantLayout::Gpu { subgroup: Some(_) }
        );
        assert_eq!(k.has_pipeline("quantsg_matvec"), sg);
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
        // q4_k rows of 288 elements: one super-block and a bit.
        let x288 = HostTensor::f32(s(&[1, 288]), &values(&mut rng, 288));
        let w = HostTensor {
            shape: s(&[3, 288]),
            dtype: DType::Q4_K,
            bytes: vec![0; 3 * 2 * 144],
        };
        let err = run_op(
            &engine,
            &mut k,
            &Op::Linear(Linear),
            &[x288, w],
            &s(&[1, 3]),
            DType::F32,
            0,
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                RunOpError::Kernel(KernelError::PartialBlock {
                    k: 288,
                    block: 256,
                    ..
                })
            ),
            "{err}"
        );
        let w = HostTensor::from_f32_values(s(&[3, 48]), DType::I8, &[1.0; 144]).unwrap();
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
    // At build time: an i8 weight, naming the node.
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[Dim::sym("seq"), Dim::Fixed(32)], DType::F32);
    let w = b.input("w", &[Dim::Fixed(4), Dim::Fixed(32)], DType::I8);
    let y = b.linear("proj", x, w);
    b.output(y);
    let err = b.build().unwrap_err();
    assert!(
        matches!(&err, GraphError::DType { node, .. } if node == "proj"),
        "{err}"
    );
    assert!(err.to_string().contains("q4_1, q5_0"), "{err}");
    assert!(err.to_string().contains("q6_k"), "{err}");
}

/// Weights in the grouped layout (what the runtime reorders q4_0 and q5_0 weights into, and q8_0's,
/// `dynrt::formats::Grouped`): linear in every kernel and gather give the reference of the
/// file's bytes; a grouped weight that is not whole groups is refused.
#[test]
fn grouped_weights_match_the_reference_in_every_kernel() {
    for gpu in testing::gpus_or_skip("grouped_weights_match_the_reference") {
        let gl = gpu.backend() == dynrt::gpu::wgpu::Backend::Gl;
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(33);
        for layout in layouts(&gpu, &k) {
            k.set_quant_layout(layout);
            for dtype in [DType::Q4_0, DType::Q5_0, DType::Q8_0] {
                // On GL every pipeline compiles under one context lock (see the fused test).
                if gl && dtype != DType::Q8_0 {
                    continue;
                }
                // N = 24 rows of K = 96: 72 blocks, 9 groups, most spanning two rows.
                let (n, kd) = (24, 96);
                let w = weight(&mut rng, dtype, n, kd);
                for m in [1, 3, 9, 64] {
                    let x = HostTensor::f32(s(&[m, kd]), &values(&mut rng, m * kd));
                    check_grouped(
                        &gpu,
                        &mut k,
                        &Op::Linear(Linear),
                        &[x, w.clone()],
                        Some(1),
                        linear_tol(kd),
                        &format!("grouped linear {layout:?} {dtype} M {m}"),
                    );
                }
                let ids = HostTensor::i32(s(&[5]), &[0, 23, 7, -1, 12]);
                check_grouped(
                    &gpu,
                    &mut k,
                    &Op::Gather(Gather { axis: 0 }),
                    &[w.clone(), ids],
                    Some(0),
                    GATHER_TOL,
                    &format!("grouped gather {layout:?} {dtype}"),
                );
            }
        }
        // 3 rows of 32: 3 blocks, not a whole group.
        let w = weight(&mut rng, DType::Q8_0, 3, 32);
        let x = HostTensor::f32(s(&[1, 32]), &values(&mut rng, 32));
        let engine = Engine::new(gpu.clone());
        let err = run_op_in(
            &engine,
            &mut k,
            &Op::Linear(Linear),
            &[x, w],
            &[WeightLayout::File, WeightLayout::Grouped],
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
}

#[test]
fn gather_dequantizes_rows_of_every_table_format() {
    for gpu in testing::gpus_or_skip("gather_dequantizes_rows") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(21);
        let tables = FORMATS.iter().map(|f| f.dtype).filter(|&d| d != DType::F32);
        for dtype in tables {
            // Row lengths in blocks of 32 (or 256 for the k-quants): 2, 1, 18 (SmolLM2's
            // 576) and 3 of 256.
            let unit = block_len(dtype).max(32);
            let long = if unit == 256 { 3 } else { 18 };
            for (v, d, ids) in [
                (50u64, 2 * unit, vec![3i32, 0, 49]),
                (7, unit, vec![6, -1, -7, 2, 2]),
                (300, long * unit, vec![299, 1, 150]),
            ] {
                let table = weight(&mut rng, dtype, v, d);
                let ids = HostTensor::i32(s(&[ids.len() as u64]), &ids);
                check(
                    &gpu,
                    &mut k,
                    &Op::Gather(Gather::default()),
                    &[table, ids],
                    GATHER_TOL,
                    &format!("gather {dtype} [{v}, {d}]"),
                );
            }
            // Ids with batch dimensions (out-of-range ids are errors of the reference and
            // of the runtime's checks: tests/hostile; here every id is in range, -40 the
            // lowest).
            let table = weight(&mut rng, dtype, 40, 3 * unit);
            let ids = HostTensor::i32(s(&[2, 3]), &[1, 39, 0, 5, -40, 12]);
            check(
                &gpu,
                &mut k,
                &Op::Gather(Gather::default()),
                &[table, ids],
                GATHER_TOL,
                &format!("gather {dtype} batch ids"),
            );
        }
        // f16 and bf16 rows of odd length start at half-word offsets.
        for dtype in [DType::F16, DType::BF16] {
            let v = values(&mut rng, 9 * 15);
            let table = HostTensor {
                shape: s(&[9, 15]),
                dtype,
                bytes: quantize(dtype, &v),
            };
            let ids = HostTensor::i32(s(&[4]), &[8, 3, 0, 5]);
            check(
                &gpu,
                &mut k,
                &Op::Gather(Gather::default()),
                &[table, ids],
                GATHER_TOL,
                &format!("gather {dtype} odd rows"),
            );
        }
    }
}

/// `t` as a constant of the graph being built.
fn constant(b: &mut GraphBuilder, label: &str, t: &HostTensor) -> dynrt::graph::NodeId {
    b.constant_bytes(
        label,
        t.shape.clone(),
        t.dtype,
        dynrt::tensor::ConstData::from_vec(t.bytes.clone()),
    )
}

/// `update_weights` in the runtime: a network's q4_0 table (read by a gather and by a tied
/// head; 4.7 MB, so reordered in two pieces) and q5_0 projection are reordered into grouped
/// planes when it is compiled, in place,
/// and its q8_0 projection is not (the kernels read q8_0 best in the file layout): the same
/// outputs bit for bit as the network compiled without the reorder, the constants region no
/// larger, one scratch buffer of the reorder kept and nothing more, and a network
/// specialised from it (the same weights: a cache hit) reorders nothing.
#[test]
fn compiled_weights_are_reordered_once_in_place() {
    use dynrt::memory::accounting::region_index;
    use dynrt::memory::predictor::Policy;
    use dynrt::memory::regions::Region;
    use dynrt::memory::AllocKind;
    use dynrt::runtime::{InferRequest, Network, NetworkOptions, RunOptions};
    for gpu in testing::gpus_or_skip("compiled_weights_are_reordered_once") {
        let mut rng = SplitMix64::new(41);
        let (vocab, d, hidden) = (4096u64, 2048u64, 96u64);
        let table = weight(&mut rng, DType::Q4_0, vocab, d);
        let w1 = weight(&mut rng, DType::Q8_0, hidden, d);
        let w2 = weight(&mut rng, DType::Q5_0, d, hidden);
        let grouped_bytes = (table.bytes.len() + w2.bytes.len()) as u64;
        let mut b = GraphBuilder::new();
        let ids = b.input("ids", &[Dim::sym("seq")], DType::I32);
        let table_c = constant(&mut b, "token_embd", &table);
        let w1_c = constant(&mut b, "w1", &w1);
        let w2_c = constant(&mut b, "w2", &w2);
        let emb = b.gather("emb", table_c, ids);
        let y1 = b.linear("proj1", emb, w1_c);
        let y2 = b.linear("proj2", y1, w2_c);
        let head = b.linear("head", y2, table_c);
        b.output(head);
        let g = b.build().unwrap();
        let mut runs = Vec::new();
        for regroup_weights in [false, true] {
            let engine = Engine::new(gpu.clone());
            let options = NetworkOptions {
                regroup_weights,
                ..NetworkOptions::default()
            };
            let net = Network::compile(&engine, g.clone(), options.clone()).unwrap();
            let stats = engine.stats();
            let constants = stats.regions[region_index(Region::Constants).unwrap()].current_bytes;
            let device = stats.kind(AllocKind::UsmDevice);
            assert_eq!(
                net.grouped_weight_bytes(),
                if regroup_weights { grouped_bytes } else { 0 }
            );
            // The same weights again: nothing reordered, nothing allocated.
            let sibling = net.specialize(options).unwrap();
            assert_eq!(sibling.grouped_weight_bytes(), net.grouped_weight_bytes());
            assert_eq!(
                engine.stats().kind(AllocKind::UsmDevice).allocations,
                device.allocations
            );
            let mut req = InferRequest::new(&net, RunOptions::new(Policy::Adaptive)).unwrap();
            let mut outs = Vec::new();
            for seq in [1u64, 12] {
                let id_values: Vec<i32> = (0..seq).map(|i| ((i * 17 + 3) % vocab) as i32).collect();
                let got = req
                    .infer_blocking(
                        &[("ids", &HostTensor::i32(s(&[seq]), &id_values))],
                        &["head"],
                    )
                    .unwrap();
                let want = reference::evaluate(
                    &g,
                    &[(
                        "ids",
                        s(&[seq]),
                        id_values.iter().map(|&v| v as f32).collect(),
                    )],
                )
                .unwrap();
                let got = got[0].to_f32();
                // Three projections deep: the tolerance of the longest, scaled by the outputs.
                let tol = linear_tol(d);
                let scale = want[0].1.iter().fold(1f32, |a, v| a.max(v.abs()));
                for (i, (&g, &w)) in got.iter().zip(&want[0].1).enumerate() {
                    assert!(
                        (g - w).abs() <= 8.0 * scale * (tol.atol + tol.rtol * w.abs()),
                        "regroup {regroup_weights} seq {seq} element {i}: {g} vs {w}"
                    );
                }
                outs.push(got);
            }
            drop(req);
            runs.push((outs, constants, device.current_bytes));
        }
        let ((plain, c0, d0), (grouped, c1, d1)) = (&runs[0], &runs[1]);
        assert_eq!(plain, grouped, "the grouped weights give other values");
        assert_eq!(c0, c1, "the constants region grew");
        // The reorder's one scratch buffer (at most 4 MiB, rounded to a whole group of
        // blocks) stays with the network family for the conversions of later iterations;
        // nothing else is added. Freeing it at the end of the compile left a cached dispatch
        // bound to it (an iteration's submit then failed validation): known, to be fixed
        // with the weights cache's bind groups.
        assert!(
            d1 >= d0 && d1 - d0 <= 4 << 20,
            "device bytes after the compile: {d1} with the reorder against {d0} without"
        );
    }
}

#[test]
fn a_network_keeps_quantized_weights_in_their_file_format_and_matches_the_reference() {
    // An embedding lookup in a q8_0 table, a q4_1 projection and an f16 one, compiled into a
    // Network: the constants region holds the weights' own bytes (each padded to a word and
    // placed at the storage offset alignment), and decode (1 token: the matrix-vector
    // kernel) and prefill (12 tokens: a prefill kernel) match the CPU reference.
    use dynrt::memory::accounting::region_index;
    use dynrt::memory::predictor::Policy;
    use dynrt::memory::regions::Region;
    use dynrt::runtime::{InferRequest, Network, NetworkOptions, RunOptions};
    for gpu in testing::gpus_or_skip("a_network_keeps_quantized_weights") {
        let engine = Engine::new(gpu.clone());
        let mut rng = SplitMix64::new(40);
        let (vocab, d, hidden, out) = (50u64, 64u64, 96u64, 40u64);
        let table = weight(&mut rng, DType::Q8_0, vocab, d);
        let w1 = weight(&mut rng, DType::Q4_1, hidden, d);
        let w2 = weight(&mut rng, DType::F16, out, hidden);
        let weight_bytes = (table.bytes.len() + w1.bytes.len() + w2.bytes.len()) as u64;
        let mut b = GraphBuilder::new();
        let ids = b.input("ids", &[Dim::sym("seq")], DType::I32);
        let x = b.input("x", &[Dim::sym("seq"), Dim::Fixed(d)], DType::F32);
        let table_c = constant(&mut b, "token_embd", &table);
        let w1_c = constant(&mut b, "w1", &w1);
        let w2_c = constant(&mut b, "w2", &w2);
        let emb = b.gather("emb", table_c, ids);
        let h = b.add("h", emb, x);
        let y1 = b.linear("proj1", h, w1_c);
        let y = b.linear("proj2", y1, w2_c);
        b.output(y);
        let g = b.build().unwrap();
        let net = Network::compile(&engine, g.clone(), NetworkOptions::default()).unwrap();
        let constants = engine.stats().regions[region_index(Region::Constants).unwrap()];
        let align = u64::from(gpu.limits().min_storage_buffer_offset_alignment).max(4);
        assert!(
            constants.current_bytes >= weight_bytes
                && constants.current_bytes <= weight_bytes + 3 * align,
            "{constants:?} for {weight_bytes} weight bytes"
        );
        let mut req = InferRequest::new(&net, RunOptions::new(Policy::Adaptive)).unwrap();
        for seq in [1u64, 12, 1] {
            let id_values: Vec<i32> = (0..seq).map(|i| ((i * 17 + 3) % vocab) as i32).collect();
            let xv = values(&mut rng, seq * d);
            let want = reference::evaluate(
                &g,
                &[
                    (
                        "ids",
                        s(&[seq]),
                        id_values.iter().map(|&v| v as f32).collect(),
                    ),
                    ("x", s(&[seq, d]), xv.clone()),
                ],
            )
            .unwrap();
            let got = req
                .infer_blocking(
                    &[
                        ("ids", &HostTensor::i32(s(&[seq]), &id_values)),
                        ("x", &HostTensor::f32(s(&[seq, d]), &xv)),
                    ],
                    &["proj2"],
                )
                .unwrap();
            let got = got[0].to_f32();
            assert_eq!(got.len(), want[0].1.len());
            let tol = linear_tol(hidden);
            for (i, (&g, &w)) in got.iter().zip(&want[0].1).enumerate() {
                assert!(
                    (g - w).abs() <= 4.0 * (tol.atol + tol.rtol * w.abs()),
                    "seq {seq} element {i}: {g} vs {w}"
                );
            }
        }
    }
}

#[test]
fn the_real_models_weights_give_the_references_projections_and_tied_head() {
    // SmolLM2-135M's own tensors (when fetched): a q4_1 attention projection, the q4_1 down
    // projection (K = 1536) and the q8_0 embedding as the tied output head (49152 rows), at
    // M = 1 and M = 5 (both kinds of kernel on every layout), and the embedding lookup.
    let Some(path) = dynrt::fetch::model_or_skip("the_real_models_weights") else {
        return;
    };
    let model = dynrt::gguf::MappedGguf::open(&path).unwrap();
    let tensor = |name: &str| {
        let info = model.gguf().require_tensor(name).unwrap();
        let dtype = match info.ggml_type() {
            GgmlType::Q4_1 => DType::Q4_1,
            GgmlType::Q8_0 => DType::Q8_0,
            t => panic!("{name}: {t}"),
        };
        HostTensor {
            shape: s(&[info.num_rows(), info.row_len()]),
            dtype,
            bytes: model.tensor_bytes(name).unwrap().to_vec(),
        }
    };
    let q = tensor("blk.0.attn_q.weight");
    let down = tensor("blk.0.ffn_down.weight");
    let embd = tensor("token_embd.weight");
    assert_eq!((q.dtype, embd.dtype), (DType::Q4_1, DType::Q8_0));
    for gpu in testing::gpus_or_skip("the_real_models_weights") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(7);
        for layout in layouts(&gpu, &k) {
            k.set_quant_layout(layout);
            for m in [1u64, 5] {
                for w in [&q, &down, &embd] {
                    let kd = w.shape.dims()[1];
                    let x = HostTensor::f32(s(&[m, kd]), &values(&mut rng, m * kd));
                    check(
                        &gpu,
                        &mut k,
                        &Op::Linear(Linear),
                        &[x, w.clone()],
                        linear_tol(kd),
                        &format!("{layout:?} M {m} {} {}", w.dtype, w.shape),
                    );
                }
            }
        }
        let ids = HostTensor::i32(s(&[4]), &[1, 2, 49151, 9906]);
        check(
            &gpu,
            &mut k,
            &Op::Gather(Gather::default()),
            &[embd.clone(), ids],
            GATHER_TOL,
            "token_embd gather",
        );
    }
}
