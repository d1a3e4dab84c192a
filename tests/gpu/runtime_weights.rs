//! `update_weights` in the running loop (`dynrt::runtime`'s reordered-weights cache): a
//! network run as decode (1 row), prefill (12 rows) and decode again, under the hardware-GPU
//! kernels (forced on software adapters), whose decode kernel reads a q8_0 weight in its file
//! layout and whose prefill GEMM reads it in grouped planes. With a budget that holds a
//! copy, each (weight, layout) is reordered at most once and a hit does no work; with none,
//! the device keeps one layout and converts in place on demand, never holding more weight
//! bytes than the file's. Every output equals the CPU reference (tolerance of the linear
//! kernels, `kernels::quant`).

use dynrt::gpu::kernels::quant::QuantLayout;
use dynrt::gpu::kernels::WeightLayout;
use dynrt::gpu::{testing, Engine};
use dynrt::graph::reference;
use dynrt::graph::{Dim, Graph, GraphBuilder};
use dynrt::memory::accounting::region_index;
use dynrt::memory::predictor::Policy;
use dynrt::memory::regions::Region;
use dynrt::rng::SplitMix64;
use dynrt::runtime::{InferRequest, Network, NetworkOptions, RunOptions, WeightCacheStats};
use dynrt::shape::{DType, Shape};
use dynrt::tensor::{ConstData, HostTensor};

const K: u64 = 512;
const N: u64 = 96;

/// x `[seq, K]` → a q8_0 `[N, K]` projection (8 groups of 8 blocks per row: whole groups).
fn graph(rng: &mut SplitMix64) -> Graph {
    let v: Vec<f32> = (0..N * K).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let bytes = dynrt::formats::of_dtype(DType::Q8_0)
        .unwrap()
        .quantize_all(&v)
        .unwrap();
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[Dim::sym("seq"), Dim::Fixed(K)], DType::F32);
    let w = b.constant_bytes(
        "w",
        Shape::new(vec![N, K]),
        DType::Q8_0,
        ConstData::from_vec(bytes),
    );
    let y = b.linear("y", x, w);
    b.output(y);
    b.build().unwrap()
}

/// Runs one iteration of `seq` rows and checks it against the CPU reference.
fn step(req: &mut InferRequest, g: &Graph, rng: &mut SplitMix64, seq: u64, ctx: &str) {
    let xv: Vec<f32> = (0..seq * K).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let shape = Shape::new(vec![seq, K]);
    let got = req
        .infer_blocking(&[("x", &HostTensor::f32(shape.clone(), &xv))], &["y"])
        .unwrap_or_else(|e| panic!("{ctx}: {e}"));
    let want = reference::evaluate(g, &[("x", shape, xv)]).unwrap();
    let got = got[0].to_f32();
    assert_eq!(got.len(), want[0].1.len(), "{ctx}");
    for (i, (&g, &w)) in got.iter().zip(&want[0].1).enumerate() {
        let tol = 2e-6 * K as f32 + 1e-5 + 1e-5 * w.abs();
        assert!((g - w).abs() <= tol, "{ctx}: element {i}: {g} vs {w}");
    }
}

fn constants_bytes(engine: &Engine) -> u64 {
    engine.stats().regions[region_index(Region::Constants).unwrap()].current_bytes
}

#[test]
fn decode_prefill_decode_reorders_each_weight_and_layout_at_most_once() {
    for gpu in testing::gpus_or_skip("decode_prefill_decode_reorders") {
        let class = QuantLayout::gpu_class(&gpu);
        // The precondition: the two kernels of the class read the weight in two layouts.
        assert_eq!(class.weight_layout(1, DType::Q8_0), WeightLayout::File);
        assert_eq!(class.weight_layout(12, DType::Q8_0), WeightLayout::Grouped);
        let mut rng = SplitMix64::new(70);
        let g = graph(&mut rng);
        let engine = Engine::new(gpu.clone());
        let options = NetworkOptions {
            kernels: Some(class),
            weight_copies_bytes: Some(1 << 20),
            ..NetworkOptions::default()
        };
        let net = Network::compile(&engine, g.clone(), options.clone()).unwrap();
        let prefill = net.specialize(options).unwrap();
        let file_bytes = constants_bytes(&engine);
        let w_bytes = N * K / 32 * 34;
        let mut decode_req = InferRequest::new(&net, RunOptions::new(Policy::Adaptive)).unwrap();
        let mut prefill_req =
            InferRequest::new(&prefill, RunOptions::new(Policy::Adaptive)).unwrap();
        let stats = || net.weight_cache_stats();
        step(&mut decode_req, &g, &mut rng, 1, "decode 1");
        let s = stats();
        assert_eq!((s.copies_made, s.conversions), (0, 0), "{s:?}");
        step(&mut prefill_req, &g, &mut rng, 12, "prefill 1");
        let s = stats();
        assert_eq!((s.copies_made, s.conversions), (1, 0), "{s:?}");
        assert_eq!(s.copy_bytes, w_bytes, "{s:?}");
        assert_eq!(constants_bytes(&engine), file_bytes + w_bytes);
        // Hits from now on: no reorder, no allocation.
        let allocations = engine
            .stats()
            .kind(dynrt::memory::AllocKind::UsmDevice)
            .allocations;
        for (i, (prefill_step, seq)) in [(false, 1), (true, 12), (false, 1), (true, 5)]
            .into_iter()
            .enumerate()
        {
            let req = if prefill_step {
                &mut prefill_req
            } else {
                &mut decode_req
            };
            let before = stats();
            step(req, &g, &mut rng, seq, &format!("again {i}"));
            let after = stats();
            assert_eq!(
                (after.copies_made, after.conversions, after.copy_bytes),
                (before.copies_made, before.conversions, before.copy_bytes),
                "{after:?}"
            );
            assert_eq!(after.hits, before.hits + 1, "{after:?}");
        }
        // A prefill of 5 rows on the GPU class is still the matrix-vector kernel: the file
        // layout, a hit too. No buffer was allocated by the hits (the requests' own buffers
        // for 5 rows may be).
        assert!(
            engine
                .stats()
                .kind(dynrt::memory::AllocKind::UsmDevice)
                .allocations
                - allocations
                <= 4
        );
    }
}

#[test]
fn a_budget_without_room_keeps_one_layout_and_converts_on_demand() {
    for gpu in testing::gpus_or_skip("a_budget_without_room") {
        let class = QuantLayout::gpu_class(&gpu);
        let mut rng = SplitMix64::new(71);
        let g = graph(&mut rng);
        let engine = Engine::new(gpu.clone());
        let options = NetworkOptions {
            kernels: Some(class),
            weight_copies_bytes: Some(0),
            ..NetworkOptions::default()
        };
        let net = Network::compile(&engine, g.clone(), options).unwrap();
        let file_bytes = constants_bytes(&engine);
        let mut req = InferRequest::new(&net, RunOptions::new(Policy::Adaptive)).unwrap();
        let mut conversions = 0;
        let mut last = WeightCacheStats::default();
        for (i, seq) in [1u64, 12, 12, 1, 1, 12].into_iter().enumerate() {
            step(
                &mut req,
                &g,
                &mut rng,
                seq,
                &format!("step {i}: {seq} rows"),
            );
            let s = net.weight_cache_stats();
            // A conversion exactly when the layout wanted changes (decode: the file layout,
            // prefill: the grouped one), never a copy.
            let changed = i > 0 && [1u64, 12, 12, 1, 1, 12][i - 1] != seq || (i == 0 && seq > 8);
            conversions += u64::from(changed);
            assert_eq!(s.conversions, conversions, "step {i}: {s:?}");
            assert_eq!((s.copies_made, s.copy_bytes), (0, 0), "step {i}: {s:?}");
            assert!(s.hits >= last.hits, "step {i}");
            let grouped = if seq > 8 { N * K / 32 * 34 } else { 0 };
            assert_eq!(net.grouped_weight_bytes(), grouped, "step {i}");
            // The weights never take more than the file's bytes.
            assert_eq!(constants_bytes(&engine), file_bytes, "step {i}");
            last = s;
        }
        assert_eq!(conversions, 3);
    }
}

#[test]
fn the_default_budget_is_a_tenth_of_the_weights() {
    for gpu in testing::gpus_or_skip("the_default_budget") {
        let mut rng = SplitMix64::new(72);
        let g = graph(&mut rng);
        let engine = Engine::new(gpu.clone());
        let net = Network::compile(&engine, g, NetworkOptions::default()).unwrap();
        let constants = constants_bytes(&engine);
        assert!(constants >= N * K / 32 * 34, "{constants}");
        assert_eq!(net.weight_cache_stats().budget_bytes, constants / 10);
    }
}
