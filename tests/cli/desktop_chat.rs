//! The desktop example seen as a person sees it: under Xvfb, `desktop_chat --prompt TEXT
//! --screenshot FILE.png --exit-after-answer` opens its window (egui and SmolLM2 on one
//! wgpu device), submits the prompt, waits for the answer, saves a screenshot and exits 0.
//! The answer must equal the headless run's (`dynrt generate --chat TEXT --json`, greedy,
//! the same max tokens), and the screenshot must show something: pixels vary, and the
//! chat area (whose rectangle the example reports) has ink. The screenshot stays at
//! `target/desktop_chat.png` (a CI artifact).
//!
//! Needs `xvfb-run` (Debian `xvfb` and `xauth`, installed by `.ci/run`) and the model;
//! without them the test prints SKIP, and fails instead under `DYNRT_REQUIRE_GPU=1` (Xvfb
//! or the window) or `DYNRT_REQUIRE_MODEL=1` (the model).

use dynrt::gpu::testing::require_gpu;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const PROMPT: &str = "What is the capital of France?";
const MAX_TOKENS: &str = "24";
/// The example's exit status when its window cannot open.
const EXIT_NO_WINDOW: i32 = 3;

fn skip_or_fail(test: &str, reason: &str) {
    if require_gpu() {
        panic!("{test}: {reason} and DYNRT_REQUIRE_GPU=1");
    }
    eprintln!("SKIP {test}: {reason}");
}

/// The example binary that `cargo test` builds beside the test binaries
/// (`target/<profile>/examples/`), rebuilt first so that `--test cli desktop_chat::` alone
/// does not run a stale one.
fn example_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lives in target/<profile>/deps");
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let mut build = Command::new(env!("CARGO"));
    build.args(["build", "--quiet", "--example", "desktop_chat"]);
    if release {
        build.arg("--release");
    }
    let status = build
        .current_dir(crate::common::repo())
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building the example failed");
    profile_dir
        .join("examples")
        .join(format!("desktop_chat{}", std::env::consts::EXE_SUFFIX))
}

/// Runs `cmd` to completion or kills it after `limit`.
fn run_with_limit(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the command starts");
    let t0 = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "still running after {limit:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn last_json_line(out: &Output, what: &str) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or_else(|| {
            panic!(
                "{what}: no JSON line on stdout:\n{stdout}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{what}: {e}: {line}"))
}

#[test]
fn the_window_answers_like_the_headless_run_and_shows_it() {
    let test = "the_window_answers_like_the_headless_run_and_shows_it";
    let Some(model) = dynrt::fetch::model_or_skip(test) else {
        return;
    };
    // No adapter: both runs would fail; skip (or fail) like the other GPU tests.
    if dynrt::gpu::testing::gpu_or_skip(test).is_none() {
        return;
    }
    if let Some(pack) = crate::common::packed() {
        eprintln!("SKIP {test}: builds examples/desktop_chat.rs with cargo, which a packed run ({pack}) does not have");
        return;
    }
    if Command::new("xvfb-run").arg("--help").output().is_err() {
        return skip_or_fail(
            test,
            "xvfb-run is not installed (apt-get install xvfb xauth)",
        );
    }
    let model = model.to_string_lossy().to_string();

    // The headless answer.
    let mut headless = Command::new(crate::common::dynrt_bin());
    headless.args([
        "generate",
        "--chat",
        PROMPT,
        "--max-tokens",
        MAX_TOKENS,
        "--json",
        "--model",
        &model,
    ]);
    let out = run_with_limit(headless, Duration::from_secs(300));
    assert!(
        out.status.success(),
        "dynrt generate failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = last_json_line(&out, "dynrt generate");

    // The window, on a virtual X display.
    let shot = crate::common::tmpdir()
        .parent()
        .expect("target/tmp has a parent")
        .join("desktop_chat.png");
    let _ = std::fs::remove_file(&shot);
    let example = example_binary();
    let mut window = Command::new("xvfb-run");
    window
        .args(["-a", "-s", "-screen 0 1280x800x24"])
        .arg(&example)
        .args([
            "--prompt",
            PROMPT,
            "--max-tokens",
            MAX_TOKENS,
            "--model",
            &model,
        ])
        .arg("--screenshot")
        .arg(&shot)
        .arg("--exit-after-answer");
    let t0 = Instant::now();
    let out = run_with_limit(window, Duration::from_secs(300));
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(EXIT_NO_WINDOW) {
        return skip_or_fail(test, &format!("the window could not open: {stderr}"));
    }
    assert!(out.status.success(), "desktop_chat failed:\n{stderr}");
    let got = last_json_line(&out, "desktop_chat");
    println!(
        "desktop_chat ran {:.1} s: {got}",
        t0.elapsed().as_secs_f64()
    );

    assert_eq!(got["shared_device"], true);
    assert_eq!(
        got["tokens"], want["tokens"],
        "tokens differ from the headless run"
    );
    assert_eq!(
        got["text"], want["text"],
        "text differs from the headless run"
    );
    assert!(
        got["text"].as_str().is_some_and(|t| !t.trim().is_empty()),
        "empty answer: {got}"
    );
    assert!(got["frames_during_generation"].as_u64().unwrap_or(0) > 0);

    // The screenshot shows a window, and its chat area has text in it.
    let img = image::open(&shot)
        .unwrap_or_else(|e| panic!("{}: {e}", shot.display()))
        .to_rgba8();
    let (w, h) = img.dimensions();
    assert!(w >= 400 && h >= 300, "screenshot is {w}x{h}");
    let mut colors = std::collections::HashSet::new();
    for p in img.pixels() {
        colors.insert(p.0);
    }
    assert!(
        colors.len() > 16,
        "blank screenshot: {} colours",
        colors.len()
    );
    let r: Vec<f64> = got["chat_rect_px"]
        .as_array()
        .expect("chat_rect_px")
        .iter()
        .map(|v| v.as_f64().unwrap_or(0.0))
        .collect();
    let (x0, y0) = (r[0].max(0.0) as u32, r[1].max(0.0) as u32);
    let (x1, y1) = ((r[2] as u32).min(w), (r[3] as u32).min(h));
    assert!(
        x1 > x0 + 50 && y1 > y0 + 50,
        "chat area {r:?} in a {w}x{h} image"
    );
    let (inked, total) = ink(&img, x0, y0, x1, y1);
    println!(
        "screenshot {} ({w}x{h}, {} colours), chat area: {inked} of {total} pixels inked",
        shot.display(),
        colors.len(),
    );
    // Two short lines of text ink about a thousand pixels (1,484 for "The capital of France
    // is Paris." at 1100x700); an empty chat area inks none.
    assert!(
        inked > 400 && inked < total / 2,
        "chat area: {inked} of {total} pixels inked: no text (or no background)"
    );
}

/// How many pixels of a rectangle differ clearly from its most common colour (the
/// background): text, where there is some; and how many pixels it has.
fn ink(img: &image::RgbaImage, x0: u32, y0: u32, x1: u32, y1: u32) -> (u64, u64) {
    let mut counts = std::collections::HashMap::new();
    for y in y0..y1 {
        for x in x0..x1 {
            *counts.entry(img.get_pixel(x, y).0).or_insert(0u64) += 1;
        }
    }
    let Some((&bg, _)) = counts.iter().max_by_key(|(_, &n)| n) else {
        return (0, 0);
    };
    let total: u64 = counts.values().sum();
    let inked: u64 = counts
        .iter()
        .filter(|(c, _)| {
            let d: i32 = (0..3).map(|i| (c[i] as i32 - bg[i] as i32).abs()).sum();
            d > 96
        })
        .map(|(_, &n)| n)
        .sum();
    (inked, total)
}
