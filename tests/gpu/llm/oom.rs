//! Out of device memory inside a batched step (`BatchEngine::step`): with a budget that holds
//! the weights, the pools and a step of fewer rows, but not the activations of a step with
//! every admitted sequence, the engine runs smaller steps (the sequences admitted last sit a
//! step out) and every sequence still gets the tokens it gets alone; with a budget too small
//! for even one row, each sequence is given up with a typed out-of-memory error, its pages
//! freed, and the engine stays usable.
//!
//! The budgets come from the least device budget under which a step of `k` one-token prompts
//! runs whole on an engine of its own (the `none` policy: every buffer has its exact size).
//! Not from the bytes such a step leaves in use: those also count the buffer a submit packs
//! its host writes into, which an engine makes only where it fits and goes without
//! otherwise, so a budget below them may still hold the step.

use super::{engine, greedy};
use dynrt::gguf::TinyLlama;
use dynrt::gpu::{Engine, Gpu};
use dynrt::llm::{BatchEngine, BatchOptions, LlmError, Model, ModelOptions, SeqId};
use dynrt::memory::predictor::Policy;
use dynrt::runtime::{RunError, RunOptions};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Sequences admitted together.
const N: usize = 4;
/// Their generation lengths: they finish at different steps, so the ones waiting for memory
/// get it when an earlier one ends.
const MAX_TOKENS: [usize; N] = [3, 9, 6, 5];

fn options() -> BatchOptions {
    BatchOptions {
        page_size: 8,
        pool_tokens: 256,
        step_tokens: 32,
        max_batch: N,
        run: RunOptions::new(Policy::None),
        ..BatchOptions::default()
    }
}

fn prompt(k: usize) -> Vec<u32> {
    vec![(k as u32 * 37 + 5) % 250]
}

/// The tiny model on `engine`, or `None` when it does not load (a budget too small for it).
fn tiny(engine: &Engine) -> Option<Model> {
    let backing: dynrt::tensor::Backing = Arc::new(TinyLlama::default().build(5).unwrap());
    Model::from_backing(engine, backing, ModelOptions::default()).ok()
}

/// The peak device bytes of one step of the first `k` prompts on an engine of its own with
/// `budget` (none: the device's), or `None` when the model did not load or the step did not
/// run all `k` rows whole.
fn peak_of_a_step_of(gpu: &Gpu, k: usize, budget: Option<u64>) -> Option<u64> {
    let engine = match budget {
        Some(b) => Engine::with_memory_budget(gpu.clone(), b),
        None => Engine::new(gpu.clone()),
    };
    let model = tiny(&engine)?;
    let mut batch = BatchEngine::new(&model, options()).unwrap();
    for (i, &max_tokens) in MAX_TOKENS.iter().enumerate().take(k) {
        batch.add(&prompt(i), greedy(max_tokens)).unwrap();
    }
    let tokens = batch.step_blocking().unwrap();
    let whole =
        tokens.len() == k && batch.stats().steps_shrunk == 0 && batch.take_failures().is_empty();
    whole.then(|| engine.stats().device_peak_bytes)
}

/// The least device budget under which one step of the first `k` prompts runs whole: the
/// step runs again under one byte less than its last peak until it no longer does (the
/// peaks fall while the buffers the engine may go without no longer fit).
fn least_budget_for_a_step_of(gpu: &Gpu, k: usize) -> u64 {
    let mut least = peak_of_a_step_of(gpu, k, None).expect("a step of the device's budget");
    while let Some(peak) = peak_of_a_step_of(gpu, k, Some(least - 1)) {
        least = peak;
    }
    least
}

/// Runs every prompt admitted at once until the engine is idle: each sequence's tokens, and
/// the sequences given up with their errors.
fn run_all(model: &Model) -> (BatchEngine, Vec<Vec<u32>>, BTreeMap<SeqId, LlmError>) {
    let mut batch = BatchEngine::new(model, options()).unwrap();
    let ids: Vec<SeqId> = (0..N)
        .map(|k| batch.add(&prompt(k), greedy(MAX_TOKENS[k])).unwrap())
        .collect();
    let mut tokens: BTreeMap<SeqId, Vec<u32>> = BTreeMap::new();
    let mut failed = BTreeMap::new();
    let mut steps = 0;
    while !batch.is_idle() {
        for t in batch.step_blocking().unwrap() {
            tokens.entry(t.seq).or_default().push(t.token);
        }
        for f in batch.take_failures() {
            failed.insert(f.seq, f.error);
        }
        steps += 1;
        assert!(steps < 1000, "the engine does not finish");
    }
    let tokens = ids
        .iter()
        .map(|id| tokens.remove(id).unwrap_or_default())
        .collect();
    (batch, tokens, failed)
}

#[test]
fn a_step_that_does_not_fit_runs_smaller_and_every_sequence_gets_its_tokens() {
    let test = "a_step_that_does_not_fit_runs_smaller_and_every_sequence_gets_its_tokens";
    let Some(roomy) = engine(test) else { return };
    let gpu = roomy.gpu().clone();
    let (want_engine, want, none_failed) = run_all(&tiny(&roomy).unwrap());
    assert!(none_failed.is_empty());
    assert_eq!(want_engine.stats().steps_shrunk, 0);
    for (k, t) in want.iter().enumerate() {
        assert_eq!(t.len(), MAX_TOKENS[k], "sequence {k} alone");
    }
    let (fewer, all) = (
        least_budget_for_a_step_of(&gpu, N - 1),
        least_budget_for_a_step_of(&gpu, N),
    );
    assert!(
        all > fewer,
        "{N} rows need no more than {} ({all} bytes)",
        N - 1
    );
    let budget = fewer + (all - fewer) / 2;
    let tight = Engine::with_memory_budget(gpu, budget);
    let (batch, got, failed) = run_all(&tiny(&tight).unwrap());
    let s = batch.stats();
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(got, want, "the tokens of a memory-short run");
    assert!(s.steps_shrunk > 0, "no step had to shrink: {s:?}");
    assert!(s.max_batch_seen < N, "{s:?}");
    assert_eq!((s.pages_used, s.out_of_memory_failures), (0, 0), "{s:?}");
    assert!(tight.stats().device_peak_bytes <= budget);
    eprintln!("{test}: budget {budget} bytes ({fewer} < it < {all}): {s:?}");
}

#[test]
fn a_sequence_that_cannot_run_even_alone_fails_typed_and_frees_its_pages() {
    let test = "a_sequence_that_cannot_run_even_alone_fails_typed_and_frees_its_pages";
    let Some(roomy) = engine(test) else { return };
    let gpu = roomy.gpu().clone();
    let one = least_budget_for_a_step_of(&gpu, 1);
    let tight = Engine::with_memory_budget(gpu, one - 1);
    let model = tiny(&tight).unwrap();
    let (batch, tokens, failed) = run_all(&model);
    assert!(tokens.iter().all(Vec::is_empty), "{tokens:?}");
    assert_eq!(failed.len(), N, "{failed:?}");
    for (seq, e) in &failed {
        assert!(
            matches!(e, LlmError::Run(RunError::OutOfMemory { .. })),
            "sequence {seq}: {e}"
        );
    }
    let s = batch.stats();
    assert_eq!(s.out_of_memory_failures, N as u64, "{s:?}");
    assert_eq!((s.pages_used, s.running), (0, 0), "{s:?}");
    assert!(tight.device_bytes_in_use() < one);
    // The engine stays usable: a sequence added now is given up the same way, not stuck.
    let mut batch = batch;
    let id = batch.add(&prompt(0), greedy(2)).unwrap();
    assert!(batch.step_blocking().unwrap().is_empty());
    let f = batch.take_failures();
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].seq, id);
    assert!(batch.is_idle());
}
