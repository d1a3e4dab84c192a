//! The two binaries' commands (issue 35): `dynrt` holds the user's commands and no benchmark,
//! `dynrt-bench` every benchmark and the memory-planning replays, each of them answering
//! `--help`.

use std::path::Path;
use std::process::Command;

/// The subcommands `exe --help` lists (its `Commands:` section, `help` left out).
fn commands(exe: &Path) -> Vec<String> {
    let out = Command::new(exe)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", exe.display()));
    assert!(out.status.success(), "{} --help failed", exe.display());
    let text = String::from_utf8_lossy(&out.stdout);
    let listed: Vec<String> = text
        .lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect();
    assert!(!listed.is_empty(), "no commands in:\n{text}");
    listed
}

#[test]
fn dynrt_holds_the_user_commands_and_no_benchmark() {
    let mut got = commands(crate::common::dynrt_bin());
    got.sort();
    let mut want = [
        "chat", "demo", "embed", "fetch", "generate", "info", "inspect", "run", "serve",
    ];
    want.sort();
    assert_eq!(got, want);
    let out = Command::new(crate::common::dynrt_bin())
        .args(["bench", "kernels", "--help"])
        .output()
        .expect("run dynrt");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unrecognized subcommand 'bench'"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn dynrt_bench_holds_every_benchmark_and_each_answers_help() {
    let bench = crate::common::dynrt_bench_bin();
    let mut got = commands(bench);
    got.sort();
    let mut want = [
        "batch", "decode", "embed", "generate", "kernels", "onnx", "plan", "predict",
    ];
    want.sort();
    assert_eq!(got, want);
    for c in &got {
        let out = Command::new(bench)
            .args([c.as_str(), "--help"])
            .output()
            .expect("run dynrt-bench");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("Usage: dynrt-bench "),
            "dynrt-bench {c} --help: {text}"
        );
    }
}
