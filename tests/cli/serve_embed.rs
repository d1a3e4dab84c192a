//! `dynrt serve --embedding-model all-minilm-l6-v2` beside SmolLM2: `POST /v1/embeddings`
//! over real HTTP on 127.0.0.1, driven by the `openai` Python package
//! (`scripts/embed_check.py`) and by hand for the error shapes. The vectors must equal the
//! independent reference's (`scripts/bert_ref.py`) within cosine 0.99999, base64 must decode
//! to the float vectors, usage must count the tokens; chat still answers. Skips without the
//! models, the GPU or the Python reference (`DYNRT_REQUIRE_MODEL=1` fails instead).

use crate::common;
use dynrt::fetch;
use dynrt::gpu::testing;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long the server may take to load both models and listen.
const START_DEADLINE: Duration = Duration::from_secs(300);

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
    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
        let body = body.to_string();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").expect("a header");
        let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap();
        assert!(
            !head.to_ascii_lowercase().contains("chunked"),
            "a chunked answer to {path}"
        );
        (
            status,
            serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}")),
        )
    }
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let n = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

fn vectors(v: &Value) -> Vec<Vec<f64>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

#[test]
fn serve_answers_embeddings_beside_the_chat_model() {
    let test = "serve_answers_embeddings_beside_the_chat_model";
    let Some(chat_model) = fetch::model_or_skip(test) else {
        return;
    };
    let Some(folder) = fetch::embedding_or_skip(&fetch::ALL_MINILM_L6_V2, test) else {
        return;
    };
    let Some(py) = common::python_or_skip(test) else {
        return;
    };
    if testing::gpu_or_skip(test).is_none() {
        return;
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_dynrt"))
        .args(["serve", "--port", "0", "--model"])
        .arg(&chat_model)
        .args([
            "--embedding-model",
            "all-minilm-l6-v2",
            "--budget-mib",
            "16",
        ])
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
    let server = Server { child, addr };

    let texts: Vec<String> = [
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "The girl is carrying a baby.",
        "A man is riding a horse.",
        "Ein Mann isst Brot, très bien — 中文 🙂",
        "",
        &"a long sentence that goes on ".repeat(80),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let dir = common::scratch(test);
    let (input, out) = (dir.join("in.json"), dir.join("out.json"));
    std::fs::write(&input, json!({ "texts": texts }).to_string()).unwrap();
    let base_url = format!("http://{}/v1", server.addr);
    common::run_script(
        &py,
        "embed_check.py",
        &[
            "--base-url",
            &base_url,
            "--model",
            "all-minilm-l6-v2",
            "--input",
            &input.display().to_string(),
            "--out",
            &out.display().to_string(),
        ],
    );
    let got = common::read_json(&out);
    let floats = vectors(&got["float"]);
    let b64 = vectors(&got["base64"]);
    assert_eq!(floats.len(), texts.len());
    for (f, b) in floats.iter().zip(&b64) {
        assert_eq!(f.len(), 384);
        // JSON floats and base64 f32 bytes are the same f32 values.
        for (x, y) in f.iter().zip(b) {
            assert_eq!(*x as f32, *y as f32);
        }
        let n = f.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((n - 1.0).abs() < 1e-5, "length {n}");
    }
    assert_eq!(vectors(&json!([got["single"]]))[0], floats[0]);
    assert_eq!(got["errors"]["unknown_model"], 404);
    assert_eq!(got["model"], "all-minilm-l6-v2");
    let reference = crate::common::run_script(
        &py,
        "bert_ref.py",
        &[
            "embed",
            "--model",
            &folder.display().to_string(),
            "--input",
            &input.display().to_string(),
            "--out",
            &dir.join("ref.json").display().to_string(),
        ],
    );
    let _ = reference;
    let r = common::read_json(&dir.join("ref.json"));
    let theirs = vectors(&r["embeddings"]);
    let tokens: u64 = r["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .sum();
    assert_eq!(got["prompt_tokens"].as_u64(), Some(tokens), "usage");
    assert_eq!(got["total_tokens"].as_u64(), Some(tokens), "usage");
    for (i, (a, b)) in floats.iter().zip(&theirs).enumerate() {
        let c = cosine(a, b);
        assert!(c >= 0.99999, "{test}: text {i}: cosine {c}");
    }

    // The error shapes, by hand.
    for (body, status, param) in [
        (json!({"input": [1, 2, 3]}), 400, "input"),
        (json!({"input": [[1, 2]]}), 400, "input"),
        (json!({"input": []}), 400, "input"),
        (json!({"input": 7}), 400, "input"),
        (json!({}), 400, "input"),
        (
            json!({"input": "x", "encoding_format": "hex"}),
            400,
            "encoding_format",
        ),
        (json!({"input": "x", "dimensions": 128}), 400, "dimensions"),
        (json!({"input": "x", "model": "gpt-4"}), 404, "model"),
    ] {
        let (s, v) = server.post("/v1/embeddings", &body);
        assert_eq!(s, status, "{body}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{v}"
        );
        if status == 400 {
            assert_eq!(v["error"]["param"], param, "{body}: {v}");
        }
    }
    let many: Vec<String> = (0..2049).map(|i| format!("s{i}")).collect();
    let (s, _) = server.post("/v1/embeddings", &json!({ "input": many }));
    assert_eq!(s, 400, "2049 inputs");
    // The chat model still answers beside it.
    let (s, v) = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
    );
    assert_eq!(s, 200, "{v}");
}
