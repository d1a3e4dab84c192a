//! A `dynrt serve` process for the server tests (`cli` and `hostile` binaries): started on a
//! free port, driven by a small blocking HTTP/1.1 client, killed when dropped. Its stderr is
//! kept (and echoed) so that tests can read the log lines; it runs a model file given, or a
//! `TinyLlama` written by [`tiny_model`] (kilobytes, fast on any adapter).
#![allow(dead_code)] // each test binary uses part of it

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the server may take to load the model and listen.
pub const START_DEADLINE: Duration = Duration::from_secs(240);
/// How long one HTTP exchange may take (lavapipe: about 0.15 s per token with SmolLM2, over
/// 1 s with Qwen2.5-0.5B's vocabulary; a busy machine several times that). A bound against a
/// hang, not a measure.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(900);

/// A `dynrt serve` process, killed when dropped.
pub struct Server {
    pub child: Child,
    pub addr: String,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tiny llama GGUF (random weights, ChatML template, a byte-level vocabulary of 265
/// tokens) with a context of `context` tokens, written once under the target directory as
/// `name.gguf`.
pub fn tiny_model(name: &str, context: u32) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("serve-models");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.gguf"));
    let bytes = dynrt::gguf::TinyLlama {
        context_len: context,
        ..dynrt::gguf::TinyLlama::default()
    }
    .build(7)
    .unwrap();
    // Written beside and renamed: tests of other binaries may read the same file.
    let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    path
}

impl Server {
    /// Starts `dynrt serve --port 0 --model MODEL EXTRA...` and waits until it is ready.
    pub fn start(model: &Path, extra: &[&str]) -> Server {
        Server::start_with(model, extra, &[])
    }

    /// [`Server::start`] with environment variables.
    pub fn start_with(model: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut server = Server::spawn(model, extra, env);
        let stdout = server.child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(START_DEADLINE).unwrap_or_else(|_| {
            panic!("dynrt serve did not print its address within {START_DEADLINE:?}")
        });
        server.addr = line
            .trim()
            .strip_prefix("dynrt serve: listening on http://")
            .unwrap_or_else(|| {
                panic!(
                    "unexpected first line {line:?}; stderr:\n{}",
                    server.stderr().join("\n")
                )
            })
            .to_string();
        server
    }

    /// Starts the process without waiting for it: its address comes from the stderr line
    /// it prints before loading the model ([`Server::wait_loading_line`]).
    pub fn spawn(model: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_dynrt"))
            .args(["serve", "--port", "0", "--model"])
            .arg(model)
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting dynrt serve");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let lines = stderr.clone();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("[serve] {line}");
                lines.lock().unwrap().push(line);
            }
        });
        Server {
            child,
            addr: String::new(),
            stderr,
        }
    }

    /// Waits for the line the server prints on stderr when it listens (before the model is
    /// loaded) and takes the address from it.
    pub fn wait_loading_line(&mut self) {
        let t = Instant::now();
        loop {
            let found = self.stderr().iter().find_map(|l| {
                let rest = l.strip_prefix("dynrt serve: loading ")?;
                let at = rest.find("on http://")?;
                Some(rest[at + 10..].split(' ').next()?.to_string())
            });
            if let Some(addr) = found {
                self.addr = addr;
                return;
            }
            assert!(t.elapsed() < START_DEADLINE, "no loading line on stderr");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The stderr lines so far.
    pub fn stderr(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid.
        let r = unsafe { libc::kill(self.child.id() as i32, signal) };
        assert_eq!(r, 0, "kill({signal})");
    }

    /// Waits for the process to exit.
    pub fn wait_exit(&mut self, deadline: Duration) -> ExitStatus {
        let t = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                t.elapsed() < deadline,
                "dynrt serve did not exit within {deadline:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server's resident memory, bytes (Linux: /proc).
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .expect("VmRSS in /proc/PID/status")
    }

    /// The server's open file descriptors (Linux: /proc).
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .unwrap()
            .count()
    }

    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(REQUEST_DEADLINE)).unwrap();
        s
    }

    /// Sends one request with `headers` (the `Host` and `Content-Type: application/json`
    /// are added unless given) and returns its status, head and body (chunked bodies
    /// decoded).
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, String, String) {
        let mut s = self.connect();
        write_request_with(&mut s, &self.addr, method, path, headers, body);
        read_response(&mut s)
    }

    /// Sends one request and returns its status and body.
    pub fn send(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let (status, _, body) = self.request(method, path, &[], body);
        (status, body)
    }

    pub fn json(&self, method: &str, path: &str, body: &Value) -> (u16, Value) {
        let (status, text) = self.send(method, path, &body.to_string());
        let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        (status, v)
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        self.send("GET", path, "")
    }

    /// The value of metric line `name` (labels included in `name`).
    pub fn metric(&self, name: &str) -> f64 {
        let (status, text) = self.get("/metrics");
        assert_eq!(status, 200);
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
    }

    /// Waits until `name` reads `value`.
    pub fn wait_metric(&self, name: &str, value: f64) {
        let t = Instant::now();
        while self.metric(name) != value {
            assert!(
                t.elapsed() < REQUEST_DEADLINE,
                "{name} never reached {value}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `/v1/memory` as JSON.
    pub fn memory(&self) -> Value {
        let (status, text) = self.get("/v1/memory");
        assert_eq!(status, 200, "{text}");
        serde_json::from_str(&text).unwrap()
    }
}

/// Writes a request with `Host: HOST`, `Content-Type: application/json` (unless `headers`
/// give them) and `Connection: close`.
pub fn write_request_with(
    s: &mut TcpStream,
    host: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) {
    let has = |n: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(n));
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    if !has("host") {
        req.push_str(&format!("Host: {host}\r\n"));
    }
    if !has("content-type") {
        req.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    s.write_all(req.as_bytes()).unwrap();
}

/// Reads a whole response (the connection closes after it): status, head, body.
pub fn read_response(s: &mut TcpStream) -> (u16, String, String) {
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
    (status, head.to_string(), body)
}

/// Decodes a chunked transfer encoding.
pub fn dechunk(mut body: &str) -> String {
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
pub fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// A streamed request whose events are read as they come.
pub struct Stream {
    reader: BufReader<TcpStream>,
    /// The `data:` payloads read so far.
    pub data: Vec<String>,
}

impl Stream {
    /// Sends `body` to `path` (streaming) and reads the response head.
    pub fn open(server: &Server, path: &str, body: &Value) -> Stream {
        let mut s = server.connect();
        write_request_with(&mut s, &server.addr, "POST", path, &[], &body.to_string());
        let mut reader = BufReader::new(s);
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert!(line.starts_with("HTTP/1.1 200"), "{line}");
        loop {
            line.clear();
            reader.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
        }
        Stream {
            reader,
            data: Vec::new(),
        }
    }

    /// Reads until the next `data:` payload; `None` when the stream ended.
    pub fn next(&mut self) -> Option<String> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.reader.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if let Some(d) = line.trim_end().strip_prefix("data: ") {
                self.data.push(d.to_string());
                return Some(d.to_string());
            }
        }
    }

    /// Reads to the end of the stream; the payloads of the whole stream.
    pub fn finish(mut self) -> Vec<String> {
        while self.next().is_some() {}
        self.data
    }
}

/// A chat of one user message, greedy.
pub fn chat_body(text: &str, max_tokens: u64, stream: bool) -> Value {
    serde_json::json!({
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    })
}

/// The answer text of a chat completion.
pub fn answer(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no answer in {v}"))
        .to_string()
}

/// A prompt the tiny model reads as `3 * reps` tokens ("a", " b" as two tokens, " a"): a
/// long prompt whose length, unlike an answer's, does not depend on what the model says.
pub fn tiny_long_prompt(reps: usize) -> String {
    "a b ".repeat(reps)
}

/// Waits until `/v1/memory` lists `n` active requests, all still reading their prompts.
pub fn wait_reading(server: &Server, n: usize) {
    let t = Instant::now();
    loop {
        let m = server.memory();
        let r = m["requests"].as_array().cloned().unwrap_or_default();
        if r.len() == n && r.iter().all(|r| r["generated"] == 0) {
            return;
        }
        assert!(
            t.elapsed() < REQUEST_DEADLINE,
            "never {n} requests reading: {m}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
