//! Files and paths: `.npy` headers that a general literal parser never finishes, lengths and
//! shapes that promise more than the file holds, FIFOs and devices named as inputs, models,
//! CSVs and traces, and `--output-dir` destinations that are symbolic links, existing files
//! or shared by two outputs.
//!
//! The CLI runs under a deadline (a hang fails the test instead of stalling CI) and, where it
//! must not reach the GPU, under `ulimit -v` (a read of `/dev/zero` fails instead of filling
//! the machine).

use crate::common;
use dynrt::npy::{read_npy, write_npy_file};
use dynrt::onnx::HostTensor;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longer than anything here takes when it works; a hang is cut off at this.
const DEADLINE: Duration = Duration::from_secs(20);

/// A fresh scratch folder for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = crate::common::tmpdir().join("hostile_io").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `f()` on another thread, or a panic when it has not returned within [`DEADLINE`] (the
/// thread is left behind: a hang fails the test rather than the whole run).
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let start = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(DEADLINE) {
        Ok(v) => {
            eprintln!("{what}: {:.3} ms", start.elapsed().as_secs_f64() * 1e3);
            v
        }
        Err(_) => panic!("{what}: no answer after {DEADLINE:?}: it hangs"),
    }
}

/// The error message of reading `bytes` as `.npy`, which must fail within the deadline.
fn npy_error(what: &str, bytes: Vec<u8>) -> String {
    match within(what, move || read_npy(&bytes).map(|_| ())) {
        Ok(()) => panic!("{what}: read as a valid .npy file"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn npy_headers_of_nested_braces_are_refused_at_once() {
    for depth in [16, 64, 10_000] {
        let header = "{".repeat(depth);
        let bytes = common::npy_file(1, &header, &[]);
        if depth == 16 {
            // The 64-byte file of the report.
            assert_eq!(bytes.len(), 10 + 16 + 1);
        }
        let e = npy_error(&format!("{depth} nested braces"), bytes);
        assert!(e.contains("not a valid .npy file"), "{depth}: {e}");
        assert!(
            e.chars().count() < 200,
            "{depth}: the message quotes too much: {e}"
        );
    }
    // The same depth in the shape and in a value.
    for header in [
        format!(
            "{{'descr': '<f4', 'fortran_order': False, 'shape': {}",
            "(".repeat(10_000)
        ),
        format!("{{'descr': {}", "[".repeat(10_000)),
        format!("{{'descr': '<f4', 'fortran_order': {}", "{".repeat(10_000)),
    ] {
        let e = npy_error("nested brackets", common::npy_file(1, &header, &[]));
        assert!(e.chars().count() < 200, "the message quotes too much: {e}");
    }
}

#[test]
fn npy_header_length_beyond_the_bound_is_refused() {
    for (version, length) in [(2u8, u32::MAX), (3, 0x0100_0000), (2, 65_537)] {
        let mut f = b"\x93NUMPY".to_vec();
        f.extend_from_slice(&[version, 0]);
        f.extend_from_slice(&length.to_le_bytes());
        f.extend_from_slice(b"{'descr': '<f4', 'fortran_order': False, 'shape': (), }\n");
        f.extend_from_slice(&[0; 4]);
        let e = npy_error(&format!("header length {length}"), f);
        assert!(
            e.contains(&format!("header is {length} bytes long")),
            "{length}: {e}"
        );
    }
}

#[test]
fn npy_shape_whose_byte_size_overflows_is_refused() {
    for shape in [
        "(4294967296, 4294967296, 2)",
        "(18446744073709551615, 2)",
        "(3074457345618258603, 3, 1)",
    ] {
        let header = format!("{{'descr': '<f4', 'fortran_order': True, 'shape': {shape}, }}");
        let e = npy_error(shape, common::npy_file(1, &header, &[0; 64]));
        assert!(e.contains("overflows"), "{shape}: {e}");
    }
    // A dimension beyond u64 is a header error that does not quote the digits at length.
    let header = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({},), }}",
        "9".repeat(5_000)
    );
    let e = npy_error("a 5000-digit dimension", common::npy_file(1, &header, &[]));
    assert!(e.contains("below 2^64") && e.chars().count() < 200, "{e}");
}

#[test]
fn npy_shape_larger_than_the_data_is_refused() {
    // Data short by less than the header's length: the bytes after the header are what
    // count, not the file's length.
    let header = format!(
        "{{'descr': '<f8', 'fortran_order': False, 'shape': (6,), }}{}",
        " ".repeat(300)
    );
    let e = npy_error("6 f8 in 40 bytes", common::npy_file(1, &header, &[0; 40]));
    assert!(
        e.contains("promises 48 bytes of data but the file holds 40"),
        "{e}"
    );
    let header = "{'descr': '<u1', 'fortran_order': True, 'shape': (1099511627776, 1024), }";
    let e = npy_error("a terabyte promised", common::npy_file(1, header, &[7; 10]));
    assert!(
        e.contains("promises 1125899906842624 bytes of data but the file holds 10"),
        "{e}"
    );
}

#[test]
fn npy_errors_quote_a_short_piece_of_the_header() {
    let junk = "x".repeat(20_000);
    for header in [
        format!("{{'descr': '<f4', 'fortran_order': {junk}}}"),
        format!("{{'descr': '{junk}', 'fortran_order': False, 'shape': ()}}"),
        format!("{{'{junk}': 1}}"),
        format!("{{'descr': '<f4', 'fortran_order': False, 'shape': (1, {junk})}}"),
    ] {
        let e = npy_error("20000 junk bytes", common::npy_file(2, &header, &[]));
        assert!(e.chars().count() < 300, "the message quotes too much: {e}");
        assert!(e.contains("xxxx"), "the message quotes nothing: {e}");
    }
}

// ---------------------------------------------------------------------------------------
// The CLI with paths that are not regular files.

/// What a run of the binary gave.
struct Outcome {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Runs `dynrt ARGS` (with `ulimit -v` 4 GiB when `limit_memory`), killing it at [`DEADLINE`].
fn dynrt(args: &[&str], limit_memory: bool) -> Outcome {
    run_binary(crate::common::dynrt_bin(), args, limit_memory)
}

/// [`dynrt`] for the `dynrt-bench` binary.
fn dynrt_bench(args: &[&str], limit_memory: bool) -> Outcome {
    run_binary(crate::common::dynrt_bench_bin(), args, limit_memory)
}

/// Runs `exe ARGS` as [`dynrt`] describes.
fn run_binary(exe: &Path, args: &[&str], limit_memory: bool) -> Outcome {
    let mut cmd = if limit_memory {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg("ulimit -v 4194304 && exec \"$0\" \"$@\"")
            .arg(exe);
        c
    } else {
        Command::new(exe)
    };
    let start = Instant::now();
    let mut child = cmd
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start dynrt");
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = pipe.read_to_end(&mut s);
            String::from_utf8_lossy(&s).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("dynrt {args:?} still running after {DEADLINE:?}: it hangs");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    eprintln!(
        "dynrt {args:?}: {:.0} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
    Outcome {
        ok: status.success(),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// Runs `dynrt ARGS`, which must fail with a message containing every one of `words`.
fn refused(args: &[&str], words: &[&str]) {
    refused_by(dynrt, args, words);
}

/// [`refused`] for a run of `run` (`dynrt` or `dynrt_bench`).
fn refused_by(run: fn(&[&str], bool) -> Outcome, args: &[&str], words: &[&str]) {
    let o = run(args, true);
    assert!(!o.ok, "dynrt {args:?} succeeded: {}", o.stdout);
    for w in words {
        assert!(
            o.stderr.contains(w),
            "dynrt {args:?}: no `{w}` in: {}",
            o.stderr
        );
    }
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("run mkfifo");
    assert!(status.success(), "mkfifo {}", path.display());
}

// A minimal protobuf writer for the ONNX models below (the library's wire structs are
// private, and the fixture models have fixed output names).

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn field_varint(out: &mut Vec<u8>, field: u64, v: u64) {
    varint(out, field << 3);
    varint(out, v);
}

fn field_bytes(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, field << 3 | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// `ValueInfoProto` of a float tensor of dims `[2]`.
fn value_info(name: &str) -> Vec<u8> {
    let mut dim = Vec::new();
    field_varint(&mut dim, 1, 2);
    let mut shape = Vec::new();
    field_bytes(&mut shape, 1, &dim);
    let mut tensor = Vec::new();
    field_varint(&mut tensor, 1, 1);
    field_bytes(&mut tensor, 2, &shape);
    let mut ty = Vec::new();
    field_bytes(&mut ty, 1, &tensor);
    let mut v = Vec::new();
    field_bytes(&mut v, 1, name.as_bytes());
    field_bytes(&mut v, 2, &ty);
    v
}

/// A model with input `x` (float `[2]`) and one `Relu(x)` output per name.
fn relu_model(outputs: &[&str]) -> Vec<u8> {
    let mut graph = Vec::new();
    for (i, name) in outputs.iter().enumerate() {
        let mut node = Vec::new();
        field_bytes(&mut node, 1, b"x");
        field_bytes(&mut node, 2, name.as_bytes());
        field_bytes(&mut node, 3, format!("relu{i}").as_bytes());
        field_bytes(&mut node, 4, b"Relu");
        field_bytes(&mut graph, 1, &node);
    }
    field_bytes(&mut graph, 2, b"hostile");
    field_bytes(&mut graph, 11, &value_info("x"));
    for name in outputs {
        field_bytes(&mut graph, 12, &value_info(name));
    }
    let mut opset = Vec::new();
    field_bytes(&mut opset, 1, b"");
    field_varint(&mut opset, 2, 13);
    let mut model = Vec::new();
    field_varint(&mut model, 1, 8);
    field_bytes(&mut model, 8, &opset);
    field_bytes(&mut model, 7, &graph);
    model
}

/// `dir/model.onnx` with the given outputs and `dir/x.npy` = `[-1, 2]`; their paths.
fn model_and_input(dir: &Path, outputs: &[&str]) -> (String, String) {
    let model = dir.join("model.onnx");
    std::fs::write(&model, relu_model(outputs)).unwrap();
    let x = dir.join("x.npy");
    write_npy_file(&x, &HostTensor::from_f32(vec![2], &[-1.0, 2.0]).unwrap()).unwrap();
    (model.display().to_string(), format!("x={}", x.display()))
}

#[test]
fn npy_inputs_that_are_not_regular_files_are_refused() {
    let dir = scratch("npy_inputs");
    let (model, _) = model_and_input(&dir, &["y"]);
    let fifo = dir.join("fifo.npy");
    mkfifo(&fifo);
    let fifo_arg = format!("x={}", fifo.display());
    refused(
        &["run", &model, "--input", &fifo_arg],
        &["input `x`", "FIFO"],
    );
    refused(
        &["run", &model, "--input", "x=/dev/zero"],
        &["input `x`", "/dev/zero is a character device"],
    );
    let dir_arg = format!("x={}", dir.display());
    refused(&["run", &model, "--input", &dir_arg], &["is a directory"]);
}

#[test]
fn model_files_that_are_not_regular_files_are_refused() {
    let dir = scratch("models");
    let fifo = dir.join("model.onnx");
    mkfifo(&fifo);
    let fifo = fifo.display().to_string();
    let folder = dir.display().to_string();
    for cmd in ["inspect", "run"] {
        refused(&[cmd, &fifo], &["FIFO"]);
        refused(&[cmd, "/dev/zero"], &["/dev/zero is a character device"]);
        refused(&[cmd, &folder], &["is a directory"]);
    }
    let gguf = dir.join("model.gguf");
    mkfifo(&gguf);
    let gguf = gguf.display().to_string();
    for (path, kind) in [
        (gguf.as_str(), "is a FIFO"),
        ("/dev/zero", "is a character device"),
        (folder.as_str(), "is a directory"),
    ] {
        let o = dynrt(&["generate", "--model", path, "--prompt", "hi"], true);
        assert!(!o.ok);
        assert!(
            o.stderr.contains(kind) && !o.stderr.contains("no such file"),
            "generate --model {path}: {}",
            o.stderr
        );
    }
}

#[test]
fn csv_and_traces_that_are_not_regular_files_are_refused() {
    let dir = scratch("text");
    let fifo = dir.join("input.csv");
    mkfifo(&fifo);
    let fifo = fifo.display().to_string();
    for cmd in ["plan", "predict"] {
        refused_by(dynrt_bench, &[cmd, &fifo], &["FIFO"]);
        refused_by(
            dynrt_bench,
            &[cmd, "/dev/zero"],
            &["/dev/zero is a character device"],
        );
    }
}

#[test]
fn external_data_that_is_a_fifo_is_refused_without_opening_it() {
    let dir = scratch("external");
    let fixture = crate::common::repo().join("fixtures/onnx/external.onnx");
    let model = dir.join("external.onnx");
    std::fs::copy(&fixture, &model).unwrap();
    mkfifo(&dir.join("external.bin"));
    let model_arg = model.display().to_string();
    // inspect only checks external files; run reads them.
    refused(&["inspect", &model_arg], &["external.bin", "FIFO"]);
    refused(&["run", &model_arg], &["external.bin", "FIFO"]);
    let e = within("OnnxFile::load with a FIFO as external data", move || {
        dynrt::onnx::OnnxFile::load(&model, &Default::default())
            .err()
            .map(|e| e.to_string())
    });
    let e = e.expect("the model loaded");
    assert!(e.contains("FIFO"), "{e}");
}

// ---------------------------------------------------------------------------------------
// `--output-dir`.

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    names
}

#[test]
fn outputs_whose_names_sanitise_alike_are_an_error_and_nothing_is_written() {
    let dir = scratch("collide");
    let (model, x) = model_and_input(&dir, &["a/b", "a_b"]);
    let out = dir.join("out");
    let out_arg = out.display().to_string();
    refused(
        &["run", &model, "--input", &x, "--output-dir", &out_arg],
        &["`a/b` and `a_b`", "a_b.npy"],
    );
    assert_eq!(listing(&out), Vec::<String>::new());
}

#[cfg(unix)]
#[test]
fn a_symbolic_link_at_an_output_path_is_not_followed() {
    let dir = scratch("symlink");
    let (model, x) = model_and_input(&dir, &["y"]);
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, b"precious").unwrap();
    std::os::unix::fs::symlink(&victim, out.join("y.npy")).unwrap();
    let out_arg = out.display().to_string();
    for extra in [&[][..], &["--overwrite"][..]] {
        let mut args = vec!["run", &model, "--input", &x, "--output-dir", &out_arg];
        args.extend_from_slice(extra);
        refused(&args, &["y.npy is a symbolic link"]);
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert!(out.join("y.npy").symlink_metadata().unwrap().is_symlink());
        assert_eq!(listing(&out), ["y.npy"]);
    }
}

#[test]
fn an_existing_output_is_kept_without_overwrite() {
    let dir = scratch("existing");
    let (model, x) = model_and_input(&dir, &["y"]);
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("y.npy"), b"old").unwrap();
    let out_arg = out.display().to_string();
    refused(
        &["run", &model, "--input", &x, "--output-dir", &out_arg],
        &["y.npy already exists", "--overwrite"],
    );
    assert_eq!(std::fs::read(out.join("y.npy")).unwrap(), b"old");
    assert_eq!(listing(&out), ["y.npy"]);
}

#[test]
fn overwrite_replaces_an_existing_output_by_a_rename() {
    let Some(_gpu) = dynrt::gpu::testing::gpu_or_skip("hostile overwrite") else {
        return;
    };
    let dir = scratch("overwrite");
    let (model, x) = model_and_input(&dir, &["y"]);
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("y.npy"), b"old").unwrap();
    let out_arg = out.display().to_string();
    let o = dynrt(
        &[
            "run",
            &model,
            "--input",
            &x,
            "--output-dir",
            &out_arg,
            "--overwrite",
        ],
        false,
    );
    assert!(o.ok, "{}", o.stderr);
    let y = dynrt::npy::read_npy_file(out.join("y.npy")).unwrap();
    assert_eq!(y.to_f64_vec().unwrap(), vec![0.0, 2.0]);
    // No temporary file is left beside it.
    assert_eq!(listing(&out), ["y.npy"]);
}
