//! Token events while generating (`Session::generate_ids_observed`, `Session::chat_observed`:
//! what the browser page draws live) and the generation report (`GenerationReport`: the
//! JSON of `dynrt generate --json` and of the page), on a tiny llama model on the GPU.

use dynrt::gguf::TinyLlama;
use dynrt::gpu::{testing, Engine};
use dynrt::llm::{GenerateParams, Generation, GenerationReport, Model, ModelOptions, Session};
use dynrt::memory::predictor::Policy;
use dynrt::runtime::report::TraceSample;
use dynrt::runtime::RunOptions;
use std::sync::Arc;

fn model(test: &str) -> Option<Model> {
    let engine = Engine::new(testing::gpu_or_skip(test)?);
    let bytes = TinyLlama::default().build(11).unwrap();
    Some(Model::from_backing(&engine, Arc::new(bytes), ModelOptions::default()).unwrap())
}

/// What one event said, owned.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    index: usize,
    token: u32,
    text: String,
    forward_ms: f64,
    memory: Option<TraceSample>,
}

fn params(max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        stop_at_eos: false,
        ..GenerateParams::default()
    }
}

/// The events of `g` must be one per token, in order, with its text, the time of the
/// forward pass that chose it and the session's memory sample of that pass.
fn check_events(seen: &[Seen], g: &Generation, session: &Session, first_sample: usize) {
    assert_eq!(seen.len(), g.tokens.len(), "one event per token");
    let text: String = seen.iter().map(|e| e.text.as_str()).collect();
    assert_eq!(
        text, g.text,
        "the events' texts add up to the generation's text"
    );
    let samples = &session.trace().samples;
    assert_eq!(
        samples.len(),
        first_sample + g.tokens.len(),
        "one memory sample per token (a step submitted ahead and given up leaves none)"
    );
    for (i, e) in seen.iter().enumerate() {
        assert_eq!((e.index, e.token), (i, g.tokens[i]));
        let want_ms = if i == 0 {
            g.prefill_ms
        } else {
            g.decode_ms[i - 1]
        };
        assert_eq!(e.forward_ms, want_ms, "event {i}: its forward pass's time");
        assert_eq!(
            e.memory.as_ref(),
            samples.get(first_sample + i),
            "event {i}: the memory sample of its forward pass"
        );
    }
}

#[test]
fn token_events_follow_the_generation_and_the_plain_calls_are_unchanged() {
    let Some(model) = model("token_events_follow_the_generation") else {
        return;
    };
    let prompt = model
        .tokenizer()
        .encode("hello world", dynrt::tokenizer::Special::Allow);
    let mut seen = Vec::new();
    let mut observed = model.session(RunOptions::new(Policy::Adaptive));
    let g = generate_observed(&mut observed, &prompt, &params(12), &mut seen);
    check_events(&seen, &g, &observed, 0);
    assert_eq!(g.tokens.len(), 12);
    // The first pass allocates the request's buffers: the chart marks it.
    assert!(seen[0].memory.as_ref().unwrap().reallocations > 0);

    // The text-only call: the same tokens and text, the text streamed in the same pieces
    // (empty ones left out).
    let mut plain = model.session(RunOptions::new(Policy::Adaptive));
    let mut pieces = Vec::new();
    let p = pollster::block_on(
        plain.generate_ids(&prompt, &params(12), &mut |t| pieces.push(t.to_owned())),
    )
    .unwrap();
    assert_eq!((&p.tokens, &p.text), (&g.tokens, &g.text));
    let nonempty: Vec<String> = seen
        .iter()
        .filter(|e| !e.text.is_empty())
        .map(|e| e.text.clone())
        .collect();
    assert_eq!(pieces, nonempty);

    // A second turn of a chat: events number from 0 again, and carry the samples of this
    // turn's passes (after the first turn's).
    let mut chat = model.session(RunOptions::new(Policy::OpenVino));
    let mut first = Vec::new();
    let g1 = chat_observed(&mut chat, "hi", &params(5), &mut first);
    check_events(&first, &g1, &chat, 0);
    let before = chat.trace().samples.len();
    let mut second = Vec::new();
    let g2 = chat_observed(&mut chat, "and then?", &params(4), &mut second);
    check_events(&second, &g2, &chat, before);
    let mut other = model.session(RunOptions::new(Policy::OpenVino));
    let o1 = other.chat_blocking("hi", &params(5), &mut |_| {}).unwrap();
    let o2 = other
        .chat_blocking("and then?", &params(4), &mut |_| {})
        .unwrap();
    assert_eq!((o1.tokens, o2.tokens), (g1.tokens, g2.tokens));
}

#[test]
fn the_generation_report_holds_the_sessions_figures() {
    let Some(model) = model("the_generation_report_holds_the_sessions_figures") else {
        return;
    };
    let mut session = model.session(RunOptions::new(Policy::Adaptive));
    let g = session
        .generate_blocking("a b c", &params(6), &mut |_| {})
        .unwrap();
    let r = GenerationReport::new(&session, &g, "adaptive");
    assert_eq!(r.tokens, g.tokens);
    assert_eq!(r.text, g.text);
    assert_eq!(r.prompt_tokens, g.prompt_tokens);
    assert_eq!(r.decode_steps, 5);
    assert_eq!(r.policy, "adaptive");
    assert_eq!(r.kv_needed_bytes, session.kv_needed_bytes());
    assert_eq!(
        r.kv_needed_bytes,
        (g.prompt_tokens as u64 + 5) * model.kv_bytes_per_token()
    );
    assert!(r.kv_reserved_bytes >= r.kv_needed_bytes);
    assert_eq!(r.weights_device_bytes, model.weight_bytes());
    assert_eq!(r.weights_file_bytes, model.file_tensor_bytes());
    assert!(r.regions.constants.bytes >= model.weight_bytes());
    assert_eq!(r.allocations, session.stats().run.allocations);
    // The JSON contract of `dynrt generate --json` (and the page's report).
    let v = serde_json::to_value(&r).unwrap();
    for key in [
        "adapter",
        "backend",
        "policy",
        "tokens",
        "text",
        "stop",
        "prompt_tokens",
        "prefill_ms",
        "prefill_tokens_per_s",
        "decode_steps",
        "decode_ms_per_token",
        "peak_bytes",
        "regions",
        "allocations",
        "reallocations",
        "kv_reserved_bytes",
        "kv_needed_bytes",
        "kv_reserved_over_needed",
        "weights_device_bytes",
        "weights_file_bytes",
    ] {
        assert!(v.get(key).is_some(), "missing `{key}` in {v}");
    }
    assert_eq!(v["stop"], "max_tokens");
}

fn chat_observed(
    session: &mut Session,
    user: &str,
    params: &GenerateParams,
    seen: &mut Vec<Seen>,
) -> Generation {
    pollster::block_on(session.chat_observed(user, params, &mut |e| seen.push(own(e)))).unwrap()
}

fn own(e: &dynrt::llm::TokenEvent<'_>) -> Seen {
    Seen {
        index: e.index,
        token: e.token,
        text: e.text.to_owned(),
        forward_ms: e.forward_ms,
        memory: e.memory.cloned(),
    }
}

fn generate_observed(
    session: &mut Session,
    prompt: &[u32],
    params: &GenerateParams,
    seen: &mut Vec<Seen>,
) -> Generation {
    pollster::block_on(session.generate_ids_observed(prompt, params, &mut |e| seen.push(own(e))))
        .unwrap()
}
