//! Loader tests on models built from the wire structs: every check of [`OnnxFile`] fails
//! with its typed error, naming the node, value or initializer.

use bytes::Bytes;
use prost::Message;

use super::external::{BytesResolver, NoExternalData};
use super::proto::*;
use super::*;

pub(crate) fn value(name: &str, elem: i32, dims: &[&str]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d.parse::<i64>() {
                Ok(v) => DimensionValue::DimValue(v),
                Err(_) => DimensionValue::DimParam(d.to_string()),
            }),
            denotation: String::new(),
        })
        .collect();
    ValueInfoProto {
        name: name.to_string(),
        r#type: Some(TypeProto {
            value: Some(TypeValue::Tensor(TypeProtoTensor {
                elem_type: elem,
                shape: Some(TensorShapeProto { dim }),
            })),
            denotation: String::new(),
        }),
        doc_string: String::new(),
    }
}

pub(crate) fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        op_type: op.to_string(),
        name: name.to_string(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

pub(crate) fn raw_f32(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
    TensorProto {
        name: name.to_string(),
        data_type: 1,
        dims: dims.to_vec(),
        raw_data: Some(Bytes::from(
            values
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        )),
        ..Default::default()
    }
}

/// A model of IR version 8 importing the default domain at opset 17, around `graph`.
pub(crate) fn opset17(graph: GraphProto) -> ModelProto {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(graph),
        ..Default::default()
    }
}

/// y = MatMul(x [batch, 4], w [4, 2]) + b, opset 17.
fn model() -> ModelProto {
    opset17(GraphProto {
        name: "g".to_string(),
        node: vec![
            node("MatMul", "mm", &["x", "w"], &["xw"]),
            node("Add", "add", &["xw", "b"], &["y"]),
        ],
        initializer: vec![
            raw_f32("w", &[4, 2], &[1.0; 8]),
            TensorProto {
                name: "b".to_string(),
                data_type: 1,
                dims: vec![2],
                float_data: vec![0.5, -0.5],
                ..Default::default()
            },
        ],
        input: vec![value("x", 1, &["batch", "4"])],
        output: vec![value("y", 1, &["batch", "2"])],
        ..Default::default()
    })
}

pub(crate) fn load(m: &ModelProto) -> Result<OnnxFile, OnnxError> {
    OnnxFile::from_bytes(
        Bytes::from(m.encode_to_vec()),
        &NoExternalData,
        &LoadOptions::default(),
    )
}

fn graph_mut(m: &mut ModelProto) -> &mut GraphProto {
    m.graph.as_mut().unwrap()
}

#[test]
fn a_valid_model_loads_with_its_types_and_data() {
    let bytes = Bytes::from(model().encode_to_vec());
    let m = OnnxFile::from_bytes(bytes.clone(), &NoExternalData, &LoadOptions::default()).unwrap();
    assert_eq!(m.opset(""), Some(17));
    assert_eq!(m.opset("ai.onnx"), Some(17));
    let x = m.graph.runtime_inputs().next().unwrap();
    assert_eq!(x.name, "x");
    let t = x.ty.as_ref().unwrap().as_tensor().unwrap();
    assert_eq!(t.dtype, Some(TensorDType::F32));
    assert_eq!(
        t.dims.as_deref(),
        Some(&[OnnxDim::Symbolic("batch".into()), OnnxDim::Fixed(4)][..])
    );
    let w = m.graph.initializer("w").unwrap();
    assert_eq!(
        (w.dtype, w.dims.as_slice(), w.size_bytes),
        (TensorDType::F32, &[4u64, 2][..], 32)
    );
    assert_eq!(w.location, DataLocation::Inline);
    // raw_data is a slice of the model buffer: not copied.
    let data = w.tensor().unwrap().bytes().unwrap();
    let range = bytes.as_ptr() as usize..bytes.as_ptr() as usize + bytes.len();
    assert!(
        range.contains(&(data.as_ptr() as usize)),
        "raw_data was copied"
    );
    let b = m.graph.initializer("b").unwrap().tensor().unwrap();
    assert_eq!(b.to_f64_vec().unwrap(), vec![0.5, -0.5]);
    assert_eq!(m.graph.nodes[1].label(), "add");
}

#[test]
fn truncated_and_malformed_bytes_are_errors() {
    let full = model().encode_to_vec();
    let mut decode_errors = 0;
    for cut in 0..full.len() {
        // A cut at a field boundary can still be a valid (smaller) model; a cut inside a
        // field never is. Neither may panic.
        if let Err(OnnxError::Decode { .. }) = OnnxFile::from_bytes(
            Bytes::copy_from_slice(&full[..cut]),
            &NoExternalData,
            &LoadOptions::default(),
        ) {
            decode_errors += 1;
        }
    }
    assert!(
        decode_errors > full.len() / 2,
        "{decode_errors} of {}",
        full.len()
    );
    let err = load_bytes(&[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]).unwrap_err();
    assert!(matches!(err, OnnxError::Decode { .. }), "{err}");
    let err = load_bytes(b"this is not an onnx file at all").unwrap_err();
    assert!(matches!(err, OnnxError::Decode { .. }), "{err}");
    assert!(matches!(load_bytes(&[]).unwrap_err(), OnnxError::NoGraph));
}

fn load_bytes(b: &[u8]) -> Result<OnnxFile, OnnxError> {
    OnnxFile::from_bytes(
        Bytes::copy_from_slice(b),
        &NoExternalData,
        &LoadOptions::default(),
    )
}

#[test]
fn opsets_outside_the_supported_range_are_refused() {
    for version in [0, 28, 1000] {
        let mut m = model();
        m.opset_import[0].version = version;
        match load(&m).unwrap_err() {
            OnnxError::UnsupportedOpset {
                domain,
                version: v,
                min: 1,
                max: 27,
            } => assert_eq!((domain.as_str(), v), ("", version)),
            e => panic!("{e}"),
        }
    }
    for version in [13, 17, 21, 27] {
        let mut m = model();
        m.opset_import[0].version = version;
        load(&m).unwrap();
    }
    let mut m = model();
    m.opset_import.push(OperatorSetIdProto {
        domain: "ai.onnx".to_string(),
        version: 18,
    });
    assert!(matches!(
        load(&m).unwrap_err(),
        OnnxError::DuplicateOpset {
            first: 17,
            second: 18,
            ..
        }
    ));
    let mut m = model();
    graph_mut(&mut m).node[0].domain = "com.microsoft".to_string();
    match load(&m).unwrap_err() {
        OnnxError::MissingOpset { node, domain, .. } => {
            assert_eq!((node.as_str(), domain.as_str()), ("mm", "com.microsoft"))
        }
        e => panic!("{e}"),
    }
    // A narrower range, as an embedder may ask for.
    let options = LoadOptions {
        default_domain_opsets: 13..=21,
        ..LoadOptions::default()
    };
    let mut m = model();
    m.opset_import[0].version = 22;
    let err = OnnxFile::from_bytes(Bytes::from(m.encode_to_vec()), &NoExternalData, &options);
    assert!(matches!(
        err,
        Err(OnnxError::UnsupportedOpset {
            version: 22,
            max: 21,
            ..
        })
    ));
}

#[test]
fn graph_checks_name_the_node() {
    let mut m = model();
    graph_mut(&mut m).node[1].input[0] = "nowhere".to_string();
    match load(&m).unwrap_err() {
        OnnxError::UndefinedInput { node, input, .. } => {
            assert_eq!((node.as_str(), input.as_str()), ("add", "nowhere"))
        }
        e => panic!("{e}"),
    }
    // Nodes out of order: Add reads xw before MatMul defines it.
    let mut m = model();
    graph_mut(&mut m).node.swap(0, 1);
    assert!(matches!(
        load(&m).unwrap_err(),
        OnnxError::UndefinedInput { .. }
    ));
    // Two nodes write `xw`; an unnamed node is called op_type#index.
    let mut m = model();
    let mut dup = node("Relu", "", &["x"], &["xw"]);
    dup.name.clear();
    graph_mut(&mut m).node.insert(1, dup);
    match load(&m).unwrap_err() {
        OnnxError::DuplicateName {
            name,
            first,
            second,
            ..
        } => {
            assert_eq!(name, "xw");
            assert_eq!(first, "node `mm`");
            assert_eq!(second, "node `Relu#1`");
        }
        e => panic!("{e}"),
    }
    // An input named like a node output.
    let mut m = model();
    graph_mut(&mut m).input.push(value("xw", 1, &["2"]));
    assert!(matches!(
        load(&m).unwrap_err(),
        OnnxError::DuplicateName { .. }
    ));
    // An input named like an initializer is its default: allowed.
    let mut m = model();
    graph_mut(&mut m).input.push(value("w", 1, &["4", "2"]));
    let loaded = load(&m).unwrap();
    assert_eq!(loaded.graph.inputs.len(), 2);
    assert_eq!(loaded.graph.runtime_inputs().count(), 1);
    // A graph output nothing defines.
    let mut m = model();
    graph_mut(&mut m).output.push(value("ghost", 1, &[]));
    assert!(
        matches!(load(&m).unwrap_err(), OnnxError::UndefinedOutput { output, .. } if output == "ghost")
    );
    // An initializer whose data does not fit its dims names the initializer.
    let mut m = model();
    graph_mut(&mut m).initializer[0].dims = vec![4, 3];
    match load(&m).unwrap_err() {
        OnnxError::Tensor { tensor, cause } => {
            assert_eq!(tensor, "w");
            assert!(matches!(
                cause,
                TensorError::DataLength {
                    expected: 48,
                    actual: 32,
                    ..
                }
            ));
        }
        e => panic!("{e}"),
    }
    let mut m = model();
    graph_mut(&mut m).input[0] = value("x", 1, &["-3"]);
    assert!(matches!(load(&m).unwrap_err(), OnnxError::Type { value, .. } if value == "x"));
    let mut m = model();
    graph_mut(&mut m).initializer[1].data_type = 99;
    assert!(matches!(
        load(&m).unwrap_err(),
        OnnxError::Tensor {
            cause: TensorError::UnknownDType { code: 99 },
            ..
        }
    ));
}

pub(crate) fn attr(name: &str, ty: i32) -> AttributeProto {
    AttributeProto {
        name: name.to_string(),
        r#type: ty,
        ..Default::default()
    }
}

#[test]
fn attributes_and_constants() {
    let mut m = model();
    let mut c = node("Constant", "c", &[], &["k"]);
    c.attribute.push(AttributeProto {
        ints: vec![1, 2, 3],
        ..attr("value_ints", attribute_type::INTS)
    });
    graph_mut(&mut m).node.push(c.clone());
    let loaded = load(&m).unwrap();
    let k = loaded.graph.nodes[2].constant_value().unwrap();
    assert_eq!((k.dtype(), k.dims()), (TensorDType::I64, &[3u64][..]));
    assert_eq!(k.to_i64_vec().unwrap(), vec![1, 2, 3]);

    // Two values.
    let mut two = c.clone();
    two.attribute.push(AttributeProto {
        f: Some(1.0),
        ..attr("value_float", attribute_type::FLOAT)
    });
    let mut m = model();
    graph_mut(&mut m).node.push(two);
    assert!(matches!(load(&m).unwrap_err(), OnnxError::Constant { node, .. } if node == "c"));
    // No value.
    let mut m = model();
    graph_mut(&mut m)
        .node
        .push(node("Constant", "c0", &[], &["k"]));
    assert!(matches!(load(&m).unwrap_err(), OnnxError::Constant { node, .. } if node == "c0"));
    // A tensor attribute with bad data.
    let mut bad = node("Constant", "ct", &[], &["k"]);
    bad.attribute.push(AttributeProto {
        t: Some(raw_f32("", &[3], &[1.0, 2.0])),
        ..attr("value", attribute_type::TENSOR)
    });
    let mut m = model();
    graph_mut(&mut m).node.push(bad);
    assert!(
        matches!(load(&m).unwrap_err(), OnnxError::Tensor { tensor, .. } if tensor == "ct/value")
    );
    // Duplicate attribute names; an unknown attribute type; a missing tensor value.
    let mut n = node("Softmax", "sm", &["y"], &["z"]);
    n.attribute = vec![
        AttributeProto {
            i: Some(-1),
            ..attr("axis", attribute_type::INT)
        },
        AttributeProto {
            i: Some(1),
            ..attr("axis", attribute_type::INT)
        },
    ];
    let mut m = model();
    graph_mut(&mut m).node.push(n.clone());
    assert!(
        matches!(load(&m).unwrap_err(), OnnxError::Attribute { node, attribute, .. } if node == "sm" && attribute == "axis")
    );
    n.attribute = vec![attr("axis", 42)];
    let mut m = model();
    graph_mut(&mut m).node.push(n.clone());
    assert!(matches!(load(&m).unwrap_err(), OnnxError::Attribute { .. }));
    n.attribute = vec![attr("weights", attribute_type::TENSOR)];
    let mut m = model();
    graph_mut(&mut m).node.push(n.clone());
    assert!(matches!(load(&m).unwrap_err(), OnnxError::Attribute { .. }));
    // An untyped attribute (old writers) takes the type of its one value.
    n.attribute = vec![AttributeProto {
        i: Some(-1),
        ..attr("axis", attribute_type::UNDEFINED)
    }];
    let mut m = model();
    graph_mut(&mut m).node.push(n);
    let loaded = load(&m).unwrap();
    assert_eq!(
        loaded.graph.nodes[2].attribute("axis"),
        Some(&AttributeValue::Int(-1))
    );
}

#[test]
fn subgraphs_see_outer_values_and_are_checked() {
    let branch = |name: &str, reads: &str| GraphProto {
        name: name.to_string(),
        node: vec![node(
            "Identity",
            &format!("{name}_id"),
            &[reads],
            &[&format!("{name}_out")],
        )],
        output: vec![value(&format!("{name}_out"), 1, &[])],
        ..Default::default()
    };
    let mut iff = node("If", "if", &["cond"], &["r"]);
    iff.attribute = vec![
        AttributeProto {
            g: Some(branch("then", "y")),
            ..attr("then_branch", attribute_type::GRAPH)
        },
        AttributeProto {
            g: Some(branch("else", "w")),
            ..attr("else_branch", attribute_type::GRAPH)
        },
    ];
    let mut m = model();
    graph_mut(&mut m).input.push(value("cond", 9, &[]));
    graph_mut(&mut m).node.push(iff.clone());
    let loaded = load(&m).unwrap();
    assert_eq!(loaded.graph.walk_nodes().len(), 5);
    // A branch that reads a value defined nowhere.
    iff.attribute[1].g = Some(branch("else", "missing"));
    let mut m = model();
    graph_mut(&mut m).input.push(value("cond", 9, &[]));
    graph_mut(&mut m).node.push(iff);
    match load(&m).unwrap_err() {
        OnnxError::UndefinedInput { node, input, .. } => {
            assert_eq!((node.as_str(), input.as_str()), ("else_id", "missing"))
        }
        e => panic!("{e}"),
    }
}

#[test]
fn external_data_through_a_bytes_resolver() {
    let mut m = model();
    let w = &mut graph_mut(&mut m).initializer[0];
    w.raw_data = None;
    w.data_location = data_location::EXTERNAL;
    w.external_data = vec![
        StringStringEntryProto {
            key: "location".into(),
            value: "w.bin".into(),
        },
        StringStringEntryProto {
            key: "offset".into(),
            value: "4".into(),
        },
        StringStringEntryProto {
            key: "length".into(),
            value: "32".into(),
        },
    ];
    let bytes = Bytes::from(m.encode_to_vec());
    let file = Bytes::from((0u8..40).collect::<Vec<u8>>());
    let mut res = BytesResolver::new();
    res.insert("w.bin", file.clone());
    let loaded = OnnxFile::from_bytes(bytes.clone(), &res, &LoadOptions::default()).unwrap();
    let w = loaded.graph.initializer("w").unwrap();
    assert_eq!(w.tensor().unwrap().bytes().unwrap().as_ref(), &file[4..36]);
    assert!(
        matches!(&w.location, DataLocation::External(r) if r.offset == 4 && r.length == Some(32))
    );
    // Check-only mode leaves the data unread but still checks the range.
    let check = LoadOptions {
        read_external: false,
        ..LoadOptions::default()
    };
    let loaded = OnnxFile::from_bytes(bytes.clone(), &res, &check).unwrap();
    assert!(loaded.graph.initializer("w").unwrap().tensor().is_none());
    // A file too short for the range, and no file at all.
    let mut short = BytesResolver::new();
    short.insert("w.bin", file.slice(..30));
    match OnnxFile::from_bytes(bytes.clone(), &short, &check).unwrap_err() {
        OnnxError::External { initializer, cause } => {
            assert_eq!(initializer, "w");
            assert!(matches!(
                cause,
                ExternalDataError::OutOfRange { file_bytes: 30, .. }
            ));
        }
        e => panic!("{e}"),
    }
    assert!(matches!(
        OnnxFile::from_bytes(bytes, &NoExternalData, &LoadOptions::default()).unwrap_err(),
        OnnxError::External {
            cause: ExternalDataError::Missing { .. },
            ..
        }
    ));
    // A location that climbs out of the folder is refused before any resolver sees it.
    graph_mut(&mut m).initializer[0].external_data[0].value = "../w.bin".into();
    let err = OnnxFile::from_bytes(
        Bytes::from(m.encode_to_vec()),
        &res,
        &LoadOptions::default(),
    );
    assert!(matches!(
        err.unwrap_err(),
        OnnxError::External {
            cause: ExternalDataError::OutsideFolder { .. },
            ..
        }
    ));
}

#[test]
fn feeds_are_checked_and_bind_symbols() {
    let mut m = model();
    graph_mut(&mut m)
        .input
        .push(value("past", 1, &["batch", "3", "past_len", "2"]));
    let loaded = load(&m).unwrap();
    let g = &loaded.graph;
    let f32s = |dims: &[u64]| {
        let n = dims.iter().product::<u64>() as usize;
        HostTensor::from_f32(dims.to_vec(), &vec![0.0; n]).unwrap()
    };
    let ok = [
        ("x".to_string(), f32s(&[2, 4])),
        ("past".to_string(), f32s(&[2, 3, 0, 2])),
    ];
    let symbols = bind_inputs(g, &ok).unwrap();
    assert_eq!(symbols.get("batch"), Some(&2));
    assert_eq!(symbols.get("past_len"), Some(&0));
    let err = |feeds: &[(String, HostTensor)]| bind_inputs(g, feeds).unwrap_err();
    assert!(matches!(err(&ok[..1]), OnnxError::MissingInput { input } if input == "past"));
    let conflict = [ok[0].clone(), ("past".to_string(), f32s(&[3, 3, 0, 2]))];
    assert!(
        matches!(err(&conflict), OnnxError::SymbolConflict { symbol, first_value: 2, value: 3, .. } if symbol == "batch")
    );
    let fixed = [("x".to_string(), f32s(&[2, 5])), ok[1].clone()];
    assert!(matches!(
        err(&fixed),
        OnnxError::InputDim {
            index: 1,
            expected: 4,
            actual: 5,
            ..
        }
    ));
    let rank = [("x".to_string(), f32s(&[8])), ok[1].clone()];
    assert!(matches!(
        err(&rank),
        OnnxError::InputRank {
            expected: 2,
            actual: 1,
            ..
        }
    ));
    let ids = HostTensor::from_i64(vec![2, 4], &[0; 8]).unwrap();
    let dtype = [("x".to_string(), ids), ok[1].clone()];
    assert!(matches!(err(&dtype), OnnxError::InputType { input, .. } if input == "x"));
    let unknown = [ok[0].clone(), ok[1].clone(), ("y".to_string(), f32s(&[1]))];
    assert!(matches!(err(&unknown), OnnxError::UnknownInput { input } if input == "y"));
    let twice = [ok[0].clone(), ok[0].clone()];
    assert!(matches!(err(&twice), OnnxError::DuplicateInput { .. }));
    assert_eq!(
        parse_input_arg("input_ids=a=b.npy").unwrap(),
        ("input_ids".into(), "a=b.npy".into())
    );
    assert!(parse_input_arg("no_equals").is_err());
    assert!(parse_input_arg("=x.npy").is_err());
}
