//! ONNX models through the importer and the runtime on a real adapter: a shape chain that
//! stays on the host while its reshape follows the symbols, and the typed errors of bad input,
//! negative dims and refused kernels, with nothing left allocated after a failure.
//!
//! Models: `fixtures/onnx/` (`scripts/gen_onnx_fixtures.py`).

use dynrt::gpu::{testing, Engine};
use dynrt::graph::{reference, GraphError};
use dynrt::memory::predictor::Policy;
use dynrt::onnx::{import, HostTensor as OnnxTensor, LoadOptions, OnnxError, OnnxFile};
use dynrt::runtime::{HostTensor, InferRequest, Network, NetworkOptions, RunError, RunOptions};
use dynrt::shape::{DType, Shape};

fn model(name: &str) -> OnnxFile {
    let path = crate::common::repo().join("fixtures/onnx").join(name);
    OnnxFile::load(&path, &LoadOptions::default()).expect("fixture loads")
}

fn engine(test: &str) -> Option<Engine> {
    testing::gpu_or_skip(test).map(Engine::new)
}

fn ramp(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32 - n as f32 / 2.0).collect()
}

#[test]
fn a_shape_chain_stays_on_the_host_while_its_reshape_follows_the_symbols() {
    let imported = import(&model("shape_chain.onnx")).unwrap();
    let g = &imported.graph;
    for label in [
        "shape",
        "batch_seq",
        "batch_2seq",
        "target",
        "is_open",
        "closed",
    ] {
        let id = g.find(label).unwrap_or_else(|| panic!("no node {label}"));
        assert!(
            g.is_shape_only(id),
            "`{label}` should be computed on the host"
        );
    }
    let Some(engine) = engine("shape_chain") else {
        return;
    };
    let net = Network::compile(&engine, imported.graph.clone(), NetworkOptions::default()).unwrap();
    let mut req = InferRequest::new(&net, RunOptions::new(Policy::OpenVino)).unwrap();
    for (batch, seq) in [(2u64, 3u64), (2, 5), (1, 1), (2, 5)] {
        let n = (batch * seq * 8) as usize;
        let xs = ramp(n);
        let x = HostTensor::f32(Shape::new(vec![batch, seq, 8]), &xs);
        let before = req.stats().dispatches;
        let out = req.infer_blocking(&[("x", &x)], &["y"]).unwrap();
        // One dispatch per iteration: the relu. The chain runs on the host and the reshape
        // is a buffer copy.
        assert_eq!(
            req.stats().dispatches - before,
            1,
            "batch {batch} seq {seq}"
        );
        assert_eq!(out[0].shape, Shape::new(vec![batch, 2 * seq, 4]));
        let want: Vec<f32> = xs.iter().map(|v| v.max(0.0)).collect();
        assert_eq!(out[0].to_f32(), want);
        // The CPU reference computes the chain its own way and agrees.
        let r = reference::evaluate(
            &net.graph().clone(),
            &[("x", Shape::new(vec![batch, seq, 8]), xs.clone())],
        )
        .unwrap();
        assert_eq!(r[0].0, out[0].shape);
    }
    assert_eq!(req.stats().iterations, 4);
}

#[test]
fn bad_inputs_and_negative_dims_are_typed_errors_naming_the_input_or_node() {
    let m = model("shape_chain.onnx");
    // Checked against the model before anything is allocated.
    let zeros = |dims: Vec<u64>| {
        let n = dims.iter().product::<u64>() as usize;
        vec![(
            "x".to_string(),
            OnnxTensor::from_f32(dims, &vec![0.0; n]).unwrap(),
        )]
    };
    let rank = dynrt::onnx::bind_inputs(&m.graph, &zeros(vec![2, 8]));
    assert!(
        matches!(&rank, Err(OnnxError::InputRank { input, expected: 3, actual: 2 }) if input == "x"),
        "{rank:?}"
    );
    let dim = dynrt::onnx::bind_inputs(&m.graph, &zeros(vec![2, 3, 7]));
    assert!(
        matches!(&dim, Err(OnnxError::InputDim { input, index: 2, expected: 8, actual: 7 }) if input == "x"),
        "{dim:?}"
    );
    let symbols = dynrt::onnx::bind_inputs(&m.graph, &zeros(vec![2, 3, 8])).unwrap();
    assert_eq!(symbols.get("seq"), Some(&3));
    let ints = vec![(
        "x".to_string(),
        OnnxTensor::from_i64(vec![1, 1, 8], &[0; 8]).unwrap(),
    )];
    assert!(matches!(
        dynrt::onnx::bind_inputs(&m.graph, &ints),
        Err(OnnxError::InputType { input, .. }) if input == "x"
    ));

    let Some(engine) = engine("bad_inputs") else {
        return;
    };
    let imported = import(&m).unwrap();
    let net = Network::compile(&engine, imported.graph, NetworkOptions::default()).unwrap();
    let mut req = InferRequest::new(&net, RunOptions::new(Policy::OpenVino)).unwrap();
    // The runtime checks too, naming the input.
    let wrong_rank = HostTensor::f32(Shape::new(vec![2, 8]), &[0.0; 16]);
    let err = req
        .infer_blocking(&[("x", &wrong_rank)], &["y"])
        .unwrap_err();
    assert!(
        matches!(&err, RunError::Graph(GraphError::InputShape { node, .. }) if node == "x"),
        "{err}"
    );
    let wrong_dim = HostTensor::f32(Shape::new(vec![1, 2, 4]), &[0.0; 8]);
    let err = req
        .infer_blocking(&[("x", &wrong_dim)], &["y"])
        .unwrap_err();
    assert!(err.to_string().contains("`x`"), "{err}");
    let wrong_type = HostTensor::i32(Shape::new(vec![1, 1, 8]), &[0; 8]);
    let err = req
        .infer_blocking(&[("x", &wrong_type)], &["y"])
        .unwrap_err();
    assert!(
        matches!(&err, RunError::BadInput { input, .. } if input == "x"),
        "{err}"
    );

    // A shape chain that computes a negative dimension: an error naming the reshape, and the
    // request stays usable.
    let imported = import(&model("negative_dim.onnx")).unwrap();
    let net = Network::compile(&engine, imported.graph, NetworkOptions::default()).unwrap();
    let mut req = InferRequest::new(&net, RunOptions::new(Policy::OpenVino)).unwrap();
    let short = HostTensor::f32(Shape::new(vec![3]), &[1.0, 2.0, 3.0]);
    let err = req.infer_blocking(&[("x", &short)], &["y"]).unwrap_err();
    assert!(
        matches!(&err, RunError::Graph(GraphError::Infer { node, .. }) if node == "y"),
        "{err}"
    );
    assert!(err.to_string().contains("negative dimension"), "{err}");
    let ten = HostTensor::f32(Shape::new(vec![10]), &ramp(10));
    let out = req.infer_blocking(&[("x", &ten)], &["y"]).unwrap();
    assert_eq!(out[0].shape, Shape::new(vec![5, 2]));
    assert_eq!(out[0].to_f32(), ramp(10));
}

#[test]
fn a_refused_kernel_fails_the_load_before_anything_is_allocated() {
    let imported = import(&model("int_div.onnx")).unwrap();
    assert_eq!(imported.outputs[0].dtype, DType::I64);
    let Some(engine) = engine("refused_kernel") else {
        return;
    };
    let before = engine.stats().total_current_bytes();
    let err = Network::compile(&engine, imported.graph, NetworkOptions::default()).unwrap_err();
    assert!(
        matches!(&err, RunError::UnsupportedDType { node, op: "div", .. } if node == "q"),
        "{err}"
    );
    assert_eq!(engine.stats().total_current_bytes(), before);
    assert_eq!(before, 0);
    // A model that compiles and runs gives everything back when dropped.
    let ok = import(&model("shape_chain.onnx")).unwrap();
    let net = Network::compile(&engine, ok.graph, NetworkOptions::default()).unwrap();
    let mut req = InferRequest::new(&net, RunOptions::new(Policy::OpenVino)).unwrap();
    let x = HostTensor::f32(Shape::new(vec![1, 2, 8]), &ramp(16));
    req.infer_blocking(&[("x", &x)], &["y"]).unwrap();
    assert!(engine.stats().total_current_bytes() > 0);
    drop(req);
    drop(net);
    assert_eq!(engine.stats().total_current_bytes(), 0);
}
