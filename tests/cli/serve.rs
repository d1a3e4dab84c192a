//! `dynrt serve` over real HTTP on 127.0.0.1: the server starts on a free port (it prints
//! the address it bound), and a small blocking HTTP/1.1 client (`tests/common/server.rs`)
//! drives it: chat and completions with and without streaming, the models list, health,
//! metrics, the OpenAI error shape for bad requests, a client that disconnects mid-stream,
//! concurrent requests, a budget so small that requests wait in the queue; and the
//! operations: API keys, CORS, 503 while loading and after the scheduler thread died, the
//! SIGTERM drain (8 open streams) and the second signal, the tokenizer endpoints, the
//! request log and latency histograms, ids across restarts, the request timeout, and a
//! 3-minute soak; every request field honoured or refused, the prompt cache across requests,
//! structured output validated by an independent JSON Schema validator, the `openai` Python
//! package as a client (scripts/serve_check.py), and a tool call's round trip with
//! Qwen2.5-Coder-0.5B. SmolLM2 where answers are checked, a tiny random model elsewhere; skips
//! without them (`DYNRT_REQUIRE_MODEL=1`, `DYNRT_REQUIRE_GPU=1` make that a failure).

use crate::server::{
    answer, chat_body, sse_data, tiny_long_prompt, tiny_model, wait_reading, write_request_with,
    Server, Stream,
};
use dynrt::gpu::testing;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

/// The text of a streamed answer (chat deltas or completion texts), its finish reason and
/// the usage chunk; checks that the stream ends with `[DONE]`.
fn streamed(body: &str) -> (String, String, Option<Value>) {
    let data = sse_data(body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{body}");
    let (mut text, mut finish, mut usage) = (String::new(), String::new(), None);
    for d in &data[..data.len() - 1] {
        let v: Value = serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}"));
        if let Some(c) = v["choices"].get(0) {
            let piece = c["delta"]["content"].as_str().or(c["text"].as_str());
            text.push_str(piece.unwrap_or(""));
            if let Some(f) = c["finish_reason"].as_str() {
                finish = f.to_string();
            }
        }
        if !v["usage"].is_null() {
            usage = Some(v["usage"].clone());
        }
    }
    (text, finish, usage)
}

fn write_request(
    s: &mut std::net::TcpStream,
    server: &Server,
    method: &str,
    path: &str,
    body: &str,
) {
    write_request_with(s, &server.addr, method, path, &[], body);
}

/// The model and a GPU, or `None` after printing why the test is skipped.
fn model(test: &str) -> Option<std::path::PathBuf> {
    let model = dynrt::fetch::model_or_skip(test)?;
    testing::gpu_or_skip(test)?;
    Some(model)
}

#[test]
fn serve_answers_openai_requests_over_http() {
    let test = "serve_answers_openai_requests_over_http";
    let Some(model) = model(test) else { return };
    let t0 = Instant::now();
    let server = Server::start(&model, &["--max-batch", "4"]);
    let started = t0.elapsed();

    assert_eq!(server.get("/health"), (200, r#"{"status":"ok"}"#.into()));
    let (status, models) = server.get("/v1/models");
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    let id = models["data"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(id, "SmolLM2-135M-Instruct.Q4_1");

    // Chat, whole and streamed: the same greedy text.
    let france = "What is the capital of France?";
    let mut body = chat_body(france, 12, false);
    body["model"] = json!(id);
    let (status, v) = server.json("POST", "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(answer(&v), "The capital of France is Paris.");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 37, "completion_tokens": 8, "total_tokens": 45,
               "prompt_tokens_details": {"cached_tokens": 0}})
    );
    let mut body = chat_body(france, 12, true);
    body["stream_options"] = json!({"include_usage": true});
    let (status, sse) = server.send("POST", "/v1/chat/completions", &body.to_string());
    assert_eq!(status, 200, "{sse}");
    let (text, finish, usage) = streamed(&sse);
    assert_eq!(text, "The capital of France is Paris.");
    assert_eq!(finish, "stop");
    assert_eq!(usage.unwrap()["completion_tokens"], 8);

    // Completions: raw text, 6 tokens, whole and streamed.
    let body = json!({"prompt": "The quick brown fox", "max_tokens": 6, "temperature": 0});
    let (status, v) = server.json("POST", "/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 6);
    let whole = v["choices"][0]["text"].as_str().unwrap().to_string();
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    let (_, sse) = server.send("POST", "/v1/completions", &stream_body.to_string());
    assert_eq!(streamed(&sse).0, whole);

    // Bad requests: OpenAI's error object with a 4xx status (and the text it must hold).
    let long_prompt = "hello ".repeat(9000);
    let bad: [(&str, String, u16, &str); 7] = [
        ("/v1/chat/completions", "{not json".into(), 400, ""),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "mirostat": 2}).to_string(),
            400,
            r#""param":"mirostat""#,
        ),
        (
            "/v1/chat/completions",
            json!({"messages": []}).to_string(),
            400,
            r#""param":"messages""#,
        ),
        (
            "/v1/chat/completions",
            chat_body("hi", 0, false).to_string(),
            400,
            r#""param":"max_tokens""#,
        ),
        (
            "/v1/chat/completions",
            chat_body("hi", 100_000, false).to_string(),
            400,
            r#""param":"max_tokens""#,
        ),
        (
            "/v1/completions",
            json!({"prompt": long_prompt, "max_tokens": 4}).to_string(),
            400,
            r#""code":"context_length_exceeded""#,
        ),
        ("/v1/nothing", "{}".into(), 404, ""),
    ];
    for (path, body, want, holds) in &bad {
        let (status, text) = server.send("POST", path, body);
        assert_eq!(
            status,
            *want,
            "{path} {}: {text}",
            &body[..body.len().min(80)]
        );
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
        assert!(text.contains(holds), "{holds} not in {text}");
    }

    // A client that goes away mid-stream: its request is cancelled, its session freed.
    let mut s = server.connect();
    let body = json!({"prompt": "1, 2, 3, 4, 5,", "max_tokens": 200, "temperature": 0,
                      "stream": true});
    write_request(
        &mut s,
        &server,
        "POST",
        "/v1/completions",
        &body.to_string(),
    );
    let mut reader = BufReader::new(s);
    let mut line = String::new();
    while !line.contains("\"text\":") {
        line.clear();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "the stream ended early"
        );
    }
    drop(reader);
    server.wait_metric("dynrt_requests_total{outcome=\"cancelled\"}", 1.0);
    server.wait_metric("dynrt_active_sessions", 0.0);
    assert_eq!(server.metric("dynrt_kv_reserved_bytes"), 0.0);
    // The same for a client that waits for the whole answer and goes away before it.
    let mut s = server.connect();
    let mut body = body;
    body["stream"] = json!(false);
    write_request(
        &mut s,
        &server,
        "POST",
        "/v1/completions",
        &body.to_string(),
    );
    server.wait_metric("dynrt_active_sessions", 1.0);
    drop(s);
    server.wait_metric("dynrt_requests_total{outcome=\"cancelled\"}", 2.0);
    server.wait_metric("dynrt_active_sessions", 0.0);
    let (status, v) = server.json(
        "POST",
        "/v1/chat/completions",
        &chat_body(france, 12, false),
    );
    assert_eq!(status, 200);
    assert_eq!(answer(&v), "The capital of France is Paris.");

    // Concurrent requests of different lengths: each gets the answer it gets alone.
    let prompts = [
        "Name three colours.",
        "What is two plus two?",
        "Write a haiku about the sea, then explain what a haiku is.",
        "Hello!",
    ];
    let alone: Vec<String> = prompts
        .iter()
        .map(|p| {
            answer(
                &server
                    .json("POST", "/v1/chat/completions", &chat_body(p, 10, false))
                    .1,
            )
        })
        .collect();
    let t = Instant::now();
    let together: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                let server = &server;
                scope.spawn(move || {
                    let (status, v) =
                        server.json("POST", "/v1/chat/completions", &chat_body(p, 10, false));
                    assert_eq!(status, 200, "{v}");
                    answer(&v)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, alone);
    let concurrent = t.elapsed();

    // The metrics count what ran.
    let (_, metrics) = server.get("/metrics");
    for name in [
        "dynrt_tokens_per_second",
        "dynrt_queue_length 0",
        "dynrt_kv_budget_bytes",
        "dynrt_device_bytes",
        "# TYPE dynrt_time_to_first_token_seconds histogram",
        "dynrt_time_to_first_token_seconds_bucket{le=\"+Inf\"}",
    ] {
        assert!(metrics.contains(name), "{name} missing:\n{metrics}");
    }
    assert!(server.metric("dynrt_tokens_generated_total") >= 60.0);
    assert!(server.metric("dynrt_requests_total{outcome=\"finished\"}") >= 13.0);
    assert!(server.metric("dynrt_time_to_first_token_seconds_count") >= 13.0);
    eprintln!(
        "{test}: server up in {:.1} s, 4 concurrent answers in {:.1} s",
        started.as_secs_f64(),
        concurrent.as_secs_f64()
    );
}

#[test]
fn serve_with_a_tiny_budget_queues_requests_and_finishes_them_all() {
    let test = "serve_with_a_tiny_budget_queues_requests_and_finishes_them_all";
    let Some(model) = model(test) else { return };
    // SmolLM2 holds 45 KiB of KV per token: 3 MiB is room for one request of about 45
    // tokens (a 37-token prompt and 8 answer tokens) at a time, not two.
    let server = Server::start(&model, &["--budget-mib", "3"]);
    let prompts = [
        "What is the capital of France?",
        "What is the capital of Spain?",
        "What is the capital of Italy?",
    ];
    let mut most_queued = 0.0f64;
    let mut most_request_pages = 0;
    let answers: Vec<(u16, Value)> = std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                let server = &server;
                scope.spawn(move || {
                    server.json("POST", "/v1/chat/completions", &chat_body(p, 8, false))
                })
            })
            .collect();
        while handles.iter().any(|h| !h.is_finished()) {
            most_queued = most_queued.max(server.metric("dynrt_queue_length"));
            assert!(server.metric("dynrt_active_sessions") <= 1.0);
            // The memory report: each active request's pages, within the pools.
            let (status, text) = server.get("/v1/memory");
            assert_eq!(status, 200, "{text}");
            let m: Value = serde_json::from_str(&text).unwrap();
            let requests = m["requests"].as_array().unwrap();
            assert!(requests.len() <= 1, "{m}");
            let pages: u64 = requests.iter().map(|r| r["pages"].as_u64().unwrap()).sum();
            assert!(
                pages <= m["scheduler"]["pages_total"].as_u64().unwrap(),
                "{m}"
            );
            assert!(
                m["kinds"]["usm_device"]["current"].as_u64().unwrap() > 0,
                "{m}"
            );
            // The weights: on the device as in the file (SmolLM2 has no q4_0 or q5_0
            // weight to reorder).
            let w = &m["weights"];
            assert!(w["device_bytes"].as_u64().unwrap() >= w["file_bytes"].as_u64().unwrap());
            assert_eq!(w["grouped_bytes"].as_u64(), Some(0), "{m}");
            most_request_pages = most_request_pages.max(pages);
            std::thread::sleep(Duration::from_millis(50));
        }
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (status, v) in &answers {
        assert_eq!(*status, 200, "{v}");
        assert!(!answer(v).is_empty(), "{v}");
    }
    assert!(most_queued >= 1.0, "no request waited: {most_queued}");
    assert!(most_request_pages > 0, "no request seen holding pages");
    // The live charts of that report.
    let (status, page) = server.get("/");
    assert_eq!(status, 200);
    assert!(
        page.contains("<canvas") && page.contains("/v1/memory"),
        "{page}"
    );
    assert_eq!(
        server.metric("dynrt_requests_total{outcome=\"finished\"}"),
        3.0
    );
    // More than the whole budget can ever hold: refused at once.
    let (status, v) = server.json(
        "POST",
        "/v1/chat/completions",
        &chat_body(prompts[0], 200, false),
    );
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "max_tokens");
}

/// A GPU (the tiny model needs no download), or `None` after printing why the test is
/// skipped.
fn tiny(test: &str, context: u32) -> Option<std::path::PathBuf> {
    testing::gpu_or_skip(test)?;
    Some(tiny_model(&format!("serve-tiny-{context}"), context))
}

/// The error object of an answer, checked to be OpenAI's shape.
fn error_of(status: u16, text: &str) -> Value {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{status} {e}: {text}"));
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{v}"
    );
    assert!(v["error"]["type"].is_string(), "{v}");
    v["error"].clone()
}

#[test]
fn serve_takes_api_keys_from_a_flag_a_file_and_the_environment() {
    let test = "serve_takes_api_keys_from_a_flag_a_file_and_the_environment";
    let Some(model) = tiny(test, 256) else { return };
    let dir = crate::common::scratch(test);
    let file = dir.join("keys");
    std::fs::write(&file, "# the keys\n\nfrom-file\n").unwrap();
    let server = Server::start_with(
        &model,
        &[
            "--api-key",
            "from-flag",
            "--api-key-file",
            file.to_str().unwrap(),
        ],
        &[("DYNRT_API_KEY", "from-env")],
    );
    let body = chat_body("hi", 2, false).to_string();
    let path = "/v1/chat/completions";
    // No key, a wrong key, a key in the wrong scheme: 401 in OpenAI's shape.
    for headers in [
        vec![],
        vec![("Authorization", "Bearer wrong")],
        vec![("Authorization", "Basic from-flag")],
        vec![("X-Api-Key", "from-fla")],
    ] {
        let (status, _, text) = server.request("POST", path, &headers, &body);
        assert_eq!(status, 401, "{headers:?}: {text}");
        assert_eq!(error_of(status, &text)["code"], "invalid_api_key");
    }
    for (name, key) in [
        ("Authorization", "Bearer from-flag"),
        ("Authorization", "bearer from-file"),
        ("X-Api-Key", "from-env"),
    ] {
        let (status, _, text) = server.request("POST", path, &[(name, key)], &body);
        assert_eq!(status, 200, "{name}: {key}: {text}");
    }
    // The health check and the dashboard's page are open; its data and the rest are not.
    assert_eq!(server.get("/health").0, 200);
    assert_eq!(server.get("/").0, 200);
    for p in ["/v1/memory", "/metrics", "/v1/models"] {
        assert_eq!(server.get(p).0, 401, "{p}");
        let (status, _, _) = server.request("GET", p, &[("X-Api-Key", "from-file")], "");
        assert_eq!(status, 200, "{p}");
    }
    // Keys never reach the log.
    let log = server.stderr().join("\n");
    assert!(log.contains("dynrt::access"), "{log}");
    for key in ["from-flag", "from-file", "from-env"] {
        assert!(!log.contains(key), "{key} in the log:\n{log}");
    }
}

#[test]
fn serve_answers_cors_preflights_and_lets_only_listed_origins_read() {
    let test = "serve_answers_cors_preflights_and_lets_only_listed_origins_read";
    let Some(model) = tiny(test, 256) else { return };
    let server = Server::start(
        &model,
        &["--cors-origins", "https://app.example,http://x.test"],
    );
    let preflight = |origin: &str| {
        server.request(
            "OPTIONS",
            "/v1/chat/completions",
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "POST"),
                (
                    "Access-Control-Request-Headers",
                    "authorization, content-type",
                ),
            ],
            "",
        )
    };
    let (status, head, _) = preflight("https://app.example");
    assert_eq!(status, 204, "{head}");
    let head = head.to_ascii_lowercase();
    assert!(
        head.contains("access-control-allow-origin: https://app.example"),
        "{head}"
    );
    assert!(
        head.contains("access-control-allow-headers: authorization, content-type"),
        "{head}"
    );
    assert!(head.contains("access-control-allow-methods:"), "{head}");
    // A request of a listed origin is answered with the header that lets its page read it.
    let (status, head, _) = server.request(
        "POST",
        "/v1/chat/completions",
        &[("Origin", "http://x.test")],
        &chat_body("hi", 2, false).to_string(),
    );
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains("access-control-allow-origin: http://x.test"),
        "{head}"
    );
    // Another site: refused, preflight or not, and told why.
    let (status, head, text) = preflight("https://evil.example");
    assert_eq!(status, 403, "{head}");
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("access-control-allow-origin"),
        "{head}"
    );
    assert_eq!(error_of(status, &text)["code"], "origin_not_allowed");
}

#[test]
fn serve_answers_503_while_the_model_loads() {
    let test = "serve_answers_503_while_the_model_loads";
    let Some(model) = model(test) else { return };
    let mut server = Server::spawn(&model, &[], &[]);
    server.wait_loading_line();
    // SmolLM2 takes seconds to load; the answers before it is ready say so.
    let (status, head, text) = server.request("GET", "/health", &[], "");
    assert_eq!(
        status, 503,
        "the first health check came after the load: {text}"
    );
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap(),
        json!({"status": "loading"})
    );
    assert!(head.to_ascii_lowercase().contains("retry-after:"), "{head}");
    let (status, text) = server.send(
        "POST",
        "/v1/chat/completions",
        &chat_body("hi", 2, false).to_string(),
    );
    // The load may have ended in between; then the request is answered.
    if status == 503 {
        assert_eq!(error_of(status, &text)["code"], "model_loading");
    } else {
        assert_eq!(status, 200, "{text}");
    }
    let t = Instant::now();
    while server.get("/health").0 != 200 {
        assert!(t.elapsed() < crate::server::START_DEADLINE, "never ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, v) = server.json("POST", "/v1/chat/completions", &chat_body("hi", 2, false));
    assert_eq!(status, 200, "{v}");
}

#[test]
fn serve_health_says_error_and_requests_get_503_after_the_scheduler_thread_died() {
    let test = "serve_health_says_error_and_requests_get_503_after_the_scheduler_thread_died";
    let Some(model) = tiny(test, 256) else { return };
    let server = Server::start_with(
        &model,
        &[],
        &[("DYNRT_SERVE_FAULT", "scheduler-panic-after:1")],
    );
    let (status, v) = server.json("POST", "/v1/chat/completions", &chat_body("hi", 2, false));
    assert_eq!(status, 200, "{v}");
    // The first request's end made the scheduler thread panic.
    let t = Instant::now();
    let health = loop {
        let (status, text) = server.get("/health");
        if status != 200 {
            break (status, text);
        }
        assert!(
            t.elapsed() < crate::server::REQUEST_DEADLINE,
            "/health stayed 200"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(health.0, 503);
    let h: Value = serde_json::from_str(&health.1).unwrap();
    assert_eq!(h["status"], "error", "{h}");
    assert!(h["reason"].as_str().unwrap().contains("panicked"), "{h}");
    for stream in [false, true] {
        let (status, text) = server.send(
            "POST",
            "/v1/chat/completions",
            &chat_body("hi", 2, stream).to_string(),
        );
        assert_eq!(status, 503, "{text}");
        assert_eq!(error_of(status, &text)["code"], "scheduler_stopped");
    }
    assert!(server
        .get("/metrics")
        .1
        .contains("dynrt_server_state{state=\"error\"} 1"));
}

/// Streams of completions from `n` clients: `prompt` and `max_tokens`.
fn open_streams(server: &Server, n: usize, prompt: &str, max_tokens: u64) -> Vec<Stream> {
    (0..n)
        .map(|i| {
            Stream::open(
                server,
                "/v1/completions",
                &json!({"prompt": format!("{prompt}{i}"), "max_tokens": max_tokens,
                        "temperature": 0, "stream": true}),
            )
        })
        .collect()
}

/// Stream `i`'s last event before its `[DONE]` (which it must end with), and how many
/// events came before that one.
fn last_event(i: usize, data: Vec<String>) -> (Value, usize) {
    assert_eq!(
        data.last().map(String::as_str),
        Some("[DONE]"),
        "stream {i}: {data:?}"
    );
    assert!(
        data.len() >= 2,
        "stream {i}: no event before [DONE]: {data:?}"
    );
    let before = data.len() - 2;
    (serde_json::from_str(&data[before]).unwrap(), before)
}

#[test]
fn sigterm_during_8_open_streams_ends_each_with_a_final_event_and_done() {
    let test = "sigterm_during_8_open_streams_ends_each_with_a_final_event_and_done";
    let Some(model) = tiny(test, 4096) else {
        return;
    };
    // 8 prompts of 3,000 tokens, 16 prompt rows per step: each is open for hundreds of steps.
    let mut server = Server::start(
        &model,
        &[
            "--max-batch",
            "8",
            "--prefill-chunk",
            "8",
            "--shutdown-timeout",
            "1",
        ],
    );
    let streams = open_streams(&server, 8, &tiny_long_prompt(1000), 500);
    wait_reading(&server, 8);
    server.signal(libc::SIGTERM);
    for (i, s) in streams.into_iter().enumerate() {
        let (last, _) = last_event(i, s.finish());
        // Not finished in the second given: ended with an error event that says why.
        assert_eq!(last["error"]["code"], "shutting_down", "stream {i}: {last}");
    }
    let status = server.wait_exit(crate::server::REQUEST_DEADLINE);
    assert!(status.success(), "{status:?}");
    let log = server.stderr().join("\n");
    assert_eq!(log.matches("outcome=shutdown").count(), 8, "{log}");
}

#[test]
fn a_lost_device_ends_8_open_streams_with_device_lost_and_the_server_recovers() {
    let test = "a_lost_device_ends_8_open_streams_with_device_lost_and_the_server_recovers";
    let Some(model) = tiny(test, 1024) else {
        return;
    };
    // The device is destroyed (as a driver reset loses it) when the 12th token reaches a
    // handler: the second decode step of the eight streams, all admitted before any decodes.
    let server = Server::start_with(
        &model,
        &["--max-batch", "8", "--prefill-chunk", "8"],
        &[("DYNRT_SERVE_FAULT", "device-lost-after-tokens:12")],
    );
    let streams = open_streams(&server, 8, &tiny_long_prompt(100), 200);
    wait_reading(&server, 8);
    let mut seen = Vec::new();
    for (i, s) in streams.into_iter().enumerate() {
        let (last, before) = last_event(i, s.finish());
        assert_eq!(last["error"]["code"], "device_lost", "stream {i}: {last}");
        seen.push(before);
    }
    assert!(
        seen.iter().sum::<usize>() >= 12,
        "tokens before the loss: {seen:?}"
    );
    // The server loads the model again on a new device, answering 503 meanwhile.
    let t = Instant::now();
    loop {
        let (status, text) = server.get("/health");
        if status == 200 {
            break;
        }
        assert_eq!(status, 503, "{text}");
        let h: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(h["status"], "recovering", "{h}");
        let (status, text) = server.send(
            "POST",
            "/v1/chat/completions",
            &chat_body("hi", 2, false).to_string(),
        );
        if status != 200 {
            assert_eq!(error_of(status, &text)["code"], "device_lost", "{text}");
        }
        assert!(
            t.elapsed() < crate::server::START_DEADLINE,
            "never recovered"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(server.metric("dynrt_device_recoveries_total"), 1.0);
    assert_eq!(server.metric("dynrt_server_state{state=\"ok\"}"), 1.0);
    let (status, v) = server.json("POST", "/v1/chat/completions", &chat_body("hi", 4, false));
    assert_eq!(status, 200, "{v}");
    assert!(v["usage"]["completion_tokens"].as_u64() > Some(0), "{v}");
    // Every page of the lost device's cache went with it; the new one holds none.
    let m = server.memory();
    assert_eq!(m["requests"].as_array().map(Vec::len), Some(0), "{m}");
    let log = server.stderr().join("\n");
    assert!(log.contains("loaded again"), "{log}");
    assert_eq!(log.matches("outcome=failed").count(), 8, "{log}");
}

#[test]
fn sigterm_lets_running_streams_finish_and_refuses_new_requests() {
    let test = "sigterm_lets_running_streams_finish_and_refuses_new_requests";
    let Some(model) = tiny(test, 256) else { return };
    let mut server = Server::start(&model, &["--max-batch", "2", "--shutdown-timeout", "600"]);
    let streams = open_streams(&server, 2, "count ", 150);
    server.wait_metric("dynrt_active_sessions", 2.0);
    server.signal(libc::SIGTERM);
    let t = Instant::now();
    while !server
        .stderr()
        .iter()
        .any(|l| l.contains("SIGTERM: finishing 2 running requests"))
    {
        assert!(
            t.elapsed() < crate::server::REQUEST_DEADLINE,
            "no drain after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // A new request is refused: no connection, or a 503 that says why.
    if let Ok(mut s) = std::net::TcpStream::connect(&server.addr) {
        s.set_read_timeout(Some(crate::server::REQUEST_DEADLINE))
            .unwrap();
        write_request(
            &mut s,
            &server,
            "POST",
            "/v1/chat/completions",
            &chat_body("hi", 2, false).to_string(),
        );
        let mut raw = Vec::new();
        let _ = std::io::Read::read_to_end(&mut s, &mut raw);
        let text = String::from_utf8_lossy(&raw);
        assert!(
            text.is_empty() || text.starts_with("HTTP/1.1 503"),
            "{text}"
        );
    }
    for (i, s) in streams.into_iter().enumerate() {
        let data = s.finish();
        assert_eq!(
            data.last().map(String::as_str),
            Some("[DONE]"),
            "stream {i}: {data:?}"
        );
        let last: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
        let finish = last["choices"][0]["finish_reason"].as_str();
        assert!(
            matches!(finish, Some("length" | "stop")),
            "stream {i}: {last}"
        );
    }
    let status = server.wait_exit(crate::server::REQUEST_DEADLINE);
    assert!(status.success(), "{status:?}");
}

#[test]
fn a_second_signal_exits_at_once() {
    let test = "a_second_signal_exits_at_once";
    let Some(model) = tiny(test, 4096) else {
        return;
    };
    let mut server = Server::start(
        &model,
        &["--shutdown-timeout", "600", "--prefill-chunk", "8"],
    );
    let _streams = open_streams(&server, 2, &tiny_long_prompt(1000), 500);
    wait_reading(&server, 2);
    server.signal(libc::SIGINT);
    let t = Instant::now();
    while !server
        .stderr()
        .iter()
        .any(|l| l.contains("SIGINT: finishing"))
    {
        assert!(
            t.elapsed() < crate::server::REQUEST_DEADLINE,
            "no drain after SIGINT"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    server.signal(libc::SIGINT);
    let status = server.wait_exit(crate::server::REQUEST_DEADLINE);
    // 128 + SIGINT: the exit of the second signal, not the drain's.
    assert_eq!(status.code(), Some(128 + libc::SIGINT), "{status:?}");
}

#[test]
fn serve_tokenizes_detokenizes_and_renders_templates_as_the_chat_endpoint_does() {
    let test = "serve_tokenizes_detokenizes_and_renders_templates_as_the_chat_endpoint_does";
    let Some(model) = model(test) else { return };
    let server = Server::start(&model, &[]);
    let messages = json!([{"role": "user", "content": "What is the capital of France?"}]);
    let (status, t) = server.json("POST", "/apply-template", &json!({"messages": messages}));
    assert_eq!(status, 200, "{t}");
    let prompt = t["prompt"].as_str().unwrap();
    assert!(prompt.starts_with("<|im_start|>system\n"), "{prompt}");
    assert!(
        prompt.ends_with(
            "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
        ),
        "{prompt}"
    );
    let (status, ids) = server.json("POST", "/tokenize", &json!({"content": prompt}));
    assert_eq!(status, 200, "{ids}");
    let ids = ids["tokens"].as_array().unwrap().clone();
    // The chat endpoint reads the same 37 tokens.
    let (_, v) = server.json(
        "POST",
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 1}),
    );
    assert_eq!(
        v["usage"]["prompt_tokens"].as_u64(),
        Some(ids.len() as u64),
        "{v}"
    );
    assert_eq!(ids.len(), 37);
    let (status, back) = server.json("POST", "/detokenize", &json!({"tokens": ids}));
    assert_eq!(status, 200);
    assert_eq!(back["content"], prompt);
    // Pieces, control tokens as text, and ids outside the vocabulary.
    let (_, p) = server.json(
        "POST",
        "/tokenize",
        &json!({"content": "Hello world", "with_pieces": true}),
    );
    assert_eq!(p["tokens"][1]["piece"], " world", "{p}");
    let (_, plain) = server.json(
        "POST",
        "/tokenize",
        &json!({"content": "<|im_end|>", "parse_special": false}),
    );
    assert!(plain["tokens"].as_array().unwrap().len() > 1, "{plain}");
    let (status, text) = server.send(
        "POST",
        "/detokenize",
        &json!({"tokens": [u32::MAX]}).to_string(),
    );
    assert_eq!(status, 400, "{text}");
    let (status, text) = server.send(
        "POST",
        "/apply-template",
        &json!({"messages": [{"role": "wizard", "content": "hi"}]}).to_string(),
    );
    assert_eq!(status, 400, "{text}");
}

#[test]
fn serve_logs_one_line_per_request_and_exports_latency_histograms() {
    let test = "serve_logs_one_line_per_request_and_exports_latency_histograms";
    let Some(model) = tiny(test, 256) else { return };
    let server = Server::start(&model, &[]);
    let (status, v) = server.json("POST", "/v1/chat/completions", &chat_body("hi", 5, false));
    assert_eq!(status, 200, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let tokens = v["usage"]["completion_tokens"].as_u64().unwrap();
    let (status, sse) = server.send(
        "POST",
        "/v1/completions",
        &json!({"prompt": "a", "max_tokens": 4, "stream": true}).to_string(),
    );
    assert_eq!(status, 200);
    assert_eq!(sse_data(&sse).last().map(String::as_str), Some("[DONE]"));
    let t = Instant::now();
    let line = loop {
        if let Some(l) = server
            .stderr()
            .into_iter()
            .find(|l| l.contains("dynrt::request") && l.contains(&id))
        {
            break l;
        }
        assert!(
            t.elapsed() < crate::server::REQUEST_DEADLINE,
            "no request line for {id}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    for field in [
        format!("completion_tokens={tokens}"),
        "prompt_tokens=".into(),
        "ttft_ms=".into(),
        "duration_ms=".into(),
        "outcome=".into(),
        "client=127.0.0.1".into(),
    ] {
        assert!(line.contains(&field), "{field} not in {line}");
    }
    let metrics = server.get("/metrics").1;
    for (name, at_least) in [
        ("dynrt_time_to_first_token_seconds_count", 2.0),
        ("dynrt_inter_token_latency_seconds_count", 1.0),
        ("dynrt_queue_time_seconds_count", 2.0),
        ("dynrt_request_duration_seconds_count", 2.0),
        ("dynrt_http_responses_total{status=\"200\"}", 2.0),
    ] {
        assert!(
            server.metric(name) >= at_least,
            "{name} < {at_least}:\n{metrics}"
        );
    }
    assert!(metrics.contains("# TYPE dynrt_inter_token_latency_seconds histogram"));
    let access = server
        .stderr()
        .into_iter()
        .filter(|l| l.contains("dynrt::access"))
        .count();
    assert!(access >= 3, "{access} access lines");
}

#[test]
fn serve_response_ids_differ_across_restarts() {
    let test = "serve_response_ids_differ_across_restarts";
    let Some(model) = tiny(test, 256) else { return };
    let id = || {
        let server = Server::start(&model, &[]);
        let (_, v) = server.json("POST", "/v1/chat/completions", &chat_body("hi", 1, false));
        v["id"].as_str().unwrap().to_string()
    };
    let (a, b) = (id(), id());
    assert!(a.starts_with("chatcmpl-") && a.len() > 20, "{a}");
    assert_ne!(a, b);
}

#[test]
fn serve_ends_a_request_past_the_request_timeout() {
    let test = "serve_ends_a_request_past_the_request_timeout";
    let Some(model) = tiny(test, 8192) else {
        return;
    };
    // One prompt row per step: the 7,500-token prompt takes thousands of steps to read.
    let server = Server::start(
        &model,
        &[
            "--request-timeout",
            "1",
            "--max-batch",
            "1",
            "--prefill-chunk",
            "1",
        ],
    );
    let body = json!({"prompt": tiny_long_prompt(2500), "max_tokens": 100, "temperature": 0});
    let (status, text) = server.send("POST", "/v1/completions", &body.to_string());
    assert_eq!(status, 504, "{text}");
    assert_eq!(error_of(status, &text)["code"], "request_timeout");
    let mut stream = body;
    stream["stream"] = json!(true);
    let (status, sse) = server.send("POST", "/v1/completions", &stream.to_string());
    assert_eq!(status, 200);
    let data = sse_data(&sse);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let last: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(last["error"]["code"], "request_timeout", "{last}");
    // Both were cancelled: nothing holds pages.
    server.wait_metric("dynrt_active_sessions", 0.0);
    assert_eq!(server.metric("dynrt_kv_reserved_bytes"), 0.0);
}

/// `scripts/soak.py` against the tiny model: thousands of mixed requests (streams read to
/// the end and abandoned, requests abandoned before their answer, invalid ones, bursts past
/// the queue) for `DYNRT_SOAK_MINUTES` (default 3); the script fails on a 5xx, a stream
/// without its final event and `[DONE]`, memory or device bytes that grew by more than 5 %
/// between rest after the warm-up and rest at the end, a page held at the end, or a drain
/// that does not exit 0.
#[test]
fn serve_soak_answers_everything_and_stays_flat() {
    let test = "serve_soak_answers_everything_and_stays_flat";
    let Some(model) = tiny(test, 4096) else {
        return;
    };
    let minutes = std::env::var("DYNRT_SOAK_MINUTES").unwrap_or_else(|_| "3".into());
    let out = std::process::Command::new("python3")
        .arg(crate::common::repo().join("scripts/soak.py"))
        .args([
            "--binary",
            env!("CARGO_BIN_EXE_dynrt"),
            "--json",
            "--minutes",
            &minutes,
        ])
        .arg("--model")
        .arg(&model)
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) if !testing::require_gpu() => {
            eprintln!("SKIP {test}: python3: {e}");
            return;
        }
        Err(e) => panic!("{test}: python3: {e}"),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let r: Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
    assert!(out.status.success(), "{r}\n{stderr}");
    assert_eq!(r["failed"], json!([]), "{r}");
    let requests = r["requests"].as_u64().unwrap();
    assert!(requests >= 1000, "only {requests} requests: {r}");
    assert!(
        r["streams_ended"].as_u64().unwrap() > 0 && r["streams_abandoned"].as_u64().unwrap() > 0,
        "{r}"
    );
    eprintln!("{test}: {r}");
}

fn chat_at(messages: &Value, max_tokens: u64) -> Value {
    json!({"messages": messages, "max_tokens": max_tokens, "temperature": 0})
}

fn post(server: &Server, path: &str, body: &Value) -> Value {
    let (status, v) = server.json("POST", path, body);
    assert_eq!(status, 200, "{body}: {v}");
    v
}

#[test]
fn serve_honours_every_request_field_or_refuses_it() {
    let test = "serve_honours_every_request_field_or_refuses_it";
    let Some(model) = model(test) else { return };
    let Some(py) = crate::common::python_or_skip(test) else {
        return;
    };
    let server = Server::start(&model, &["--max-batch", "4", "--alias", "smol"]);
    let chat = "/v1/chat/completions";
    let france = "What is the capital of France?";

    // Any model name is accepted and the response names the served one (`--alias`); a
    // 100 KB name is not echoed anywhere.
    let mut body = chat_body(france, 12, false);
    body["model"] = json!("x".repeat(100_000));
    let (status, text) = server.send("POST", chat, &body.to_string());
    assert_eq!(status, 200, "{}", &text[..text.len().min(300)]);
    assert!(text.len() < 2000, "{} bytes", text.len());
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["model"], "smol");
    assert_eq!(answer(&v), "The capital of France is Paris.");
    let (_, models) = server.get("/v1/models");
    assert!(models.contains(r#""id":"smol""#), "{models}");

    // Fields this server does not implement: a 400 that names each.
    for field in [
        "mirostat",
        "typical_p",
        "store",
        "audio",
        "metadata",
        "prediction",
        "functions",
    ] {
        let mut body = chat_body(france, 4, false);
        body[field] = json!(1);
        let (status, v) = server.json("POST", chat, &body);
        assert_eq!(status, 400, "{field}: {v}");
        assert_eq!(v["error"]["param"], field, "{v}");
        assert_eq!(v["error"]["code"], "unsupported_parameter", "{v}");
    }
    // ... and a null one means nothing.
    let mut body = chat_body(france, 4, false);
    body["functions"] = Value::Null;
    post(&server, chat, &body);
    // SmolLM2's template offers no tools: refused, not ignored.
    let mut body = chat_body(france, 4, false);
    body["tools"] = json!([{"type": "function", "function": {"name": "f"}}]);
    let (status, v) = server.json("POST", chat, &body);
    assert_eq!(
        (status, &v["error"]["param"]),
        (400, &json!("tools")),
        "{v}"
    );

    // max_completion_tokens, stop.
    let mut body = chat_body(france, 12, false);
    body["max_completion_tokens"] = json!(3);
    let v = post(&server, chat, &body);
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let mut body = chat_body(france, 12, false);
    body["stop"] = json!(["Paris"]);
    let v = post(&server, chat, &body);
    assert_eq!(answer(&v), "The capital of France is ");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // Text parts are joined with newlines, as llama-server and vLLM join them.
    let parts = json!([{"role": "user", "content": [
        {"type": "text", "text": "What is the capital"}, {"type": "text", "text": "of France?"}]}]);
    let joined = json!([{"role": "user", "content": "What is the capital\nof France?"}]);
    let a = post(&server, chat, &chat_at(&parts, 8));
    let b = post(&server, chat, &chat_at(&joined, 8));
    assert_eq!(answer(&a), answer(&b));
    assert_eq!(a["usage"]["prompt_tokens"], b["usage"]["prompt_tokens"]);

    // logit_bias: banning " Paris" changes the greedy answer; an id outside the vocabulary
    // is a 400.
    let m = dynrt::gguf::MappedGguf::open(&model).unwrap();
    let tok = dynrt::tokenizer::Tokenizer::from_gguf(m.gguf()).unwrap();
    let paris = tok.encode(" Paris", dynrt::tokenizer::Special::Plain);
    assert_eq!(paris.len(), 1, "{paris:?}");
    let mut body = chat_body(france, 12, false);
    body["logit_bias"] = json!({ paris[0].to_string(): -100 });
    let banned = answer(&post(&server, chat, &body));
    assert!(banned.starts_with("The capital of France is") && !banned.contains(" Paris"));
    body["logit_bias"] = json!({"99999999": 1});
    let (status, v) = server.json("POST", chat, &body);
    assert_eq!(
        (status, &v["error"]["param"]),
        (400, &json!("logit_bias")),
        "{v}"
    );

    // Penalties: repetition is punished, over the window of repeat_last_n tokens (0: none).
    let count = |penalty: &[(&str, Value)]| {
        let mut body = json!({"prompt": "The cat and the cat and the cat and the",
                              "max_tokens": 8, "temperature": 0});
        for (name, value) in penalty {
            body[*name] = value.clone();
        }
        let v = post(&server, "/v1/completions", &body);
        let text = v["choices"][0]["text"].as_str().unwrap().to_string();
        (text.matches(" cat").count(), text)
    };
    let (plain, plain_text) = count(&[]);
    assert!(plain >= 2, "{plain_text:?}");
    for penalty in ["presence_penalty", "frequency_penalty", "repeat_penalty"] {
        let strength = json!(if penalty == "repeat_penalty" {
            1.8
        } else {
            2.0
        });
        let (n, text) = count(&[(penalty, strength)]);
        assert!(n < plain, "{penalty}: {text:?} against {plain_text:?}");
    }
    assert_eq!(
        count(&[
            ("presence_penalty", json!(2.0)),
            ("repeat_last_n", json!(0))
        ])
        .1,
        plain_text
    );
    // Any JSON object.
    let object = json!({"messages": [{"role": "user",
        "content": "Reply with the JSON object {\"ok\": true} and nothing else."}],
        "max_tokens": 30, "temperature": 0, "response_format": {"type": "json_object"}});
    let v = post(&server, chat, &object);
    let text = answer(&v);
    assert!(
        serde_json::from_str::<Value>(&text).is_ok_and(|o| o.is_object()),
        "{text}"
    );

    // n answers, seeded: the same seed gives the same answers; the stream indexes them.
    let mut body = chat_body("Tell me a word.", 6, false);
    body["temperature"] = json!(1.0);
    body["seed"] = json!(11);
    body["n"] = json!(3);
    let a = post(&server, chat, &body);
    let b = post(&server, chat, &body);
    assert_eq!(a["choices"].as_array().unwrap().len(), 3);
    assert_eq!(a["choices"], b["choices"]);
    // The answers' tokens summed, the prompt counted once.
    assert!(a["usage"]["completion_tokens"].as_u64().unwrap() >= 3);
    assert_eq!(a["usage"]["prompt_tokens"], b["usage"]["prompt_tokens"]);
    body["stream"] = json!(true);
    body["n"] = json!(2);
    let (_, sse) = server.send("POST", chat, &body.to_string());
    let data = sse_data(&sse);
    assert_eq!(data.iter().filter(|d| *d == "[DONE]").count(), 1, "{sse}");
    let indexes: std::collections::BTreeSet<u64> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter_map(|v| v["choices"][0]["index"].as_u64())
        .collect();
    assert_eq!(indexes.into_iter().collect::<Vec<_>>(), [0, 1], "{sse}");
    // Defaults (llama-server's sampling) with a seed repeat too.
    let seeded = json!({"messages": [{"role": "user", "content": "Tell me a word."}],
                        "max_tokens": 6, "seed": 5});
    assert_eq!(
        answer(&post(&server, chat, &seeded)),
        answer(&post(&server, chat, &seeded))
    );

    // Log-probabilities: greedy takes the most likely token.
    let mut body = chat_body(france, 4, false);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(2);
    let v = post(&server, chat, &body);
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 4, "{v}");
    for e in content {
        assert_eq!(e["top_logprobs"][0]["token"], e["token"], "{e}");
        assert!(e["logprob"].as_f64().unwrap() <= 0.0);
    }

    // The prompt cache: each turn of a chat reads the one before from the cache; another
    // partition (cache_salt) or cache_prompt: false reads nothing.
    let mut messages = vec![json!({"role": "user", "content": "Hi! Tell me about cats."})];
    let mut last_prompt = 0;
    for turn in 1..=4 {
        let v = post(&server, chat, &chat_at(&json!(messages), 12));
        let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
        let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        if turn > 1 {
            // Everything but the last page of the turn before (pages of 16).
            assert!(
                cached + 16 >= last_prompt,
                "turn {turn}: {cached} of {prompt} cached"
            );
        }
        last_prompt = prompt;
        messages.push(json!({"role": "assistant", "content": answer(&v)}));
        messages.push(json!({"role": "user", "content": format!("And {turn} more?")}));
    }
    messages.truncate(messages.len() - 1);
    let mut again = chat_at(&json!(messages), 4);
    let cached = |v: &Value| v["usage"]["prompt_tokens_details"]["cached_tokens"].clone();
    assert!(cached(&post(&server, chat, &again)).as_u64().unwrap() > 0);
    again["cache_salt"] = json!("another client");
    assert_eq!(cached(&post(&server, chat, &again)), 0);
    again["cache_salt"] = Value::Null;
    again["cache_prompt"] = json!(false);
    assert_eq!(cached(&post(&server, chat, &again)), 0);
    assert!(server.metric("dynrt_prompt_tokens_cached_total") > 0.0);
    assert!(server.metric("dynrt_kv_pages_cached") > 0.0);
    assert_eq!(server.metric("dynrt_kv_reserved_bytes"), 0.0);

    // The openai package: chat, streaming, completions, log-probabilities, n, JSON schema
    // output and an unsupported field, as a client would send them.
    let out = crate::common::run_script(
        &py,
        "serve_check.py",
        &["--base-url", &format!("http://{}/v1", server.addr)],
    );
    assert!(out.trim_end().ends_with("OK"), "{out}");
    eprintln!("{test}: {out}");
}

/// 100 answers held to five JSON schemas (strings bounded, so that every answer ends well
/// within `max_tokens`), sampled (temperature 0.6, llama-server's other defaults, each with its
/// own seed): every one parses and the `jsonschema` package validates it against its schema.
#[test]
fn serve_structured_output_validates_against_its_schema() {
    let test = "serve_structured_output_validates_against_its_schema";
    let Some(model) = model(test) else { return };
    let Some(py) = crate::common::python_or_skip(test) else {
        return;
    };
    // Ten clients asking for ten answers each: 100 requests, more than the default queue.
    let server = Server::start(&model, &["--max-batch", "10", "--max-queue", "128"]);
    let schemas = [
        (
            "Describe a person.",
            json!({"type": "object", "properties": {
                "name": {"type": "string", "maxLength": 24},
                "age": {"type": "integer"},
                "email": {"anyOf": [{"type": "string", "maxLength": 30}, {"type": "null"}]}},
              "required": ["name", "age"]}),
        ),
        (
            "Pick a colour and say how sure you are.",
            json!({"type": "object", "properties": {
                "colour": {"enum": ["red", "green", "blue"]},
                "sure": {"type": "boolean"},
                "score": {"type": "number"}},
              "required": ["colour", "sure", "score"]}),
        ),
        (
            "List a few fruits.",
            json!({"type": "array", "items": {"type": "string", "maxLength": 12},
                   "minItems": 1, "maxItems": 3}),
        ),
        (
            "Give a point on a map.",
            json!({"$defs": {"coord": {"type": "number"}},
                   "type": "object", "properties": {
                     "lat": {"$ref": "#/$defs/coord"}, "lon": {"$ref": "#/$defs/coord"},
                     "label": {"const": "point"}},
                   "required": ["lat", "lon", "label"], "additionalProperties": false}),
        ),
        (
            "Plan a short trip.",
            json!({"type": "object", "properties": {
                "stops": {"type": "array", "maxItems": 2, "items": {"type": "object",
                  "properties": {"city": {"type": "string", "maxLength": 16},
                                 "nights": {"type": "integer"}},
                  "required": ["city", "nights"]}},
                "by_train": {"type": "boolean"}},
              "required": ["stops", "by_train"]}),
        ),
    ];
    let mut cases = Vec::new();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..10)
            .map(|round| {
                let (server, schemas) = (&server, &schemas);
                scope.spawn(move || {
                    let (question, schema) = &schemas[round % schemas.len()];
                    let format = json!({"type": "json_schema",
                                        "json_schema": {"name": "answer", "schema": schema}});
                    let body = json!({
                        "messages": [{"role": "user", "content": question}],
                        "max_tokens": 256, "n": 10, "seed": round * 100, "temperature": 0.6,
                        "response_format": format,
                    });
                    let v = post(server, "/v1/chat/completions", &body);
                    let choices = v["choices"].as_array().unwrap().clone();
                    (schema.clone(), choices)
                })
            })
            .collect();
        for h in handles {
            let (schema, choices) = h.join().unwrap();
            for c in choices {
                let text = c["message"]["content"].as_str().unwrap().to_string();
                assert_eq!(c["finish_reason"], "stop", "{test}: cut short: {text}");
                cases.push(json!({"schema": schema, "text": text}));
            }
        }
    });
    assert_eq!(cases.len(), 100);
    let dir = crate::common::scratch(test);
    let file = dir.join("answers.json");
    std::fs::write(&file, serde_json::to_string(&cases).unwrap()).unwrap();
    let out = crate::common::run_script(&py, "validate_json.py", &[&file.display().to_string()]);
    assert!(out.contains("100 of 100 valid"), "{out}");
    eprintln!("{test}: {out}");
}

/// A tool call and its round trip with Qwen2.5-Coder-0.5B, whose template offers tools: the
/// answer is a call (`finish_reason: "tool_calls"`) with arguments of the tool's schema, and
/// the chat with the call and the tool's answer renders and gets an answer; the same with the
/// `openai` package.
#[test]
fn serve_tool_call_round_trip_with_qwen() {
    let test = "serve_tool_call_round_trip_with_qwen";
    let Some(model) = dynrt::fetch::cached_or_skip(&dynrt::fetch::QWEN25_CODER_05B_INSTRUCT, test)
    else {
        return;
    };
    if testing::gpu_or_skip(test).is_none() {
        return;
    }
    let Some(py) = crate::common::python_or_skip(test) else {
        return;
    };
    let server = Server::start(&model, &[]);
    let chat = "/v1/chat/completions";
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]);
    let question = json!({"role": "user", "content": "What is the weather in Paris?"});
    let body = json!({"messages": [question], "tools": tools, "max_tokens": 40,
                      "temperature": 0});
    let v = post(&server, chat, &body);
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{v}");
    let call = &c["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {call}"));
    assert!(args["city"].is_string(), "{args}");
    let id = call["id"].as_str().unwrap();
    assert!(id.starts_with("call_"), "{id}");
    let history = json!([question,
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": id, "content": "{\"sky\": \"sunny\", \"celsius\": 21}"}]);
    let body = json!({"messages": history, "tools": tools, "max_tokens": 24, "temperature": 0});
    let v = post(&server, chat, &body);
    let again = &v["choices"][0];
    assert!(
        again["message"]["content"].is_string() || again["message"]["tool_calls"].is_array(),
        "{v}"
    );
    // The history was read from the cache up to the new turn.
    assert!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 100,
        "{v}"
    );
    // A forced call (tool_choice "required") and its round trip with the openai package.
    let out = crate::common::run_script(
        &py,
        "serve_check.py",
        &[
            "--base-url",
            &format!("http://{}/v1", server.addr),
            "--tool-call",
        ],
    );
    assert!(out.trim_end().ends_with("OK"), "{out}");
    eprintln!("{test}: {out}");
}
