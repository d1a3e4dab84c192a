//! `dynrt serve` over real HTTP on 127.0.0.1: the server starts on a free port (it prints
//! the address it bound), and a small blocking HTTP/1.1 client drives it: chat and
//! completions with and without streaming, the models list, health, metrics, the OpenAI
//! error shape for bad requests, a client that disconnects mid-stream, concurrent requests,
//! and a budget so small that requests wait in the queue; every request field honoured or
//! refused, the prompt cache across requests, structured output validated by an independent
//! JSON Schema validator, the `openai` Python package as a client (scripts/serve_check.py),
//! and a tool call's round trip with Qwen2.5. SmolLM2 (Qwen2.5-Coder-0.5B for tools) on the
//! GPU; skips without them (`DYNRT_REQUIRE_MODEL=1`, `DYNRT_REQUIRE_GPU=1` make that a
//! failure).

use dynrt::gpu::testing;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the server may take to load the model and listen.
const START_DEADLINE: Duration = Duration::from_secs(180);
/// How long one HTTP exchange may take (lavapipe: about 0.15 s per token with SmolLM2, over
/// 1 s with Qwen2.5-0.5B's vocabulary; a busy machine several times that). A bound against a
/// hang, not a measure.
const REQUEST_DEADLINE: Duration = Duration::from_secs(900);

/// A `dynrt serve` process, killed when dropped.
struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(model: &Path, extra: &[&str]) -> Server {
        let mut child = Command::new(crate::common::dynrt_bin())
            .args(["serve", "--port", "0", "--model"])
            .arg(model)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting dynrt serve");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(START_DEADLINE).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("dynrt serve did not print its address within {START_DEADLINE:?}")
        });
        let addr = line
            .trim()
            .strip_prefix("dynrt serve: listening on http://")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        Server { child, addr }
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(REQUEST_DEADLINE)).unwrap();
        s
    }

    /// Sends one request and returns its status and body (chunked bodies decoded).
    fn send(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut s = self.connect();
        write_request(&mut s, method, path, body);
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let text = String::from_utf8(raw).expect("a UTF-8 response");
        let (head, body) = text.split_once("\r\n\r\n").expect("a header");
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no status in {head:?}"));
        let chunked = head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked");
        let body = if chunked {
            dechunk(body)
        } else {
            body.to_string()
        };
        (status, body)
    }

    fn json(&self, method: &str, path: &str, body: &Value) -> (u16, Value) {
        let (status, text) = self.send(method, path, &body.to_string());
        let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        (status, v)
    }

    fn get(&self, path: &str) -> (u16, String) {
        self.send("GET", path, "")
    }

    /// The value of metric line `name` (labels included in `name`).
    fn metric(&self, name: &str) -> f64 {
        let (status, text) = self.get("/metrics");
        assert_eq!(status, 200);
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
    }

    /// Waits until `name` reads `value`.
    fn wait_metric(&self, name: &str, value: f64) {
        let t = Instant::now();
        while self.metric(name) != value {
            assert!(
                t.elapsed() < REQUEST_DEADLINE,
                "{name} never reached {value}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn write_request(s: &mut TcpStream, method: &str, path: &str, body: &str) {
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
}

/// Decodes a chunked transfer encoding.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").expect("a chunk size");
        let n = usize::from_str_radix(size.trim(), 16).expect("a hex chunk size");
        if n == 0 {
            return out;
        }
        out.push_str(&rest[..n]);
        body = &rest[n + 2..];
    }
}

/// The `data:` payloads of a server-sent-events body.
fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

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

fn chat_body(text: &str, max_tokens: u64, stream: bool) -> Value {
    json!({
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    })
}

fn answer(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no answer in {v}"))
        .to_string()
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
    write_request(&mut s, "POST", "/v1/completions", &body.to_string());
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
    write_request(&mut s, "POST", "/v1/completions", &body.to_string());
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
    let server = Server::start(&model, &["--max-batch", "10"]);
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
