//! A desktop chat window with a language model (SmolLM2 by default, `--model NAME|PATH` for
//! another), where the UI and the model share **one wgpu device**:
//! eframe (egui on its wgpu renderer) creates the device, and dynrt's engine is built from
//! it (`Gpu::from_device`) with an explicit share of memory. Generation runs on a thread of
//! its own, so the render loop never waits for a forward pass; streamed text, the memory
//! counters (bytes per kind and per region, reallocations marked) and tokens/s are polled
//! every frame.
//!
//! ```sh
//! cargo run --release -- fetch        # once: the model into the cache
//! cargo run --release --example desktop_chat
//! # scripted: submit a prompt, wait for the answer, save a screenshot, exit 0
//! cargo run --release --example desktop_chat -- --prompt "What is the capital of France?" \
//!     --screenshot chat.png --exit-after-answer
//! ```
//!
//! With `--exit-after-answer` the last line on stdout is a JSON object: the answer's
//! `text` and `tokens`, the frames drawn while generating and the longest gap between two
//! of them, the chat area in screenshot pixels (`chat_rect_px`). Exit status: 0 done, 1 an
//! error, 3 the window could not open (no display, or no adapter that presents to it).

use clap::Parser;
use dynrt::gpu::{self, wgpu, EmbedOptions, Engine, Gpu};
use dynrt::llm::{GenerateParams, Model, ModelOptions};
use dynrt::memory::accounting::{MemoryStats, COUNTED_REGIONS};
use dynrt::memory::predictor::Policy;
use dynrt::memory::AllocKind;
use dynrt::runtime::RunOptions;
use eframe::egui;
use egui_plot::{Legend, Line, Plot, VLine};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(about = "dynrt desktop chat: SmolLM2 and egui on one wgpu device")]
struct Args {
    /// Submit this chat message as soon as the model is loaded.
    #[arg(long)]
    prompt: Option<String>,
    /// Save a PNG of the window once the answer is shown.
    #[arg(long)]
    screenshot: Option<PathBuf>,
    /// Quit after the first answer (and the screenshot), printing a JSON summary.
    #[arg(long)]
    exit_after_answer: bool,
    /// The GGUF file, or the name of a fetched model (`dynrt fetch --list`; default: the
    /// SmolLM2 model). A model without a chat template (Gemma 3 270M) continues the text.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Tokens per answer at most.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Preallocation policy to start with: none, openvino, adaptive.
    #[arg(long, default_value = "adaptive")]
    policy: String,
    /// Device memory dynrt may use, in MiB (the app's share for it).
    #[arg(long, default_value_t = 1024)]
    budget_mib: u64,
}

/// Exit status when no window could be opened (the test skips on it unless a GPU is required).
const EXIT_NO_WINDOW: u8 = 3;

fn main() -> ExitCode {
    env_logger::init();
    let args = Args::parse();
    let failure: Arc<Mutex<Option<String>>> = Arc::default();
    let policy: Policy = match args.policy.parse() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: --policy: {e}");
            return ExitCode::FAILURE;
        }
    };
    let model_path = match dynrt::fetch::resolve_model(args.model.as_deref()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let options = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default()
            .with_inner_size([1100.0, 700.0])
            .with_title("dynrt desktop chat"),
        wgpu_options: wgpu_options(),
        ..Default::default()
    };
    let fail = failure.clone();
    let result = eframe::run_native(
        "dynrt desktop chat",
        options,
        Box::new(move |cc| {
            let app = ChatApp::new(cc, args, policy, model_path, fail)?;
            Ok(Box::new(app))
        }),
    );
    if let Some(msg) = failure.lock().unwrap_or_else(|p| p.into_inner()).take() {
        eprintln!("error: {msg}");
        return ExitCode::FAILURE;
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(eframe::Error::AppCreation(e)) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: the window could not open: {e}");
            ExitCode::from(EXIT_NO_WINDOW)
        }
    }
}

/// egui's usual device request, with dynrt's limits merged in (never above the adapter's:
/// where the adapter has less, dynrt refuses the device by name instead of the request
/// failing) and `MAPPABLE_PRIMARY_BUFFERS` where offered (dynrt's `usm_shared` kind).
fn wgpu_options() -> eframe::egui_wgpu::WgpuConfiguration {
    use eframe::egui_wgpu::{WgpuConfiguration, WgpuSetup, WgpuSetupCreateNew};
    let mut setup = WgpuSetupCreateNew::without_display_handle();
    setup.device_descriptor = Arc::new(|adapter: &wgpu::Adapter| {
        let base = if adapter.get_info().backend == wgpu::Backend::Gl {
            wgpu::Limits::downlevel_webgl2_defaults()
        } else {
            wgpu::Limits::default()
        };
        let limits = wgpu::Limits {
            max_texture_dimension_2d: 8192,
            ..base
        }
        .or_better_values_from(&gpu::required_limits())
        .or_worse_values_from(&adapter.limits());
        wgpu::DeviceDescriptor {
            label: Some("desktop_chat: egui and dynrt"),
            required_features: adapter.features() & wgpu::Features::MAPPABLE_PRIMARY_BUFFERS,
            required_limits: limits,
            ..Default::default()
        }
    });
    WgpuConfiguration {
        wgpu_setup: WgpuSetup::CreateNew(setup),
        ..Default::default()
    }
}

/// What the UI asks the generation thread.
struct Ask {
    text: String,
    policy: Policy,
    max_tokens: usize,
}

/// What the generation thread reports.
enum Report {
    Loaded { weight_bytes: u64, load_ms: f64 },
    Piece(String),
    Done(Answer),
    Failed(String),
}

struct Answer {
    text: String,
    tokens: Vec<u32>,
    prompt_tokens: usize,
    prefill_tokens_per_s: f64,
    decode_ms_per_token: f64,
    new_session: bool,
}

/// The generation thread: loads the model, then answers each [`Ask`] in its session (a new
/// one when the policy changes), streaming text back. Every call here blocks this thread
/// only; wgpu's device and queue are shared with the render thread.
fn generation_thread(
    engine: Engine,
    path: PathBuf,
    asks: Receiver<Ask>,
    reports: Sender<Report>,
    ctx: egui::Context,
) {
    let send = |r: Report| {
        // The UI has gone when the receiver is dropped: nothing left to tell.
        let _ = reports.send(r);
        ctx.request_repaint();
    };
    let t0 = Instant::now();
    let model = match Model::load(&engine, &path, ModelOptions::default()) {
        Ok(m) => m,
        Err(e) => return send(Report::Failed(format!("{}: {e}", path.display()))),
    };
    send(Report::Loaded {
        weight_bytes: model.weight_bytes(),
        load_ms: t0.elapsed().as_secs_f64() * 1e3,
    });
    let mut session = None;
    for ask in asks {
        let new_session = !matches!(&session, Some((p, _)) if *p == ask.policy);
        if new_session {
            session = Some((ask.policy, model.session(RunOptions::new(ask.policy))));
        }
        let Some((_, s)) = session.as_mut() else {
            continue;
        };
        let params = GenerateParams {
            max_tokens: ask.max_tokens,
            ..GenerateParams::default()
        };
        let mut on_text = |piece: &str| send(Report::Piece(piece.to_string()));
        // A base model (Gemma 3 270M) has no chat template: each message continues the text.
        let answer = if model.tokenizer().chat_template().is_some() {
            s.chat_blocking(&ask.text, &params, &mut on_text)
        } else {
            s.generate_blocking(&ask.text, &params, &mut on_text)
        };
        match answer {
            Ok(g) => send(Report::Done(Answer {
                prefill_tokens_per_s: g.prefill_tokens_per_s(),
                decode_ms_per_token: g.decode_ms_per_token(),
                text: g.text,
                tokens: g.tokens,
                prompt_tokens: g.prompt_tokens,
                new_session,
            })),
            Err(e) => send(Report::Failed(e.to_string())),
        }
    }
}

/// One sample of the engine's counters for the chart.
struct Sample {
    t_s: f64,
    kind_bytes: [u64; 4],
    region_bytes: [u64; 3],
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Loading,
    Ready,
    Generating,
    Failed,
}

/// The scripted run (`--exit-after-answer`): after the answer, a few frames to lay it out,
/// then the screenshot, then the summary and close.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Exit {
    Waiting,
    Settling(u32),
    Screenshot,
    Closing,
}

struct Turn {
    user: String,
    reply: String,
}

struct ChatApp {
    args: Args,
    engine: Engine,
    asks: Option<Sender<Ask>>,
    reports: Receiver<Report>,
    failure: Arc<Mutex<Option<String>>>,
    phase: Phase,
    status: String,
    policy: Policy,
    input: String,
    turns: Vec<Turn>,
    last_answer: Option<Answer>,
    start: Instant,
    samples: Vec<Sample>,
    realloc_marks: Vec<f64>,
    region_allocations: u64,
    gen_started: Option<Instant>,
    /// When the first piece of the answer arrived (the prefill is over) and how many since.
    first_piece: Option<Instant>,
    gen_pieces: usize,
    frame_last: Option<Instant>,
    gen_frames: u64,
    gen_max_frame_ms: f64,
    chat_rect_px: [f32; 4],
    exit: Exit,
    shot: Arc<Mutex<Option<Result<PathBuf, String>>>>,
}

impl ChatApp {
    fn new(
        cc: &eframe::CreationContext<'_>,
        args: Args,
        policy: Policy,
        model_path: PathBuf,
        failure: Arc<Mutex<Option<String>>>,
    ) -> Result<ChatApp, Box<dyn std::error::Error + Send + Sync>> {
        let rs = cc
            .wgpu_render_state
            .as_ref()
            .ok_or("eframe did not start its wgpu renderer")?;
        // The one device: egui renders with it, dynrt computes on it.
        let gpu = Gpu::from_device(
            &rs.device,
            &rs.queue,
            EmbedOptions::new(args.budget_mib << 20),
        )?;
        let engine = Engine::new(gpu);
        let (ask_tx, ask_rx) = channel();
        let (report_tx, report_rx) = channel();
        let (e, ctx) = (engine.clone(), cc.egui_ctx.clone());
        std::thread::Builder::new()
            .name("dynrt generation".into())
            .spawn(move || generation_thread(e, model_path, ask_rx, report_tx, ctx))?;
        let info = engine.gpu().adapter_info();
        let status = format!(
            "loading the model on `{}` ({:?}), the window's device",
            info.name, info.backend
        );
        Ok(ChatApp {
            args,
            engine,
            asks: Some(ask_tx),
            reports: report_rx,
            failure,
            phase: Phase::Loading,
            status,
            policy,
            input: String::new(),
            turns: Vec::new(),
            last_answer: None,
            start: Instant::now(),
            samples: Vec::new(),
            realloc_marks: Vec::new(),
            region_allocations: 0,
            gen_started: None,
            first_piece: None,
            gen_pieces: 0,
            frame_last: None,
            gen_frames: 0,
            gen_max_frame_ms: 0.0,
            chat_rect_px: [0.0; 4],
            exit: Exit::Waiting,
            shot: Arc::default(),
        })
    }

    fn submit(&mut self, text: String) {
        let Some(asks) = &self.asks else { return };
        let ask = Ask {
            text: text.clone(),
            policy: self.policy,
            max_tokens: self.args.max_tokens,
        };
        if asks.send(ask).is_err() {
            return self.fail("the generation thread has stopped".into());
        }
        self.turns.push(Turn {
            user: text,
            reply: String::new(),
        });
        self.phase = Phase::Generating;
        self.gen_started = Some(Instant::now());
        self.first_piece = None;
        self.gen_pieces = 0;
        self.gen_frames = 0;
        self.gen_max_frame_ms = 0.0;
        self.status = "generating on the generation thread…".into();
    }

    fn fail(&mut self, msg: String) {
        self.status = format!("error: {msg}");
        self.phase = Phase::Failed;
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        f.get_or_insert(msg);
    }

    fn drain_reports(&mut self) {
        while let Ok(r) = self.reports.try_recv() {
            match r {
                Report::Loaded {
                    weight_bytes,
                    load_ms,
                } => {
                    self.phase = Phase::Ready;
                    self.status = format!(
                        "model loaded: {:.1} MB of weights in {:.1} s",
                        weight_bytes as f64 / 1e6,
                        load_ms / 1e3
                    );
                    self.region_allocations = region_allocations(&self.engine.stats());
                    if let Some(p) = self.args.prompt.clone() {
                        self.submit(p);
                    }
                }
                Report::Piece(p) => {
                    self.gen_pieces += 1;
                    self.first_piece.get_or_insert_with(Instant::now);
                    if let Some(t) = self.turns.last_mut() {
                        t.reply.push_str(&p);
                    }
                }
                Report::Done(a) => {
                    self.phase = Phase::Ready;
                    self.status = format!(
                        "{} tokens: prefill {:.1} tokens/s ({} prompt tokens), decode {:.1} tokens/s{}",
                        a.tokens.len(),
                        a.prefill_tokens_per_s,
                        a.prompt_tokens,
                        if a.decode_ms_per_token > 0.0 { 1e3 / a.decode_ms_per_token } else { 0.0 },
                        if a.new_session { " (new session)" } else { "" }
                    );
                    if let Some(t) = self.turns.last_mut() {
                        t.reply = a.text.clone();
                    }
                    self.last_answer = Some(a);
                    if self.args.exit_after_answer && self.exit == Exit::Waiting {
                        self.exit = Exit::Settling(3);
                    }
                }
                Report::Failed(msg) => self.fail(msg),
            }
        }
    }

    /// Samples the engine's counters (at most every 50 ms) and marks reallocations: region
    /// allocations after the model is loaded are the KV cache and activations growing.
    fn sample(&mut self) {
        let t_s = self.start.elapsed().as_secs_f64();
        if self
            .samples
            .last()
            .is_some_and(|s| t_s - s.t_s < 0.05 && self.phase != Phase::Generating)
        {
            return;
        }
        let stats = self.engine.stats();
        let mut kind_bytes = [0; 4];
        for k in AllocKind::ALL {
            kind_bytes[k.index()] = stats.current_bytes(k);
        }
        let region_bytes = [0, 1, 2].map(|i| stats.regions[i].current_bytes);
        let allocs = region_allocations(&stats);
        if self.phase != Phase::Loading && allocs > self.region_allocations {
            self.realloc_marks.push(t_s);
        }
        self.region_allocations = allocs;
        self.samples.push(Sample {
            t_s,
            kind_bytes,
            region_bytes,
        });
    }

    fn frame_timing(&mut self) {
        let now = Instant::now();
        if self.phase == Phase::Generating {
            if let Some(last) = self.frame_last {
                let ms = now.duration_since(last).as_secs_f64() * 1e3;
                self.gen_max_frame_ms = self.gen_max_frame_ms.max(ms);
            }
            self.gen_frames += 1;
        }
        self.frame_last = Some(now);
    }

    fn scripted_exit(&mut self, ctx: &egui::Context) {
        match self.exit {
            Exit::Waiting | Exit::Closing => {}
            Exit::Settling(0) => match self.args.screenshot.clone() {
                Some(path) => {
                    let slot = self.shot.clone();
                    ctx.request_screenshot(move |image| {
                        *slot.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some(save_png(&image, &path).map(|()| path));
                    });
                    self.exit = Exit::Screenshot;
                }
                None => self.close(ctx, None),
            },
            Exit::Settling(n) => self.exit = Exit::Settling(n - 1),
            Exit::Screenshot => {
                let done = self.shot.lock().unwrap_or_else(|p| p.into_inner()).take();
                match done {
                    Some(Ok(path)) => self.close(ctx, Some(path)),
                    Some(Err(e)) => {
                        self.fail(format!("screenshot: {e}"));
                        self.close(ctx, None);
                    }
                    None => {}
                }
            }
        }
        if self.phase == Phase::Failed && self.args.exit_after_answer {
            self.close(ctx, None);
        }
        if self.exit != Exit::Waiting {
            ctx.request_repaint();
        }
    }

    fn close(&mut self, ctx: &egui::Context, screenshot: Option<PathBuf>) {
        if self.exit == Exit::Closing {
            return;
        }
        self.exit = Exit::Closing;
        if let Some(a) = &self.last_answer {
            let info = self.engine.gpu().adapter_info();
            let summary = serde_json::json!({
                "text": a.text,
                "tokens": a.tokens,
                "prompt_tokens": a.prompt_tokens,
                "decode_ms_per_token": a.decode_ms_per_token,
                "frames_during_generation": self.gen_frames,
                "max_frame_interval_ms": self.gen_max_frame_ms,
                "chat_rect_px": self.chat_rect_px,
                "screenshot": screenshot,
                "adapter": info.name,
                "backend": format!("{:?}", info.backend),
                "shared_device": self.engine.gpu().is_shared(),
                "reallocations_marked": self.realloc_marks.len(),
            });
            println!("{summary}");
        }
        // Dropping the sender ends the generation thread's loop.
        self.asks = None;
        ctx.send_viewport_cmd(egui::ViewportCommand::Close);
    }

    fn top_bar(&mut self, ui: &mut egui::Ui) {
        let info = self.engine.gpu().adapter_info();
        ui.horizontal(|ui| {
            ui.heading("dynrt desktop chat");
            ui.label(format!(
                "one wgpu device for UI and model: {} ({:?})",
                info.name, info.backend
            ));
        });
        ui.horizontal(|ui| {
            ui.label("policy:");
            let idle = self.phase == Phase::Ready;
            for p in Policy::ALL {
                ui.add_enabled_ui(idle, |ui| ui.radio_value(&mut self.policy, p, p.name()));
            }
            ui.separator();
            if let (Phase::Generating, Some(t0)) = (self.phase, self.gen_started) {
                // Each streamed piece is one token's text (a token that ends inside a
                // UTF-8 character waits for the next), so pieces per second after the
                // first is the decode rate; before it, the prefill is running.
                let rate = match self.first_piece {
                    Some(t1) if self.gen_pieces > 1 => format!(
                        "decoding {:.1} tokens/s",
                        (self.gen_pieces - 1) as f64 / t1.elapsed().as_secs_f64().max(1e-3)
                    ),
                    _ => format!("prefill running {:.1} s", t0.elapsed().as_secs_f64()),
                };
                ui.label(format!(
                    "{rate}, {} frames drawn meanwhile (longest gap {:.0} ms)",
                    self.gen_frames, self.gen_max_frame_ms
                ));
            } else {
                ui.label(&self.status);
            }
        });
    }

    fn memory_panel(&self, ui: &mut egui::Ui) {
        let stats = self.engine.stats();
        ui.heading("device memory");
        ui.label(format!(
            "{:.1} of {:.0} MB budget in use; {} reallocations marked",
            self.engine.device_bytes_in_use() as f64 / 1e6,
            self.engine.memory_budget_bytes() as f64 / 1e6,
            self.realloc_marks.len()
        ));
        let mb = |b: u64| b as f64 / 1e6;
        let series = |pick: &dyn Fn(&Sample) -> u64| -> Vec<[f64; 2]> {
            self.samples.iter().map(|s| [s.t_s, mb(pick(s))]).collect()
        };
        let kinds = AllocKind::ALL
            .into_iter()
            .filter(|&k| stats.peak_bytes(k) > 0)
            .map(|k| (k.to_string(), series(&|s| s.kind_bytes[k.index()])))
            .collect();
        let regions = (COUNTED_REGIONS.iter().enumerate())
            .map(|(i, r)| (r.to_string(), series(&|s| s.region_bytes[i])))
            .collect();
        let h = (ui.available_height() / 2.0 - 40.0).max(80.0);
        self.chart(ui, "MB per kind", h, kinds);
        self.chart(ui, "MB per region", h, regions);
    }

    /// One chart of the memory panel: a line per series, reallocations as red lines.
    fn chart(
        &self,
        ui: &mut egui::Ui,
        title: &str,
        height: f32,
        lines: Vec<(String, Vec<[f64; 2]>)>,
    ) {
        ui.label(title);
        Plot::new(title)
            .height(height)
            .legend(Legend::default())
            .allow_scroll(false)
            .show(ui, |plot_ui| {
                for (name, pts) in lines {
                    plot_ui.line(Line::new(name, pts));
                }
                for (i, &t) in self.realloc_marks.iter().enumerate() {
                    let name = if i == 0 { "reallocation" } else { "" };
                    plot_ui.vline(VLine::new(name, t).color(egui::Color32::RED));
                }
            });
    }

    fn chat(&mut self, ui: &mut egui::Ui) {
        let ppp = ui.ctx().pixels_per_point();
        let rect = ui.max_rect();
        self.chat_rect_px = [
            rect.min.x * ppp,
            rect.min.y * ppp,
            rect.max.x * ppp,
            rect.max.y * ppp,
        ];
        egui::ScrollArea::vertical()
            .stick_to_bottom(true)
            .auto_shrink([false, false])
            .show(ui, |ui| {
                if self.turns.is_empty() {
                    ui.weak("Ask SmolLM2-135M-Instruct something below.");
                }
                for t in &self.turns {
                    ui.label(egui::RichText::new(format!("You: {}", t.user)).strong());
                    ui.label(format!("SmolLM2: {}", t.reply));
                    ui.add_space(8.0);
                }
            });
    }

    fn input_bar(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            let edit = egui::TextEdit::singleline(&mut self.input)
                .hint_text("Type a message and press Enter")
                .desired_width(ui.available_width() - 70.0);
            let resp = ui.add(edit);
            let enter = resp.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
            let idle = self.phase == Phase::Ready;
            let clicked = ui.add_enabled(idle, egui::Button::new("Send")).clicked();
            if idle && (enter || clicked) && !self.input.trim().is_empty() {
                let text = std::mem::take(&mut self.input);
                self.submit(text.trim().to_string());
            }
        });
    }
}

fn region_allocations(stats: &MemoryStats) -> u64 {
    stats.regions.iter().map(|r| r.allocations).sum()
}

fn save_png(image: &egui::ColorImage, path: &std::path::Path) -> Result<(), String> {
    let [w, h] = image.size;
    let bytes: Vec<u8> = image.pixels.iter().flat_map(|c| c.to_array()).collect();
    let buf = image::RgbaImage::from_raw(w as u32, h as u32, bytes)
        .ok_or_else(|| format!("a {w}x{h} screenshot with a wrong pixel count"))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    buf.save(path)
        .map_err(|e| format!("{}: {e}", path.display()))
}

impl eframe::App for ChatApp {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        let ctx = ui.ctx().clone();
        self.frame_timing();
        self.drain_reports();
        self.sample();
        egui::Panel::top("top").show(ui, |ui| self.top_bar(ui));
        egui::Panel::bottom("input").show(ui, |ui| self.input_bar(ui));
        egui::Panel::right("memory")
            .default_size(460.0)
            .show(ui, |ui| self.memory_panel(ui));
        egui::CentralPanel::default().show(ui, |ui| self.chat(ui));
        if self.phase == Phase::Generating || self.phase == Phase::Loading {
            // Keep drawing while the other thread works: the frame gaps are the proof that
            // the render loop does not wait for it.
            ctx.request_repaint_after(Duration::from_millis(16));
        }
        self.scripted_exit(&ctx);
    }
}
