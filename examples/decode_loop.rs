//! The decode loop through the library API: build a small GPT-2 style decoder, compile it,
//! prefill a prompt, then decode greedily while the KV cache grows in place.
//!
//! ```sh
//! cargo run --release --example decode_loop            # adaptive policy
//! DYNRT_VERBOSE=2 cargo run --release --example decode_loop -- openvino
//! ```

use dynrt::demo::decoder::{build_graph, labels, DecoderConfig, DecoderWeights};
use dynrt::gpu::{Engine, Gpu, GpuOptions};
use dynrt::memory::predictor::Policy;
use dynrt::memory::AllocKind;
use dynrt::runtime::{HostTensor, InferRequest, Network, NetworkOptions, RunOptions, StateBinding};
use dynrt::shape::Shape;

fn main() -> anyhow::Result<()> {
    let policy: Policy = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "adaptive".into())
        .parse()?;
    let engine = Engine::new(Gpu::new_blocking(GpuOptions::from_env()?)?);

    // 1. The model: a graph with symbols `seq` (new tokens) and `past` (cached tokens).
    let config = DecoderConfig::default();
    let model = build_graph(&config, &DecoderWeights::generate(&config))?;

    // 2. Compile once: constants go to usm_device, memory dependencies and the static plan are
    //    computed, and each (past, present) pair becomes a KV-cache state kept on the GPU.
    let states = model.states.iter().map(|(past, present)| StateBinding {
        past: past.clone(),
        present: present.clone(),
    });
    let network = Network::compile(
        &engine,
        model.graph,
        NetworkOptions {
            states: states.collect(),
            ..NetworkOptions::default()
        },
    )?;

    // 3. One request: its own shape predictor, memory pool and KV cache.
    let mut request = InferRequest::new(&network, RunOptions::from_env(policy)?)?;

    // 4. Prefill the prompt, then feed back each chosen token.
    let mut tokens: Vec<i32> = vec![1, 2, 3, 4, 5, 6, 7, 8];
    let mut position = 0i32;
    let mut generated = Vec::new();
    for step in 0..24 {
        let new: Vec<i32> = if step == 0 {
            tokens.clone()
        } else {
            vec![*tokens.last().unwrap_or(&0)]
        };
        let seq = new.len() as u64;
        let positions: Vec<i32> = (position..position + seq as i32).collect();
        let ids = HostTensor::i32(Shape::new(vec![seq]), &new);
        let pos = HostTensor::i32(Shape::new(vec![seq]), &positions);
        let out = request.infer_blocking(
            &[(labels::TOKENS, &ids), (labels::POSITIONS, &pos)],
            &[labels::LOGITS],
        )?;
        position += seq as i32;

        // Greedy: the largest logit of the last row.
        let logits = out[0].to_f32();
        let last = &logits[logits.len() - config.vocab as usize..];
        let next = (0..last.len()).fold(0, |best, i| if last[i] > last[best] { i } else { best });
        tokens.push(next as i32);
        generated.push(next);

        let stats = engine.stats();
        println!(
            "step {step:2}: token {next:3}  kv rows {:3}  usm_device {:7} B  usm_shared {:5} B",
            request.state_shapes()[0].dims()[0],
            stats.current_bytes(AllocKind::UsmDevice),
            stats.current_bytes(AllocKind::UsmShared),
        );
    }

    // 5. What the memory system did.
    let s = request.stats();
    let (hits, misses) = network.pipeline_cache_counts();
    println!("generated {generated:?}");
    println!(
        "{policy} policy: {} allocations ({} after the first step), {} reuses, {} KV growths",
        s.allocations, s.reallocations, s.reuses, s.state_growths
    );
    println!(
        "{} shape updates skipped, pipeline cache {hits} hits / {misses} misses, {} submits",
        s.shape_updates_skipped, s.submits
    );
    println!(
        "{} dispatches, {} of them replayed from their nodes' dispatch plans",
        s.dispatches, s.dispatches_replayed
    );
    Ok(())
}
