//! Text generation through the library: load SmolLM2 once, open two sessions that share its
//! weights, stream a chat reply and a raw continuation, then ask a follow-up that reuses the
//! first session's KV cache.
//!
//! ```sh
//! cargo run --release -- fetch                 # once: puts the model in the cache
//! cargo run --release --example generate [MODEL.gguf]
//! ```

use dynrt::gpu::{Engine, Gpu, GpuOptions};
use dynrt::llm::{GenerateParams, Model, ModelOptions, SamplingParams};
use dynrt::memory::predictor::Policy;
use dynrt::memory::AllocKind;
use dynrt::runtime::RunOptions;
use std::io::Write;

fn main() -> anyhow::Result<()> {
    let explicit = std::env::args().nth(1).map(std::path::PathBuf::from);
    let path = dynrt::fetch::resolve_model(explicit.as_deref())?;
    let engine = Engine::new(Gpu::new_blocking(GpuOptions::from_env()?)?);

    // One load: the weights go to the device once, in their GGUF format.
    let model = Model::load(&engine, &path, ModelOptions::default())?;
    let c = model.config();
    println!(
        "{}: {} layers, {} heads ({} KV), context {}; weights {:.1} MB on the device",
        path.display(),
        c.num_layers,
        c.num_heads,
        c.num_kv_heads,
        c.context_len,
        model.weight_bytes() as f64 / 1e6
    );

    // Text is printed as soon as it is whole UTF-8.
    let mut print = |piece: &str| {
        print!("{piece}");
        let _ = std::io::stdout().flush();
    };
    let greedy = GenerateParams {
        max_tokens: 48,
        ..GenerateParams::default()
    };

    // Session 1: a chat (the model's template), greedy.
    let mut chat = model.session(RunOptions::new(Policy::Adaptive));
    print!("\n> What is the capital of France?\n");
    let reply = chat.chat_blocking("What is the capital of France?", &greedy, &mut print)?;
    println!(
        "\n  [{} prompt tokens, {:.1} tokens/s; {} tokens at {:.0} ms each]",
        reply.prompt_tokens,
        reply.prefill_tokens_per_s(),
        reply.tokens.len(),
        reply.decode_ms_per_token()
    );

    // Session 2, beside it: a raw continuation, sampled with a seed.
    let mut story = model.session(RunOptions::new(Policy::Adaptive));
    let sampled = GenerateParams {
        max_tokens: 32,
        sampling: SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            seed: 7,
            ..SamplingParams::default()
        },
        ..GenerateParams::default()
    };
    print!("\nOnce upon a time");
    story.generate_blocking("Once upon a time", &sampled, &mut print)?;
    println!();

    // Back to session 1: only the new turn is prefilled, the first stays in its KV cache.
    print!("\n> And of Germany?\n");
    let follow = chat.chat_blocking("And of Germany?", &greedy, &mut print)?;
    println!(
        "\n  [{} new prompt tokens on top of {} cached]",
        follow.prompt_tokens,
        chat.cached_tokens().len() - follow.prompt_tokens - follow.tokens.len() + 1
    );

    let stats = engine.stats();
    println!(
        "\nKV cache of session 1: {} reserved for {} needed; device memory peak {:.1} MB",
        chat.kv_reserved_bytes(),
        chat.kv_needed_bytes(),
        stats.peak_bytes(AllocKind::UsmDevice) as f64 / 1e6
    );
    Ok(())
}
