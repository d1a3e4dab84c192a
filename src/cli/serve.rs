//! `dynrt serve`: an OpenAI-compatible HTTP server on one model. The model and its
//! [`Scheduler`] live on one thread ([`SchedulerHandle`]) that runs the GPU work; the HTTP
//! handlers (tokio + axum) tokenize a request's prompt in a small pool of their own
//! (`serve_prepare`), submit it and relay its events, as server-sent events when the client
//! streams. A client that goes away cancels its request.
//!
//! Around the handlers: the connections' limits (`serve_http`), the checks of every request
//! and the uniform errors (`serve_guard`), the latency histograms (`serve_metrics`). The
//! server listens before the model is loaded (503 until then), and SIGTERM or SIGINT drains
//! it: no new request is taken, the running ones finish within `--shutdown-timeout` or end
//! with an error event and `[DONE]`, and a second signal exits at once.

use super::serve_api::{self, ApiError, ChatBody, Choice, CompletionBody, Endpoint, Header};
use super::serve_api::{Defaults, Plan, ShownLogprob, Usage};
use super::serve_embed::Embedder;
use super::serve_guard::{self, truncated, Client, Policy};
use super::serve_http::{self, Limits};
use super::serve_metrics::Metrics;
use super::serve_prepare::{DetokenizeBody, Prep, TokenizeBody};
use super::shared::model::{self, ModelArgs};
use anyhow::Context;
use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use dynrt::llm::{
    Prompt, RequestId, ScheduleError, Scheduler, SchedulerEvent, SchedulerHandle, SchedulerOptions,
    ThreadState,
};
use dynrt::runtime::report::human_bytes;
use dynrt::structured::{TokenTrie, ToolFormat};
use dynrt::tokenizer::Tokenizer;
use futures::StreamExt;
use serde_json::json;
use sha2::Digest;
use std::collections::VecDeque;
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

/// Arguments of `dynrt serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on. A loopback or given address answers only requests whose
    /// `Host` names it (see --allowed-host); 0.0.0.0 or :: answers any, and should have an
    /// --api-key.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the address is printed on stdout).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// KV-cache memory, MiB: the pools of the paged cache, allocated at the first request
    /// and kept (default: 256 MiB, or three quarters of the device budget left after the
    /// weights where that is less; at most what one storage binding holds per layer). A
    /// request starts when its prompt fits beside what the others hold; until then it
    /// waits.
    #[arg(long = "budget-mib")]
    pub budget_mib: Option<u64>,
    /// Requests in progress at once at most; the others wait in the queue.
    #[arg(long = "max-batch", default_value_t = 8)]
    pub max_batch: usize,
    /// Prompt tokens per step, shared by the prompts being read (shortest first): the
    /// longest a prompt holds the other requests back.
    #[arg(long = "prefill-chunk", default_value_t = 128)]
    pub prefill_chunk: usize,
    /// Positions per page of the KV pools: smaller pages waste less of each request's last
    /// page, larger ones give attention fewer page-table reads.
    #[arg(long = "page-size", default_value_t = 16)]
    pub page_size: u32,
    /// When the pools run out of pages, compute a request's tokens again later instead of
    /// copying its pages to host memory and back.
    #[arg(long = "no-offload")]
    pub no_offload: bool,
    /// The model's name in responses and `/v1/models` (default: the file's stem). Requests
    /// may name any model: this server has one.
    #[arg(long)]
    pub alias: Option<String>,
    /// Ignore request fields this server does not implement (logged) instead of answering
    /// 400.
    #[arg(long = "lenient-fields")]
    pub lenient_fields: bool,
    #[command(flatten)]
    pub embedding: super::serve_embed::Args,
    /// Requests waiting for a place at most; more are answered 429 with Retry-After.
    #[arg(long = "max-queue", default_value_t = 64)]
    pub max_queue: usize,
    /// An API key clients must send (`Authorization: Bearer KEY` or `X-Api-Key: KEY`);
    /// repeat for several. Keys also come from --api-key-file and the variable
    /// DYNRT_API_KEY, which keep them out of the process list.
    #[arg(long = "api-key")]
    pub api_key: Vec<String>,
    /// A file of API keys, one per line (blank lines and lines starting with # skipped).
    #[arg(long = "api-key-file")]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Origins (`https://app.example`) whose pages may call this server, comma-separated,
    /// or `*`: they get CORS headers and their preflights are allowed. Pages of other sites
    /// are refused (403).
    #[arg(long = "cors-origins", alias = "allow-origin", value_delimiter = ',')]
    pub cors_origins: Vec<String>,
    /// Another host name requests may give in `Host` (a name this machine has behind a
    /// proxy); repeat for several, `*` for any.
    #[arg(long = "allowed-host")]
    pub allowed_host: Vec<String>,
    /// Connections open at once at most; one more is answered 503 and closed.
    #[arg(long = "max-connections", default_value_t = 256)]
    pub max_connections: usize,
    /// Seconds a request's head may take to arrive, and an idle connection may stay open.
    #[arg(long = "header-timeout", default_value_t = 10.0)]
    pub header_timeout: f64,
    /// Seconds a request's body may take to arrive (408 after).
    #[arg(long = "body-timeout", default_value_t = 30.0)]
    pub body_timeout: f64,
    /// Seconds an answer may wait for the client to read it before its connection closes
    /// (and its request is cancelled).
    #[arg(long = "write-timeout", default_value_t = 60.0)]
    pub write_timeout: f64,
    /// Seconds a generation may take from its arrival (0: no limit); then it ends (a stream
    /// with an error event and `[DONE]`, otherwise a 504).
    #[arg(long = "request-timeout", default_value_t = 600.0)]
    pub request_timeout: f64,
    /// Seconds the running requests may take to finish after SIGTERM or SIGINT; then they
    /// end with an error event and `[DONE]`. A second signal exits at once.
    #[arg(long = "shutdown-timeout", default_value_t = 10.0)]
    pub shutdown_timeout: f64,
}

/// KV-cache bytes when `--budget-mib` is not given (at most).
const DEFAULT_BUDGET: u64 = 256 << 20;

/// The largest request body read, bytes (413 above).
const MAX_BODY_BYTES: usize = 2 << 20;

/// The most bytes of stop texts one request may give (400 above): the scheduler compares
/// them with the answer at every token.
const MAX_STOP_BYTES: usize = 4 << 10;

/// The largest API-key file read.
const MAX_KEY_FILE_BYTES: u64 = 1 << 20;

/// How long connections may take to close after the running requests were ended.
const CUT_GRACE: Duration = Duration::from_secs(5);

/// What the server has once the model is loaded.
struct Loaded {
    handle: SchedulerHandle,
    /// The model's engine: device memory per kind for `/v1/memory`.
    engine: dynrt::gpu::Engine,
    prep: Prep,
    /// The weights on the device, in the file, and reordered into grouped planes (bytes).
    weights: serde_json::Value,
    context: usize,
    max_queue: usize,
    /// The model's tokenizer: token texts for log-probabilities.
    tokenizer: Arc<Tokenizer>,
    /// The vocabulary as a trie, for structured output.
    trie: Arc<TokenTrie>,
    /// How the model's chat template writes tool calls.
    tool_format: Option<ToolFormat>,
    /// The sampling of fields a request leaves out.
    defaults: Defaults,
    /// The sentence model of `--embedding-model` (`/v1/embeddings`).
    embedder: Option<Arc<Embedder>>,
}

/// What every handler shares.
struct App {
    /// The name responses give in `model` (`--alias`, or the file's stem).
    model_id: String,
    /// `--lenient-fields`.
    lenient: bool,
    created: u64,
    /// Response ids are `chatcmpl-` + this + a counter: this server's own 64 random bits, so
    /// ids differ across restarts.
    id_prefix: String,
    next: AtomicU64,
    ttft: Mutex<serve_api::Histogram>,
    metrics: Arc<Metrics>,
    /// The model being served: set once loaded, replaced when a lost device was recovered.
    loaded: RwLock<Option<Arc<Loaded>>>,
    /// Set from a device loss until the model is loaded again on a new device.
    recovering: AtomicBool,
    /// Lost devices recovered from.
    recoveries: AtomicU64,
    /// Why the last try to load the model again failed (`/health` while recovering).
    recover_error: Mutex<Option<String>>,
    /// The command line, to load the model again after a device loss.
    args: Args,
    /// Set by the first signal: no new requests.
    draining: watch::Sender<bool>,
    /// Set once `--shutdown-timeout` has passed: the running requests end now.
    cut: watch::Sender<bool>,
    /// Generation requests between arrival and end.
    generating: AtomicUsize,
    /// Generation requests that ended.
    ended: AtomicU64,
    request_timeout: Option<Duration>,
    body_timeout: Duration,
    /// `DYNRT_SERVE_FAULT=scheduler-panic-after:N`: the scheduler thread panics once N
    /// requests ended (the tests of a server whose scheduler died).
    panic_after: Option<u64>,
    /// `DYNRT_SERVE_FAULT=device-lost-after-tokens:N`: the device is destroyed (as a driver
    /// reset would lose it) when the N-th token reaches a handler (the recovery's tests).
    lose_after_tokens: Option<u64>,
    /// Tokens that reached handlers (counted only with `lose_after_tokens`).
    tokens: AtomicU64,
}

type Shared = Arc<App>;

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// 64 bits that differ between two runs of the server: a hash of the time, the process id
/// and a stack address.
fn boot_id() -> String {
    let local = 0u8;
    let seed = format!(
        "{:?} {} {:p}",
        SystemTime::now().duration_since(UNIX_EPOCH),
        std::process::id(),
        &local
    );
    let digest = sha2::Sha256::digest(seed.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

fn seconds(s: f64, name: &str) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(s).with_context(|| format!("--{name} {s}: give seconds, 0 or more"))
}

/// The API keys of `--api-key`, `--api-key-file` and `DYNRT_API_KEY`.
fn api_keys(args: &Args) -> anyhow::Result<Vec<String>> {
    let mut keys = args.api_key.clone();
    if let Ok(k) = std::env::var("DYNRT_API_KEY") {
        keys.extend(k.split(',').map(str::to_string));
    }
    if let Some(path) = &args.api_key_file {
        let text = dynrt::fileio::read_bounded_text(path, MAX_KEY_FILE_BYTES, "API key file")
            .with_context(|| format!("--api-key-file {}", path.display()))?;
        keys.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_string),
        );
    }
    let keys: Vec<String> = keys
        .into_iter()
        .map(|k| k.trim().to_string())
        .filter(|k| !k.is_empty())
        .collect();
    if let Some(k) = keys
        .iter()
        .find(|k| k.bytes().any(|b| !b.is_ascii_graphic()))
    {
        anyhow::bail!(
            "an API key holds a space or a character outside printable ASCII (it starts with {:?}): \
             keys travel in an HTTP header",
            truncated(k, 4)
        );
    }
    Ok(keys)
}

/// Runs `dynrt serve` until it is stopped by a signal (drained, exit 0) or fails.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let keys = api_keys(&args)?;
    let limits = Limits {
        max_connections: args.max_connections.max(1),
        header_timeout: seconds(args.header_timeout, "header-timeout")?,
        write_timeout: seconds(args.write_timeout, "write-timeout")?,
    };
    let request_timeout = seconds(args.request_timeout, "request-timeout")?;
    let body_timeout = seconds(args.body_timeout, "body-timeout")?;
    let shutdown_timeout = seconds(args.shutdown_timeout, "shutdown-timeout")?;
    let path = model::model_path(args.model.model.as_deref())?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    // A model's name or the file's stem; never its path, which would tell clients where it
    // lives.
    let model_id = match (&args.alias, &args.model.model) {
        (Some(alias), _) => alias.clone(),
        (None, Some(m)) if !m.exists() => m.display().to_string(),
        _ => stem,
    };
    let policy = Policy::new(&args.host, &args.allowed_host, &args.cors_origins, &keys);
    let loopback = args.host == "localhost"
        || args
            .host
            .trim_matches(|c| c == '[' || c == ']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if !loopback && keys.is_empty() {
        eprintln!(
            "warning: dynrt serve listens on {} without an API key: anyone who reaches it can \
             use the model (/v1/memory answers this machine only); give --api-key, \
             --api-key-file or DYNRT_API_KEY",
            args.host
        );
    }
    let fault = |name: &str| {
        std::env::var("DYNRT_SERVE_FAULT").ok().and_then(|f| {
            f.strip_prefix(name)
                .and_then(|n| n.strip_prefix(':'))
                .and_then(|n| n.parse().ok())
        })
    };
    let panic_after = fault("scheduler-panic-after");
    let lose_after_tokens = fault("device-lost-after-tokens");
    let metrics = Arc::new(Metrics::default());
    let app = Arc::new(App {
        model_id,
        lenient: args.lenient_fields,
        created: unix_now(),
        id_prefix: boot_id(),
        next: AtomicU64::new(1),
        ttft: Mutex::new(serve_api::Histogram::default()),
        metrics: metrics.clone(),
        loaded: RwLock::new(None),
        recovering: AtomicBool::new(false),
        recoveries: AtomicU64::new(0),
        recover_error: Mutex::new(None),
        args: args.clone(),
        draining: watch::channel(false).0,
        cut: watch::channel(false).0,
        generating: AtomicUsize::new(0),
        ended: AtomicU64::new(0),
        request_timeout: (!request_timeout.is_zero()).then_some(request_timeout),
        body_timeout,
        panic_after,
        lose_after_tokens,
        tokens: AtomicU64::new(0),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let code = runtime.block_on(serve(args, app, policy, metrics, limits, shutdown_timeout));
    // The pool's threads may be encoding a prompt nobody waits for any more.
    runtime.shutdown_timeout(Duration::from_secs(1));
    code
}

async fn serve(
    args: Args,
    app: Shared,
    policy: Policy,
    metrics: Arc<Metrics>,
    limits: Limits,
    shutdown_timeout: Duration,
) -> anyhow::Result<ExitCode> {
    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("listening on {}:{}", args.host, args.port))?;
    let addr = listener.local_addr()?;
    #[cfg(unix)]
    let mut signals = serve_http::signals::install().context("installing the signal handlers")?;
    let open = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let guard = Arc::new(serve_guard::Guarded { policy, metrics });
    let server = tokio::spawn(serve_http::serve(
        listener,
        router(app.clone(), guard),
        limits,
        app.draining.subscribe(),
        open.clone(),
    ));
    eprintln!(
        "dynrt serve: loading {} on http://{addr} (answering 503 until it is ready)",
        app.model_id
    );
    let model_args = args.clone();
    let loading = tokio::task::spawn_blocking(move || load(&model_args));
    #[cfg(unix)]
    let loaded = tokio::select! {
        l = loading => l.context("loading the model")??,
        s = signals.recv() => {
            eprintln!("dynrt serve: signal {} while loading: exiting", s.unwrap_or(0));
            return Ok(ExitCode::FAILURE);
        }
    };
    #[cfg(not(unix))]
    let loaded = loading.await.context("loading the model")??;
    let summary = format!(
        "serving {} (context {} tokens) on {}: KV budget {}",
        app.model_id,
        loaded.context,
        loaded.engine.gpu().adapter_info().name,
        human_bytes(loaded.handle.stats().scheduler.budget_bytes),
    );
    let d = &loaded.defaults;
    let defaults = format!(
        "defaults: temperature {}, top_k {}, top_p {}, min_p {}, repeat_penalty {} over {} tokens; tools: {}",
        d.temperature,
        d.top_k,
        d.top_p,
        d.min_p,
        d.repeat_penalty,
        d.repeat_last_n,
        if loaded.tool_format.is_some() { "<tool_call> blocks" } else { "none" },
    );
    app.set_loaded(loaded);
    eprintln!("{defaults}");
    println!("dynrt serve: listening on http://{addr}");
    std::io::stdout().flush()?;
    eprintln!(
        "{summary}, {} requests at once, prompts in chunks of {}, {} queued at most",
        args.max_batch.max(1),
        args.prefill_chunk.max(1),
        args.max_queue,
    );
    #[cfg(unix)]
    {
        let signal = signals.recv().await.unwrap_or(libc::SIGTERM);
        drain(
            &app,
            &open,
            limits.max_connections,
            shutdown_timeout,
            signal,
            &mut signals,
        )
        .await;
    }
    #[cfg(not(unix))]
    {
        let _ = (shutdown_timeout, &open);
        std::future::pending::<()>().await;
    }
    server.abort();
    Ok(ExitCode::SUCCESS)
}

/// The first signal's drain: stop taking requests, let the running ones finish within
/// `timeout`, then end them; a second signal exits at once.
#[cfg(unix)]
async fn drain(
    app: &Shared,
    open: &tokio::sync::Semaphore,
    max_connections: usize,
    timeout: Duration,
    signal: i32,
    signals: &mut tokio::sync::mpsc::Receiver<i32>,
) {
    let name = if signal == libc::SIGINT {
        "SIGINT"
    } else {
        "SIGTERM"
    };
    eprintln!(
        "dynrt serve: {name}: finishing {} running requests (up to {:.0} s; another signal \
         exits at once)",
        app.generating.load(Ordering::Relaxed),
        timeout.as_secs_f64()
    );
    app.draining.send_replace(true);
    let idle = || async {
        while app.generating.load(Ordering::Relaxed) > 0
            || open.available_permits() < max_connections
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let exit_now = |s: Option<i32>| -> ! {
        let s = s.unwrap_or(libc::SIGTERM);
        eprintln!("dynrt serve: a second signal: exiting now");
        std::process::exit(128 + s)
    };
    tokio::select! {
        _ = idle() => return,
        _ = tokio::time::sleep(timeout) => {}
        s = signals.recv() => exit_now(s),
    }
    eprintln!(
        "dynrt serve: ending {} requests that did not finish in time",
        app.generating.load(Ordering::Relaxed)
    );
    app.cut.send_replace(true);
    tokio::select! {
        _ = idle() => {}
        _ = tokio::time::sleep(CUT_GRACE) => {}
        s = signals.recv() => exit_now(s),
    }
}

/// Loads the model and starts its scheduler (on a blocking thread: seconds).
fn load(args: &Args) -> anyhow::Result<Loaded> {
    let (engine, model, run) = model::open(&args.model)?;
    let embedder = super::serve_embed::start(&engine, &args.embedding)?;
    let budget_bytes = match args.budget_mib {
        Some(m) => m.saturating_mul(1 << 20),
        None => {
            let left = engine
                .memory_budget_bytes()
                .saturating_sub(engine.stats().device_current_bytes());
            (left / 4 * 3).min(DEFAULT_BUDGET)
        }
    };
    let context = model.context_len() as usize;
    let mut options = SchedulerOptions::new(budget_bytes, run);
    options.max_active = args.max_batch;
    options.prefill_chunk = args.prefill_chunk;
    options.page_size = args.page_size;
    options.offload = !args.no_offload;
    options.max_queue = args.max_queue;
    let weights = json!({
        "device_bytes": model.weight_bytes(),
        "file_bytes": model.file_tensor_bytes(),
        "grouped_bytes": model.grouped_weight_bytes(),
    });
    let prep = Prep::new(model.tokenizer().clone(), context);
    let tokenizer = Arc::new(model.tokenizer().clone());
    let trie = Arc::new(TokenTrie::new(&tokenizer, model.stop_ids()));
    let tool_format = tokenizer
        .chat_template()
        .and_then(|t| ToolFormat::of_template(t.source()));
    let defaults = Defaults::new(model.recommended_sampling());
    let scheduler = Scheduler::new(model, options).context("laying out the KV pools")?;
    let handle = SchedulerHandle::spawn(scheduler).context("starting the scheduler thread")?;
    Ok(Loaded {
        handle,
        engine,
        prep,
        weights,
        context,
        max_queue: args.max_queue,
        tokenizer,
        trie,
        tool_format,
        defaults,
        embedder,
    })
}

fn router(app: Shared, guard: serve_guard::Shared) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/", get(dashboard))
        .route("/v1/memory", get(memory))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/apply-template", post(apply_template))
        .fallback(not_found)
        .with_state(app)
        .layer(axum::middleware::from_fn_with_state(
            guard,
            serve_guard::guard,
        ))
}

fn unavailable(message: String, code: &'static str) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        message,
        Some(code),
    )
}

/// The 503 of a request that met a lost device, or came while the model is loaded again.
fn device_lost(reason: &str) -> ApiError {
    unavailable(
        format!(
            "the GPU device was lost ({reason}): the model is being loaded again on a new \
             device; try again in a moment"
        ),
        "device_lost",
    )
}

impl App {
    /// The model served now (none while it loads the first time).
    fn current(&self) -> Option<Arc<Loaded>> {
        self.loaded
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_loaded(&self, loaded: Loaded) -> Option<Arc<Loaded>> {
        self.loaded
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .replace(Arc::new(loaded))
    }

    /// The loaded model, or the 503 that says why there is none to use.
    fn ready(self: &Arc<Self>) -> Result<Arc<Loaded>, ApiError> {
        if *self.draining.borrow() {
            return Err(unavailable(
                "the server is shutting down".into(),
                "shutting_down",
            ));
        }
        if self.recovering.load(Ordering::SeqCst) {
            return Err(device_lost("recovering"));
        }
        let Some(loaded) = self.current() else {
            return Err(unavailable(
                "the model is loading: try again in a moment".into(),
                "model_loading",
            ));
        };
        if let Some(lost) = loaded.engine.gpu().lost() {
            recover(self);
            return Err(device_lost(&lost.reason));
        }
        if let ThreadState::Stopped { reason } = loaded.handle.state() {
            return Err(unavailable(reason, "scheduler_stopped"));
        }
        Ok(loaded)
    }
}

/// After a device loss: loads the model again on a new device (the command line's model,
/// budget and options) and serves with it; tries again with a growing pause while loading
/// fails. Requests meanwhile get a 503 with code `device_lost`, `/health` says
/// `recovering`. Does nothing when a recovery runs already or the server is draining.
fn recover(app: &Shared) {
    if *app.draining.borrow() || app.recovering.swap(true, Ordering::SeqCst) {
        return;
    }
    eprintln!("dynrt serve: the GPU device was lost: loading the model again on a new device");
    let app = app.clone();
    tokio::spawn(async move {
        let mut pause = Duration::from_millis(500);
        loop {
            let args = app.args.clone();
            let loaded = tokio::task::spawn_blocking(move || load(&args))
                .await
                .map_err(anyhow::Error::from)
                .and_then(|l| l);
            match loaded {
                Ok(loaded) => {
                    let adapter = loaded.engine.gpu().adapter_info().name.clone();
                    let old = app.set_loaded(loaded);
                    // The old scheduler's thread is joined when its last holder lets go.
                    tokio::task::spawn_blocking(move || drop(old));
                    *app.recover_error.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    app.recoveries.fetch_add(1, Ordering::Relaxed);
                    app.recovering.store(false, Ordering::SeqCst);
                    eprintln!("dynrt serve: the model is loaded again on {adapter}: serving");
                    return;
                }
                Err(e) => {
                    eprintln!(
                        "dynrt serve: loading the model again failed: {e:#}; trying again in {:.1} s",
                        pause.as_secs_f64()
                    );
                    *app.recover_error.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(format!("{e:#}"));
                    if *app.draining.borrow() {
                        return;
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(30));
                }
            }
        }
    });
}

/// `{"status": "ok"}`, or a 503 whose status says why not: `loading`, `shutting_down`,
/// `recovering` (the device was lost: the model is loaded again; with the last try's error
/// when one failed), or `error` with the reason (the scheduler thread ended).
async fn health(State(app): State<Shared>) -> Response {
    let (status, body) = if *app.draining.borrow() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "shutting_down"}),
        )
    } else if app.recovering.load(Ordering::SeqCst) {
        let error = app
            .recover_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "recovering", "last_error": error}),
        )
    } else {
        match app.current().map(|l| l.handle.state()) {
            None => (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"status": "loading"}),
            ),
            Some(ThreadState::Running) => (StatusCode::OK, json!({"status": "ok"})),
            Some(ThreadState::Stopped { reason }) => (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"status": "error", "reason": reason}),
            ),
        }
    };
    (status, Json(body)).into_response()
}

async fn not_found() -> ApiError {
    ApiError::no_endpoint()
}

async fn metrics(State(app): State<Shared>) -> Response {
    let mut text = match app.current() {
        Some(l) => {
            let ttft = app.ttft.lock().unwrap_or_else(|e| e.into_inner()).clone();
            serve_api::metrics_text(&l.handle.stats(), &ttft)
        }
        None => String::new(),
    };
    text.push_str(&app.metrics.text());
    let state = if *app.draining.borrow() {
        "shutting_down"
    } else if app.recovering.load(Ordering::SeqCst) {
        "recovering"
    } else {
        match app.current().map(|l| l.handle.state()) {
            None => "loading",
            Some(ThreadState::Running) => "ok",
            Some(ThreadState::Stopped { .. }) => "error",
        }
    };
    text.push_str("# HELP dynrt_server_state The server's state (1 for the current one).\n");
    text.push_str("# TYPE dynrt_server_state gauge\n");
    for s in ["loading", "ok", "shutting_down", "recovering", "error"] {
        text.push_str(&format!(
            "dynrt_server_state{{state=\"{s}\"}} {}\n",
            u8::from(s == state)
        ));
    }
    text.push_str(
        "# HELP dynrt_device_recoveries_total Lost GPU devices the server loaded its model again after.\n",
    );
    text.push_str("# TYPE dynrt_device_recoveries_total counter\n");
    text.push_str(&format!(
        "dynrt_device_recoveries_total {}\n",
        app.recoveries.load(Ordering::Relaxed)
    ));
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// The page with live charts of `/v1/memory`.
async fn dashboard() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("dashboard.html"),
    )
        .into_response()
}

/// The memory report: the scheduler's gauges, what each active request holds (pages,
/// shared pages, bytes offloaded to the host), the engine's bytes per allocation kind and the
/// weights' bytes (on the device, in the file, reordered into grouped planes).
async fn memory(State(app): State<Shared>) -> Result<Json<serde_json::Value>, ApiError> {
    let loaded = app.current().ok_or_else(|| {
        unavailable(
            "the model is loading: try again in a moment".into(),
            "model_loading",
        )
    })?;
    let live = loaded.handle.stats();
    let stats = loaded.engine.stats();
    let kinds: serde_json::Map<String, serde_json::Value> = dynrt::memory::AllocKind::ALL
        .iter()
        .map(|&k| {
            let v = json!({"current": stats.current_bytes(k), "peak": stats.peak_bytes(k)});
            (k.name().to_string(), v)
        })
        .collect();
    Ok(Json(json!({
        "model": app.model_id,
        "tokens_per_s": live.tokens_per_s,
        "scheduler": live.scheduler,
        "requests": loaded.handle.request_memory(),
        "kinds": kinds,
        "weights": loaded.weights,
    })))
}

async fn models(State(app): State<Shared>) -> Json<serde_json::Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": app.model_id,
            "object": "model",
            "created": app.created,
            "owned_by": "dynrt",
        }],
    }))
}

/// The body, read within `--body-timeout` and [`MAX_BODY_BYTES`].
async fn read_body(app: &App, headers: &HeaderMap, body: Body) -> Result<Vec<u8>, ApiError> {
    let too_large = |n: usize| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the body has {n} bytes or more, over the {MAX_BODY_BYTES} this server reads"),
            None,
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if let Some(n) = declared.filter(|&n| n > MAX_BODY_BYTES) {
        return Err(too_large(n));
    }
    let read = async {
        let mut out = Vec::with_capacity(declared.unwrap_or(0));
        let mut stream = body.into_data_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    format!("the body could not be read: {e}"),
                    None,
                )
            })?;
            if out.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(too_large(out.len() + chunk.len()));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    };
    tokio::time::timeout(app.body_timeout, read)
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!(
                    "the body did not arrive within {:.0} s (--body-timeout)",
                    app.body_timeout.as_secs_f64()
                ),
                None,
            )
        })?
}

impl Loaded {
    fn server(&self, client: &Client) -> serve_api::Server<'_> {
        serve_api::Server {
            context: self.context,
            partition: serve_guard::cache_partition(client),
            defaults: &self.defaults,
            tool_format: self.tool_format,
        }
    }
}

async fn chat(
    State(app): State<Shared>,
    Extension(client): Extension<Client>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let loaded = app.ready()?;
    let body = read_body(&app, &headers, body).await?;
    let ignored = serve_api::check_fields(&body, Endpoint::Chat, app.lenient)?;
    let mut plan = serve_api::parse::<ChatBody>(&body)?.plan(&loaded.server(&client))?;
    plan.ignored = ignored;
    generate_response(&app, &loaded, client, plan).await
}

async fn completions(
    State(app): State<Shared>,
    Extension(client): Extension<Client>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let loaded = app.ready()?;
    let body = read_body(&app, &headers, body).await?;
    let ignored = serve_api::check_fields(&body, Endpoint::Completion, app.lenient)?;
    let mut plan = serve_api::parse::<CompletionBody>(&body)?.plan(&loaded.server(&client))?;
    plan.ignored = ignored;
    generate_response(&app, &loaded, client, plan).await
}

/// `POST /v1/embeddings`: the sentence model of `--embedding-model`, or a 404 without one.
async fn embeddings(
    State(app): State<Shared>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<serde_json::Value>, ApiError> {
    let loaded = app.ready()?;
    let Some(embedder) = loaded.embedder.clone() else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "this server has no embedding model (start it with --embedding-model)",
            Some("model_not_found"),
        ));
    };
    let body = read_body(&app, &headers, body).await?;
    super::serve_embed::answer(&embedder, &body).await
}

async fn tokenize(
    State(app): State<Shared>,
    Extension(client): Extension<Client>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let loaded = app.ready()?;
    let body: TokenizeBody = serve_api::parse(&read_body(&app, &headers, body).await?)?;
    let text = loaded.prep.tokenize(client, body).await?;
    Ok(([(header::CONTENT_TYPE, "application/json")], text).into_response())
}

async fn detokenize(
    State(app): State<Shared>,
    Extension(client): Extension<Client>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<serde_json::Value>, ApiError> {
    let loaded = app.ready()?;
    let body: DetokenizeBody = serve_api::parse(&read_body(&app, &headers, body).await?)?;
    loaded.prep.detokenize(client, body).await.map(Json)
}

async fn apply_template(
    State(app): State<Shared>,
    Extension(client): Extension<Client>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<serde_json::Value>, ApiError> {
    let loaded = app.ready()?;
    let body: ChatBody = serve_api::parse(&read_body(&app, &headers, body).await?)?;
    let messages = body.messages()?;
    loaded.prep.apply_template(client, messages).await.map(Json)
}

/// Tokenizes the prompt, submits the request's answers and responds with them whole or as a
/// stream of chunks.
async fn generate_response(
    app: &Shared,
    loaded: &Arc<Loaded>,
    client: Client,
    plan: Plan,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    if !plan.ignored.is_empty() {
        log::info!("ignored request fields: {}", plan.ignored.join(", "));
    }
    let n = app.next.fetch_add(1, Ordering::Relaxed);
    let stop_bytes: usize = plan.stop.iter().map(String::len).sum();
    if stop_bytes > MAX_STOP_BYTES {
        return Err(ApiError::bad(
            format!(
                "the stop texts have {stop_bytes} bytes, more than the {MAX_STOP_BYTES} allowed"
            ),
            Some("stop"),
        ));
    }
    loaded.prep.check(&plan.prompt)?;
    // Refused before the prompt is read when the queue is full already (the scheduler
    // checks again when the request arrives).
    let queued = loaded.handle.stats().scheduler.queued;
    if queued + plan.n > loaded.max_queue {
        return Err(ApiError::from(ScheduleError::QueueFull { queued }));
    }
    let ids = loaded.prep.encode(client, plan.prompt.clone()).await?;
    let id = format!("{}{n:x}", app.id_prefix);
    let header = Header {
        endpoint: plan.endpoint,
        id: match plan.endpoint {
            Endpoint::Chat => format!("chatcmpl-{id}"),
            Endpoint::Completion => format!("cmpl-{id}"),
        },
        created: unix_now(),
        model: app.model_id.clone(),
        tools: plan.tools.clone(),
        logprobs: plan.logprobs,
    };
    let mut runs = Vec::with_capacity(plan.n);
    for mut request in plan.requests(&loaded.trie) {
        request.prompt = Prompt::Ids(ids.clone());
        // An error drops the answers submitted before it, which cancels them.
        let submitted = loaded.handle.submit(request).await?;
        app.generating.fetch_add(1, Ordering::Relaxed);
        runs.push(Running {
            log: RequestLog {
                app: app.clone(),
                id: header.id.clone(),
                client,
                arrived,
                first_token: None,
                prompt_tokens: 0,
                completion_tokens: 0,
                outcome: "cancelled",
            },
            guard: CancelOnDrop {
                loaded: loaded.clone(),
                id: submitted.id,
                armed: true,
            },
            events: submitted.events,
            tokenizer: loaded.tokenizer.clone(),
            last_token: None,
            deadline: app
                .request_timeout
                .map(|t| tokio::time::Instant::from_std(arrived + t)),
            cut: app.cut.subscribe(),
        });
    }
    if plan.stream {
        Ok(stream(runs, header, plan.include_usage).into_response())
    } else {
        whole(runs, header).await.map(IntoResponse::into_response)
    }
}

/// Cancels its request when dropped before the request ended (the client went away).
struct CancelOnDrop {
    /// The model the request runs on.
    loaded: Arc<Loaded>,
    id: RequestId,
    armed: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.loaded.handle.cancel(self.id);
        }
    }
}

/// One log line per generation request when it ends (at info, target `dynrt::request`),
/// and its end-to-end time in the histogram.
struct RequestLog {
    app: Shared,
    id: String,
    client: Client,
    arrived: Instant,
    first_token: Option<Duration>,
    prompt_tokens: usize,
    completion_tokens: usize,
    /// `stop`, `length`, `failed`, `timeout`, `shutdown`, or `cancelled` (the client went
    /// away) until one of those is known.
    outcome: &'static str,
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        let app = &self.app;
        let seconds = self.arrived.elapsed().as_secs_f64();
        app.metrics.request(seconds);
        app.generating.fetch_sub(1, Ordering::Relaxed);
        let ended = app.ended.fetch_add(1, Ordering::Relaxed) + 1;
        log::info!(
            target: "dynrt::request",
            "{} client={} prompt_tokens={} completion_tokens={} ttft_ms={} duration_ms={:.1} outcome={}",
            self.id,
            self.client,
            self.prompt_tokens,
            self.completion_tokens,
            self.first_token
                .map_or_else(|| "-".to_string(), |t| format!("{:.1}", t.as_secs_f64() * 1e3)),
            seconds * 1e3,
            self.outcome,
        );
        if app.panic_after == Some(ended) {
            if let Some(l) = app.current() {
                let _ = l.handle.with_scheduler(|_| {
                    panic!("injected by DYNRT_SERVE_FAULT=scheduler-panic-after")
                });
            }
        }
    }
}

/// A request in progress, as the handler sees it.
struct Running {
    log: RequestLog,
    guard: CancelOnDrop,
    events: futures::channel::mpsc::Receiver<SchedulerEvent>,
    /// Token texts for log-probabilities.
    tokenizer: Arc<Tokenizer>,
    last_token: Option<Instant>,
    /// When `--request-timeout` ends it.
    deadline: Option<tokio::time::Instant>,
    /// Turns true when the drain's time is up.
    cut: watch::Receiver<bool>,
}

/// What a request's next event means to its response.
enum Next {
    /// Text that is now final, and the log-probabilities of the token that came (when
    /// asked for; none for control tokens).
    Text(String, Option<ShownLogprob>),
    End {
        finish: &'static str,
        usage: Usage,
    },
    /// It ended without its answer: the error to send.
    Failed(ApiError),
}

impl Running {
    /// The next event that matters (`None`: the scheduler dropped the request).
    async fn next(&mut self) -> Option<Next> {
        loop {
            let deadline = self.deadline;
            let event = tokio::select! {
                e = self.events.next() => e,
                _ = async {
                    match deadline {
                        Some(d) => tokio::time::sleep_until(d).await,
                        None => std::future::pending().await,
                    }
                } => {
                    self.log.outcome = "timeout";
                    return Some(Next::Failed(ApiError::new(
                        StatusCode::GATEWAY_TIMEOUT,
                        "timeout_error",
                        "the request took longer than this server allows (--request-timeout)",
                        Some("request_timeout"),
                    )));
                }
                _ = self.cut.wait_for(|c| *c) => {
                    self.log.outcome = "shutdown";
                    return Some(Next::Failed(unavailable(
                        "the server is shutting down: the request was ended before its answer was complete".into(),
                        "shutting_down",
                    )));
                }
            };
            let Some(event) = event else {
                self.log.outcome = "failed";
                return None;
            };
            match event {
                SchedulerEvent::Started { .. } => {
                    self.log
                        .app
                        .metrics
                        .queued(self.log.arrived.elapsed().as_secs_f64());
                }
                SchedulerEvent::Token {
                    text,
                    token,
                    logprobs,
                    ..
                } => {
                    let now = Instant::now();
                    match self.last_token.replace(now) {
                        Some(t) => self.log.app.metrics.inter_token((now - t).as_secs_f64()),
                        None => {
                            let ttft = now - self.log.arrived;
                            self.log.first_token = Some(ttft);
                            self.log
                                .app
                                .ttft
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .observe(ttft.as_secs_f64());
                        }
                    }
                    self.log.completion_tokens += 1;
                    let app = &self.log.app;
                    if let Some(n) = app.lose_after_tokens {
                        if app.tokens.fetch_add(1, Ordering::Relaxed) + 1 == n {
                            log::warn!("DYNRT_SERVE_FAULT: destroying the device");
                            self.guard.loaded.engine.gpu().destroy();
                        }
                    }
                    let shown = logprobs
                        .filter(|_| !self.tokenizer.is_control(token))
                        .map(|lp| ShownLogprob::new(&self.tokenizer, token, &lp));
                    return Some(Next::Text(text, shown));
                }
                SchedulerEvent::Finished {
                    reason,
                    prompt_tokens,
                    completion_tokens,
                    cached_tokens,
                    ..
                } => {
                    self.guard.armed = false;
                    let finish = serve_api::finish_reason(reason);
                    self.log.outcome = finish;
                    self.log.prompt_tokens = prompt_tokens;
                    self.log.completion_tokens = completion_tokens;
                    return Some(Next::End {
                        finish,
                        usage: Usage {
                            prompt_tokens,
                            completion_tokens,
                            cached_tokens,
                        },
                    });
                }
                SchedulerEvent::Failed { error, .. } => {
                    self.guard.armed = false;
                    self.log.outcome = "failed";
                    if let Some(lost) = error.device_lost() {
                        recover(&self.log.app);
                        return Some(Next::Failed(device_lost(&lost.reason)));
                    }
                    return Some(Next::Failed(ApiError::server(error.to_string())));
                }
            }
        }
    }

    /// The error for a request the scheduler dropped without a last event: its thread
    /// ended.
    fn dropped(&self) -> ApiError {
        let reason = match self.guard.loaded.handle.state() {
            ThreadState::Stopped { reason } => reason,
            _ => "the request was dropped before it ended".into(),
        };
        unavailable(reason, "scheduler_stopped")
    }
}

/// One answer, whole.
async fn collect(mut run: Running) -> Result<(Choice, Usage), ApiError> {
    let mut choice = Choice::default();
    loop {
        match run.next().await {
            Some(Next::Text(t, lp)) => {
                choice.text.push_str(&t);
                choice.logprobs.extend(lp);
            }
            Some(Next::End { finish, usage }) => {
                choice.finish = finish;
                return Ok((choice, usage));
            }
            Some(Next::Failed(e)) => return Err(e),
            None => return Err(run.dropped()),
        }
    }
}

/// The counts of a request's answers: the prompt once, the answers' tokens summed.
fn total(usages: impl IntoIterator<Item = Usage>) -> Usage {
    usages.into_iter().fold(Usage::default(), |t, u| Usage {
        prompt_tokens: u.prompt_tokens,
        completion_tokens: t.completion_tokens + u.completion_tokens,
        cached_tokens: t.cached_tokens.max(u.cached_tokens),
    })
}

/// The answers as one JSON object (`stream: false`).
async fn whole(runs: Vec<Running>, header: Header) -> Result<Json<serde_json::Value>, ApiError> {
    let answers = futures::future::try_join_all(runs.into_iter().map(collect)).await?;
    let usage = total(answers.iter().map(|(_, u)| *u));
    let choices: Vec<Choice> = answers.into_iter().map(|(c, _)| c).collect();
    Ok(Json(header.response(&choices, usage)))
}

/// The answers as server-sent events: OpenAI's chunks of every answer as they come (each
/// names its answer's `index`), the usage chunk when asked, then `data: [DONE]`; an answer
/// that ends without its text (a failure, the timeout, the shutdown, the scheduler gone)
/// sends an error object as its last event.
fn stream(
    runs: Vec<Running>,
    header: Header,
    include_usage: bool,
) -> Sse<impl futures::Stream<Item = Result<Event, std::convert::Infallible>>> {
    struct St {
        run: Running,
        header: Header,
        index: usize,
        pending: VecDeque<String>,
        first_chunk: bool,
        done: bool,
        /// The whole text so far (tool calls are read from it at the end).
        all: String,
        /// Text held back: it may be (the start of) a tool call.
        held: String,
        /// Log-probabilities of tokens whose text is not out yet.
        logprobs: Vec<ShownLogprob>,
        /// Bytes of text sent so far.
        sent: usize,
        usages: Arc<Mutex<Vec<Usage>>>,
    }
    let usages = Arc::new(Mutex::new(Vec::new()));
    let per_answer = runs.into_iter().enumerate().map(|(index, run)| {
        let start = St {
            run,
            header: header.clone(),
            index,
            pending: VecDeque::new(),
            first_chunk: true,
            done: false,
            all: String::new(),
            held: String::new(),
            logprobs: Vec::new(),
            sent: 0,
            usages: usages.clone(),
        };
        futures::stream::unfold(start, |mut st| async move {
            loop {
                if let Some(data) = st.pending.pop_front() {
                    return Some((data, st));
                }
                if st.done {
                    return None;
                }
                match st.run.next().await {
                    Some(Next::Text(t, lp)) => {
                        st.all.push_str(&t);
                        st.logprobs.extend(lp);
                        st.held.push_str(&t);
                        let keep = serve_api::held_for_tools(&st.header.tools, &st.all, &st.held);
                        let out: String = st.held.drain(..st.held.len() - keep).collect();
                        if !out.is_empty() || st.first_chunk {
                            let first = std::mem::replace(&mut st.first_chunk, false);
                            let chunk = st.header.chunk(
                                st.index,
                                Some(&out),
                                &st.logprobs,
                                st.sent,
                                first,
                                None,
                            );
                            st.sent += out.len();
                            st.logprobs.clear();
                            st.pending.push_back(chunk.to_string());
                        }
                    }
                    Some(Next::End { mut finish, usage }) => {
                        let first = std::mem::replace(&mut st.first_chunk, false);
                        let calls = match st.held.is_empty() {
                            true => None,
                            false => st.header.tool_call_chunk(st.index, &st.all, first),
                        };
                        let mut text = None;
                        let role_sent = calls.is_some();
                        match calls {
                            Some(chunk) => {
                                st.pending.push_back(chunk.to_string());
                                if finish == "stop" {
                                    finish = "tool_calls";
                                }
                            }
                            // Held text that was no call after all.
                            None if !st.held.is_empty() => {
                                text = Some(std::mem::take(&mut st.held))
                            }
                            None => {}
                        }
                        let end = st.header.chunk(
                            st.index,
                            text.as_deref(),
                            &st.logprobs,
                            st.sent,
                            first && !role_sent,
                            Some(finish),
                        );
                        st.pending.push_back(end.to_string());
                        st.usages
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(usage);
                        st.done = true;
                    }
                    Some(Next::Failed(e)) => {
                        st.pending.push_back(e.body().to_string());
                        st.done = true;
                    }
                    None => {
                        st.pending.push_back(st.run.dropped().body().to_string());
                        st.done = true;
                    }
                }
            }
        })
        .boxed()
    });
    let per_answer: Vec<_> = per_answer.collect();
    let tail_header = header;
    let tail = futures::stream::once(async move {
        let mut out = Vec::new();
        if include_usage {
            let usages = std::mem::take(&mut *usages.lock().unwrap_or_else(|e| e.into_inner()));
            out.push(tail_header.usage_chunk(total(usages)).to_string());
        }
        out.push("[DONE]".to_string());
        futures::stream::iter(out)
    })
    .flatten();
    let events = futures::stream::select_all(per_answer)
        .chain(tail)
        .map(|data| Ok(Event::default().data(data)));
    // A comment now and then while a request waits in the queue: a client that went away
    // is noticed (the write fails) and its request cancelled.
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(2)))
}
