//! A GPT-2 style decoder layer with a KV cache, run node by node on the GPU (`run_graph`) and
//! checked against the CPU reference evaluator, for prefill and for decode steps; and the
//! causal mask checked end to end: decoding token 6 over a 5-token past gives the logits that a
//! 6-token prefill gives for its last token.
//!
//! Tolerance: |gpu - ref| <= 2e-3 + 2e-3 |ref| (a chain of ~30 f32 kernels against f64
//! intermediates).

use crate::common;

use dynrt::gpu::kernels::run::run_graph;
use dynrt::gpu::kernels::Kernels;
use dynrt::gpu::{testing, Engine};
use dynrt::graph::{reference, Dim, Graph, GraphBuilder, NodeId};
use dynrt::rng::SplitMix64;
use dynrt::shape::{DType, Shape};

const D: u64 = 32;
const H: u64 = 4;
const DH: u64 = 8;
const F: u64 = 64;
const V: u64 = 50;

fn s(d: &[u64]) -> Shape {
    Shape::new(d.to_vec())
}

fn weights(
    b: &mut GraphBuilder,
    rng: &mut SplitMix64,
    label: &str,
    dims: &[u64],
    scale: f32,
) -> NodeId {
    let n = dims.iter().product::<u64>() as usize;
    b.constant(
        label,
        s(dims),
        (0..n).map(|_| rng.uniform(-scale, scale)).collect(),
    )
}

/// Outputs: logits [S, V], k_all [H, P+S, DH], v_all [H, P+S, DH].
fn decoder_layer() -> Graph {
    let mut rng = SplitMix64::new(11);
    let mut b = GraphBuilder::new();
    let ids = b.input("ids", &[Dim::sym("seq")], DType::I32);
    let past_k = b.input(
        "past_k",
        &[Dim::Fixed(H), Dim::sym("past"), Dim::Fixed(DH)],
        DType::F32,
    );
    let past_v = b.input(
        "past_v",
        &[Dim::Fixed(H), Dim::sym("past"), Dim::Fixed(DH)],
        DType::F32,
    );
    let wte = weights(&mut b, &mut rng, "wte", &[V, D], 1.0);
    let emb = b.gather("emb", wte, ids);
    let g1 = weights(&mut b, &mut rng, "ln1.g", &[D], 1.0);
    let b1 = weights(&mut b, &mut rng, "ln1.b", &[D], 0.1);
    let ln1 = b.layer_norm("ln1", emb, g1, b1, 1e-5);
    let wqkv = weights(&mut b, &mut rng, "w_qkv", &[D, 3 * D], 0.3);
    let bqkv = weights(&mut b, &mut rng, "b_qkv", &[3 * D], 0.1);
    let qkv = b.matmul("qkv.mm", ln1, wqkv, false);
    let qkv = b.add("qkv", qkv, bqkv);
    let d = D as i64;
    let q = b.slice("q", qkv, &[1], &[0], &[d], &[1]);
    let k = b.slice("k", qkv, &[1], &[d], &[2 * d], &[1]);
    let v = b.slice("v", qkv, &[1], &[2 * d], &[3 * d], &[1]);
    // q's head split goes through shape_of (host-evaluated shape data); k and v use 0 = copy.
    let q_shape = b.shape_of("q.shape", q);
    let seq = b.slice("q.seq", q_shape, &[0], &[0], &[1], &[1]);
    let heads = b.constant_i32("heads", s(&[2]), &[H as i32, DH as i32]);
    let q_target = b.concat("q.target", &[seq, heads], 0);
    let q3 = b.reshape_to("q3", q, q_target);
    let k3 = b.reshape("k3", k, &[0, H as i64, DH as i64]);
    let v3 = b.reshape("v3", v, &[0, H as i64, DH as i64]);
    let qh = b.transpose("qh", q3, &[1, 0, 2]);
    let kh = b.transpose("kh", k3, &[1, 0, 2]);
    let vh = b.transpose("vh", v3, &[1, 0, 2]);
    let k_all = b.concat("k_all", &[past_k, kh], 1);
    let v_all = b.concat("v_all", &[past_v, vh], 1);
    let scores = b.matmul("scores", qh, k_all, true);
    let scale = b.constant("scale", s(&[1]), vec![1.0 / (DH as f32).sqrt()]);
    let scaled = b.mul("scaled", scores, scale);
    let masked = b.causal_mask("masked", scaled);
    let probs = b.softmax("probs", masked);
    let ctx = b.matmul("ctx", probs, v_all, false);
    let ctx_t = b.transpose("ctx_t", ctx, &[1, 0, 2]);
    let ctx2 = b.reshape("ctx2", ctx_t, &[0, -1]);
    let wo = weights(&mut b, &mut rng, "w_o", &[D, D], 0.3);
    let attn = b.matmul("attn", ctx2, wo, false);
    let h = b.add("h", emb, attn);
    let g2 = weights(&mut b, &mut rng, "ln2.g", &[D], 1.0);
    let ln2 = b.rms_norm("ln2", h, g2, 1e-6);
    let w1 = weights(&mut b, &mut rng, "w1", &[D, F], 0.3);
    let mlp = b.matmul("mlp.up", ln2, w1, false);
    let mlp = b.gelu("mlp.act", mlp);
    let gate = b.silu("mlp.gate", mlp);
    let mlp = b.sub("mlp.mix", mlp, gate);
    let w2 = weights(&mut b, &mut rng, "w2", &[F, D], 0.3);
    let mlp = b.matmul("mlp.down", mlp, w2, false);
    let out = b.add("out", h, mlp);
    // A where with a constant per-feature condition, and a relu'd copy as the other branch.
    let cond: Vec<f32> = (0..D).map(|i| (i % 3 != 0) as u32 as f32).collect();
    let cond = b.constant("cond", s(&[D]), cond);
    let relu = b.relu("relu", out);
    let sel = b.where_("sel", cond, out, relu);
    let logits = b.matmul("logits", sel, wte, true);
    b.output(logits).output(k_all).output(v_all);
    b.build().unwrap()
}

fn compare(got: &[(Shape, Vec<f32>)], want: &[(Shape, Vec<f32>)], ctx: &str) {
    assert_eq!(got.len(), want.len());
    for (o, ((gs, g), (ws, w))) in got.iter().zip(want).enumerate() {
        assert_eq!(gs, ws, "{ctx}: output {o} shape");
        assert_eq!(g.len(), w.len());
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(
                (a - b).abs() <= 2e-3 + 2e-3 * b.abs(),
                "{ctx}: output {o} element {i}: gpu {a} vs ref {b}"
            );
        }
    }
}

#[test]
fn decoder_layer_prefill_and_decode_match_the_reference() {
    let g = decoder_layer();
    for gpu in testing::gpus_or_skip("decoder_layer_prefill_and_decode") {
        let engine = Engine::new(gpu.clone());
        let mut k = Kernels::new(&gpu);
        let tokens = [3.0, 17.0, 42.0, 0.0, 9.0, 25.0];
        let empty = s(&[H, 0, DH]);
        // Prefill 5 tokens.
        let inputs = vec![
            ("ids", s(&[5]), tokens[..5].to_vec()),
            ("past_k", empty.clone(), vec![]),
            ("past_v", empty.clone(), vec![]),
        ];
        let want = reference::evaluate(&g, &inputs).unwrap();
        let got = run_graph(&engine, &mut k, &g, &inputs).unwrap();
        compare(&got, &want, "prefill 5");
        // Decode token 6 over the 5-token cache from the GPU prefill.
        let inputs = vec![
            ("ids", s(&[1]), vec![tokens[5]]),
            ("past_k", got[1].0.clone(), got[1].1.clone()),
            ("past_v", got[2].0.clone(), got[2].1.clone()),
        ];
        let want = reference::evaluate(&g, &inputs).unwrap();
        let step = run_graph(&engine, &mut k, &g, &inputs).unwrap();
        compare(&step, &want, "decode 1 over 5");
        assert_eq!(step[1].0, s(&[H, 6, DH]));
        // The same token as the last of a 6-token prefill: identical logits (causal mask).
        let inputs = vec![
            ("ids", s(&[6]), tokens.to_vec()),
            ("past_k", empty.clone(), vec![]),
            ("past_v", empty.clone(), vec![]),
        ];
        let full = run_graph(&engine, &mut k, &g, &inputs).unwrap();
        let last = &full[0].1[5 * V as usize..];
        for (i, (a, b)) in step[0].1.iter().zip(last).enumerate() {
            assert!(
                (a - b).abs() <= 2e-3 + 2e-3 * b.abs(),
                "logit {i}: decode {a} vs prefill {b}"
            );
        }
        let st = k.stats();
        assert!(st.hits > st.misses, "{st:?}");
    }
}

/// Ops given one tensor twice (`Mul(x, x)`, `where(c, i, i)`) and logic ops leaving slots
/// unused: the dispatch path binds no storage range twice (it refuses to, with
/// `KernelError::AliasedBindings`, which Dawn's "writable storage buffer binding aliasing"
/// would be in the browser) and the values are right.
#[test]
fn operands_given_twice_and_unused_slots_never_alias_a_binding() {
    let g = common::aliased_operands_graph();
    for gpu in testing::gpus_or_skip("operands_given_twice") {
        let engine = Engine::new(gpu.clone());
        let mut k = Kernels::new(&gpu);
        for n in [1, 7, 300] {
            let (x, i) = common::aliased_operands_inputs(n);
            let inputs = vec![
                ("x", s(&[n as u64]), x.clone()),
                ("i", s(&[n as u64]), i.clone()),
            ];
            let got = run_graph(&engine, &mut k, &g, &inputs)
                .unwrap_or_else(|e| panic!("n={n} on {:?}: {e}", gpu.backend()));
            let values: Vec<Vec<f32>> = got.into_iter().map(|(_, v)| v).collect();
            common::check_aliased_outputs(&x, &i, &values, &format!("n={n}"));
        }
    }
}
