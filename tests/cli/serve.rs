//! `dynrt serve` over real HTTP on 127.0.0.1: the server starts on a free port (it prints
//! the address it bound), and a small blocking HTTP/1.1 client (`tests/common/server.rs`)
//! drives it: chat and completions with and without streaming, the models list, health,
//! metrics, the OpenAI error shape for bad requests, a client that disconnects mid-stream,
//! concurrent requests, a budget so small that requests wait in the queue; and the
//! operations: API keys, CORS, 503 while loading and after the scheduler thread died, the
//! SIGTERM drain (8 open streams) and the second signal, the tokenizer endpoints, the
//! request log and latency histograms, ids across restarts, the request timeout, and a
//! 3-minute soak. SmolLM2 where answers are checked, a tiny random model elsewhere; skips
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
        json!({"prompt_tokens": 37, "completion_tokens": 8, "total_tokens": 45})
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
            json!({"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}).to_string(),
            404,
            r#""param":"model""#,
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
        let data = s.finish();
        assert_eq!(
            data.last().map(String::as_str),
            Some("[DONE]"),
            "stream {i}: {data:?}"
        );
        let last: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
        // Not finished in the second given: ended with an error event that says why.
        assert_eq!(last["error"]["code"], "shutting_down", "stream {i}: {last}");
    }
    let status = server.wait_exit(crate::server::REQUEST_DEADLINE);
    assert!(status.success(), "{status:?}");
    let log = server.stderr().join("\n");
    assert_eq!(log.matches("outcome=shutdown").count(), 8, "{log}");
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
