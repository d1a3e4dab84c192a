//! `dynrt-bench predict` end to end: the built binary on small traces with hand-computed output,
//! malformed input, and the shipped fixture traces.

use dynrt::memory::predictor::{replay, Policy, PredictorOptions, ReplayConfig, Trace};
use std::path::PathBuf;
use std::process::Command;

/// Writes `text` to a fresh file under the test scratch folder.
fn trace_file(name: &str, text: &str) -> PathBuf {
    let dir = crate::common::tmpdir().join("predict_cli");
    std::fs::create_dir_all(&dir).expect("scratch folder");
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write trace");
    path
}

/// Runs `dynrt-bench predict ARGS` with the options variable unset; returns (success, stdout, stderr).
fn predict(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(crate::common::dynrt_bench_bin())
        .arg("predict")
        .args(args)
        .env_remove("DYNRT_MEM_PREALLOCATION_OPTIONS")
        .output()
        .expect("run dynrt-bench");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `k` grows by one f32 column per row; `s` is a u8 vector.
const SMALL: &str = "id,dtype,shape\nk,f32,1x2\nk,f32,1x3\nk,f32,1x4\nk,f32,1x5\ns,u8,7\n";

#[test]
fn openvino_replay_matches_hand_computed_json() {
    let path = trace_file("small.csv", SMALL);
    let (ok, stdout, stderr) = predict(&[path.to_str().unwrap(), "--json"]);
    assert!(ok, "{stderr}");
    // Rows 1-2: fewer than 3 shapes, exact (8, 12 bytes). Row 3: steps [0,1] twice, unit
    // slice [1,1] = 4 bytes <= 16384: [1, 4 + 10] = 56 bytes. Row 4: 20 bytes fit in 56.
    // Row 5: a new id, exact 7 bytes. Peak reserved 56 + 7; peak needed 20 + 7.
    let expected = [
        r#"{"row":1,"id":"k","shape":[1,2],"predicted":false,"prediction":[],"reallocated":true,"reserved_bytes":8}"#,
        r#"{"row":2,"id":"k","shape":[1,3],"predicted":false,"prediction":[],"reallocated":true,"reserved_bytes":12}"#,
        r#"{"row":3,"id":"k","shape":[1,4],"predicted":true,"prediction":[1,14],"reallocated":true,"reserved_bytes":56}"#,
        r#"{"row":4,"id":"k","shape":[1,5],"predicted":false,"prediction":[],"reallocated":false,"reserved_bytes":56}"#,
        r#"{"row":5,"id":"s","shape":[7],"predicted":false,"prediction":[],"reallocated":true,"reserved_bytes":7}"#,
        r#"{"summary":{"rows":5,"reallocations":4,"bytes_allocated_total":83,"peak_reserved_bytes":63,"peak_needed_bytes":27}}"#,
    ];
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines, expected);
}

#[test]
fn none_policy_and_disabled_options_allocate_exactly() {
    let path = trace_file("small_none.csv", SMALL);
    let summary = r#"{"summary":{"rows":5,"reallocations":5,"bytes_allocated_total":63,"peak_reserved_bytes":27,"peak_needed_bytes":27}}"#;
    for args in [
        vec![path.to_str().unwrap(), "--json", "--policy", "none"],
        vec![path.to_str().unwrap(), "--json", "--options", "0 0 0 1.0"],
    ] {
        let (ok, stdout, stderr) = predict(&args);
        assert!(ok, "{stderr}");
        assert_eq!(stdout.lines().last(), Some(summary), "{args:?}");
        assert_eq!(stdout.lines().count(), 6);
    }
}

#[test]
fn budget_refuses_the_prediction() {
    let path = trace_file("small_budget.csv", SMALL);
    // Row 3 asks for 56 bytes with 12 in use: 10 * 68 = 680 must be below 9 * budget.
    let (ok, stdout, stderr) = predict(&[path.to_str().unwrap(), "--json", "--budget-bytes", "75"]);
    assert!(ok, "{stderr}");
    let row3 = stdout.lines().nth(2).unwrap_or_default();
    assert!(row3.contains(r#""predicted":true"#), "{row3}");
    assert!(row3.ends_with(r#""reserved_bytes":16}"#), "{row3}");
    let (_, stdout, _) = predict(&[path.to_str().unwrap(), "--json", "--budget-bytes", "76"]);
    assert!(stdout
        .lines()
        .nth(2)
        .unwrap_or_default()
        .ends_with(r#""reserved_bytes":56}"#));
}

#[test]
fn table_output_has_every_row_and_the_summary() {
    let path = trace_file("small_table.csv", SMALL);
    let (ok, stdout, stderr) = predict(&[path.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("1x14"), "{stdout}");
    assert!(
        stdout.contains("5 rows, 4 reallocations (0 reclaims), 83 bytes allocated in total, peak reserved 63 bytes, peak needed 27 bytes"),
        "{stdout}"
    );
}

#[test]
fn raw_trace_drives_the_predictor_with_can_reuse() {
    // A `can_reuse` column means raw calls, one per row with that flag, whatever a
    // simulation would hold: row 3 says "reuse" although 3 bytes exceed the 2-byte buffer,
    // so it only records the shape and the buffer stays 2 bytes.
    let text = "id,dtype,shape,can_reuse\nk,u8,1,0\nk,u8,2,0\nk,u8,3,1\nk,u8,4,0\n";
    let path = trace_file("raw.csv", text);
    let (ok, stdout, stderr) = predict(&[path.to_str().unwrap(), "--json"]);
    assert!(ok, "{stderr}");
    let reserved: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split(r#""reserved_bytes":"#).nth(1))
        .collect();
    // Row 4: history (2, 3, 4) has equal steps of 1: 4 + 10 = 14 bytes.
    assert_eq!(reserved, ["1}", "2}", "2}", "14}"]);
    assert!(stdout.contains(r#""reallocations":3"#), "{stdout}");
    let text = "id,dtype,shape,can_reuse\nk,u8,1,0\nk,u8,2,0\nk,u8,3,0\nk,u8,4,1\nk,u8,5,1\n";
    let path = trace_file("raw_ok.csv", text);
    let (ok, stdout, stderr) = predict(&[path.to_str().unwrap(), "--json"]);
    assert!(ok, "{stderr}");
    // Row 3 predicts 3 + 10 = 13 bytes; rows 4-5 only record.
    let reserved: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split(r#""reserved_bytes":"#).nth(1))
        .collect();
    assert_eq!(reserved, ["1}", "2}", "13}", "13}", "13}"]);
}

#[test]
fn malformed_rows_are_errors_naming_the_row_and_print_nothing() {
    for (text, needle) in [
        (
            "id,dtype,shape\nk,f32,1x2\nk,f33,1x3\n",
            "row 2 (line 3): unknown dtype `f33`",
        ),
        (
            "id,dtype,shape\nk,f32,1x2\nk,f32,1xzx3\n",
            "row 2 (line 3): malformed shape",
        ),
        (
            "id,dtype,shape\nk,f32,1x2\nk,f32\n",
            "row 2 (line 3): expected 3 comma-separated fields",
        ),
        (
            "id,dtype,shape\nk,f32,1x2\nk,f32,1x2x3\n",
            "row 2 (line 3): shape 1x2x3 of `k` has rank 3",
        ),
        ("id,dtype,size\nk,f32,1x2\n", "trace header `id,dtype,size`"),
    ] {
        let path = trace_file("bad.csv", text);
        for json in [true, false] {
            let mut args = vec![path.to_str().unwrap()];
            if json {
                args.push("--json");
            }
            let (ok, stdout, stderr) = predict(&args);
            assert!(!ok, "{text}");
            assert!(stdout.is_empty(), "{text}: {stdout}");
            assert!(stderr.contains(needle), "{text}: {stderr}");
        }
    }
}

#[test]
fn malformed_options_name_their_source() {
    let path = trace_file("small_opts.csv", SMALL);
    let (ok, stdout, stderr) = predict(&[path.to_str().unwrap(), "--options", "10 16384 2"]);
    assert!(!ok && stdout.is_empty());
    assert!(stderr.contains("--options"), "{stderr}");
    let out = Command::new(crate::common::dynrt_bench_bin())
        .args(["predict", path.to_str().unwrap()])
        .env("DYNRT_MEM_PREALLOCATION_OPTIONS", "10 lots 2 1.1")
        .output()
        .expect("run dynrt-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("DYNRT_MEM_PREALLOCATION_OPTIONS"),
        "{stderr}"
    );
    assert!(stderr.contains("lots"), "{stderr}");
}

fn fixtures() -> Vec<PathBuf> {
    let dir = crate::common::repo().join("fixtures/traces");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("fixtures/traces")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .collect();
    paths.sort();
    paths
}

#[test]
fn compare_lists_every_policy_for_every_fixture() {
    let paths = fixtures();
    assert!(paths.len() >= 4, "found {paths:?}");
    let mut args = vec!["--compare".to_string()];
    args.extend(paths.iter().map(|p| p.display().to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, stdout, stderr) = predict(&args);
    assert!(ok, "{stderr}");
    let table_rows = stdout
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| trace"))
        .count();
    assert_eq!(table_rows, 3 * paths.len(), "{stdout}");
}

/// The shipped traces are what `scripts/gen_traces.py` writes (stdlib Python only; `.ci/run`
/// installs `python3`).
#[test]
fn fixtures_are_reproducible() {
    if let Some(pack) = crate::common::packed() {
        if Command::new("python3").arg("--version").output().is_err() {
            eprintln!(
                "SKIP fixtures_are_reproducible: no python3 on this machine (a packed run, {pack})"
            );
            return;
        }
    }
    let out = Command::new("python3")
        .arg(crate::common::repo().join("scripts/gen_traces.py"))
        .arg("--check")
        .output()
        .unwrap_or_else(|e| {
            panic!("python3 scripts/gen_traces.py: {e} (install python3: apt-get install python3)")
        });
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Guards the measured benchmark claims (counts and bytes, not timings).
#[test]
fn adaptive_meets_its_targets_on_the_fixtures() {
    let load = |name: &str| {
        let path = crate::common::repo().join("fixtures/traces").join(name);
        Trace::parse(&std::fs::read_to_string(&path).expect("fixture")).expect("parse")
    };
    let run = |trace: &Trace, policy| {
        replay(
            trace,
            &ReplayConfig::new(policy, PredictorOptions::openvino_defaults()),
        )
        .expect("replay")
        .summary
    };
    let decode = load("decode.csv");
    let (r, a) = (
        run(&decode, Policy::OpenVino),
        run(&decode, Policy::Adaptive),
    );
    assert!(a.reallocations * 4 <= r.reallocations, "{a:?} vs {r:?}");
    assert!(a.peak_reserved_bytes as f64 <= 1.10 * a.peak_needed_bytes as f64);
    let chat = load("chat.csv");
    let (r, a) = (run(&chat, Policy::OpenVino), run(&chat, Policy::Adaptive));
    assert!(a.reallocations * 2 <= r.reallocations, "{a:?} vs {r:?}");
    assert!(a.peak_reserved_bytes as f64 <= 1.10 * a.peak_needed_bytes as f64);
    let images = load("images.csv");
    let (r, a) = (
        run(&images, Policy::OpenVino),
        run(&images, Policy::Adaptive),
    );
    assert!(a.reallocations <= r.reallocations, "{a:?} vs {r:?}");
    assert!(
        a.peak_reserved_bytes <= r.peak_reserved_bytes,
        "{a:?} vs {r:?}"
    );
}
