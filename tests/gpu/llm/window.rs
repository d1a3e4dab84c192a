//! Sliding-window layers (Gemma 3's local layers) keep a bounded cache: their oldest rows are
//! dropped as the conversation grows, and the logits stay what a fresh prefill of the same
//! tokens computes (where nothing was dropped yet).

use super::{engine, greedy};
use dynrt::llm::{Model, ModelOptions, WeightFormat};
use dynrt::memory::predictor::Policy;
use dynrt::runtime::RunOptions;
use std::sync::Arc;

#[test]
fn sliding_window_caches_stay_bounded_and_keep_the_logits() {
    let test = "sliding_window_caches_stay_bounded_and_keep_the_logits";
    let Some(engine) = engine(test) else { return };
    // A window of 4 keys: layers 0-4 local, 5 global, 6 local.
    let window = 4u64;
    let t = super::tiny_gemma3(window as u32);
    let backing: dynrt::tensor::Backing = Arc::new(t.build(11).unwrap());
    let options = ModelOptions {
        format: WeightFormat::F32,
        ..ModelOptions::default()
    };
    let model = Model::from_backing(&engine, backing, options).unwrap();
    let prompt: Vec<u32> = vec![5, 80, 33, 120, 7, 9];
    let steps = 40;
    let mut session = model.session(RunOptions::new(Policy::Adaptive));
    let g = session
        .generate_ids_blocking(&prompt, &greedy(steps), &mut |_| {})
        .unwrap();
    assert_eq!(g.tokens.len(), steps);

    // Bounded: after 45 tokens a global layer holds 45 rows, a local one at most
    // window + window / 4 (5 here); the bytes reserved per layer show it.
    let [global, local] = session.kv_by_layer_kind();
    assert_eq!((global.layers, local.layers), (1, 6));
    let row = 2 * 32 * 4; // keys and values of one token, one KV head of 32
    assert_eq!(global.needed_bytes, 45 * row);
    assert_eq!(local.needed_bytes, 6 * window * row);
    let per_global = global.reserved_bytes;
    let per_local = local.reserved_bytes / 6;
    eprintln!(
        "{test}: reserved per global layer {per_global} B, per local layer {per_local} B \
         (rows of {row} B)"
    );
    assert!(per_global >= 45 * row, "{per_global}");
    assert!(
        per_local <= 4 * window * row && per_local * 3 < per_global,
        "local layers must hold about their window: {per_local} B per layer against \
         {per_global} B for the global one"
    );

    // The same logits as a fresh session that prefills the tokens at once (nothing dropped
    // there: its caches start empty), at steps before and long after the first drops.
    let mut all = prompt.clone();
    all.extend(&g.tokens);
    for step in [0usize, 3, 9, 20, 39] {
        let mut fresh = model.session(RunOptions::new(Policy::Adaptive));
        let logits = fresh.forward_blocking(&all[..prompt.len() + step]).unwrap();
        let worst = logits
            .iter()
            .zip(&g.logits[step])
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-4, "step {step}: max |logit diff| {worst}");
    }
}
