//! Helpers shared by the integration tests that need the model or the Python reference.
#![allow(dead_code)] // each test binary uses part of it

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The repository root.
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A scratch directory for test `name` under the target directory, emptied first.
pub fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
    d
}

/// The python of `scripts/pyenv.sh` (created on first use), or `None` after printing why
/// `test` is skipped; panics instead when `DYNRT_REQUIRE_MODEL=1`.
pub fn python_or_skip(test: &str) -> Option<PathBuf> {
    static PY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let py = PY.get_or_init(|| {
        let out = Command::new("bash")
            .arg(repo().join("scripts/pyenv.sh"))
            .output()
            .map_err(|e| format!("scripts/pyenv.sh: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "scripts/pyenv.sh failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    });
    match py {
        Ok(p) => Some(p.clone()),
        Err(e) if dynrt::fetch::require_model() => {
            panic!("{test}: DYNRT_REQUIRE_MODEL=1 but the Python reference is unavailable: {e}")
        }
        Err(e) => {
            eprintln!("SKIP {test}: {e}");
            None
        }
    }
}

/// Runs `scripts/smollm2_ref.py ARGS` with `python`; panics with its stderr on failure.
pub fn run_reference(python: &Path, args: &[&str]) -> String {
    let out = Command::new(python)
        .arg(repo().join("scripts/smollm2_ref.py"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", python.display()));
    assert!(
        out.status.success(),
        "smollm2_ref.py {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Reads a JSON file.
pub fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A JSON array of integers as `u64`s (panics on anything else: the reference wrote it).
pub fn json_u64s(v: &serde_json::Value) -> Vec<u64> {
    let a = v.as_array().unwrap_or_else(|| panic!("not an array: {v}"));
    a.iter()
        .map(|x| x.as_u64().unwrap_or_else(|| panic!("not a u64: {x}")))
        .collect()
}

/// A JSON array of token ids.
pub fn json_ids(v: &serde_json::Value) -> Vec<u32> {
    json_u64s(v).into_iter().map(|x| x as u32).collect()
}

/// A JSON array of f32 values. JSON carries them as shortest decimal strings; serde_json's
/// f64 parse may miss by an ulp of f64, which the cast to f32 absorbs.
pub fn json_f32s(v: &serde_json::Value) -> Vec<f32> {
    let a = v.as_array().unwrap_or_else(|| panic!("not an array: {v}"));
    a.iter()
        .map(|x| x.as_f64().unwrap_or_else(|| panic!("not a number: {x}")) as f32)
        .collect()
}
