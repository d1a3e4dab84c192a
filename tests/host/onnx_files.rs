//! ONNX files on disk: external data beside the model (present, missing, too short, outside
//! the folder through `..` or a symbolic link), opsets out of range, `.npy` fixtures, and
//! `dynrt inspect` end to end.

use dynrt::onnx::{
    DataLocation, ExternalDataError, LoadOptions, OnnxDim, OnnxError, OnnxFile, TensorDType,
};
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixtures() -> PathBuf {
    crate::common::repo().join("fixtures/onnx")
}

/// A fresh scratch folder for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = crate::common::tmpdir().join("onnx_files").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Replaces every occurrence of `from` by `to` (same length, so protobuf lengths stay valid).
fn patch(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let mut out = bytes.to_vec();
    let mut found = 0;
    for i in 0..=out.len() - from.len() {
        if &out[i..i + from.len()] == from {
            out[i..i + from.len()].copy_from_slice(to);
            found += 1;
        }
    }
    assert!(found > 0, "pattern not found");
    out
}

fn external_error(path: &Path) -> (String, ExternalDataError) {
    match OnnxFile::load(path, &LoadOptions::default()) {
        Err(OnnxError::External { initializer, cause }) => (initializer, cause),
        other => panic!("expected an external-data error, got {other:?}"),
    }
}

#[test]
fn external_data_is_read_from_the_models_folder() {
    let m = OnnxFile::load(fixtures().join("external.onnx"), &LoadOptions::default()).unwrap();
    let big = m.graph.initializer("big").unwrap();
    assert!(
        matches!(&big.location, DataLocation::External(r) if r.location == "external.bin" && r.offset == 0)
    );
    let values = big.tensor().unwrap().to_f64_vec().unwrap();
    assert_eq!(values, (0..16).map(f64::from).collect::<Vec<_>>());
    let ids = m.graph.initializer("ids").unwrap().tensor().unwrap();
    assert_eq!(
        (ids.dtype(), ids.to_i64_vec().unwrap()),
        (TensorDType::I64, vec![7, 8, 9])
    );
    let x = m.graph.runtime_inputs().next().unwrap();
    let dims =
        x.ty.as_ref()
            .unwrap()
            .as_tensor()
            .unwrap()
            .dims
            .clone()
            .unwrap();
    assert_eq!(dims, vec![OnnxDim::Symbolic("n".into()), OnnxDim::Fixed(4)]);
}

#[test]
fn missing_short_and_escaping_external_data_are_typed_errors() {
    let model = std::fs::read(fixtures().join("external.onnx")).unwrap();
    let data = std::fs::read(fixtures().join("external.bin")).unwrap();

    // No data file.
    let dir = scratch("missing");
    std::fs::write(dir.join("external.onnx"), &model).unwrap();
    let (init, cause) = external_error(&dir.join("external.onnx"));
    assert_eq!(init, "big");
    assert!(
        matches!(cause, ExternalDataError::Missing { ref location, .. } if location == "external.bin")
    );

    // A data file that ends inside the second tensor (offset 64, 24 bytes).
    let dir = scratch("short");
    std::fs::write(dir.join("external.onnx"), &model).unwrap();
    std::fs::write(dir.join("external.bin"), &data[..80]).unwrap();
    let (init, cause) = external_error(&dir.join("external.onnx"));
    assert_eq!(init, "ids");
    assert!(matches!(
        cause,
        ExternalDataError::OutOfRange {
            offset: 64,
            length: 24,
            file_bytes: 80,
            ..
        }
    ));

    // `../ernal.bin`: out of the folder by name, even though the file exists there.
    let dir = scratch("dotdot");
    std::fs::create_dir_all(dir.join("model")).unwrap();
    std::fs::write(dir.join("ernal.bin"), &data).unwrap();
    let escaping = patch(&model, b"external.bin", b"../ernal.bin");
    std::fs::write(dir.join("model/external.onnx"), escaping).unwrap();
    let (_, cause) = external_error(&dir.join("model/external.onnx"));
    assert!(
        matches!(cause, ExternalDataError::OutsideFolder { .. }),
        "{cause}"
    );

    // A symbolic link inside the folder that points out of it.
    #[cfg(unix)]
    {
        let dir = scratch("symlink");
        std::fs::create_dir_all(dir.join("model")).unwrap();
        std::fs::write(dir.join("secret.bin"), &data).unwrap();
        std::os::unix::fs::symlink(dir.join("secret.bin"), dir.join("model/external.bin")).unwrap();
        std::fs::write(dir.join("model/external.onnx"), &model).unwrap();
        let (_, cause) = external_error(&dir.join("model/external.onnx"));
        assert!(
            matches!(cause, ExternalDataError::OutsideFolder { .. }),
            "{cause}"
        );
        // The same file copied inside the folder loads.
        std::fs::remove_file(dir.join("model/external.bin")).unwrap();
        std::fs::write(dir.join("model/external.bin"), &data).unwrap();
        OnnxFile::load(dir.join("model/external.onnx"), &LoadOptions::default()).unwrap();
    }
}

#[test]
fn opsets_out_of_range_and_truncated_files() {
    let model = std::fs::read(fixtures().join("external.onnx")).unwrap();
    // opset_import { domain: "" version: 17 } is 0x42 0x04 0x0a 0x00 0x10 0x11.
    let dir = scratch("opset");
    let opset28 = patch(
        &model,
        &[0x42, 0x04, 0x0a, 0x00, 0x10, 0x11],
        &[0x42, 0x04, 0x0a, 0x00, 0x10, 0x1c],
    );
    std::fs::copy(fixtures().join("external.bin"), dir.join("external.bin")).unwrap();
    std::fs::write(dir.join("external.onnx"), opset28).unwrap();
    match OnnxFile::load(dir.join("external.onnx"), &LoadOptions::default()) {
        Err(OnnxError::UnsupportedOpset {
            domain,
            version: 28,
            min: 1,
            max: 27,
        }) => assert_eq!(domain, ""),
        other => panic!("{other:?}"),
    }
    std::fs::write(dir.join("external.onnx"), &model[..model.len() / 2]).unwrap();
    assert!(matches!(
        OnnxFile::load(dir.join("external.onnx"), &LoadOptions::default()),
        Err(OnnxError::Decode { .. })
    ));
    assert!(matches!(
        OnnxFile::load(dir.join("absent.onnx"), &LoadOptions::default()),
        Err(OnnxError::Io { .. })
    ));
}

#[test]
fn npy_fixtures_written_by_numpy() {
    let x = dynrt::npy::read_npy_file(fixtures().join("input.npy")).unwrap();
    assert_eq!((x.dtype(), x.dims()), (TensorDType::F32, &[2u64, 3][..]));
    assert_eq!(x.to_f64_vec().unwrap(), vec![0., 1., 2., 3., 4., 5.]);
    let e = dynrt::npy::read_npy_file(fixtures().join("empty.npy")).unwrap();
    assert_eq!(
        (e.dtype(), e.dims(), e.num_elements()),
        (TensorDType::I64, &[1u64, 3, 0, 4][..], 0)
    );
    // What dynrt writes reads back the same (numpy's own files were the input).
    let dir = scratch("npy");
    dynrt::npy::write_npy_file(dir.join("x.npy"), &x).unwrap();
    assert_eq!(dynrt::npy::read_npy_file(dir.join("x.npy")).unwrap(), x);
    assert!(matches!(
        dynrt::npy::read_npy_file(dir.join("absent.npy")),
        Err(dynrt::npy::NpyError::Io { .. })
    ));
}

fn inspect(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(crate::common::dynrt_bin())
        .arg("inspect")
        .args(args)
        .output()
        .expect("run dynrt");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn inspect_reports_io_ops_bytes_and_unsupported_nodes() {
    let ext = fixtures().join("external.onnx");
    let (ok, stdout, stderr) = inspect(&[ext.to_str().unwrap(), "--json"]);
    assert!(ok, "{stderr}");
    let j: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(j["opsets"][0]["version"], 17);
    assert_eq!(j["inputs"][0]["name"], "x");
    assert_eq!(
        j["inputs"][0]["type"]["tensor"]["dims"],
        serde_json::json!(["n", 4])
    );
    assert_eq!(j["initializers"]["external_bytes"], 88);
    assert_eq!(j["initializers"]["inline_bytes"], 16);
    assert_eq!(
        j["initializers"]["external_files"][0]["location"],
        "external.bin"
    );
    assert_eq!(j["nodes"], 3);
    assert_eq!(j["unsupported"], serde_json::json!([]));
    // "Supported" is the importer's converter registry, the one source of truth.
    let hist = j["op_histogram"].as_array().unwrap();
    assert_eq!(hist.len(), 3);
    for op in hist {
        let t = op["op_type"].as_str().unwrap();
        let registered = dynrt::onnx::import::converter(t).is_some();
        assert_eq!(op["supported"], serde_json::json!(registered), "{t}");
    }

    let features = fixtures().join("features.onnx");
    let (ok, stdout, stderr) = inspect(&[features.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("symbolic dims: batch, seq"), "{stdout}");
    assert!(stdout.contains("unsupported ops (2 nodes):"), "{stdout}");
    assert!(
        stdout.contains("  if: If (not in the importer's op list)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  loop: Loop (not in the importer's op list)"),
        "{stdout}"
    );
    assert!(stdout.contains("6  Constant-13"), "{stdout}");

    let dir = scratch("inspect");
    let bytes = std::fs::read(&features).unwrap();
    std::fs::write(dir.join("cut.onnx"), &bytes[..bytes.len() - 7]).unwrap();
    let (ok, _, stderr) = inspect(&[dir.join("cut.onnx").to_str().unwrap()]);
    assert!(!ok);
    assert!(stderr.contains("is not a valid ONNX protobuf"), "{stderr}");
}
