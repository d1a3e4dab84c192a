//! `llm::Scheduler` on SmolLM2: several requests of different lengths in one batched forward
//! pass per step give each the greedy tokens it gets alone; a long prompt is prefilled in
//! chunks beside the others' decode rows; cancelling frees the request's pages at once; a
//! small budget queues requests and every one of them finishes. Skips without the model or a GPU
//! (`DYNRT_REQUIRE_MODEL=1`, `DYNRT_REQUIRE_GPU=1` make that a failure).

use dynrt::gpu::{testing, Engine};
use dynrt::llm::{
    FinishReason, GenerateParams, LlmError, Model, ModelOptions, Prompt, Request, RequestId,
    ScheduleError, Scheduler, SchedulerEvent, SchedulerOptions,
};
use dynrt::memory::predictor::Policy;
use dynrt::runtime::RunOptions;
use dynrt::tokenizer::ChatMessage;
use std::collections::HashMap;

fn smollm2(test: &str) -> Option<Model> {
    let path = dynrt::fetch::model_or_skip(test)?;
    let engine = Engine::new(testing::gpu_or_skip(test)?);
    Some(Model::load(&engine, &path, ModelOptions::default()).unwrap())
}

fn run_options() -> RunOptions {
    RunOptions::new(Policy::Adaptive)
}

fn chat(text: &str) -> Prompt {
    Prompt::Chat(vec![ChatMessage::user(text)])
}

fn params(max_tokens: usize, stop_at_eos: bool) -> GenerateParams {
    GenerateParams {
        max_tokens,
        stop_at_eos,
        ..GenerateParams::default()
    }
}

/// A prompt of about 300 tokens (several chunks of 64).
fn long_text() -> String {
    "The history of the printing press begins in the fifteenth century, when movable type \
     changed how books were made and who could read them. "
        .repeat(12)
        + "In one sentence, the printing press"
}

/// What one request produced through the scheduler.
#[derive(Debug, Default)]
struct Outcome {
    tokens: Vec<u32>,
    text: String,
    reason: Option<FinishReason>,
}

/// Steps until idle; returns each request's outcome and the request of every token event
/// in order. Checks after every step that the KV reserved stays within the budget.
fn drain(s: &mut Scheduler) -> (HashMap<RequestId, Outcome>, Vec<RequestId>) {
    let mut out: HashMap<RequestId, Outcome> = HashMap::new();
    let mut order = Vec::new();
    while !s.is_idle() {
        let events = s.step_blocking();
        let mut seen = std::collections::HashSet::new();
        for e in &events {
            if let SchedulerEvent::Token { id, .. } = e {
                assert!(
                    seen.insert(*id),
                    "one token per request per step: {events:?}"
                );
            }
        }
        for e in events {
            match e {
                SchedulerEvent::Token {
                    id, token, text, ..
                } => {
                    let o = out.entry(id).or_default();
                    o.tokens.push(token);
                    o.text.push_str(&text);
                    order.push(id);
                }
                SchedulerEvent::Finished { id, reason, .. } => {
                    out.entry(id).or_default().reason = Some(reason);
                }
                SchedulerEvent::Failed { id, error } => panic!("request {id} failed: {error}"),
                SchedulerEvent::Started { .. } => {}
            }
        }
        let st = s.stats();
        assert!(
            st.kv_reserved_bytes <= st.budget_bytes,
            "{} reserved over the budget {}",
            st.kv_reserved_bytes,
            st.budget_bytes
        );
    }
    (out, order)
}

#[test]
fn scheduled_greedy_answers_equal_each_request_run_alone() {
    let test = "scheduled_greedy_answers_equal_each_request_run_alone";
    let Some(model) = smollm2(test) else { return };
    let requests = vec![
        Request::new(chat("What is the capital of France?"), params(12, true)),
        Request::new(
            Prompt::Text("The quick brown fox jumps over the lazy dog. The dog".into()),
            params(16, false),
        ),
        Request::new(Prompt::Text(long_text()), params(8, false)),
        Request::new(
            chat("Write a Python function that checks whether a number is prime."),
            params(10, true),
        ),
    ];
    let mut options = SchedulerOptions::new(64 << 20, run_options());
    options.prefill_chunk = 64;
    let mut s = Scheduler::new(model.clone(), options).unwrap();
    // Each alone, in a session of its own, as `dynrt generate` runs it (its prompt
    // prefilled whole).
    let mut alone = Vec::new();
    for r in &requests {
        let mut session = model.session(run_options());
        let g = match &r.prompt {
            Prompt::Chat(m) => session.chat_blocking(&m[0].content, &r.params, &mut |_| {}),
            Prompt::Text(t) => session.generate_blocking(t, &r.params, &mut |_| {}),
            Prompt::Ids(_) | Prompt::ChatWithTools { .. } => unreachable!("no ids or tools here"),
        }
        .unwrap();
        assert_eq!(
            s.encode(&r.prompt).unwrap(),
            session.cached_tokens()[..g.prompt_tokens]
        );
        alone.push((g.prompt_tokens, g));
    }
    assert!(
        alone[2].0 > 4 * 64,
        "the long prompt has {} tokens",
        alone[2].0
    );
    let ids: Vec<RequestId> = requests
        .iter()
        .map(|r| s.submit(r.clone()).unwrap())
        .collect();
    let (out, order) = drain(&mut s);
    for (i, (id, (_, g))) in ids.iter().zip(&alone).enumerate() {
        let o = &out[id];
        assert_eq!(o.tokens, g.tokens, "request {i}: tokens");
        assert_eq!(o.text, g.text, "request {i}: text");
    }
    assert_eq!(out[&ids[0]].text, "The capital of France is Paris.");
    assert_eq!(out[&ids[0]].reason, Some(FinishReason::Stop));
    assert_eq!(out[&ids[1]].reason, Some(FinishReason::Length));
    // The long prompt took at least five passes; the short requests answered meanwhile.
    let first_long = order.iter().position(|&id| id == ids[2]).unwrap();
    let before: Vec<_> = order[..first_long]
        .iter()
        .filter(|&&id| id != ids[2])
        .collect();
    assert!(
        before.len() >= 4,
        "tokens before the long prompt's first: {order:?}"
    );
    let st = s.stats();
    assert!(st.prefill_steps >= alone[2].0.div_ceil(64) as u64, "{st:?}");
    assert!(st.decode_steps > 0 && st.batch_sequences <= 4, "{st:?}");
    assert_eq!(st.finished, 4);
    assert_eq!(
        st.tokens_generated_total,
        alone
            .iter()
            .map(|(_, g)| g.tokens.len() as u64)
            .sum::<u64>()
    );
    assert_eq!((st.active, st.queued, st.kv_reserved_bytes), (0, 0, 0));
    eprintln!("{test}: token order {order:?}");

    // A stop text ends the answer before it; it is not part of the text.
    let mut r = requests[0].clone();
    r.stop = vec![" Paris".into()];
    let id = s.submit(r).unwrap();
    let (out, _) = drain(&mut s);
    assert_eq!(out[&id].text, "The capital of France is");
    assert_eq!(out[&id].reason, Some(FinishReason::Stop));
}

#[test]
fn requests_outgrowing_the_pools_go_to_host_memory_and_answer_as_alone() {
    let test = "requests_outgrowing_the_pools_go_to_host_memory_and_answer_as_alone";
    let Some(model) = smollm2(test) else { return };
    let requests = [
        Request::new(chat("What is the capital of France?"), params(40, false)),
        Request::new(chat("Write a haiku about the sea."), params(40, false)),
    ];
    let probe =
        Scheduler::new(model.clone(), SchedulerOptions::new(1 << 20, run_options())).unwrap();
    let lens: Vec<usize> = (requests.iter())
        .map(|r| probe.encode(&r.prompt).unwrap().len())
        .collect();
    drop(probe);
    // Pools of pages of 16 with room for both prompts and one page more, not for both
    // answers: both start, and when neither can grow, one goes to host memory.
    let pages: usize = lens.iter().map(|n| (n + 1).div_ceil(16)).sum::<usize>() + 1;
    let needed: usize = lens.iter().map(|n| (n + 40).div_ceil(16)).sum();
    assert!(needed > pages, "{lens:?}");
    let budget = (pages * 16) as u64 * model.kv_bytes_per_token();
    let mut s =
        Scheduler::new(model.clone(), SchedulerOptions::new(budget, run_options())).unwrap();
    let alone: Vec<Vec<u32>> = (requests.iter())
        .map(|r| {
            let mut session = model.session(run_options());
            let Prompt::Chat(m) = &r.prompt else {
                unreachable!("chats only")
            };
            (session.chat_blocking(&m[0].content, &r.params, &mut |_| {}))
                .unwrap()
                .tokens
        })
        .collect();
    let ids: Vec<RequestId> = (requests.iter())
        .map(|r| s.submit(r.clone()).unwrap())
        .collect();
    let (out, _) = drain(&mut s);
    for (k, id) in ids.iter().enumerate() {
        assert_eq!(out[id].tokens, alone[k], "request {k}");
    }
    let st = s.stats();
    assert!(st.offloads > 0 && st.kv_offloaded_peak_bytes > 0, "{st:?}");
    assert_eq!((st.preemptions, st.kv_offloaded_bytes), (0, 0), "{st:?}");
    eprintln!("{test}: {st:?}");
}

#[test]
fn cancelling_a_request_frees_its_pages_at_once() {
    let test = "cancelling_a_request_frees_its_pages_at_once";
    let Some(model) = smollm2(test) else { return };
    let engine = model.engine().clone();
    let per_token = model.kv_bytes_per_token();
    let mut s = Scheduler::new(model, SchedulerOptions::new(64 << 20, run_options())).unwrap();
    let request = Request::new(Prompt::Text(long_text()), params(40, false));
    // Two requests side by side until the first has 3 tokens, then both cancelled; returns
    // the device bytes while they ran, and checks the scheduler's counters.
    let mut run_and_cancel = || {
        let id = s.submit(request.clone()).unwrap();
        let second = s.submit(request.clone()).unwrap();
        let mut tokens = 0;
        while tokens < 3 {
            tokens += s
                .step_blocking()
                .iter()
                .filter(|e| matches!(e, SchedulerEvent::Token { id: i, .. } if *i == id))
                .count();
        }
        let st = s.stats();
        assert_eq!(st.active, 2);
        let busy = engine.stats().device_current_bytes();
        assert!(s.cancel(id));
        assert!(s.cancel(second));
        assert!(!s.cancel(id), "already gone");
        assert!(s.is_idle());
        let after = s.stats();
        assert_eq!(
            (after.active, after.pages_used, after.kv_reserved_bytes),
            (0, 0, 0)
        );
        (busy, st)
    };
    let (busy, st) = run_and_cancel();
    // Both requests held the long prompt (about 300 tokens) and more, in whole pages of the
    // pools (allocated once and kept: the cancel frees and allocates no device memory). The
    // second started after the first had computed pages of the same prompt and shares
    // them: a shared page counts for both.
    let held = u64::from(st.pages_used) * st.page_bytes;
    let seen = u64::from(st.pages_used + st.pages_shared) * st.page_bytes;
    assert!(st.pages_shared > 0 && st.tokens_shared > 0, "{st:?}");
    assert!(seen >= 2 * 300 * per_token, "{st:?}");
    assert!(
        held <= st.budget_bytes && st.kv_allocated_bytes == st.budget_bytes,
        "{st:?}"
    );
    assert_eq!(engine.stats().device_current_bytes(), busy);
    // The freed pages serve the next requests: the same again, no new device memory. The
    // prompt's full pages (about 300 tokens) stayed in the prompt cache: the first takes
    // them from there and the second shares them (so neither computes a copy of them).
    let (busy_again, st_again) = run_and_cancel();
    assert_eq!(busy_again, busy);
    assert!(st_again.pages_used <= st.pages_used, "{st_again:?}");
    assert!(st_again.tokens_cached >= 256, "{st_again:?}");
    assert_eq!(s.stats().cancelled, 4);
    eprintln!(
        "{test}: {} pages of {} B held by two requests, device bytes {busy} before and after",
        st.pages_used, st.page_bytes
    );
}

#[test]
fn a_small_budget_queues_requests_and_every_one_finishes() {
    let test = "a_small_budget_queues_requests_and_every_one_finishes";
    let Some(model) = smollm2(test) else { return };
    let probe =
        Scheduler::new(model.clone(), SchedulerOptions::new(1 << 20, run_options())).unwrap();
    let prompts = [
        "What is the capital of France?",
        "Name a colour.",
        "What is two plus two?",
    ];
    let needs: Vec<u64> = prompts
        .iter()
        .map(|p| {
            let n = probe.encode(&chat(p)).unwrap().len();
            probe.need_bytes(n, 6).0 as u64
        })
        .collect();
    // Room for the largest one in whole pages of 16 positions, not for two.
    let per_token = model.kv_bytes_per_token();
    let positions = needs.iter().max().unwrap().div_ceil(16) * 16;
    let budget = positions * per_token;
    assert!(2 * needs.iter().min().unwrap() > positions, "{needs:?}");
    let mut s =
        Scheduler::new(model.clone(), SchedulerOptions::new(budget, run_options())).unwrap();
    // The pools hold whole pages: at most the budget.
    let ids: Vec<RequestId> = prompts
        .iter()
        .map(|p| s.submit(Request::new(chat(p), params(6, true))).unwrap())
        .collect();
    assert_eq!(s.stats().queued, 3);
    let mut most_active = 0;
    let mut done = HashMap::new();
    while !s.is_idle() {
        for e in s.step_blocking() {
            if let SchedulerEvent::Finished { id, reason, .. } = e {
                done.insert(id, reason);
            }
        }
        let st = s.stats();
        most_active = most_active.max(st.active);
        assert!(st.kv_reserved_bytes <= budget);
    }
    assert_eq!(most_active, 1, "the budget holds one request at a time");
    assert_eq!(done.len(), 3, "{done:?}");
    assert!(ids.iter().all(|id| done.contains_key(id)));

    // Refused at once, nothing queued: too large for the whole budget, and invalid.
    let big = s.submit(Request::new(chat(prompts[0]), params(1000, true)));
    assert!(
        matches!(big, Err(ScheduleError::OverBudget { .. })),
        "{big:?}"
    );
    let mut invalid = |r: Request| match s.submit(r) {
        Err(ScheduleError::Invalid(e)) => *e,
        other => panic!("not refused as invalid: {other:?}"),
    };
    let zero = invalid(Request::new(chat(prompts[0]), params(0, true)));
    assert!(matches!(zero, LlmError::BadParameter { .. }), "{zero:?}");
    let empty = invalid(Request::new(Prompt::Text(String::new()), params(1, true)));
    assert!(matches!(empty, LlmError::EmptyPrompt), "{empty:?}");
    let context = model.context_len() as usize;
    let long = invalid(Request::new(
        Prompt::Ids(vec![1; context + 1]),
        params(1, true),
    ));
    assert!(matches!(long, LlmError::ContextFull { .. }), "{long:?}");
    assert!(s.is_idle());
}
