//! The ONNX backend node tests as data: every case of `onnx==1.22.0` (1765) must parse —
//! its model and every `input_K.pb` / `output_K.pb`; a case that does not is a bug.
//!
//! Needs the cases: `scripts/fetch_onnx_tests.sh` (cache `target/onnx-tests`, or
//! `DYNRT_ONNX_TESTS_DIR`). Without them the test is skipped with a message, and fails when
//! `DYNRT_REQUIRE_ONNX_TESTS=1` (CI). Writes one line per case to
//! `<cache>/parse-report.tsv`: name, `ok` or the error, the ops the model uses.

use dynrt::onnx::{testdata, LoadOptions};
use std::collections::BTreeMap;
use std::fmt::Write as _;

#[test]
fn every_node_test_case_parses() {
    let Some(dir) = testdata::dir_or_skip() else {
        return;
    };
    let cases = testdata::list_cases(&dir).expect("list the cases");
    assert_eq!(cases.len(), 1765, "onnx==1.22.0 ships 1765 node test cases");

    let options = LoadOptions::default();
    let mut report = String::new();
    let mut ok = 0usize;
    let mut bugs = Vec::new();
    let mut ops_used: BTreeMap<String, usize> = BTreeMap::new();
    let (mut inputs, mut outputs) = (0usize, 0usize);
    for path in &cases {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        match testdata::load_case(path, &options) {
            Ok(case) => {
                ok += 1;
                assert!(!case.data_sets.is_empty(), "{name}: no test_data_set");
                for set in &case.data_sets {
                    assert!(!set.outputs.is_empty(), "{name}/{}: no outputs", set.name);
                    inputs += set.inputs.len();
                    outputs += set.outputs.len();
                }
                let mut ops: Vec<String> = case
                    .model
                    .graph
                    .walk_nodes()
                    .iter()
                    .map(|n| {
                        if n.domain.is_empty() {
                            n.op_type.clone()
                        } else {
                            format!("{}:{}", n.domain, n.op_type)
                        }
                    })
                    .collect();
                ops.sort();
                ops.dedup();
                for op in &ops {
                    *ops_used.entry(op.clone()).or_default() += 1;
                }
                let _ = writeln!(report, "{name}\tok\t{}", ops.join(","));
            }
            Err(e) => {
                let _ = writeln!(report, "{name}\terror\t{e}");
                bugs.push(format!("{name}: {e}"));
            }
        }
    }
    let report_path = dir.parent().unwrap().join("parse-report.tsv");
    std::fs::write(&report_path, &report).expect("write the report");
    eprintln!(
        "{} cases: {ok} parsed ({inputs} input and {outputs} output files), {} failed; {} op types; per case: {}",
        cases.len(),
        bugs.len(),
        ops_used.len(),
        report_path.display()
    );
    assert!(
        bugs.is_empty(),
        "{} cases fail to parse:\n{}",
        bugs.len(),
        bugs.join("\n")
    );
    assert_eq!(ok, cases.len());
}
