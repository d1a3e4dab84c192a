//! `dynrt generate` (one prompt, text streamed to stdout) and `dynrt chat` (an interactive
//! multi-turn session): a GGUF model of any architecture dynrt runs, on the GPU.

use anyhow::Context;
use dynrt::llm::{GenerateParams, GenerationReport, SamplingParams};
use dynrt::memory::AllocKind;
use dynrt::runtime::report::{human_bytes, render_svg};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use super::shared::model::{open, ModelArgs};

/// How tokens are chosen and how many.
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Tokens to generate at most.
    #[arg(long = "max-tokens", default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep the K most likely tokens (0: all).
    #[arg(long = "top-k", default_value_t = 0)]
    pub top_k: usize,
    /// Keep the most likely tokens up to this probability mass (1: all).
    #[arg(long = "top-p", default_value_t = 1.0)]
    pub top_p: f32,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Keep generating after the end-of-sequence token.
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
}

impl SamplingArgs {
    fn params(&self) -> GenerateParams {
        GenerateParams {
            max_tokens: self.max_tokens,
            sampling: SamplingParams {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                seed: self.seed,
                ..SamplingParams::default()
            },
            stop_at_eos: !self.ignore_eos,
            keep_logits: false,
        }
    }
}

/// Arguments of `dynrt generate`.
#[derive(clap::Args, Debug, Clone)]
#[command(group = clap::ArgGroup::new("input").required(true))]
pub struct Args {
    /// Raw text to continue (control tokens written in it are matched).
    #[arg(long, group = "input")]
    pub prompt: Option<String>,
    /// A user message, rendered with the model's chat template.
    #[arg(long, group = "input")]
    pub chat: Option<String>,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Print one JSON object (tokens, text, speed, memory) instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Write an SVG of bytes in use per kind over the steps.
    #[arg(long)]
    pub report: Option<PathBuf>,
}

/// Arguments of `dynrt chat`.
#[derive(clap::Args, Debug, Clone)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// Prints the progress of a prompt prefilled in chunks (only prompts longer than one chunk
/// report it).
fn show_prefill_progress(session: &mut dynrt::llm::Session) {
    session.set_prefill_progress(|done, total| eprintln!("[prefill {done}/{total} tokens]"));
}

/// Runs `dynrt generate`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    // The report's file is created first: a path that cannot be written fails at once,
    // not after the whole generation.
    let mut report_file = match &args.report {
        Some(path) => Some(
            std::fs::File::create(path).with_context(|| format!("--report {}", path.display()))?,
        ),
        None => None,
    };
    let (engine, model, run) = open(&args.model)?;
    let mut session = model.session(run);
    show_prefill_progress(&mut session);
    let params = args.sampling.params();
    let stdout = std::io::stdout();
    let stream = !args.json;
    let mut on_text = |piece: &str| {
        if stream {
            let mut out = stdout.lock();
            let _ = out.write_all(piece.as_bytes());
            let _ = out.flush();
        }
    };
    let g = match (&args.prompt, &args.chat) {
        (_, Some(chat)) => session.chat_blocking(chat, &params, &mut on_text)?,
        (Some(prompt), None) => session.generate_blocking(prompt, &params, &mut on_text)?,
        (None, None) => anyhow::bail!("give --prompt TEXT or --chat TEXT"),
    };
    if let (Some(path), Some(file)) = (&args.report, report_file.as_mut()) {
        let title = format!(
            "dynrt generate: {} policy, {} prompt + {} generated tokens on {}",
            args.model.policy,
            g.prompt_tokens,
            g.tokens.len(),
            engine.gpu().adapter_info().name
        );
        file.write_all(render_svg(session.trace(), &title).as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&GenerationReport::new(&session, &g, &args.model.policy))?
        );
    } else {
        println!();
        eprintln!(
            "[{} prompt tokens at {:.1} tokens/s; {} generated, {:.1} ms per token; KV {} reserved for {} needed; peak device {}]",
            g.prompt_tokens,
            g.prefill_tokens_per_s(),
            g.tokens.len(),
            g.decode_ms_per_token(),
            human_bytes(session.kv_reserved_bytes()),
            human_bytes(session.kv_needed_bytes()),
            human_bytes(engine.stats().peak_bytes(AllocKind::UsmDevice)),
        );
        let [global, local] = session.kv_by_layer_kind();
        if local.layers > 0 {
            eprintln!(
                "[KV of {} global layers {} reserved for {} needed; of {} sliding-window layers {} reserved for {} needed]",
                global.layers,
                human_bytes(global.reserved_bytes),
                human_bytes(global.needed_bytes),
                local.layers,
                human_bytes(local.reserved_bytes),
                human_bytes(local.needed_bytes),
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `dynrt chat`: one line of stdin per turn; `/reset` starts over, `/quit` or end of
/// input ends.
pub fn run_chat(args: ChatArgs) -> anyhow::Result<ExitCode> {
    let (_engine, model, run) = open(&args.model)?;
    let mut session = model.session(run);
    show_prefill_progress(&mut session);
    let params = args.sampling.params();
    eprintln!(
        "chatting with {} ({} layers, context {}): one message per line, /reset to start over, /quit to end",
        model.config().arch.name,
        model.config().num_layers,
        model.context_len()
    );
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut raw = Vec::new();
    loop {
        print!("> ");
        std::io::stdout().flush()?;
        raw.clear();
        if input.read_until(b'\n', &mut raw)? == 0 {
            break;
        }
        // A line that is not UTF-8 is refused alone; the conversation goes on.
        let Ok(line) = std::str::from_utf8(&raw) else {
            eprintln!("error: that line is not valid UTF-8 text; it was ignored");
            continue;
        };
        let text = line.trim();
        match text {
            "" => continue,
            "/quit" | "/exit" => break,
            "/reset" => {
                session.reset();
                eprintln!("(new conversation)");
                continue;
            }
            _ => {}
        }
        let mut on_text = |piece: &str| {
            print!("{piece}");
            let _ = std::io::stdout().flush();
        };
        match session.chat_blocking(text, &params, &mut on_text) {
            Ok(g) => {
                println!();
                eprintln!(
                    "[{} new prompt tokens at {:.1} tokens/s, {} generated at {:.1} ms per token, {} in the cache]",
                    g.prompt_tokens,
                    g.prefill_tokens_per_s(),
                    g.tokens.len(),
                    g.decode_ms_per_token(),
                    session.cached_tokens().len()
                );
            }
            Err(e) => eprintln!("\nerror: {e}"),
        }
    }
    Ok(ExitCode::SUCCESS)
}
