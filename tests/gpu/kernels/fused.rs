//! The fused projections (`fused_linear`: a linear with an RMSNorm of x, a gated activation
//! and a residual folded in) against the CPU reference in every `quant` kernel, and a block
//! rewritten by `dynrt::graph::fuse` against the same block unfused, compiled and run by the
//! runtime (fewer dispatches, the same values).
//!
//! Tolerances (|gpu - ref| <= atol + rtol * |ref|):
//! * fused_linear: atol 8e-6 * K + 1e-5, rtol 1e-4 (the linear's f32 accumulation over K
//!   terms of a normalised x, whose values reach a few units; the activation's exp)
//! * fused vs unfused block: 1e-5 of the output's largest magnitude (both f32 on the
//!   device, summed in other orders; the residual stream of random weights grows to a few
//!   hundred), 1e-4 of it against the CPU reference

use super::quant::{block_len, check, layouts, s, values, weight, Tol};
use dynrt::formats::FORMATS;
use dynrt::gpu::kernels::Kernels;
use dynrt::gpu::{testing, Engine};
use dynrt::graph::ops::{
    rope_block, rope_table, rope_table_rows, BinaryOp, FusedLinear, GateAct, Rope, UnaryOp,
};
use dynrt::graph::reference;
use dynrt::graph::{Dim, Graph, GraphBuilder, NodeId, Op};
use dynrt::rng::SplitMix64;
use dynrt::runtime::{HostTensor, InferRequest, Network, NetworkOptions, RunOptions};
use dynrt::shape::DType;
use dynrt::tensor::ConstData;

fn fused_tol(k: u64) -> Tol {
    Tol {
        atol: 8e-6 * k as f32 + 1e-5,
        rtol: 1e-4,
    }
}

/// Every combination the rewrite makes, and the parts alone.
fn variants() -> Vec<FusedLinear> {
    let mut v = Vec::new();
    for norm in [None, Some(1e-5)] {
        for gate in [None, Some(GateAct::Silu), Some(GateAct::GeluTanh)] {
            for residual in [false, true] {
                if norm.is_some() || gate.is_some() || residual {
                    v.push(FusedLinear {
                        norm,
                        gate,
                        residual,
                        rope: None,
                    });
                }
            }
        }
    }
    v
}

/// The inputs of `op` for x `[m, k]` and `n` outputs: the weight (2n rows with a gate),
/// gamma, the residual.
fn inputs(
    rng: &mut SplitMix64,
    op: &FusedLinear,
    dtype: DType,
    m: u64,
    k: u64,
    n: u64,
) -> Vec<HostTensor> {
    let rows = if op.gate.is_some() { 2 * n } else { n };
    let mut v = vec![
        HostTensor::f32(s(&[m, k]), &values(rng, m * k)),
        weight(rng, dtype, rows, k),
    ];
    if op.norm.is_some() {
        v.push(HostTensor::f32(s(&[k]), &values(rng, k)));
    }
    if op.residual {
        v.push(HostTensor::f32(s(&[m, n]), &values(rng, m * n)));
    }
    v
}

/// Positions `[m]` (the last one past the table when `outside`) and a table for 40.
fn rope_inputs(m: u64, rope_dim: u64, outside: bool) -> [HostTensor; 2] {
    let mut pos: Vec<i32> = (0..m as i32).map(|i| (i * 7) % 40).collect();
    if outside {
        pos[m as usize - 1] = 4000;
    }
    let table = rope_table(10000.0, rope_dim as u32, 40);
    [
        HostTensor::i32(s(&[m]), &pos),
        HostTensor::f32(s(&[u64::from(rope_table_rows(40)), rope_dim]), &table),
    ]
}

/// One case of the kernel test: the op, the weight type, M, K, N, and with RoPE the rotated
/// elements per head.
type Case = (FusedLinear, DType, u64, u64, u64, u64);

/// The cases of the kernel test. Every variant on the formats of the models (q4_1, q8_0,
/// q4_k, q6_k, f16, f32) at M = 1, 3 (matrix-vector), 9, 70 (prefill; under the hardware
/// layout 8 is still matrix-vector, 9 and 70 the tiled kernel), odd N, two blocks of K; every
/// other format with all three parts at once; plain formats with odd K (the partial last
/// block of x and gamma element by element). RoPE on adjacent pairs and on halves, the whole
/// head rotated or half of it, with a norm and a residual or neither, on heads of 16 (three
/// of them: N = 48); at M = 9 the last position is outside the table.
fn cases() -> Vec<Case> {
    let all = FusedLinear {
        norm: Some(1e-6),
        gate: Some(GateAct::Silu),
        residual: true,
        rope: None,
    };
    let model_formats = [
        DType::Q4_1,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q6_K,
        DType::F16,
        DType::F32,
    ];
    let mut v = Vec::new();
    for dtype in FORMATS.iter().map(|f| f.dtype) {
        let kd = 2 * block_len(dtype).max(32);
        let ops = if model_formats.contains(&dtype) {
            variants()
        } else {
            vec![all]
        };
        for op in ops {
            for (m, n) in [(1, 33), (3, 5), (9, 65), (70, 7)] {
                v.push((op, dtype, m, kd, n, 0));
            }
        }
    }
    for dtype in [DType::F32, DType::F16] {
        for (m, kd, n) in [(1, 45, 9), (5, 45, 3), (70, 33, 4)] {
            v.push((all, dtype, m, kd, n, 0));
        }
    }
    for dtype in [DType::Q4_1, DType::Q8_0, DType::Q4_K, DType::F16] {
        let kd = 2 * block_len(dtype).max(32);
        for (interleaved, rope_dim) in [(true, 16), (false, 16), (false, 8), (true, 8)] {
            for (norm, residual) in [(None, false), (Some(1e-5), true)] {
                let rope = Rope {
                    head_dim: 16,
                    block: rope_block(40),
                    interleaved,
                };
                let op = FusedLinear {
                    norm,
                    gate: None,
                    residual,
                    rope: Some(rope),
                };
                for m in [1, 3, 9, 70] {
                    v.push((op, dtype, m, kd, 48, rope_dim));
                }
            }
        }
    }
    v
}

#[test]
fn fused_linear_matches_the_reference_in_every_kernel() {
    for gpu in testing::gpus_or_skip("fused_linear_matches_the_reference") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(21);
        // On GL (llvmpipe) every pipeline compiles under the adapter's one context lock,
        // which other tests wait for at most 6 s: there, the formats of the models only
        // (every variant still runs on Vulkan with every format).
        let gl = gpu.backend() == dynrt::gpu::wgpu::Backend::Gl;
        let on_gl = [DType::Q4_1, DType::Q8_0, DType::F32];
        let all = cases();
        for (i, layout) in layouts(&gpu, &k).into_iter().enumerate() {
            k.set_quant_layout(layout);
            // The adapter's own kernels take every case; the other classes' kernels (which
            // call the same epilogue code) every epilogue in q4_1 and every format with all
            // of it at a decode and a prefill shape: their pipelines compile on a software
            // adapter at a cost that the whole cross product would multiply.
            let chosen: Vec<Case> = if i == 0 {
                all.clone()
            } else {
                all.iter()
                    .copied()
                    .filter(|&(op, dtype, m, _, _, _)| {
                        dtype == DType::Q4_1
                            || (op.norm.is_some()
                                && op.gate.is_some()
                                && op.residual
                                && (m == 1 || m == 70))
                    })
                    .collect()
            };
            for (op, dtype, m, kd, n, rope_dim) in chosen {
                if gl && !on_gl.contains(&dtype) {
                    continue;
                }
                let mut ins = inputs(&mut rng, &op, dtype, m, kd, n);
                if op.rope.is_some() {
                    ins.extend(rope_inputs(m, rope_dim, m == 9));
                }
                check(
                    &gpu,
                    &mut k,
                    &Op::FusedLinear(op),
                    &ins,
                    fused_tol(kd),
                    &format!("{op:?} rope_dim {rope_dim} {layout:?} {dtype} M {m} K {kd} N {n}"),
                );
            }
        }
    }
}

/// A quantized weight `[n, k]` as a constant.
fn qweight(b: &mut GraphBuilder, rng: &mut SplitMix64, label: &str, n: u64, k: u64) -> NodeId {
    let w = weight(rng, DType::Q4_1, n, k);
    b.constant_bytes(label, w.shape, w.dtype, ConstData::from_vec(w.bytes))
}

/// Two pre-norm blocks as a decoder writes them: Q/K/V of one norm, the output projection and
/// its residual, a SwiGLU feed-forward and its residual; then a GeGLU feed-forward (gelu on
/// the gate, `mul`) and its residual. Weights in q4_1.
fn blocks(d: u64, ffn: u64) -> Graph {
    let mut rng = SplitMix64::new(8);
    let mut b = GraphBuilder::new();
    let mut x = b.input("x", &[Dim::sym("seq"), Dim::Fixed(d)], DType::F32);
    let positions = b.input("positions", &[Dim::sym("seq")], DType::I32);
    let table = b.constant(
        "table",
        s(&[u64::from(rope_table_rows(40)), 32]),
        rope_table(10000.0, 32, 40),
    );
    for l in 0..2 {
        let p = |s: &str| format!("{l}.{s}");
        let g1 = b.constant(p("g1"), s(&[d]), values(&mut rng, d));
        let h = b.rms_norm(p("norm1"), x, g1, 1e-6);
        let wq = qweight(&mut b, &mut rng, &p("wq"), d, d);
        let wk = qweight(&mut b, &mut rng, &p("wk"), d, d);
        let wv = qweight(&mut b, &mut rng, &p("wv"), d, d);
        let q = b.linear(p("q"), h, wq);
        let kk = b.linear(p("k"), h, wk);
        // RoPE on heads of 32, adjacent pairs in the first block, halves in the second.
        let rope = Rope {
            head_dim: 32,
            block: rope_block(40),
            interleaved: l == 0,
        };
        let q = b.rope(p("q.rope"), q, positions, table, rope);
        let kk = b.rope(p("k.rope"), kk, positions, table, rope);
        let v = b.linear(p("v"), h, wv);
        let qk = b.mul(p("qk"), q, kk);
        let a = b.add(p("a"), qk, v);
        let wo = qweight(&mut b, &mut rng, &p("wo"), d, d);
        let o = b.linear(p("o"), a, wo);
        x = b.add(p("res1"), x, o);
        let g2 = b.constant(p("g2"), s(&[d]), values(&mut rng, d));
        let h2 = b.rms_norm(p("norm2"), x, g2, 1e-6);
        let wg = qweight(&mut b, &mut rng, &p("wg"), ffn, d);
        let wu = qweight(&mut b, &mut rng, &p("wu"), ffn, d);
        let gate = b.linear(p("gate"), h2, wg);
        let up = b.linear(p("up"), h2, wu);
        let act = if l == 0 {
            b.binary(p("act"), BinaryOp::SiluMul, gate, up)
        } else {
            let g = b.unary(p("gelu"), UnaryOp::Gelu, gate);
            b.mul(p("act"), g, up)
        };
        let wd = qweight(&mut b, &mut rng, &p("wd"), d, ffn);
        let down = b.linear(p("down"), act, wd);
        x = b.add(p("res2"), down, x);
    }
    b.output(x);
    b.build().unwrap()
}

#[test]
fn a_fused_block_gives_the_unfused_values_in_fewer_dispatches() {
    let Some(gpu) = testing::gpu_or_skip("a_fused_block_gives_the_unfused_values") else {
        return;
    };
    let engine = Engine::new(gpu);
    let (d, ffn) = (64, 96);
    let g = blocks(d, ffn);
    let (fused_graph, report) = dynrt::graph::fuse::fuse(&g).unwrap();
    // Per block: the norms of Q/K/V and of the feed-forward, the gate, the RoPE of Q and K,
    // and three residuals (`a = qk + v` is one too: v is a projection read once).
    assert_eq!(
        (report.gated, report.norms, report.ropes, report.residuals),
        (2, 4, 4, 6)
    );
    let nets: Vec<Network> = [false, true]
        .into_iter()
        .map(|fuse| {
            let options = NetworkOptions {
                fuse,
                ..NetworkOptions::default()
            };
            Network::compile(&engine, g.clone(), options).unwrap()
        })
        .collect();
    // The compiled graph is the rewritten one.
    assert_eq!(nets[1].graph().len(), fused_graph.len());
    assert!(nets[1].graph().len() < nets[0].graph().len());
    let mut reqs: Vec<InferRequest> = nets
        .iter()
        .map(|n| {
            InferRequest::new(n, RunOptions::new(dynrt::memory::predictor::Policy::None)).unwrap()
        })
        .collect();
    let mut rng = SplitMix64::new(2);
    // Decode (matrix-vector kernels), then prefill (the prefill kernels), twice each.
    for seq in [1, 1, 5, 70, 1] {
        let xv = values(&mut rng, seq * d);
        let x = HostTensor::f32(s(&[seq, d]), &xv);
        let pos: Vec<i32> = (0..seq as i32).map(|i| i % 40).collect();
        let pos_f: Vec<f32> = pos.iter().map(|&p| p as f32).collect();
        let positions = HostTensor::i32(s(&[seq]), &pos);
        let want = reference::evaluate(
            &g,
            &[
                ("x", s(&[seq, d]), xv.clone()),
                ("positions", s(&[seq]), pos_f),
            ],
        )
        .unwrap();
        let mut outs = Vec::new();
        for r in &mut reqs {
            let before = r.stats().dispatches;
            let y = r
                .infer_blocking(&[("x", &x), ("positions", &positions)], &["1.res2"])
                .unwrap();
            outs.push((y[0].to_f32(), r.stats().dispatches - before));
        }
        let (unfused, fused) = (&outs[0], &outs[1]);
        // Errors scale with the largest values summed: the stream's largest.
        let scale = 1.0 + want[0].1.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (i, ((&a, &b), &w)) in unfused.0.iter().zip(&fused.0).zip(&want[0].1).enumerate() {
            let near = |u: f32, v: f32, tol: f32| (u - v).abs() <= tol * scale;
            assert!(
                near(b, a, 1e-5),
                "seq {seq} element {i}: unfused {a} fused {b}"
            );
            assert!(
                near(b, w, 1e-4),
                "seq {seq} element {i}: fused {b} reference {w}"
            );
        }
        // Per block unfused: norm, q, k, rope, rope, v, mul, add, o, add, norm, gate, up,
        // silu_mul, down, add (16; the GeGLU block's gelu and mul one more); fused: q, k (each
        // with its norm and RoPE), mul, v + residual, o + residual, the gated projection,
        // down + residual (7).
        assert_eq!((unfused.1, fused.1), (16 + 17, 7 + 7), "seq {seq}");
    }
}

#[test]
fn the_rewrite_can_be_turned_off() {
    let Some(gpu) = testing::gpu_or_skip("the_rewrite_can_be_turned_off") else {
        return;
    };
    let engine = Engine::new(gpu);
    let g = blocks(32, 32);
    let off = NetworkOptions {
        fuse: false,
        ..NetworkOptions::default()
    };
    let net = Network::compile(&engine, g.clone(), off).unwrap();
    assert_eq!(net.graph().len(), g.len());
    assert!(!net
        .graph()
        .nodes()
        .iter()
        .any(|n| matches!(n.op, Op::FusedLinear(_))));
    let on = Network::compile(&engine, g, NetworkOptions::default()).unwrap();
    assert!(on
        .graph()
        .nodes()
        .iter()
        .any(|n| matches!(n.op, Op::FusedLinear(_))));
}
