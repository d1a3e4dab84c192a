//! The ONNX backend node tests, run: every case of `onnx==1.22.0` whose ops the importer maps
//! is imported, compiled and run on the GPU, and its outputs compared with the expected ones.
//!
//! Tolerance: floats within `atol + rtol * |expected|` with `rtol = 1e-3`, `atol = 1e-7` (the
//! defaults of ONNX's own backend test runner), NaN where NaN is expected; integers and bools
//! exactly; shapes and element types exactly.
//!
//! Every case ends in one of: `passed`; `unsupported op` (the importer's one error listing the
//! nodes it does not map); `unsupported type` (an element type dynrt does not hold, f16/bf16
//! refused by an op's dtype rule, a type the kernels refuse when the network compiles, or a
//! non-tensor value); `failed` (anything else, with the reason). A failure is a bug or a documented limit: the test fails when a case
//! fails that [`DOCUMENTED_LIMITS`] does not list, and when a listed case passes (so the list
//! stays true).
//!
//! Needs the cases: `scripts/fetch_onnx_tests.sh` (cache `target/onnx-tests`, or
//! `DYNRT_ONNX_TESTS_DIR`); without them the test is skipped with a message and fails when
//! `DYNRT_REQUIRE_ONNX_TESTS=1` (CI). Writes `<cache>/run-report.tsv` (one line per case:
//! name, status, reason, ops) and prints the counts and every failure.

use dynrt::gpu::{testing, Engine};
use dynrt::memory::predictor::Policy;
use dynrt::onnx::import::{self, ImportError};
use dynrt::onnx::testdata::{self, NodeTestCase, TestValue};
use dynrt::onnx::{HostTensor as OnnxTensor, LoadOptions};
use dynrt::runtime::{HostTensor, InferRequest, Network, NetworkOptions, RunError, RunOptions};
use dynrt::shape::DType;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Relative tolerance for floats.
const RTOL: f64 = 1e-3;
/// Absolute tolerance for floats.
const ATOL: f64 = 1e-7;

/// Cases that fail for a reason that is a limit of dynrt, not a bug: each reason with its
/// cases (also in docs/onnx.md, "Ops of the importer").
const DOCUMENTED_LIMITS: &[(&str, &[&str])] = &[
    (
        "Attention with nonpad_kv_seqlen (opset 24's padding lengths): not mapped",
        &["test_attention_4d_diff_heads_mask4d_padded_kv"],
    ),
    (
        "BatchNormalization in training mode (batch statistics and running-mean outputs): only the inference form is mapped",
        &[
            "test_batchnorm_epsilon_training_mode",
            "test_batchnorm_example_training_mode",
        ],
    ),
    (
        "GatherND with batch_dims above 0: only batch_dims = 0 is mapped (a gather over the merged leading axes)",
        &["test_gathernd_example_int32_batch_dim1"],
    ),
    (
        "CumSum whose axis is fed at run time: the kernel's layout needs the axis when the model is imported (a constant axis is mapped)",
        &["test_cumsum_1d_int32_exclusive", "test_cumsum_2d_int32"],
    ),
    (
        "Neg on i64 shape values (the expanded LayerNormalization's axis arithmetic): the elementwise unary ops take f32 only",
        &[
            "test_layer_normalization_2d_axis_negative_1_expanded",
            "test_layer_normalization_2d_axis_negative_1_expanded_ver18",
            "test_layer_normalization_2d_axis_negative_2_expanded",
            "test_layer_normalization_2d_axis_negative_2_expanded_ver18",
            "test_layer_normalization_3d_axis_negative_1_epsilon_expanded",
            "test_layer_normalization_3d_axis_negative_1_epsilon_expanded_ver18",
            "test_layer_normalization_3d_axis_negative_2_epsilon_expanded",
            "test_layer_normalization_3d_axis_negative_2_epsilon_expanded_ver18",
            "test_layer_normalization_3d_axis_negative_3_epsilon_expanded",
            "test_layer_normalization_3d_axis_negative_3_epsilon_expanded_ver18",
            "test_layer_normalization_4d_axis_negative_1_expanded",
            "test_layer_normalization_4d_axis_negative_1_expanded_ver18",
            "test_layer_normalization_4d_axis_negative_2_expanded",
            "test_layer_normalization_4d_axis_negative_2_expanded_ver18",
            "test_layer_normalization_4d_axis_negative_3_expanded",
            "test_layer_normalization_4d_axis_negative_3_expanded_ver18",
            "test_layer_normalization_4d_axis_negative_4_expanded",
            "test_layer_normalization_4d_axis_negative_4_expanded_ver18",
            "test_layer_normalization_default_axis_expanded",
            "test_layer_normalization_default_axis_expanded_ver18",
        ],
    ),
    (
        "MaxPool on u8, or asked for its Indices output: the pooling kernels take f32 and write values only",
        &[
            "test_maxpool_2d_uint8",
            "test_maxpool_with_argmax_2d_precomputed_pads",
            "test_maxpool_with_argmax_2d_precomputed_strides",
        ],
    ),
    (
        "Range of floats fed at run time (also the expanded Blackman/Hamming/Hann windows, whose Range runs to the size cast to float): its length needs the values on the host, which carries integer shape data only",
        &[
            "test_blackmanwindow_expanded",
            "test_blackmanwindow_symmetric_expanded",
            "test_hammingwindow_expanded",
            "test_hammingwindow_symmetric_expanded",
            "test_hannwindow_expanded",
            "test_hannwindow_symmetric_expanded",
            "test_range_float_type_positive_delta",
        ],
    ),
    (
        "ReduceMax / ReduceMin of bools: the reduction kernels take f32 (integer reductions run on the host as shape data)",
        &["test_reduce_max_bool_inputs", "test_reduce_min_bool_inputs"],
    ),
];

/// The documented reason `name` fails, if it is a documented limit.
fn limit_of(name: &str) -> Option<&'static str> {
    DOCUMENTED_LIMITS
        .iter()
        .find(|(_, cases)| cases.contains(&name))
        .map(|(reason, _)| *reason)
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Status {
    Passed,
    UnsupportedOp,
    UnsupportedType,
    Failed,
}

impl Status {
    fn name(&self) -> &'static str {
        match self {
            Status::Passed => "passed",
            Status::UnsupportedOp => "unsupported op",
            Status::UnsupportedType => "unsupported type",
            Status::Failed => "failed",
        }
    }
}

fn unsupported_type(reason: impl Into<String>) -> (Status, String) {
    (Status::UnsupportedType, reason.into())
}

fn failed(reason: impl Into<String>) -> (Status, String) {
    (Status::Failed, reason.into())
}

/// Compares one output; `Err` says how it differs.
fn compare(name: &str, got: &HostTensor, want: &OnnxTensor) -> Result<(), String> {
    let want_dtype = import::dtype_of(want.dtype())
        .ok_or_else(|| format!("{name}: expected type {} is not a dynrt type", want.dtype()))?;
    if got.dtype != want_dtype {
        return Err(format!(
            "{name}: type {} instead of {want_dtype}",
            got.dtype
        ));
    }
    if got.shape.dims() != want.dims() {
        return Err(format!(
            "{name}: shape {:?} instead of {:?}",
            got.shape.dims(),
            want.dims()
        ));
    }
    let expected = import::runtime_tensor(name, want).map_err(|e| e.to_string())?;
    if got.dtype.is_int() {
        let (g, w) = (
            dynrt::tensor::decode_i64(got.dtype, &got.bytes).map_err(|e| e.to_string())?,
            dynrt::tensor::decode_i64(got.dtype, &expected.bytes).map_err(|e| e.to_string())?,
        );
        if let Some(i) = (0..g.len()).find(|&i| g[i] != w[i]) {
            return Err(format!(
                "{name}: element {i} is {} instead of {} ({} of {} differ)",
                g[i],
                w[i],
                (0..g.len()).filter(|&i| g[i] != w[i]).count(),
                g.len()
            ));
        }
        return Ok(());
    }
    let (g, w) = (got.to_f32(), expected.to_f32());
    let bad = |i: usize| {
        let (a, e) = (f64::from(g[i]), f64::from(w[i]));
        if e.is_nan() || a.is_nan() {
            return e.is_nan() != a.is_nan();
        }
        if e.is_infinite() || a.is_infinite() {
            return a != e;
        }
        (a - e).abs() > ATOL + RTOL * e.abs()
    };
    if let Some(i) = (0..g.len()).find(|&i| bad(i)) {
        return Err(format!(
            "{name}: element {i} is {} instead of {} ({} of {} outside rtol {RTOL} atol {ATOL})",
            g[i],
            w[i],
            (0..g.len()).filter(|&i| bad(i)).count(),
            g.len()
        ));
    }
    Ok(())
}

/// Imports, compiles and runs one case on `engine`.
fn run_case(engine: &Engine, case: &NodeTestCase) -> (Status, String) {
    let imported = match import::import(&case.model) {
        Ok(m) => m,
        Err(e @ ImportError::Unsupported { .. }) => return (Status::UnsupportedOp, e.to_string()),
        Err(e @ (ImportError::UnsupportedDType { .. } | ImportError::NotATensor { .. })) => {
            return unsupported_type(e.to_string())
        }
        // Half floats are refused by the ops' dtype rules (no f16 arithmetic without
        // SHADER_F16), a documented limit rather than a failure.
        Err(
            e @ ImportError::NodeDType {
                got: DType::F16 | DType::BF16,
                ..
            },
        ) => return unsupported_type(e.to_string()),
        Err(e) => return failed(format!("import: {e}")),
    };
    let network = match Network::compile(engine, imported.graph.clone(), NetworkOptions::default())
    {
        Ok(n) => n,
        Err(e @ RunError::UnsupportedDType { .. }) => return unsupported_type(e.to_string()),
        Err(e) => return failed(format!("compile: {e}")),
    };
    // Poison on: a kernel that reads bytes nothing wrote shows as NaN or a wrong integer.
    let options = RunOptions {
        poison: true,
        ..RunOptions::new(Policy::OpenVino)
    };
    let mut request = match InferRequest::new(&network, options) {
        Ok(r) => r,
        Err(e) => return failed(format!("request: {e}")),
    };
    for set in &case.data_sets {
        let mut feeds: Vec<(String, HostTensor)> = Vec::new();
        for (value, input) in set.inputs.iter().zip(&imported.inputs) {
            let TestValue::Tensor(t) = value else {
                return unsupported_type(format!("input `{}` is not a tensor", input.name));
            };
            match import::runtime_tensor(&input.name, t) {
                Ok(h) => feeds.push((input.name.clone(), h)),
                Err(e) => return unsupported_type(e.to_string()),
            }
        }
        let feeds: Vec<(&str, &HostTensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let read: Vec<&str> = imported.outputs.iter().map(|o| o.name.as_str()).collect();
        let outputs = match request.infer_blocking(&feeds, &read) {
            Ok(o) => o,
            Err(e) => return failed(format!("{}: run: {e}", set.name)),
        };
        for ((got, want), name) in outputs.iter().zip(&set.outputs).zip(&read) {
            let TestValue::Tensor(want) = want else {
                return unsupported_type(format!("output `{name}` is not a tensor"));
            };
            if let Err(e) = compare(name, got, want) {
                return failed(format!("{}: {e}", set.name));
            }
        }
    }
    (Status::Passed, String::new())
}

#[test]
fn node_test_cases_run_on_the_gpu() {
    let Some(dir) = testdata::dir_or_skip() else {
        return;
    };
    let Some(gpu) = testing::gpu_or_skip("node_test_cases_run_on_the_gpu") else {
        return;
    };
    let engine = Engine::new(gpu);
    let filter = std::env::var("DYNRT_NODE_TEST_FILTER").unwrap_or_default();
    let cases = testdata::list_cases(&dir).expect("list the cases");
    assert_eq!(cases.len(), 1765, "onnx==1.22.0 ships 1765 node test cases");

    let started = std::time::Instant::now();
    let mut counts: BTreeMap<Status, usize> = BTreeMap::new();
    let mut report = String::new();
    let mut failures = Vec::new();
    for path in &cases {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.contains(&filter) {
            continue;
        }
        let case = testdata::load_case(path, &LoadOptions::default()).unwrap_or_else(|e| {
            panic!("{name}: every case parses (tests/host/onnx_node_tests.rs): {e}")
        });
        let mut ops: Vec<&str> = case
            .model
            .graph
            .nodes
            .iter()
            .map(|n| n.op_type.as_str())
            .collect();
        ops.sort();
        ops.dedup();
        let (status, reason) = run_case(&engine, &case);
        if status == Status::Failed {
            failures.push((name.clone(), reason.clone()));
        }
        *counts.entry(status.clone()).or_default() += 1;
        let _ = writeln!(
            report,
            "{name}\t{}\t{}\t{}",
            status.name(),
            reason.replace(['\t', '\n'], " "),
            ops.join(",")
        );
    }
    let elapsed = started.elapsed();
    let report_path = dir.parent().unwrap().join("run-report.tsv");
    std::fs::write(&report_path, &report).expect("write the report");
    // Nothing is left allocated once every network and request is dropped.
    assert_eq!(
        engine.stats().total_current_bytes(),
        0,
        "bytes in use after the run"
    );

    let count = |s: Status| counts.get(&s).copied().unwrap_or(0);
    eprintln!(
        "node tests: {} passed, {} failed, {} unsupported op, {} unsupported type ({} cases, {:.1} s); per case: {}",
        count(Status::Passed),
        count(Status::Failed),
        count(Status::UnsupportedOp),
        count(Status::UnsupportedType),
        counts.values().sum::<usize>(),
        elapsed.as_secs_f64(),
        report_path.display()
    );
    let mut unexpected = Vec::new();
    for (name, reason) in &failures {
        match limit_of(name) {
            Some(limit) => eprintln!("FAILED {name} (documented limit: {limit}): {reason}"),
            None => {
                eprintln!("FAILED {name}: {reason}");
                unexpected.push(format!("{name}: {reason}"));
            }
        }
    }
    let listed_but_fine: Vec<&str> = DOCUMENTED_LIMITS
        .iter()
        .flat_map(|(_, cases)| cases.iter().copied())
        .filter(|n| n.contains(&filter) && !failures.iter().any(|(f, _)| f == n))
        .collect();
    assert!(
        unexpected.is_empty(),
        "{} cases fail that are not documented limits:\n{}",
        unexpected.len(),
        unexpected.join("\n")
    );
    assert!(
        filter.is_empty() || !counts.is_empty(),
        "DYNRT_NODE_TEST_FILTER={filter} matches no case"
    );
    assert!(
        listed_but_fine.is_empty(),
        "documented limits that no longer fail (remove them): {listed_but_fine:?}"
    );
    assert!(
        count(Status::Passed) > 0 || !filter.is_empty(),
        "no case passed: the harness is broken"
    );
}
