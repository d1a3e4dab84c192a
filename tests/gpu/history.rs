//! The verbose history on stderr (`DYNRT_VERBOSE=2`): this test runs itself as a child
//! process with the variable set, parses every line the child printed, and checks the
//! arithmetic line by line and against the child's own in-process history.

use crate::common;
use dynrt::gpu::{testing, BufferDesc, Engine};
use dynrt::memory::accounting::{check_history, parse_history, AllocOp};
use dynrt::memory::AllocKind;

/// Runs in the child: a mix of allocations and frees of every supported kind, then prints the
/// in-process history to stdout for the parent to compare.
#[test]
#[ignore = "child process of verbose_history_lines_parse_and_add_up"]
fn history_child() {
    assert!(
        common::in_child(module_path!(), "history_child"),
        "run by verbose_history_lines_parse_and_add_up, not by hand"
    );
    let Some(gpu) = testing::gpu_or_skip("history_child") else {
        println!("CHILD-SKIPPED");
        return;
    };
    let engine = Engine::new(gpu.clone());
    engine.record_history(1 << 16);
    let mut live = Vec::new();
    for (i, kind) in AllocKind::ALL
        .into_iter()
        .filter(|k| gpu.supports_kind(*k))
        .enumerate()
    {
        for j in 0..3u64 {
            let size = 1024 * (i as u64 + 1) + 4 * j;
            live.push(
                engine
                    .allocate(&BufferDesc {
                        label: "h",
                        size_bytes: size,
                        kind,
                    })
                    .unwrap(),
            );
        }
        live.remove(0);
    }
    let dev = engine
        .allocate(&BufferDesc {
            label: "d",
            size_bytes: 64,
            kind: AllocKind::UsmDevice,
        })
        .unwrap();
    engine.write(&dev, 0, &[1; 64]).unwrap(); // staging: one usm_host pair
    assert_eq!(engine.read_blocking(&dev, 0, 64).unwrap(), vec![1; 64]); // readback: another
    drop(dev);
    drop(live);
    for e in engine.history() {
        println!("INPROC {e}");
    }
}

#[test]
fn verbose_history_lines_parse_and_add_up() {
    // The child picks its backend from WGPU_BACKEND: run it on each backend the tests cover.
    for backend in ["vulkan", "gl"] {
        check_child_history(backend);
    }
}

fn check_child_history(backend: &str) {
    let out = common::run_alone(
        module_path!(),
        "history_child",
        &[("DYNRT_VERBOSE", "2"), ("WGPU_BACKEND", backend)],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "child on {backend} failed:\n{stdout}\n{stderr}"
    );
    if stdout.contains("CHILD-SKIPPED") {
        assert!(!testing::require_gpu());
        eprintln!("SKIP verbose_history_lines_parse_and_add_up on {backend}: no adapter");
        return;
    }
    let printed = parse_history(&stderr).unwrap();
    let inproc: Vec<_> = stdout
        .lines()
        .filter_map(|l| l.split_once("INPROC ").map(|(_, rest)| rest))
        .map(|l| dynrt::memory::accounting::AllocEvent::parse(l).unwrap())
        .collect();
    // Precondition: the child really allocated (3 kinds at least, staging and readback).
    assert!(
        printed.len() >= 2 * (3 * 3 + 3),
        "only {} lines on stderr:\n{stderr}",
        printed.len()
    );
    assert_eq!(
        printed, inproc,
        "stderr lines differ from the in-process history"
    );
    check_history(&printed).unwrap();
    // Every line on stderr that mentions an allocation type is one of the parsed events.
    let raw_lines = stderr
        .lines()
        .filter(|l| l.contains(" allocation type (current="))
        .count();
    assert_eq!(raw_lines, printed.len());
    let frees = printed.iter().filter(|e| e.op == AllocOp::Free).count();
    assert_eq!(frees * 2, printed.len(), "every allocation was freed");
    let last = printed.last().unwrap();
    assert_eq!(last.op, AllocOp::Free);
}
