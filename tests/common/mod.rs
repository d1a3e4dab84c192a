//! Helpers shared by the test binaries (`gpu`, `host`, `cli`, `hostile`): scratch folders,
//! the model's Python reference, child processes for tests that need a process of their own.
#![allow(dead_code)] // each test binary uses part of it

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// A path from the environment variable `var`, else the build-time `default`: a test binary
/// copied to another machine (`scripts/gpu_tests.sh`) finds its
/// files where the pack put them instead of where they were when it was built.
fn path_from_env(cell: &'static OnceLock<PathBuf>, var: &str, default: &str) -> &'static Path {
    cell.get_or_init(|| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map_or_else(|| PathBuf::from(default), PathBuf::from)
    })
}

/// The repository root: `DYNRT_REPO`, else where the tests were built from.
pub fn repo() -> &'static Path {
    static REPO: OnceLock<PathBuf> = OnceLock::new();
    path_from_env(&REPO, "DYNRT_REPO", env!("CARGO_MANIFEST_DIR"))
}

/// The folder for the tests' scratch files and caches: `DYNRT_TEST_TMPDIR`, else cargo's
/// `CARGO_TARGET_TMPDIR` of the build.
pub fn tmpdir() -> &'static Path {
    static TMP: OnceLock<PathBuf> = OnceLock::new();
    path_from_env(&TMP, "DYNRT_TEST_TMPDIR", env!("CARGO_TARGET_TMPDIR"))
}

/// The `dynrt` command-line binary the tests run: `DYNRT_BIN`, else the one cargo built
/// beside the tests.
pub fn dynrt_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    path_from_env(&BIN, "DYNRT_BIN", env!("CARGO_BIN_EXE_dynrt"))
}

/// The `dynrt-bench` binary (benchmarks, `predict`, `plan`) the tests run: `DYNRT_BENCH_BIN`,
/// else the one cargo built beside the tests.
pub fn dynrt_bench_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    path_from_env(&BIN, "DYNRT_BENCH_BIN", env!("CARGO_BIN_EXE_dynrt-bench"))
}

/// Set (`DYNRT_PACK`, to the pack's folder) when the tests run from the pack of
/// `scripts/gpu_tests.sh` on a machine without the build tree, cargo, the network or the
/// Python references: the tests that need those skip, saying so.
pub fn packed() -> Option<String> {
    std::env::var("DYNRT_PACK").ok().filter(|v| !v.is_empty())
}

/// A scratch directory for test `name` under [`tmpdir`], emptied first.
pub fn scratch(name: &str) -> PathBuf {
    let d = tmpdir().join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
    d
}

/// Held while a test checks and writes a reference cached under the target directory, so
/// that two tests of one binary wanting the same cache entry on a fresh clone do not both
/// write it (one removing or truncating files the other is reading). A test that panicked
/// holding it leaves the cache as a later check finds it, so poisoning is ignored.
pub fn cache_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The variable that marks a child process of [`run_alone`]: the name of the test it runs.
const CHILD_ENV: &str = "DYNRT_TEST_CHILD";

/// The name libtest gives test `test` of the module whose `module_path!()` is `module_path`:
/// the path without the crate (the binary), e.g. `history::history_child`.
pub fn test_name(module_path: &str, test: &str) -> String {
    match module_path.split_once("::") {
        Some((_, module)) => format!("{module}::{test}"),
        None => test.to_string(),
    }
}

/// Runs test `test` of module `module_path` (its `module_path!()`) alone in a child process of
/// this test binary, ignored or not, on one thread, output not captured, with `env` set; for a
/// test that needs a process of its own (it sets variables that other tests read, or reads one
/// that would change theirs) in a binary shared with other tests. Panics unless the child ran
/// exactly that test; its exit status is the caller's to check.
pub fn run_alone(module_path: &str, test: &str, env: &[(&str, &str)]) -> Output {
    let name = test_name(module_path, test);
    let exe = std::env::current_exe().expect("the test binary's own path");
    let out = Command::new(exe)
        .args(["--exact", &name, "--include-ignored", "--nocapture"])
        .arg("--test-threads=1")
        .env(CHILD_ENV, &name)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("running {name} in a child process: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("running 1 test"),
        "the child process did not run {name} alone:\n{stdout}"
    );
    out
}

/// True in the child process that [`run_alone`] started for test `test` of `module_path`.
pub fn in_child(module_path: &str, test: &str) -> bool {
    std::env::var(CHILD_ENV).is_ok_and(|v| v == test_name(module_path, test))
}

/// A proptest configuration of `cases` cases whose failures are saved beside the test's source
/// file (`foo.rs`: `foo.proptest-regressions`) and run again first from there. Proptest's
/// default looks for the test binary's `main.rs` above the file and would keep them under
/// `tests/proptest-regressions/` instead.
pub fn proptest_config(cases: u32) -> proptest::test_runner::Config {
    use proptest::test_runner::{Config, FileFailurePersistence};
    Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Config::default()
    }
}

/// The python of `scripts/pyenv.sh` (created on first use), or `None` after printing why
/// `test` is skipped; panics instead when `DYNRT_REQUIRE_MODEL=1`.
pub fn python_or_skip(test: &str) -> Option<PathBuf> {
    static PY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let py = PY.get_or_init(|| {
        if let Some(pack) = packed() {
            // No network to build the venv with: pip would only time out, test after test.
            return Err(format!(
                "the Python references need scripts/pyenv.sh's venv, which a packed run \
                 ({pack}) does not have"
            ));
        }
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
    run_script(python, "smollm2_ref.py", args)
}

/// Runs `scripts/SCRIPT` with `args` under `python` and returns its stdout; panics with
/// its stderr if it fails. Its BLAS runs on one thread: the tests run two at a time beside
/// the software adapter's threads, where BLAS threads mostly spin (bert_ref.py on 40
/// sentences took 19 s of CPU with OpenBLAS's threads, 2.5 s with one).
pub fn run_script(python: &Path, script: &str, args: &[&str]) -> String {
    let out = Command::new(python)
        .arg(repo().join("scripts").join(script))
        .args(args)
        .env("OPENBLAS_NUM_THREADS", "1")
        .env("OMP_NUM_THREADS", "1")
        .env("MKL_NUM_THREADS", "1")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", python.display()));
    assert!(
        out.status.success(),
        "{script} {args:?} failed:\n{}",
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

/// A graph whose ops get one tensor twice or leave kernel slots unused, the dispatches Dawn
/// rejects when two storage bindings alias: inputs `x` (f32 `[n]`) and `i` (i32 `[n]`);
/// outputs, in order, `sq = x * x`, `dbl = x + x` (elementwise), `isq = i * i` (logic, third
/// slot unused), `gt = x > dbl` (logic compare), `sel = where(gt, i, i)` (logic, both value
/// operands one tensor), `fsel = where(gt, x, x)` (f32), `ng = not(gt)` (two slots unused).
pub fn aliased_operands_graph() -> dynrt::graph::Graph {
    use dynrt::graph::ops::{CompareOp, Not};
    use dynrt::graph::{Dim, GraphBuilder};
    use dynrt::shape::DType;
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[Dim::sym("n")], DType::F32);
    let i = b.input("i", &[Dim::sym("n")], DType::I32);
    let sq = b.mul("sq", x, x);
    let dbl = b.add("dbl", x, x);
    let isq = b.mul("isq", i, i);
    let gt = b.node("gt", CompareOp::Greater, &[x, dbl]);
    let sel = b.where_("sel", gt, i, i);
    let fsel = b.where_("fsel", gt, x, x);
    let ng = b.node("ng", Not, &[gt]);
    for o in [sq, dbl, isq, gt, sel, fsel, ng] {
        b.output(o);
    }
    b.build().expect("the aliased-operands graph is valid")
}

/// Inputs of [`aliased_operands_graph`] with `n` (at most 600) elements: both signs and
/// zeros; i32 squares stay below 2^24, so the f32 carriers of the outputs are exact.
pub fn aliased_operands_inputs(n: usize) -> (Vec<f32>, Vec<f32>) {
    let x = (0..n).map(|k| (k as f32 - n as f32 / 2.0) * 0.75).collect();
    let i = (0..n).map(|k| (k as f32 - 3.0) * 5.0).collect();
    (x, i)
}

/// Checks the outputs of [`aliased_operands_graph`] (f32 carriers, bools 0/1) exactly.
pub fn check_aliased_outputs(x: &[f32], i: &[f32], got: &[Vec<f32>], ctx: &str) {
    let gt: Vec<bool> = x.iter().map(|&v| v > v + v).collect();
    let b = |v: bool| if v { 1.0 } else { 0.0 };
    let want: [Vec<f32>; 7] = [
        x.iter().map(|v| v * v).collect(),
        x.iter().map(|v| v + v).collect(),
        i.iter().map(|v| v * v).collect(),
        gt.iter().map(|&g| b(g)).collect(),
        i.to_vec(),
        x.to_vec(),
        gt.iter().map(|&g| b(!g)).collect(),
    ];
    let names = ["sq", "dbl", "isq", "gt", "sel", "fsel", "ng"];
    assert_eq!(got.len(), want.len(), "{ctx}: outputs");
    for ((g, w), name) in got.iter().zip(&want).zip(names) {
        assert_eq!(g, w, "{ctx}: output {name}");
    }
}

/// The WGSL of shader file `path` as the device compiles it: the source its pipelines get
/// (`dynrt::gpu::shader_sources`: the prelude, the file, and for `quant` the weight formats'
/// decoders from `src/formats`).
pub fn shader_source(path: &Path) -> String {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let (_, src) = dynrt::gpu::shader_sources()
        .find(|&(name, _)| name == stem)
        .unwrap_or_else(|| panic!("{}: no pipeline is made from it", path.display()));
    let file = std::fs::read_to_string(path).unwrap();
    assert!(
        src.strip_prefix(dynrt::gpu::PRELUDE_WGSL)
            .is_some_and(|rest| rest.starts_with(&file)),
        "{}: its pipelines' source is not the prelude and then the file",
        path.display()
    );
    src.to_string()
}

/// A `.npy` file of format `version` with header text `header` (newline added) and `data`:
/// hostile headers that no `.npy` writer would make.
pub fn npy_file(version: u8, header: &str, data: &[u8]) -> Vec<u8> {
    let mut f = b"\x93NUMPY".to_vec();
    f.extend_from_slice(&[version, 0]);
    let text = format!("{header}\n");
    if version == 1 {
        f.extend_from_slice(&(text.len() as u16).to_le_bytes());
    } else {
        f.extend_from_slice(&(text.len() as u32).to_le_bytes());
    }
    f.extend_from_slice(text.as_bytes());
    f.extend_from_slice(data);
    f
}
