//! A growth step of a session's KV cache past `RunOptions::growth_transient_bytes` moves the
//! states one after the other: each state's old buffer is freed before the next state's new
//! one is allocated, so the peak holds one old buffer beside the cache, not the whole cache
//! twice. Within the bound the step's own work copies them all (one submit).

use super::{engine, greedy};
use dynrt::gguf::TinyLlama;
use dynrt::gpu::Engine;
use dynrt::llm::{Model, ModelOptions};
use dynrt::memory::predictor::Policy;
use dynrt::runtime::RunOptions;
use std::sync::Arc;

/// Generates on a tiny model of 8 layers with `options` (on an engine of its own); returns
/// the KV bytes at the end, the bytes of one state then, and how far the placeholders
/// region's peak (the KV states live there) went over what it holds at the end.
fn growth_peak(engine: &Engine, options: RunOptions) -> (u64, u64, u64) {
    let t = TinyLlama {
        num_layers: 8,
        ..TinyLlama::default()
    };
    let backing: dynrt::tensor::Backing = Arc::new(t.build(3).unwrap());
    let model = Model::from_backing(engine, backing, ModelOptions::default()).unwrap();
    let mut session = model.session(options);
    let prompt: Vec<u32> = (0..40).map(|i| i * 3 + 1).collect();
    session
        .generate_ids_blocking(&prompt, &greedy(24), &mut |_| {})
        .unwrap();
    let kv = session.kv_reserved_bytes();
    let one_state = kv / (2 * u64::from(model.config().num_layers));
    let region = engine.stats().regions[1];
    (kv, one_state, region.peak_bytes - region.current_bytes)
}

#[test]
fn a_growth_step_holds_one_old_state_beside_the_cache() {
    let test = "a_growth_step_holds_one_old_state_beside_the_cache";
    let Some(engine) = engine(test) else { return };
    // Policy none: every state grows by one row at every step.
    let alone = RunOptions {
        growth_transient_bytes: 0,
        ..RunOptions::new(Policy::None)
    };
    let (kv, one_state, over) = growth_peak(&engine, alone);
    eprintln!("{test}: KV {kv} bytes, one state {one_state}, peak over the end {over}");
    assert!(kv > 0 && one_state > 0);
    assert!(
        over <= one_state,
        "peak {over} bytes over the cache, one state is {one_state}"
    );

    // Within the default bound (8 MiB, more than this whole cache) the step copies every
    // state in its own work: the last growth held all the old buffers.
    let Some(engine) = super::engine(test) else {
        return;
    };
    let (kv, _, over) = growth_peak(&engine, RunOptions::new(Policy::None));
    eprintln!("{test}: default bound: peak over the end {over}");
    assert!(over > kv / 2, "{over} of {kv}");
}
