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
use dynrt::gpu::kernels::quant::QuantLayout;
use dynrt::gpu::kernels::Kernels;
use dynrt::gpu::{testing, Engine};
use dynrt::graph::ops::fused_linear::PLAIN;
use dynrt::graph::ops::{
    rope_block, rope_table, rope_table_rows, BinaryOp, FusedLinear, GateAct, HeadNorm, KvSplit,
    Rope, UnaryOp,
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
                        ..PLAIN
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
        ..PLAIN
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
                    residual,
                    rope: Some(rope),
                    ..PLAIN
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

/// An attention block's epilogues (`shaders/quant.wgsl` bits 6-10): the biases, head norms
/// and post-norm through every kernel (the segment kernels at M = 1 and 3, the products and
/// `quant_segment_finish` at M = 9 and 70), and Q/K/V as one projection over three weights of
/// different formats, whose queries are checked here (its keys and values, which it writes
/// into the KV cache, by the runtime test below). Heads of 16; the parameters vector holds
/// gamma, the biases, the head norms' weights and the post-norm's as the op orders them.
#[test]
fn attention_block_epilogues_match_the_reference_in_every_kernel() {
    for gpu in testing::gpus_or_skip("attention_block_epilogues_match_the_reference") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(23);
        let gl = gpu.backend() == dynrt::gpu::wgpu::Backend::Gl;
        let rope = |halves: bool| Rope {
            head_dim: 16,
            block: rope_block(40),
            interleaved: !halves,
        };
        let head_norm = Some(HeadNorm {
            head_dim: 16,
            eps: 1e-6,
        });
        let kv = |slots: bool| Some(KvSplit { kv_rows: 16, slots });
        // (op, weight formats (queries, keys, values), rows of the queries' weight)
        let cases: Vec<(FusedLinear, [DType; 3], u64)> = vec![
            (
                FusedLinear {
                    norm: Some(1e-5),
                    bias: true,
                    rope: Some(rope(true)),
                    ..PLAIN
                },
                [DType::Q4_1; 3],
                48,
            ),
            (
                FusedLinear {
                    norm: Some(1e-5),
                    head_norm,
                    rope: Some(rope(true)),
                    ..PLAIN
                },
                [DType::Q8_0; 3],
                48,
            ),
            (
                FusedLinear {
                    head_norm,
                    rope: Some(rope(false)),
                    ..PLAIN
                },
                [DType::F16; 3],
                32,
            ),
            (
                FusedLinear {
                    post_norm: Some(1e-6),
                    residual: true,
                    ..PLAIN
                },
                [DType::Q4_K; 3],
                40,
            ),
            // A row longer than the segment kernels hold (SEG_MAX): every kernel stores the
            // products, quant_segment_finish reads them back where they were stored.
            (
                FusedLinear {
                    post_norm: Some(1e-6),
                    residual: true,
                    ..PLAIN
                },
                [DType::Q8_0; 3],
                dynrt::gpu::kernels::quant::SEG_MAX + 100,
            ),
            (
                FusedLinear {
                    norm: Some(1e-5),
                    bias: true,
                    kv: kv(false),
                    rope: Some(rope(true)),
                    ..PLAIN
                },
                [DType::Q5_0, DType::Q5_0, DType::Q8_0],
                32,
            ),
            (
                FusedLinear {
                    norm: Some(1e-5),
                    head_norm,
                    kv: kv(true),
                    rope: Some(rope(true)),
                    ..PLAIN
                },
                [DType::Q4_1, DType::Q6_K, DType::F32],
                32,
            ),
            (
                FusedLinear {
                    norm: Some(1e-5),
                    kv: kv(false),
                    rope: Some(rope(false)),
                    ..PLAIN
                },
                [DType::Q4_1; 3],
                64,
            ),
        ];
        // Every layout of the linear tests, and the hardware class without subgroups too (its
        // 64-invocation matrix-vector kernel; on GL it is the class itself).
        let mut all = layouts(&gpu, &k);
        if !all.contains(&QuantLayout::Gpu { subgroup: None }) {
            all.push(QuantLayout::Gpu { subgroup: None });
        }
        for layout in all {
            k.set_quant_layout(layout);
            for (op, formats, nq) in &cases {
                if gl
                    && formats
                        .iter()
                        .any(|f| ![DType::Q4_1, DType::Q8_0].contains(f))
                {
                    continue;
                }
                let kd = 2 * formats
                    .iter()
                    .map(|&f| block_len(f).max(32))
                    .max()
                    .unwrap_or(32);
                for m in [1, 3, 9, 70] {
                    // x on a vec4 (the kernels that read it as vec4s, the subgroup kernel)
                    // and one element past one (those that read f32s).
                    for skew in [0, 1] {
                        let ins = epilogue_inputs(&mut rng, op, *formats, m, kd, *nq);
                        check(
                            &gpu,
                            &mut k,
                            &Op::FusedLinear(*op),
                            &ins,
                            fused_tol(kd),
                            &skewed(
                                format!("{op:?} {formats:?} {layout:?} M {m} K {kd} Nq {nq}"),
                                skew,
                            ),
                        );
                    }
                }
            }
        }
        // The kernels meant ran: both classes' segment kernels and the finishing pass, the
        // matrix-vector and prefill kernels of both classes, in both readings of x, and the
        // subgroup kernel where the adapter has subgroups.
        for entry in [
            "segment_wg8",
            "segment_wg64",
            "segment_finish",
            "matvec_wg8",
            "regtile",
            "mm",
        ] {
            for family in ["quant", "quantx4"] {
                let name = format!("{family}_{entry}");
                assert!(k.has_pipeline(&name), "{name} did not run");
            }
        }
        assert!(k.has_pipeline("quant_matvec_coop"));
        let sg = matches!(
            QuantLayout::gpu_class(&gpu),
            QuantLayout::Gpu { subgroup: Some(_) }
        );
        assert_eq!(k.has_pipeline("quantsg_matvec"), sg);
    }
}

/// `ctx` padded so that `check` places x `skew` elements past a vec4 (it skews the inputs
/// by the context's length).
pub(super) fn skewed(mut ctx: String, skew: usize) -> String {
    while ctx.len() % 3 != skew {
        ctx.push(' ');
    }
    ctx
}

/// The inputs of an epilogue case: x, the weights, the parameters, the residual, the
/// integers, the table, and with a KV split its destinations (zeros: the kernel writes them,
/// the check reads the queries).
pub(super) fn epilogue_inputs(
    rng: &mut SplitMix64,
    op: &FusedLinear,
    formats: [DType; 3],
    m: u64,
    k: u64,
    nq: u64,
) -> Vec<HostTensor> {
    let kv = op.kv.map_or(0, |kv| u64::from(kv.kv_rows));
    let mut v = vec![HostTensor::f32(s(&[m, k]), &values(rng, m * k))];
    v.push(weight(rng, formats[0], nq, k));
    if op.kv.is_some() {
        v.push(weight(rng, formats[1], kv, k));
        v.push(weight(rng, formats[2], kv, k));
    }
    let n_all = nq + 2 * kv;
    let at = op.param_offsets(k as usize, n_all as usize, nq as usize);
    if op.has_params() {
        // Norm weights around 1, biases around 0.
        let p: Vec<f32> = (0..at.len)
            .map(|i| {
                let v = rng.uniform(-1.0, 1.0);
                if (at.bias..at.bias + n_all as usize).contains(&i) && op.bias {
                    v
                } else {
                    1.0 + 0.5 * v
                }
            })
            .collect();
        v.push(HostTensor::f32(s(&[at.len as u64]), &p));
    }
    if op.residual {
        v.push(HostTensor::f32(s(&[m, nq]), &values(rng, m * nq)));
    }
    let slots = op.kv.is_some_and(|kv| kv.slots);
    if op.has_ints() {
        let mut ints: Vec<i32> = (0..m as i32).map(|i| (i * 7) % 40).collect();
        if slots {
            ints.extend((0..m as i32).map(|i| (i * 5) % m as i32));
        }
        v.push(HostTensor::i32(s(&[ints.len() as u64]), &ints));
    }
    if op.rope.is_some() {
        let table = rope_table(10000.0, 16, 40);
        v.push(HostTensor::f32(
            s(&[u64::from(rope_table_rows(40)), 16]),
            &table,
        ));
    }
    if op.kv.is_some() {
        for _ in 0..2 {
            v.push(HostTensor::f32(s(&[m, kv]), &vec![0.0; (m * kv) as usize]));
        }
    }
    v
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

/// Options of [`layer`]: what varies by architecture and cache.
#[derive(Debug, Clone, Copy)]
struct Layer {
    bias: bool,
    head_norm: bool,
    post_norm: bool,
    paged: bool,
}

const WIDTH: u64 = 64;
const HEAD: u64 = 32;
const KV: u64 = 32;
const POOL: u64 = 16;

/// One decoder layer as `dynrt::llm` builds it: width 64, two query heads and one KV head of
/// 32 (RoPE on halves), Q4_1 projections but the values' Q8_0 (as Qwen2.5's and Gemma 3's
/// files mix them), over a contiguous cache or a pool of 16 rows in pages of 4. Outputs: the
/// layer's output, the presents.
fn layer(o: Layer) -> (Graph, Vec<dynrt::runtime::StateBinding>) {
    use dynrt::graph::ops::{Attention, PagedAttention};
    let mut rng = SplitMix64::new(31);
    let mut b = GraphBuilder::new();
    let seq = Dim::sym("seq");
    let d = WIDTH;
    let x = b.input("x", &[seq.clone(), Dim::Fixed(d)], DType::F32);
    let pos = b.input("positions", std::slice::from_ref(&seq), DType::I32);
    let rows = if o.paged {
        Dim::Fixed(POOL)
    } else {
        Dim::sym("past")
    };
    let past_k = b.input("past_k", &[rows.clone(), Dim::Fixed(KV)], DType::F32);
    let past_v = b.input("past_v", &[rows, Dim::Fixed(KV)], DType::F32);
    let vector = |b: &mut GraphBuilder, rng: &mut SplitMix64, l: &str, n: u64, around: f32| {
        let v: Vec<f32> = values(rng, n).iter().map(|v| around + 0.5 * v).collect();
        b.constant(l, s(&[n]), v)
    };
    let g1 = vector(&mut b, &mut rng, "g1", d, 1.0);
    let h = b.rms_norm("norm1", x, g1, 1e-6);
    let wq = qweight(&mut b, &mut rng, "wq", 2 * HEAD, d);
    let wk = qweight(&mut b, &mut rng, "wk", KV, d);
    let wv = {
        let w = weight(&mut rng, DType::Q8_0, KV, d);
        b.constant_bytes("wv", w.shape, w.dtype, ConstData::from_vec(w.bytes))
    };
    let mut q = b.linear("q", h, wq);
    let mut k = b.linear("k", h, wk);
    let mut v = b.linear("v", h, wv);
    if o.bias {
        let bq = vector(&mut b, &mut rng, "bq", 2 * HEAD, 0.0);
        let bk = vector(&mut b, &mut rng, "bk", KV, 0.0);
        let bv = vector(&mut b, &mut rng, "bv", KV, 0.0);
        q = b.add("q.bias", q, bq);
        k = b.add("k.bias", k, bk);
        v = b.add("v.bias", v, bv);
    }
    if o.head_norm {
        for (name, t) in [("q", &mut q), ("k", &mut k)] {
            let g = vector(&mut b, &mut rng, &format!("{name}n"), HEAD, 1.0);
            let width = b.shape_of(format!("{name}_norm.width"), *t);
            let heads = b.reshape(format!("{name}_norm.heads"), *t, &[-1, HEAD as i64]);
            let normed = b.rms_norm(format!("{name}_norm"), heads, g, 1e-6);
            *t = b.reshape_to(format!("{name}_norm.rows"), normed, width);
        }
    }
    let table = b.constant(
        "table",
        s(&[u64::from(rope_table_rows(64)), HEAD]),
        rope_table(10000.0, HEAD as u32, 64),
    );
    let rope = Rope {
        head_dim: HEAD as u32,
        block: rope_block(64),
        interleaved: false,
    };
    let q = b.rope("q.rope", q, pos, table, rope);
    let k = b.rope("k.rope", k, pos, table, rope);
    let (pk, pv, attn) = if o.paged {
        let slots = b.input("slots", std::slice::from_ref(&seq), DType::I32);
        let rows_in = b.input("rows", &[seq.clone(), Dim::Fixed(2)], DType::I32);
        let pages = b.input("pages", &[Dim::Fixed(1), Dim::Fixed(4)], DType::I32);
        let pk = b.scatter_rows("present_k", past_k, k, slots);
        let pv = b.scatter_rows("present_v", past_v, v, slots);
        let attention = PagedAttention {
            num_heads: 2,
            num_kv_heads: 1,
            window: 0,
            page_size: 4,
        };
        let a = b.paged_attention("attn", [q, pk, pv, rows_in, pages], attention);
        (pk, pv, a)
    } else {
        let pk = b.concat("present_k", &[past_k, k], 0);
        let pv = b.concat("present_v", &[past_v, v], 0);
        let attention = Attention {
            num_heads: 2,
            num_kv_heads: 1,
            window: 0,
        };
        (pk, pv, b.attention("attn", q, pk, pv, attention))
    };
    let wo = qweight(&mut b, &mut rng, "wo", d, 2 * HEAD);
    let mut out = b.linear("o", attn, wo);
    if o.post_norm {
        let g = vector(&mut b, &mut rng, "post1", d, 1.0);
        out = b.rms_norm("o.post", out, g, 1e-6);
    }
    let x2 = b.add("x2", x, out);
    let g2 = vector(&mut b, &mut rng, "g2", d, 1.0);
    let h2 = b.rms_norm("norm2", x2, g2, 1e-6);
    let wg = qweight(&mut b, &mut rng, "wg", 96, d);
    let wu = qweight(&mut b, &mut rng, "wu", 96, d);
    let gate = b.linear("gate", h2, wg);
    let up = b.linear("up", h2, wu);
    let act = b.binary("act", BinaryOp::SiluMul, gate, up);
    let wd = qweight(&mut b, &mut rng, "wd", d, 96);
    let mut down = b.linear("down", act, wd);
    if o.post_norm {
        let g = vector(&mut b, &mut rng, "post2", d, 1.0);
        down = b.rms_norm("down.post", down, g, 1e-6);
    }
    let x3 = b.add("x3", x2, down);
    b.output(x3);
    b.output(pk);
    b.output(pv);
    let states = ["k", "v"]
        .map(|s| dynrt::runtime::StateBinding {
            past: format!("past_{s}"),
            present: format!("present_{s}"),
        })
        .to_vec();
    (b.build().unwrap(), states)
}

/// A decoder layer over its KV cache, unfused and fused (Q/K/V with the norm, biases, head
/// norms and RoPE as one projection writing the cache; the output projection, the gated
/// feed-forward and the down projection with their post-norms and residuals): the same
/// outputs and caches step after step (decode steps and prompts of several rows, a
/// contiguous cache that grows and a paged pool written at slots), NaN poison on, and five
/// dispatches a decode step (seven with the two post-norms) against the unfused graph's.
#[test]
fn a_decoder_layer_runs_five_dispatches_with_the_unfused_values() {
    let Some(gpu) = testing::gpu_or_skip("a_decoder_layer_runs_five_dispatches") else {
        return;
    };
    let engine = Engine::new(gpu);
    for (bias, head_norm, post_norm) in [
        (false, false, false),
        (true, false, false),
        (false, true, true),
    ] {
        for paged in [false, true] {
            let o = Layer {
                bias,
                head_norm,
                post_norm,
                paged,
            };
            let (g, states) = layer(o);
            let nets: Vec<Network> = [false, true]
                .into_iter()
                .map(|fuse| {
                    let options = NetworkOptions {
                        fuse,
                        states: states.clone(),
                        ..NetworkOptions::default()
                    };
                    Network::compile(&engine, g.clone(), options).unwrap()
                })
                .collect();
            assert!(
                nets[1]
                    .graph()
                    .nodes()
                    .iter()
                    .any(|n| matches!(n.op, Op::FusedLinear(FusedLinear { kv: Some(_), .. }))),
                "{o:?}: no KV split"
            );
            let mut reqs: Vec<InferRequest> = nets
                .iter()
                .map(|n| {
                    let mut run = RunOptions::new(dynrt::memory::predictor::Policy::Adaptive);
                    run.poison = true;
                    InferRequest::new(n, run).unwrap()
                })
                .collect();
            let mut rng = SplitMix64::new(5);
            let mut past = 0u64;
            // Pages 3, 1, 0, 2 of the pool: position p at row pages[p / 4] * 4 + p % 4.
            let pages = [3i32, 1, 0, 2];
            for seq in [1u64, 1, 4, 1, 3, 1] {
                let xs = HostTensor::f32(s(&[seq, WIDTH]), &values(&mut rng, seq * WIDTH));
                let p: Vec<i32> = (past..past + seq).map(|p| p as i32).collect();
                let positions = HostTensor::i32(s(&[seq]), &p);
                let slots: Vec<i32> = p
                    .iter()
                    .map(|&p| pages[p as usize / 4] * 4 + p % 4)
                    .collect();
                let rows: Vec<i32> = p.iter().flat_map(|&p| [0, p]).collect();
                let slots = HostTensor::i32(s(&[seq]), &slots);
                let rows = HostTensor::i32(s(&[seq, 2]), &rows);
                let table = HostTensor::i32(s(&[1, 4]), &pages);
                let mut inputs = vec![("x", &xs), ("positions", &positions)];
                if paged {
                    inputs.extend([("slots", &slots), ("rows", &rows), ("pages", &table)]);
                }
                let mut outs = Vec::new();
                for r in &mut reqs {
                    let (d0, c0) = (r.stats().dispatches, r.stats().copies);
                    let y = r
                        .infer_blocking(&inputs, &["x3", "present_k", "present_v"])
                        .unwrap_or_else(|e| panic!("{o:?} seq {seq}: {e}"));
                    let (d, c) = (r.stats().dispatches - d0, r.stats().copies - c0);
                    outs.push((y, d, c));
                }
                let ((unfused, d_u, _), (fused, d_f, copies)) = (&outs[0], &outs[1]);
                for (t, (a, b)) in ["x3", "present_k", "present_v"]
                    .iter()
                    .zip(unfused.iter().zip(fused))
                {
                    let (a, b) = (a.to_f32(), b.to_f32());
                    assert_eq!(a.len(), b.len(), "{o:?} seq {seq}: {t}");
                    let scale = 1.0 + a.iter().fold(0f32, |m, v| m.max(v.abs()));
                    for (i, (u, f)) in a.iter().zip(&b).enumerate() {
                        // The pool's rows no step wrote are whatever each request left there.
                        if paged
                            && *t != "x3"
                            && !p.iter().any(|&q| {
                                let row = pages[q as usize / 4] * 4 + q % 4;
                                i as i32 / KV as i32 == row
                            })
                        {
                            continue;
                        }
                        assert!(
                            (u - f).abs() <= 1e-5 * scale,
                            "{o:?} seq {seq}: {t}[{i}]: unfused {u} fused {f}"
                        );
                    }
                }
                // A post-norm's products are stored and each row finished by a second
                // dispatch (one segment a row would leave the device idle in one workgroup).
                if seq == 1 {
                    let want = if post_norm { 7 } else { 5 };
                    assert_eq!(
                        *d_f, want,
                        "{o:?}: a decode step's dispatches (unfused {d_u})"
                    );
                }
                // The keys and values go straight into the cache: no append copies (growth
                // copies only when the contiguous cache grows); a pool's step copies its
                // positions and slots into one integer input, once for all layers.
                if paged {
                    assert_eq!(*copies, 2, "{o:?} seq {seq}");
                }
                past += seq;
            }
        }
    }
}
