//! `dynrt serve`: an OpenAI-compatible HTTP server on one model. The model and its
//! [`Scheduler`] live on one thread ([`SchedulerHandle`]) that runs the GPU work; the HTTP
//! handlers (tokio + axum) submit requests to it and relay its events, as server-sent
//! events when the client streams. A client that goes away cancels its request.

use super::generate::{self, ModelArgs};
use super::serve_api::{self, ApiError, ChatBody, Choice, CompletionBody, Endpoint, Header};
use super::serve_api::{Defaults, Plan, ShownLogprob, Usage};
use anyhow::Context;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use dynrt::llm::{RequestId, Scheduler, SchedulerEvent, SchedulerHandle, SchedulerOptions};
use dynrt::runtime::report::human_bytes;
use dynrt::structured::{TokenTrie, ToolFormat};
use dynrt::tokenizer::Tokenizer;
use futures::StreamExt;
use serde_json::json;
use std::collections::VecDeque;
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Arguments of `dynrt serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on.
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
    /// Prompt tokens per step: the longest a prompt holds the other requests back.
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
}

/// KV-cache bytes when `--budget-mib` is not given (at most).
const DEFAULT_BUDGET: u64 = 256 << 20;

/// What every handler shares.
struct App {
    handle: SchedulerHandle,
    /// The model's engine: device memory per kind for `/v1/memory`.
    engine: dynrt::gpu::Engine,
    /// The name responses give in `model` (`--alias`, or the file's stem).
    model_id: String,
    /// The weights on the device, in the file, and reordered into grouped planes (bytes).
    weights: serde_json::Value,
    context: usize,
    /// The model's tokenizer: token texts for log-probabilities.
    tokenizer: Arc<Tokenizer>,
    /// The vocabulary as a trie, for structured output.
    trie: Arc<TokenTrie>,
    /// How the model's chat template writes tool calls.
    tool_format: Option<ToolFormat>,
    /// The sampling of fields a request leaves out.
    defaults: Defaults,
    /// `--lenient-fields`.
    lenient: bool,
    created: u64,
    next: AtomicU64,
    ttft: Mutex<serve_api::Histogram>,
}

type Shared = Arc<App>;

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Runs `dynrt serve` until the process is stopped.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (engine, model, run) = generate::open(&args.model)?;
    let embedder = super::serve_embed::start(&engine, &args.embedding)?;
    let path = generate::model_path(args.model.model.as_deref())?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let model_id = match (&args.alias, &args.model.model) {
        (Some(alias), _) => alias.clone(),
        (None, Some(m)) if !m.exists() => m.display().to_string(),
        _ => stem,
    };
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
    let per_token = model.kv_bytes_per_token();
    let tokenizer = Arc::new(model.tokenizer().clone());
    let trie = Arc::new(TokenTrie::new(&tokenizer, model.stop_ids()));
    let tool_format = tokenizer
        .chat_template()
        .and_then(|t| ToolFormat::of_template(t.source()));
    let defaults = Defaults::new(model.recommended_sampling());
    let weights = json!({
        "device_bytes": model.weight_bytes(),
        "file_bytes": model.file_tensor_bytes(),
        "grouped_bytes": model.grouped_weight_bytes(),
    });
    let scheduler = Scheduler::new(model, options).context("laying out the KV pools")?;
    // What the pools hold: whole pages, at most one binding per layer.
    let budget_bytes = scheduler.engine().pool_bytes();
    let handle = SchedulerHandle::spawn(scheduler).context("starting the scheduler thread")?;
    let app = Arc::new(App {
        handle,
        engine: engine.clone(),
        model_id,
        weights,
        context,
        tokenizer,
        trie,
        tool_format,
        defaults,
        lenient: args.lenient_fields,
        created: unix_now(),
        next: AtomicU64::new(1),
        ttft: Mutex::new(serve_api::Histogram::default()),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("listening on {}:{}", args.host, args.port))?;
        let addr = listener.local_addr()?;
        println!("dynrt serve: listening on http://{addr}");
        std::io::stdout().flush()?;
        let d = &app.defaults;
        eprintln!(
            "defaults: temperature {}, top_k {}, top_p {}, min_p {}, repeat_penalty {} over {} tokens; tools: {}",
            d.temperature,
            d.top_k,
            d.top_p,
            d.min_p,
            d.repeat_penalty,
            d.repeat_last_n,
            if app.tool_format.is_some() { "<tool_call> blocks" } else { "none" },
        );
        eprintln!(
            "serving {} (context {context} tokens) on {}: KV budget {} ({} tokens), {} requests at once, prompts in chunks of {}",
            app.model_id,
            engine.gpu().adapter_info().name,
            human_bytes(budget_bytes),
            budget_bytes / per_token.max(1),
            args.max_batch.max(1),
            args.prefill_chunk.max(1),
        );
        axum::serve(listener, super::serve_embed::with_routes(router(app), embedder))
            .await
            .context("serving HTTP")
    })?;
    Ok(ExitCode::SUCCESS)
}

fn router(app: Shared) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/", get(dashboard))
        .route("/v1/memory", get(memory))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .fallback(not_found)
        .with_state(app)
}

async fn health() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

async fn not_found() -> ApiError {
    ApiError::no_endpoint()
}

async fn metrics(State(app): State<Shared>) -> Response {
    let live = app.handle.stats();
    let ttft = app.ttft.lock().unwrap_or_else(|e| e.into_inner()).clone();
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        serve_api::metrics_text(&live, &ttft),
    )
        .into_response()
}

/// The page with live charts of `/v1/memory`.
async fn dashboard() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("dashboard.html"),
    )
        .into_response()
}

/// The memory report: the scheduler's gauges, what each active request holds (pages,
/// shared pages, bytes offloaded to the host), the engine's bytes per allocation kind and the
/// weights' bytes (on the device, in the file, reordered into grouped planes).
async fn memory(State(app): State<Shared>) -> Json<serde_json::Value> {
    let live = app.handle.stats();
    let stats = app.engine.stats();
    let kinds: serde_json::Map<String, serde_json::Value> = dynrt::memory::AllocKind::ALL
        .iter()
        .map(|&k| {
            let v = json!({"current": stats.current_bytes(k), "peak": stats.peak_bytes(k)});
            (k.name().to_string(), v)
        })
        .collect();
    Json(json!({
        "model": app.model_id,
        "tokens_per_s": live.tokens_per_s,
        "scheduler": live.scheduler,
        "requests": app.handle.request_memory(),
        "kinds": kinds,
        "weights": app.weights,
    }))
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

/// A body the server could not read (over axum's 2 MB limit, a broken upload) as an error
/// in OpenAI's shape with the status axum chose.
fn read_body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| ApiError::unreadable(e.status(), e.body_text()))
}

impl App {
    fn server(&self) -> serve_api::Server<'_> {
        serve_api::Server {
            context: self.context,
            defaults: &self.defaults,
            tool_format: self.tool_format,
        }
    }
}

async fn chat(
    State(app): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = read_body(body)?;
    let ignored = serve_api::check_fields(&body, Endpoint::Chat, app.lenient)?;
    let mut plan = serve_api::parse::<ChatBody>(&body)?.plan(&app.server())?;
    plan.ignored = ignored;
    generate_response(app, plan).await
}

async fn completions(
    State(app): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = read_body(body)?;
    let ignored = serve_api::check_fields(&body, Endpoint::Completion, app.lenient)?;
    let mut plan = serve_api::parse::<CompletionBody>(&body)?.plan(&app.server())?;
    plan.ignored = ignored;
    generate_response(app, plan).await
}

/// Submits the request's answers and responds with them whole or as a stream of chunks.
async fn generate_response(app: Shared, plan: Plan) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    if !plan.ignored.is_empty() {
        log::info!("ignored request fields: {}", plan.ignored.join(", "));
    }
    let n = app.next.fetch_add(1, Ordering::Relaxed);
    let mut runs = Vec::with_capacity(plan.n);
    for request in plan.requests(&app.trie) {
        // An error drops the answers submitted before it, which cancels them.
        let submitted = app.handle.submit(request).await?;
        runs.push(Running {
            guard: CancelOnDrop {
                app: app.clone(),
                id: submitted.id,
                armed: true,
            },
            events: submitted.events,
            arrived,
            first: true,
        });
    }
    let header = Header {
        endpoint: plan.endpoint,
        id: match plan.endpoint {
            Endpoint::Chat => format!("chatcmpl-{n}"),
            Endpoint::Completion => format!("cmpl-{n}"),
        },
        created: unix_now(),
        model: app.model_id.clone(),
        tools: plan.tools.clone(),
        logprobs: plan.logprobs,
    };
    if plan.stream {
        Ok(stream(runs, header, plan.include_usage).into_response())
    } else {
        whole(runs, header).await.map(IntoResponse::into_response)
    }
}

/// Cancels its request when dropped before the request ended (the client went away).
struct CancelOnDrop {
    app: Shared,
    id: RequestId,
    armed: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.app.handle.cancel(self.id);
        }
    }
}

/// A request in progress, as the handler sees it.
struct Running {
    guard: CancelOnDrop,
    events: futures::channel::mpsc::UnboundedReceiver<SchedulerEvent>,
    arrived: Instant,
    first: bool,
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
    Failed(String),
}

impl Running {
    /// The next event that matters (`None`: the request was dropped by the scheduler).
    async fn next(&mut self) -> Option<Next> {
        loop {
            match self.events.next().await? {
                SchedulerEvent::Started { .. } => {}
                SchedulerEvent::Token {
                    text,
                    token,
                    logprobs,
                    ..
                } => {
                    if self.first {
                        self.first = false;
                        let seconds = self.arrived.elapsed().as_secs_f64();
                        let app = &self.guard.app;
                        app.ttft
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .observe(seconds);
                    }
                    let tokenizer = &self.guard.app.tokenizer;
                    let shown = logprobs
                        .filter(|_| !tokenizer.is_control(token))
                        .map(|lp| ShownLogprob::new(tokenizer, token, &lp));
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
                    return Some(Next::End {
                        finish: serve_api::finish_reason(reason),
                        usage: Usage {
                            prompt_tokens,
                            completion_tokens,
                            cached_tokens,
                        },
                    });
                }
                SchedulerEvent::Failed { error, .. } => {
                    self.guard.armed = false;
                    return Some(Next::Failed(error.to_string()));
                }
            }
        }
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
            Some(Next::Failed(e)) => return Err(ApiError::server(e)),
            None => return Err(ApiError::server("the request was dropped before it ended")),
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
/// names its answer's `index`), the usage chunk when asked, then `data: [DONE]`.
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
                        st.pending.push_back(ApiError::server(e).body().to_string());
                        st.done = true;
                    }
                    None => return None,
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
