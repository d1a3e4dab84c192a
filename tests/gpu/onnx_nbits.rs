//! ONNX Runtime's 4-bit `MatMulNBits` (`com.microsoft`) through dynrt's importer and the
//! `linear` kernels, against ONNX Runtime's CPU provider on the same files.
//!
//! `scripts/nbits_ref.py cases` writes the models (ONNX Runtime's own quantizer,
//! `MatMulNBitsQuantizer`, at block sizes 32 (asymmetric and symmetric), 64 and 128, a partial
//! last block, a 3-D x; and hand-built nodes with float zero points and a bias, and with an odd
//! number of blocks per row), x, and two references: onnxruntime's output and numpy's reading
//! of the operator's definition (in f64). dynrt imports each file (the weight becomes one
//! `q4_nb` constant of 24 bytes per 32 weights, never f32) and runs it on every test adapter.
//!
//! Tolerance: |dynrt - ref| <= 2e-6 * K + 1e-5 (f32 sums over K terms of |x| < 1 and
//! |w| <= about 1 in another order; as the `linear` kernel tests).
//!
//! Without the Python venv or an adapter the test prints SKIP; `DYNRT_REQUIRE_MODEL=1` /
//! `DYNRT_REQUIRE_GPU=1` make that a failure.

use crate::common;

use dynrt::gpu::{testing, Engine};
use dynrt::graph::Op;
use dynrt::memory::predictor::Policy;
use dynrt::npy::read_npy_file;
use dynrt::onnx::import::runtime_tensor;
use dynrt::onnx::{import, LoadOptions, OnnxFile};
use dynrt::runtime::{HostTensor, InferRequest, Network, NetworkOptions, RunOptions};
use dynrt::shape::DType;
use std::path::Path;

/// An .npy file as a runtime tensor.
fn npy(path: &Path) -> HostTensor {
    let t = read_npy_file(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    runtime_tensor(&path.display().to_string(), &t).unwrap()
}

#[test]
fn matmul_nbits_matches_onnx_runtime_and_numpy() {
    let test = "matmul_nbits_matches_onnx_runtime_and_numpy";
    let Some(py) = common::python_or_skip(test) else {
        return;
    };
    let gpus = testing::gpus_or_skip(test);
    if gpus.is_empty() {
        return;
    }
    let dir = common::scratch(test);
    common::run_script(&py, "nbits_ref.py", &["cases", &dir.display().to_string()]);
    let cases = std::fs::read_to_string(dir.join("cases.txt")).unwrap();
    let cases: Vec<&str> = cases.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(cases.len(), 7, "{cases:?}");
    for gpu in gpus {
        let adapter = gpu.adapter_info().name.clone();
        let engine = Engine::new(gpu);
        for case in &cases {
            let d = dir.join(case);
            let model = OnnxFile::load(d.join("model.onnx"), &LoadOptions::default()).unwrap();
            let imported = import(&model).unwrap_or_else(|e| panic!("{case}: {e}"));
            // The weight is one q4_nb constant, 24 bytes per 32 weights.
            let g = &imported.graph;
            let weights: Vec<_> = g
                .order()
                .iter()
                .filter_map(|&id| match &g.node(id).op {
                    Op::Constant(c) if c.dtype == DType::Q4_NB => Some(c),
                    _ => None,
                })
                .collect();
            assert_eq!(weights.len(), 1, "{case}");
            let (n, k) = (weights[0].shape.dims()[0], weights[0].shape.dims()[1]);
            assert_eq!(
                weights[0].data.bytes().len() as u64,
                n * k / 32 * 24,
                "{case}"
            );

            let x = npy(&d.join("x.npy"));
            let net = Network::compile(&engine, imported.graph, NetworkOptions::default())
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            let mut req = InferRequest::new(&net, RunOptions::new(Policy::OpenVino)).unwrap();
            let out = req.infer_blocking(&[("x", &x)], &["y"]).unwrap();
            let y = out[0].to_f32();
            let tol = 2e-6 * k as f32 + 1e-5;
            for reference in ["ort", "numpy"] {
                let r = npy(&d.join(format!("{reference}.npy")));
                assert_eq!(out[0].shape, r.shape, "{case}");
                let r = r.to_f32();
                let worst = y
                    .iter()
                    .zip(&r)
                    .fold(0f32, |a, (p, q)| a.max((p - q).abs()));
                assert!(
                    worst <= tol,
                    "{case} on {}: |dynrt - {reference}| = {worst} > {tol}",
                    adapter
                );
                eprintln!(
                    "{case} on {}: |dynrt - {reference}| <= {worst:.3e}",
                    adapter
                );
            }
        }
    }
}
