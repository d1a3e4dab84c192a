//! The decode demo on a real adapter: the library loop (prefill network, KV cache moved to the
//! decode network) and the `dynrt demo` command line.

use dynrt::demo::decoder::DecoderConfig;
use dynrt::demo::{Demo, DemoConfig};
use dynrt::gpu::{testing, Engine};
use dynrt::memory::predictor::Policy;
use dynrt::runtime::report::DemoSummary;
use dynrt::runtime::RunOptions;
use std::process::Command;

fn small(policy: Policy, planner: bool, pool: bool) -> DemoConfig {
    let mut run = RunOptions::new(policy);
    run.pool = pool;
    DemoConfig {
        model: DecoderConfig {
            layers: 2,
            heads: 2,
            dim: 32,
            vocab: 96,
            max_positions: 64,
            seed: 5,
        },
        prompt_len: 5,
        steps: 20,
        run,
        planner,
        check_every: 1,
    }
}

#[test]
fn the_demo_decodes_the_same_tokens_with_every_memory_option_and_matches_the_reference() {
    let Some(gpu) = testing::gpu_or_skip("demo") else {
        return;
    };
    let mut first: Option<Vec<u32>> = None;
    for policy in Policy::ALL {
        for (planner, pool) in [(true, true), (false, true), (true, false)] {
            let engine = Engine::new(gpu.clone());
            let mut demo = Demo::new(&engine, small(policy, planner, pool)).unwrap();
            let mut errors = Vec::new();
            while !demo.done() {
                let r = demo.step_blocking().unwrap();
                errors.push(r.max_abs_err.expect("checked every step"));
            }
            let what = format!("{policy} planner={planner} pool={pool}");
            assert_eq!(errors.len(), 20, "{what}");
            assert!(errors.iter().all(|e| *e <= 1e-3), "{what}: {errors:?}");
            let s = demo.summary();
            assert_eq!(s.tokens.len(), 20);
            assert!(s.tokens.iter().all(|&t| t < 96));
            // Greedy decoding of this model does not just echo one token.
            let mut distinct = s.tokens.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert!(distinct.len() > 3, "{what}: tokens {:?}", s.tokens);
            assert!(
                s.pipeline_cache.misses > 0 && s.pipeline_cache.misses < 30,
                "{what}"
            );
            assert!(s.shape_updates_skipped > 0, "{what}");
            assert!(s.peak_bytes.usm_device > 0, "{what}");
            assert_eq!(demo.trace().samples.len(), 20);
            match &first {
                None => first = Some(s.tokens),
                Some(f) => assert_eq!(f, &s.tokens, "{what}: other tokens"),
            }
        }
    }
}

#[test]
fn exact_allocation_reallocates_far_more_than_the_predictors() {
    let Some(gpu) = testing::gpu_or_skip("demo") else {
        return;
    };
    let mut reallocs = Vec::new();
    for policy in Policy::ALL {
        let engine = Engine::new(gpu.clone());
        let mut config = small(policy, true, true);
        config.steps = 60;
        config.check_every = 0;
        let mut demo = Demo::new(&engine, config).unwrap();
        while !demo.done() {
            demo.step_blocking().unwrap();
        }
        reallocs.push(demo.summary().reallocations);
    }
    // none, openvino, adaptive
    assert!(reallocs[0] > 3 * reallocs[1], "{reallocs:?}");
    assert!(reallocs[2] <= reallocs[1], "{reallocs:?}");
}

#[test]
fn the_cli_prints_the_contract_json_and_an_svg_report() {
    let Some(_gpu) = testing::gpu_or_skip("demo") else {
        return;
    };
    let svg = std::env::temp_dir().join(format!("dynrt-demo-test-{}.svg", std::process::id()));
    let out = Command::new(crate::common::dynrt_bin())
        .args([
            "demo", "--steps", "12", "--json", "--policy", "openvino", "--report",
        ])
        .arg(&svg)
        .output()
        .expect("run dynrt");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with('{'))
        .expect("a JSON line");
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    for k in [
        "adapter",
        "backend",
        "policy",
        "steps",
        "tokens",
        "max_abs_err",
        "allocations",
        "reallocations",
        "bytes_allocated_total",
        "peak_bytes",
        "pipeline_cache",
        "shape_updates_skipped",
        "ms_per_step",
        "sizing",
        "regions",
    ] {
        assert!(keys.contains(&k), "missing {k} in {line}");
    }
    assert_eq!(keys.len(), 15, "{line}");
    // Every region was used: the weights, the inputs/outputs and KV cache, the activations.
    for (name, r) in [
        ("constants", v["regions"]["constants"].clone()),
        ("placeholders", v["regions"]["placeholders"].clone()),
        ("internal", v["regions"]["internal"].clone()),
    ] {
        let (bytes, buffers, peak) = (
            r["bytes"].as_u64().unwrap(),
            r["buffers"].as_u64().unwrap(),
            r["peak_bytes"].as_u64().unwrap(),
        );
        assert!(bytes > 0 && buffers > 0 && peak >= bytes, "{name}: {r}");
    }
    let s: DemoSummary = serde_json::from_str(line).unwrap();
    assert_eq!(
        (s.policy.as_str(), s.steps, s.tokens.len()),
        ("openvino", 12, 12)
    );
    assert!(s.max_abs_err <= 1e-2);
    let picture = std::fs::read_to_string(&svg).expect("svg written");
    assert!(picture.contains("<polyline") && picture.contains("reallocation(s)"));
    let _ = std::fs::remove_file(&svg);

    // A bad argument is an error that says what is wrong.
    let out = Command::new(crate::common::dynrt_bin())
        .args(["demo", "--heads", "3"])
        .output()
        .expect("run dynrt");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a multiple of heads"));
}

/// The runtime and `dynrt-bench predict` run one sizing path: the shape trace a demo run writes
/// replays to the run's own reallocation count and peak reserved bytes, for every policy.
#[test]
fn the_demo_trace_replays_to_the_runs_sizing_numbers() {
    let Some(_gpu) = testing::gpu_or_skip("demo trace replay") else {
        return;
    };
    for policy in ["none", "openvino", "adaptive"] {
        let csv = std::env::temp_dir().join(format!(
            "dynrt-demo-trace-{policy}-{}.csv",
            std::process::id()
        ));
        let out = Command::new(crate::common::dynrt_bin())
            .args(["demo", "--steps", "40", "--json", "--policy", policy])
            .arg("--trace-out")
            .arg(&csv)
            .output()
            .expect("run dynrt demo");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().find(|l| l.starts_with('{')).expect("json");
        let run: DemoSummary = serde_json::from_str(line).unwrap();
        assert!(run.sizing.rows > 100, "{policy}: {:?}", run.sizing);
        assert!(run.sizing.reallocations > 0, "{policy}: {:?}", run.sizing);
        let out = Command::new(crate::common::dynrt_bench_bin())
            .args(["predict", "--json", "--policy", policy])
            .arg(&csv)
            .output()
            .expect("run dynrt-bench predict");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let last = text.lines().last().expect("summary line");
        let v: serde_json::Value = serde_json::from_str(last).unwrap();
        let s = &v["summary"];
        assert_eq!(
            s["rows"].as_u64(),
            Some(run.sizing.rows),
            "{policy}: {last}"
        );
        assert_eq!(
            s["reallocations"].as_u64(),
            Some(run.sizing.reallocations),
            "{policy}: {last}"
        );
        assert_eq!(
            s["peak_reserved_bytes"].as_u64(),
            Some(run.sizing.peak_reserved_bytes),
            "{policy}: {last}"
        );
        let _ = std::fs::remove_file(&csv);
    }
}
