//! `dynrt run` and `dynrt-bench onnx` end to end: the built binary on the exported-style KV
//! attention fixture (`fixtures/onnx/kv_attention.onnx`), with `.npy` files in and out,
//! against the public session API and the inputs' own concatenation.

use crate::common;
use dynrt::gpu::{testing, Engine};
use dynrt::npy::{read_npy_file, write_npy_file};
use dynrt::onnx::{Carry, HostTensor, OnnxSession, SessionOptions, TensorData};
use dynrt::rng::SplitMix64;
use std::path::{Path, PathBuf};
use std::process::Command;

const HEADS: u64 = 2;
const HEAD_DIM: u64 = 4;

fn fixture() -> PathBuf {
    crate::common::repo().join("fixtures/onnx/kv_attention.onnx")
}

fn f32s(t: &HostTensor) -> Vec<f32> {
    match t.data() {
        TensorData::Bytes(b) => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        TensorData::Strings(_) => panic!("not f32"),
    }
}

/// A `[1, HEADS, t, HEAD_DIM]` tensor of uniform values.
fn tensor(rng: &mut SplitMix64, t: u64) -> HostTensor {
    let v: Vec<f32> = (0..HEADS * t * HEAD_DIM)
        .map(|_| rng.uniform(-1.0, 1.0))
        .collect();
    HostTensor::from_f32(vec![1, HEADS, t, HEAD_DIM], &v).unwrap()
}

/// Runs `dynrt ARGS`; returns (success, stdout, stderr).
fn dynrt(args: &[&str]) -> (bool, String, String) {
    run_binary(crate::common::dynrt_bin(), args)
}

/// Runs `dynrt-bench ARGS`; returns (success, stdout, stderr).
fn dynrt_bench(args: &[&str]) -> (bool, String, String) {
    run_binary(crate::common::dynrt_bench_bin(), args)
}

fn run_binary(exe: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(exe)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", exe.display()));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Writes the feeds of one step (`past` rows of cache, `new` new rows) into `dir`.
fn feeds(dir: &Path, past: u64, new: u64) -> Vec<(String, HostTensor)> {
    let mut rng = SplitMix64::new(5);
    let named = vec![
        ("q".to_string(), tensor(&mut rng, new)),
        ("k".to_string(), tensor(&mut rng, new)),
        ("v".to_string(), tensor(&mut rng, new)),
        ("past_key_values.0.key".to_string(), tensor(&mut rng, past)),
        (
            "past_key_values.0.value".to_string(),
            tensor(&mut rng, past),
        ),
    ];
    for (name, t) in &named {
        write_npy_file(dir.join(format!("{name}.npy")), t).unwrap();
    }
    named
}

#[test]
fn run_writes_every_output_as_npy_and_matches_the_session() {
    let Some(gpu) = testing::gpu_or_skip("onnx_cli run") else {
        return;
    };
    let dir = common::scratch("onnx_cli_run");
    let out_dir = dir.join("out");
    for past in [0u64, 3] {
        let named = feeds(&dir, past, 2);
        let mut args: Vec<String> = vec!["run".into(), fixture().display().to_string()];
        for (name, _) in &named {
            args.push("--input".into());
            args.push(format!(
                "{name}={}",
                dir.join(format!("{name}.npy")).display()
            ));
        }
        // The second step replaces the first step's files.
        args.extend([
            "--output-dir".into(),
            out_dir.display().to_string(),
            "--overwrite".into(),
        ]);
        args.push("--json".into());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, stdout, stderr) = dynrt(&refs);
        assert!(ok, "past {past}: {stderr}");
        let doc: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        let outputs = doc["outputs"].as_array().unwrap();
        assert_eq!(outputs.len(), 3, "{doc}");

        // The same step through the public API.
        let engine = Engine::new(gpu.clone());
        let options = SessionOptions {
            carry: Carry::None,
            ..SessionOptions::default()
        };
        let mut session = OnnxSession::load(&engine, fixture(), &options).unwrap();
        let feed_refs: Vec<(&str, &HostTensor)> =
            named.iter().map(|(n, t)| (n.as_str(), t)).collect();
        session.run_blocking(&feed_refs).unwrap();
        for o in outputs {
            let name = o["name"].as_str().unwrap();
            let file = out_dir.join(format!("{name}.npy"));
            assert_eq!(
                o["file"].as_str(),
                Some(file.display().to_string().as_str())
            );
            let got = read_npy_file(&file).unwrap();
            let want = session.read_blocking(name).unwrap();
            assert_eq!(got.dims(), want.dims(), "past {past} {name}");
            assert_eq!(f32s(&got), f32s(&want), "past {past} {name}");
        }
        // The present is the past with the new keys after it, per head.
        let present = read_npy_file(out_dir.join("present.0.key.npy")).unwrap();
        assert_eq!(present.dims(), [1, HEADS, past + 2, HEAD_DIM]);
        let (p, k) = (f32s(&named[3].1), f32s(&named[1].1));
        let d = HEAD_DIM as usize;
        let mut want = Vec::new();
        for h in 0..HEADS as usize {
            let past = past as usize;
            want.extend_from_slice(&p[h * past * d..(h + 1) * past * d]);
            want.extend_from_slice(&k[h * 2 * d..(h + 1) * 2 * d]);
        }
        assert_eq!(f32s(&present), want, "past {past}");
    }
}

#[test]
fn run_names_a_missing_or_unknown_input() {
    let Some(_gpu) = testing::gpu_or_skip("onnx_cli errors") else {
        return;
    };
    let dir = common::scratch("onnx_cli_errors");
    let named = feeds(&dir, 1, 1);
    let model = fixture().display().to_string();
    let arg = |name: &str| format!("{name}={}", dir.join(format!("{name}.npy")).display());
    // Without `v`.
    let mut args = vec!["run".to_string(), model.clone()];
    for (name, _) in named.iter().filter(|(n, _)| n != "v") {
        args.extend(["--input".into(), arg(name)]);
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, _, stderr) = dynrt(&refs);
    assert!(!ok);
    assert!(stderr.contains("`v`"), "{stderr}");
    // An input the model does not have.
    args.extend([
        "--input".into(),
        format!("nope={}", dir.join("q.npy").display()),
    ]);
    args.extend(["--input".into(), arg("v")]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, _, stderr) = dynrt(&refs);
    assert!(!ok);
    assert!(stderr.contains("nope"), "{stderr}");
}

#[test]
fn bench_onnx_prints_one_json_line_per_run() {
    let Some(_gpu) = testing::gpu_or_skip("onnx_cli bench") else {
        return;
    };
    let dir = common::scratch("onnx_cli_bench");
    feeds(&dir, 0, 4);
    let out = dir.join("out");
    let model = fixture().display().to_string();
    let (ok, stdout, stderr) = dynrt_bench(&[
        "onnx",
        &model,
        "--feeds",
        dir.to_str().unwrap(),
        "--steps",
        "3",
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    let doc: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(doc["runtime"], "dynrt");
    assert!(doc["provider"].as_str().unwrap().starts_with("dynrt "));
    assert_eq!(doc["steps"].as_array().unwrap().len(), 3, "{doc}");
    for s in doc["steps"].as_array().unwrap() {
        assert!(s["ms"].as_f64().unwrap() > 0.0, "{doc}");
    }
    assert!(doc["peak_bytes"].as_u64().unwrap() > 0, "{doc}");
    // Every step fed the same inputs: the last step's outputs are step 0's.
    let attn = read_npy_file(out.join("attn.npy")).unwrap();
    assert_eq!(attn.dims(), [1, HEADS, 4, HEAD_DIM]);
}
