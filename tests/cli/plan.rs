//! `dynrt-bench plan` end to end: every instance of `fixtures/planner/` is planned with a
//! time limit and the height reached is asserted (a regression in any strategy fails here),
//! plus the error paths (malformed rows, a capacity that cannot be met) and the output files.

use std::path::PathBuf;
use std::process::Command;

fn bench_dir() -> PathBuf {
    crate::common::repo().join("fixtures/planner")
}

fn instances() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for sub in ["minimalloc-challenging", "real-models"] {
        let dir = bench_dir().join(sub);
        for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "csv") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

fn plan(args: &[&str]) -> (i32, serde_json::Value, String) {
    let out = Command::new(crate::common::dynrt_bench_bin())
        .arg("plan")
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let json = stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or(serde_json::Value::Null);
    (out.status.code().unwrap_or(-1), json, stderr)
}

/// (file stem, extra arguments, height the run must reach or beat). Heights are those the
/// deterministic parts of the planner reach; the time limits leave room for slow machines.
fn expectation(stem: &str) -> (Vec<&'static str>, u64) {
    match stem {
        // Challenging instances: must fit at capacity (search; far below MiniMalloc's times).
        s if s.ends_with(".1048576") => (
            vec!["--capacity", "1048576", "--time-limit-ms", "60000"],
            1_048_576,
        ),
        "example.12" => (vec!["--capacity", "12"], 12),
        // Search reaches the lower bound.
        "resnet50" => (vec!["--time-limit-ms", "60000"], 1_515_472_556),
        "G_1" => (vec!["--time-limit-ms", "60000"], 3_030_937_746),
        // The first greedy order always completes; it already beats the best known heights
        // (5714911295 and 1535980319).
        "pangu_2.6B" => (
            vec!["--strategy", "greedy-size", "--time-limit-ms", "1"],
            5_572_042_819,
        ),
        "S_1" => (
            vec!["--strategy", "greedy-size", "--time-limit-ms", "1"],
            1_522_348_819,
        ),
        // The search's first dive is optimal here.
        "Y_1" => (
            vec!["--strategy", "search", "--time-limit-ms", "120000"],
            497_261_190_115,
        ),
        other => panic!("no expectation for instance {other}: add one"),
    }
}

#[test]
fn every_instance_reaches_its_recorded_height() {
    let files = instances();
    assert_eq!(
        files.len(),
        17,
        "expected 12 MiniMalloc and 5 real-model instances, found {files:?}"
    );
    for f in &files {
        let stem = f.file_stem().unwrap().to_string_lossy().to_string();
        let (mut args, want) = expectation(&stem);
        let path = f.to_string_lossy().to_string();
        args.insert(0, &path);
        args.push("--json");
        let (code, json, stderr) = plan(&args);
        assert_eq!(code, 0, "{stem}: {stderr}");
        assert_eq!(json["fits"], true, "{stem}: {json}");
        let height = json["height"].as_u64().unwrap();
        let lb = json["lower_bound"].as_u64().unwrap();
        assert!(
            height <= want,
            "{stem}: height {height}, expected at most {want}"
        );
        assert!(
            height >= lb,
            "{stem}: height {height} below the lower bound {lb}"
        );
    }
}

#[test]
fn outputs_and_errors() {
    let dir = std::env::temp_dir().join(format!("dynrt-plan-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let example = bench_dir().join("minimalloc-challenging/example.12.csv");
    let (out_csv, svg) = (dir.join("sol.csv"), dir.join("sol.svg"));
    let (code, json, stderr) = plan(&[
        example.to_str().unwrap(),
        "--out",
        out_csv.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    for key in [
        "buffers",
        "lower_bound",
        "height",
        "ratio",
        "fits",
        "capacity",
        "strategy",
        "millis",
    ] {
        assert!(json.get(key).is_some(), "missing {key} in {json}");
    }
    assert_eq!(json["capacity"], serde_json::Value::Null);
    let solution = std::fs::read_to_string(&out_csv).unwrap();
    assert!(solution.starts_with("id,lower,upper,size,offset\n"));
    let bufs = dynrt::memory::planner::parse_csv(&solution).unwrap();
    let offsets: Vec<u64> = solution
        .lines()
        .skip(1)
        .map(|l| l.rsplit(',').next().unwrap().parse().unwrap())
        .collect();
    dynrt::memory::planner::validate(&bufs, &offsets, 1).unwrap();
    assert!(
        std::fs::read_to_string(&svg)
            .unwrap()
            .matches("<rect")
            .count()
            >= 5
    );

    // A capacity below the lower bound: non-zero exit, clear message.
    let (code, _, stderr) = plan(&[
        example.to_str().unwrap(),
        "--capacity",
        "11",
        "--time-limit-ms",
        "200",
    ]);
    assert_ne!(code, 0);
    assert!(stderr.contains("no plan fits in 11 bytes"), "{stderr}");

    // Malformed rows name the line.
    let cases = [
        ("id,lower,upper,size\na,0,3,4\nb,1,2\n", "line 3"),
        ("id,lower,upper,size\na,0,3,-4\n", "negative"),
        (
            "id,lower,upper,size\na,5,3,4\n",
            "upper 3 must be greater than lower 5",
        ),
        ("id,lower,upper,size\na,0,3,4\na,1,2,4\n", "duplicate id"),
        (
            "id,lower,upper,size\na,0,three,4\n",
            "not a non-negative integer",
        ),
        ("id,lower,size\n", "no `upper` column"),
    ];
    for (k, (text, want)) in cases.iter().enumerate() {
        let f = dir.join(format!("bad{k}.csv"));
        std::fs::write(&f, text).unwrap();
        let (code, _, stderr) = plan(&[f.to_str().unwrap()]);
        assert_ne!(code, 0, "{text}");
        assert!(stderr.contains(want), "{stderr} should contain {want}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
