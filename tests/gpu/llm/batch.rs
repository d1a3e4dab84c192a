//! Many sequences in one forward pass over a paged KV cache (`dynrt::llm::BatchEngine`):
//! every sequence's greedy tokens and logits equal those of the same prompt run alone in a
//! `Session`, while sequences join between steps, prompts are cut into chunks, pages are
//! shared between prompts with a common start, and a pool too small for all of them makes
//! the engine offload pages to host memory and restore them (or preempt and recompute).

use super::{engine, greedy, prompt_ids, smollm2};
use dynrt::gguf::TinyLlama;
use dynrt::gpu::Engine;
use dynrt::llm::{BatchEngine, BatchOptions, GenerateParams, LlmError, Model, ModelOptions, SeqId};
use dynrt::memory::predictor::Policy;
use dynrt::memory::AllocKind;
use dynrt::runtime::RunOptions;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Tokens and logits of `prompt` generated alone in a session.
fn alone(model: &Model, prompt: &[u32], params: &GenerateParams) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut session = model.session(RunOptions::new(Policy::Adaptive));
    let g = session
        .generate_ids_blocking(prompt, params, &mut |_| {})
        .unwrap();
    (g.tokens, g.logits)
}

/// Runs the engine until it is idle, adding `later[k]` after step `k.0`. Returns each
/// sequence's tokens and logits by its id.
type Produced = BTreeMap<SeqId, (Vec<u32>, Vec<Vec<f32>>)>;
fn run(
    batch: &mut BatchEngine,
    later: &[(u64, Vec<u32>)],
    params: &GenerateParams,
) -> (Produced, Vec<SeqId>) {
    let mut out = Produced::new();
    let mut ids = Vec::new();
    let mut step = 0u64;
    loop {
        for (at, prompt) in later {
            if *at == step {
                ids.push(batch.add(prompt, *params).unwrap());
            }
        }
        if batch.is_idle() && later.iter().all(|(at, _)| *at <= step) {
            return (out, ids);
        }
        for t in batch.step_blocking().unwrap() {
            let e = out.entry(t.seq).or_default();
            e.0.push(t.token);
            e.1.push(t.logits);
        }
        step += 1;
        assert!(step < 10_000, "the engine does not finish");
    }
}

/// The same tokens, and logits within `atol` at every step.
fn assert_same_within(
    what: &str,
    got: &(Vec<u32>, Vec<Vec<f32>>),
    want: &(Vec<u32>, Vec<Vec<f32>>),
    atol: f32,
) {
    assert_eq!(got.0, want.0, "{what}: tokens");
    for (i, (a, b)) in got.1.iter().zip(&want.1).enumerate() {
        let worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(worst < atol, "{what}: step {i}: max |logit diff| {worst}");
    }
}

/// [`assert_same_within`] the tiny models' 1e-4.
fn assert_same(what: &str, got: &(Vec<u32>, Vec<Vec<f32>>), want: &(Vec<u32>, Vec<Vec<f32>>)) {
    assert_same_within(what, got, want, 1e-4);
}

/// Runs `prompts` together from the first step with `options` and checks each against the
/// same prompt alone. Returns the engine (idle) for its counters.
fn batched_equals_alone(
    model: &Model,
    prompts: &[Vec<u32>],
    params: &GenerateParams,
    options: BatchOptions,
) -> BatchEngine {
    let want: Vec<_> = prompts.iter().map(|p| alone(model, p, params)).collect();
    let mut batch = BatchEngine::new(model, options).unwrap();
    let later: Vec<_> = prompts.iter().map(|p| (0, p.clone())).collect();
    let (out, ids) = run(&mut batch, &later, params);
    for (k, id) in ids.iter().enumerate() {
        assert_same(&format!("sequence {k}"), &out[id], &want[k]);
    }
    batch
}

fn tiny(engine: &Engine) -> Model {
    let t = TinyLlama::default();
    let backing: dynrt::tensor::Backing = Arc::new(t.build(5).unwrap());
    Model::from_backing(engine, backing, ModelOptions::default()).unwrap()
}

#[test]
fn batched_sequences_match_each_one_alone() {
    let test = "batched_sequences_match_each_one_alone";
    let Some(engine) = engine(test) else { return };
    let model = tiny(&engine);
    let params = greedy(12);
    let long: Vec<u32> = (0..37).map(|i| (i * 7 + 3) % 250).collect();
    let mut shares = long[..33].to_vec();
    shares.extend([9, 8, 7]);
    let short = vec![42, 17, 5];
    let prompts = [long.clone(), short.clone(), shares.clone(), long.clone()];
    let want: Vec<_> = prompts.iter().map(|p| alone(&model, p, &params)).collect();

    let mut batch = BatchEngine::new(
        &model,
        BatchOptions {
            page_size: 8,
            pool_tokens: 512,
            step_tokens: 16,
            max_batch: 4,
            ..BatchOptions::default()
        },
    )
    .unwrap();
    // The long prompt and the short one start together (the long one in chunks of 16 rows,
    // then decode rows beside the other's); the other two join once the long prompt's
    // pages are written, and share its four full pages.
    let later = [(0, long.clone()), (0, short), (5, shares), (6, long)];
    let (out, ids) = run(&mut batch, &later, &params);
    for (k, id) in ids.iter().enumerate() {
        assert_same(&format!("sequence {k}"), &out[id], &want[k]);
    }
    let s = batch.stats();
    assert_eq!(s.pages_used, 0, "finished sequences free their pages");
    assert_eq!(s.tokens_shared, 32 + 32, "{s:?}");
    assert!(s.max_batch_seen >= 3, "{s:?}");
    assert_eq!(s.preemptions, 0, "{s:?}");
    eprintln!("{test}: {s:?}");
}

/// Tokens chosen on the device in a batched step (no logits asked for: only token ids come
/// back) equal a session's, greedy and seeded sampling alike (the draw's counter is the new
/// token's position in both), also beside a sequence whose logits come back to the host
/// (kept logits, or penalties: its row is sampled on the host from the same step).
#[test]
fn batched_tokens_chosen_on_the_device_equal_a_sessions() {
    let test = "batched_tokens_chosen_on_the_device_equal_a_sessions";
    let Some(engine) = engine(test) else { return };
    let model = tiny(&engine);
    let device = |sampling: dynrt::llm::SamplingParams| GenerateParams {
        max_tokens: 10,
        sampling,
        stop_at_eos: false,
        keep_logits: false,
    };
    let sampled = dynrt::llm::SamplingParams {
        temperature: 0.9,
        top_k: 40,
        top_p: 0.95,
        seed: 11,
        ..dynrt::llm::SamplingParams::default()
    };
    let full = dynrt::llm::SamplingParams {
        temperature: 1.3,
        top_k: 0,
        seed: 5,
        ..dynrt::llm::SamplingParams::default()
    };
    let penalized = dynrt::llm::SamplingParams {
        penalties: dynrt::llm::Penalties {
            repeat: 1.3,
            ..dynrt::llm::Penalties::default()
        },
        ..dynrt::llm::SamplingParams::default()
    };
    assert!(!device(sampled).sampling.needs_logits());
    assert!(device(penalized).sampling.needs_logits());
    let runs = [
        (
            vec![42u32, 17, 5],
            device(dynrt::llm::SamplingParams::default()),
        ),
        (
            (0..21).map(|i| (i * 5 + 1) % 250).collect(),
            device(sampled),
        ),
        (vec![7, 7, 7, 7, 9], device(full)),
        (vec![3, 1, 4, 1, 5, 9, 2, 6], device(penalized)),
        (vec![100, 200], greedy(10)),
    ];
    let mut batch = BatchEngine::new(
        &model,
        BatchOptions {
            page_size: 8,
            pool_tokens: 512,
            step_tokens: 16,
            max_batch: 8,
            ..BatchOptions::default()
        },
    )
    .unwrap();
    let mut ids = Vec::new();
    for (prompt, params) in &runs {
        ids.push(batch.add(prompt, *params).unwrap());
    }
    let mut out: BTreeMap<SeqId, Vec<u32>> = BTreeMap::new();
    let mut steps = 0;
    while !batch.is_idle() {
        for t in batch.step_blocking().unwrap() {
            out.entry(t.seq).or_default().push(t.token);
        }
        steps += 1;
        assert!(steps < 1_000, "the engine does not finish");
    }
    for (k, ((prompt, params), id)) in runs.iter().zip(&ids).enumerate() {
        let (want, _) = alone(&model, prompt, params);
        assert_eq!(out[id], want, "sequence {k} ({:?})", params.sampling);
    }
    // Three sequences of 10 tokens on the device; the penalized and kept-logits ones on the
    // host.
    assert_eq!(
        batch.stats().tokens_chosen_on_device,
        30,
        "{:?}",
        batch.stats()
    );
    // The sampled rows did draw: not every token is the greedy one.
    let (greedy_tokens, _) = alone(&model, &runs[2].0, &greedy(10));
    assert_ne!(
        out[&ids[2]], greedy_tokens,
        "a temperature of 1.3 over the whole vocabulary"
    );
}

/// Three prompts of 14 tokens whose sequences reach 34 positions (5 pages of 8) and pools of
/// six pages: they cannot all run at once.
fn small_pool(offload: bool) -> (Vec<Vec<u32>>, BatchOptions) {
    let prompts = (0..3)
        .map(|k| (0..14).map(|i| (i * 11 + k * 29 + 1) % 250).collect())
        .collect();
    let options = BatchOptions {
        page_size: 8,
        pool_tokens: 48,
        step_tokens: 32,
        max_batch: 3,
        offload,
        ..BatchOptions::default()
    };
    (prompts, options)
}

#[test]
fn a_small_pool_preempts_and_recomputes_with_the_same_tokens() {
    let test = "a_small_pool_preempts_and_recomputes_with_the_same_tokens";
    let Some(engine) = engine(test) else { return };
    let model = tiny(&engine);
    let params = greedy(20);
    let (prompts, options) = small_pool(false);
    let mut batch = batched_equals_alone(&model, &prompts, &params, options);
    let s = batch.stats();
    assert!(s.preemptions > 0, "{s:?}");
    assert_eq!((s.pages_used, s.offloads), (0, 0));

    // Cancelling frees a sequence's pages at once; the engine stays usable.
    let id = batch.add(&prompts[0], params).unwrap();
    batch.step_blocking().unwrap();
    assert_eq!(batch.stats().pages_used, 2);
    assert!(batch.cancel(id));
    assert_eq!(batch.stats().pages_used, 0);
    assert!(!batch.cancel(id));
    // A request larger than the pool is refused before it runs.
    let big: Vec<u32> = vec![1; 40];
    assert!(batch.add(&big, params).is_err());
}

/// Sequences of the pool with `options` that cannot all run at once: every one's tokens and
/// logits equal the prompt alone, some went to host memory and came back, none was
/// recomputed, and the host memory is free again at the end.
fn offloads_and_restores(model: &Model, prompts: &[Vec<u32>], options: BatchOptions) {
    let host = |m: &Model| m.engine().stats().current_bytes(AllocKind::UsmHost);
    let host_before = host(model);
    let batch = batched_equals_alone(model, prompts, &greedy(20), options);
    let s = batch.stats();
    assert!(s.offloads > 0, "{s:?}");
    assert_eq!(s.restores, s.offloads, "{s:?}");
    assert_eq!(s.preemptions, 0, "{s:?}");
    assert!(s.offloaded_peak_bytes > 0, "{s:?}");
    assert_eq!((s.offloaded_bytes, s.offloaded_sequences), (0, 0), "{s:?}");
    assert_eq!((s.pages_used, s.swa_pages_used), (0, 0), "{s:?}");
    assert_eq!(host(model), host_before, "host memory left behind");
    eprintln!("{s:?}");
}

#[test]
fn a_small_pool_offloads_pages_to_the_host_and_restores_them() {
    let test = "a_small_pool_offloads_pages_to_the_host_and_restores_them";
    let Some(engine) = engine(test) else { return };
    let model = tiny(&engine);
    let (prompts, options) = small_pool(true);
    offloads_and_restores(&model, &prompts, options);
}

#[test]
fn the_preallocation_policy_holds_spare_pages_that_others_reclaim() {
    let test = "the_preallocation_policy_holds_spare_pages_that_others_reclaim";
    let Some(engine) = engine(test) else { return };
    let model = tiny(&engine);
    let params = greedy(30);
    let a: Vec<u32> = (0..6).map(|i| i * 17 + 4).collect();
    let b: Vec<u32> = (0..20).map(|i| (i * 23 + 9) % 250).collect();
    let want = [alone(&model, &a, &params), alone(&model, &b, &params)];
    // Pages of 4: `a` fills 9 of them, `b` 13, and the pools hold 20: `b` joins once `a`
    // holds pages ahead, and near their ends the pages one needs are the other's spares.
    let with_policy = |policy: Policy| {
        let mut batch = BatchEngine::new(
            &model,
            BatchOptions {
                page_size: 4,
                pool_tokens: 80,
                step_tokens: 32,
                max_batch: 2,
                run: RunOptions::new(policy),
                ..BatchOptions::default()
            },
        )
        .unwrap();
        let (out, ids) = run(&mut batch, &[(0, a.clone()), (8, b.clone())], &params);
        for (k, id) in ids.iter().enumerate() {
            assert_same(&format!("{policy} sequence {k}"), &out[id], &want[k]);
        }
        batch.stats()
    };
    let openvino = with_policy(Policy::OpenVino);
    assert!(openvino.spare_pages_reclaimed > 0, "{openvino:?}");
    assert_eq!(openvino.preemptions, 0, "{openvino:?}");
    let none = with_policy(Policy::None);
    assert_eq!(none.spare_pages_reclaimed, 0, "{none:?}");
    assert_eq!((openvino.spare_pages, none.spare_pages), (0, 0));
    eprintln!("{test}: openvino {openvino:?}\nnone {none:?}");
}

#[test]
fn batched_sliding_window_layers_match_alone() {
    let test = "batched_sliding_window_layers_match_alone";
    let Some(engine) = engine(test) else { return };
    // Gemma 3's layout with a window of 4: layers 0-4 local, 5 global, 6 local.
    let t = super::tiny_gemma3(4);
    let backing: dynrt::tensor::Backing = Arc::new(t.build(11).unwrap());
    let model = Model::from_backing(&engine, backing, ModelOptions::default()).unwrap();
    let params = greedy(24);
    let prompts: Vec<Vec<u32>> = vec![vec![5, 80, 33, 120, 7, 9], (1..20).collect()];
    let options = BatchOptions {
        page_size: 4,
        pool_tokens: 256,
        ..BatchOptions::default()
    };
    batched_equals_alone(&model, &prompts, &params, options);

    // The sliding-window layers give their pages back once out of the window: with a
    // window of 4 and pages of 4, a decoding sequence holds at most 3 of them (the window's
    // two and the page being written) while its global layers hold every page.
    // Their pools hold what max_batch sequences need: (window + step_tokens) / page + 1
    // pages each, 4 here, against the 64 of the global layers.
    let options = BatchOptions {
        step_tokens: 8,
        max_batch: 2,
        ..options
    };
    let mut batch = BatchEngine::new(&model, options).unwrap();
    assert_eq!(batch.stats().swa_pages_total, 8);
    batch.add(&prompts[1], params).unwrap();
    let (mut most_swa, mut most) = (0, 0);
    while !batch.is_idle() {
        batch.step_blocking().unwrap();
        let s = batch.stats();
        most_swa = most_swa.max(s.swa_pages_used);
        most = most.max(s.pages_used);
    }
    assert!(most_swa <= 3, "sliding-window pages held: {most_swa}");
    assert!(most >= 10, "global pages held: {most}");
    let s = batch.stats();
    assert_eq!((s.pages_used, s.swa_pages_used), (0, 0));

    // Offloaded sequences bring back only their pages in the window to the sliding-window
    // pools: twelve global pages of 4 for three sequences of up to 34 positions.
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|k| (0..14).map(|i| (i * 13 + k * 31 + 2) % 250).collect())
        .collect();
    let options = BatchOptions {
        pool_tokens: 48,
        step_tokens: 16,
        max_batch: 3,
        ..options
    };
    offloads_and_restores(&model, &prompts, options);
}

#[test]
fn smollm2_batched_answers_equal_the_answers_alone() {
    let test = "smollm2_batched_answers_equal_the_answers_alone";
    let Some((engine, path, _)) = smollm2(test) else {
        return;
    };
    let model = Model::load(&engine, &path, ModelOptions::default()).unwrap();
    let params = greedy(8);
    let texts = [
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "What is the capital of Italy?",
    ];
    let prompts: Vec<Vec<u32>> = texts.iter().map(|t| prompt_ids(&model, true, t)).collect();
    let want: Vec<_> = prompts.iter().map(|p| alone(&model, p, &params)).collect();
    let mut batch = BatchEngine::new(&model, BatchOptions::default()).unwrap();
    let later: Vec<_> = prompts.iter().map(|p| (0, p.clone())).collect();
    let (out, ids) = run(&mut batch, &later, &params);
    for (k, id) in ids.iter().enumerate() {
        assert_same_within(texts[k], &out[id], &want[k], 1e-3);
    }
    eprintln!("{test}: {:?}", batch.stats());
}

#[test]
fn bad_options_and_requests_are_refused_with_typed_errors() {
    let test = "bad_options_and_requests_are_refused_with_typed_errors";
    let Some(engine) = engine(test) else { return };
    let model = tiny(&engine);
    let bad = |options: BatchOptions| match BatchEngine::new(&model, options) {
        Err(LlmError::BadParameter { name, .. }) => name,
        other => panic!("not refused: {other:?}"),
    };
    let base = BatchOptions::default();
    assert_eq!(
        bad(BatchOptions {
            page_size: 0,
            ..base
        }),
        "page_size"
    );
    assert_eq!(
        bad(BatchOptions {
            pool_tokens: 0,
            ..base
        }),
        "pool_tokens"
    );
    assert_eq!(
        bad(BatchOptions {
            step_tokens: 0,
            ..base
        }),
        "step_tokens"
    );
    assert_eq!(
        bad(BatchOptions {
            max_batch: 200,
            ..base
        }),
        "max_batch"
    );
    // Pools larger than one storage binding per layer.
    assert_eq!(
        bad(BatchOptions {
            pool_tokens: u32::MAX,
            ..base
        }),
        "pool_tokens"
    );
    let mut batch = BatchEngine::new(&model, base).unwrap();
    let params = greedy(4);
    assert!(matches!(batch.add(&[], params), Err(LlmError::EmptyPrompt)));
    let vocab = model.config().vocab_size;
    assert!(matches!(
        batch.add(&[1, vocab], params),
        Err(LlmError::UnknownToken { .. })
    ));
    let context = model.context_len() as usize;
    assert!(matches!(
        batch.add(&vec![1; context], params),
        Err(LlmError::ContextFull { .. })
    ));
    // Nothing was added; the engine still runs a good request.
    assert!(batch.is_idle());
    batch.add(&[1, 2, 3], params).unwrap();
    let mut tokens = 0;
    while !batch.is_idle() {
        tokens += batch.step_blocking().unwrap().len();
    }
    assert_eq!(tokens, 4);
    assert_eq!(batch.stats().pages_used, 0);
}
