//! Reading and writing user-named files with stated bounds (native only).
//!
//! Every file a user names — a model, external tensor data, a `.npy` input, a planner CSV, a
//! predictor trace — is read through [`read_bounded`] (or opened through [`open_regular`]),
//! which
//!
//! * checks with `metadata` that the path is a regular file *before* opening it, so a FIFO
//!   (whose `open` blocks until a writer appears), a device such as `/dev/zero` (endless) or a
//!   directory is a [`FileError::NotAFile`] that says what the path is;
//! * refuses a file longer than the caller's bound ([`FileError::TooLarge`]) before reading;
//! * reads at most the bound plus one byte, so a file that grows while it is read is refused
//!   too rather than read without end.
//!
//! The bounds dynrt uses: [`MAX_ONNX_BYTES`] (2 GiB, protobuf's own limit on one message),
//! [`MAX_NPY_BYTES`] (16 GiB) and [`MAX_TEXT_BYTES`] (1 GiB, CSV buffer lists and shape
//! traces).
//!
//! Outputs go through [`write_new_file`]: the bytes are written to a fresh temporary file in
//! the destination's folder (created exclusively, so never through a symbolic link) and then
//! moved into place; a symbolic link at the destination is refused, and an existing file is
//! replaced only when the caller asks for it ([`Replace::Allow`]).

use std::fs::{File, Metadata, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;

/// Largest `.onnx` file (and ONNX test-data `.pb` file) read: 2 GiB, the limit protobuf puts
/// on one serialized message. Larger models keep their weights as external data, which is
/// read per tensor.
pub const MAX_ONNX_BYTES: u64 = 2 << 30;

/// Largest `.npy` file read: 16 GiB. The whole array is held in host memory and then uploaded
/// to one GPU buffer; a larger array does not fit either on the machines dynrt targets.
pub const MAX_NPY_BYTES: u64 = 16 << 30;

/// Largest text input read (a planner CSV, a predictor trace): 1 GiB, some twenty million
/// rows.
pub const MAX_TEXT_BYTES: u64 = 1 << 30;

/// What a path is when it is not a regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileKind {
    /// A directory.
    Directory,
    /// A FIFO (named pipe): opening it for reading waits for a writer.
    Fifo,
    /// A character device, such as `/dev/zero` or a terminal.
    CharDevice,
    /// A block device, such as a disk.
    BlockDevice,
    /// A Unix domain socket.
    Socket,
    /// A symbolic link (only reported where links are not followed: output paths).
    Symlink,
    /// Anything else the platform has.
    Other,
}

impl FileKind {
    /// The kind of a path that `meta` describes, `None` for a regular file.
    pub fn of(meta: &Metadata) -> Option<FileKind> {
        let t = meta.file_type();
        if t.is_file() {
            return None;
        }
        if t.is_dir() {
            return Some(FileKind::Directory);
        }
        if t.is_symlink() {
            return Some(FileKind::Symlink);
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileTypeExt;
            if t.is_fifo() {
                return Some(FileKind::Fifo);
            }
            if t.is_char_device() {
                return Some(FileKind::CharDevice);
            }
            if t.is_block_device() {
                return Some(FileKind::BlockDevice);
            }
            if t.is_socket() {
                return Some(FileKind::Socket);
            }
        }
        Some(FileKind::Other)
    }
}

impl std::fmt::Display for FileKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FileKind::Directory => "a directory",
            FileKind::Fifo => "a FIFO (named pipe)",
            FileKind::CharDevice => "a character device",
            FileKind::BlockDevice => "a block device",
            FileKind::Socket => "a socket",
            FileKind::Symlink => "a symbolic link",
            FileKind::Other => "not a regular file",
        })
    }
}

/// Errors opening, reading or writing a user-named file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    /// The operating system refused (no such file, permission denied, a read error).
    #[error("{path}: {cause}")]
    Io {
        /// The path.
        path: String,
        /// The operating system's error.
        cause: std::io::Error,
    },
    /// The path is not a regular file (a directory, a FIFO, a device, a socket, or a
    /// symbolic link where an output would be written).
    #[error("{path} is {kind}, not a regular file")]
    NotAFile {
        /// The path.
        path: String,
        /// What it is.
        kind: FileKind,
    },
    /// The file is longer than the bound for its kind (or grew past it while being read).
    #[error("{path} is {size_bytes} bytes, more than the {max_bytes} bytes allowed for {what}")]
    TooLarge {
        /// The path.
        path: String,
        /// Its size in bytes (when it grew while being read: the bytes read, bound + 1).
        size_bytes: u64,
        /// The bound in bytes.
        max_bytes: u64,
        /// What the file was read as (`an ONNX model`, `a .npy file`, ...).
        what: &'static str,
    },
    /// The file is not UTF-8 text.
    #[error("{path} is not UTF-8 text")]
    NotText {
        /// The path.
        path: String,
    },
    /// An output would replace an existing file and the caller did not allow it.
    #[error("{path} already exists")]
    Exists {
        /// The path.
        path: String,
    },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> FileError + '_ {
    move |cause| FileError::Io {
        path: path.display().to_string(),
        cause,
    }
}

/// Checks that `path` (following symbolic links) is a regular file, without opening it.
/// Returns its length in bytes.
///
/// # Errors
/// [`FileError::Io`] when it cannot be queried (it does not exist, say),
/// [`FileError::NotAFile`] when it is a directory, FIFO, device or socket.
pub fn check_regular(path: &Path) -> Result<u64, FileError> {
    let meta = std::fs::metadata(path).map_err(io_error(path))?;
    match FileKind::of(&meta) {
        None => Ok(meta.len()),
        Some(kind) => Err(FileError::NotAFile {
            path: path.display().to_string(),
            kind,
        }),
    }
}

/// Opens a regular file for reading; returns it and its length in bytes. The path is checked
/// with [`check_regular`] before it is opened; on Unix it is then opened non-blocking (a FIFO
/// swapped in after the check does not block) and the opened file is checked again.
///
/// # Errors
/// As [`check_regular`]; [`FileError::Io`] when it cannot be opened.
pub fn open_regular(path: &Path) -> Result<(File, u64), FileError> {
    check_regular(path)?;
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Reads of a regular file ignore O_NONBLOCK; an open of a FIFO with it returns at once.
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path).map_err(io_error(path))?;
    let meta = file.metadata().map_err(io_error(path))?;
    match FileKind::of(&meta) {
        None => Ok((file, meta.len())),
        Some(kind) => Err(FileError::NotAFile {
            path: path.display().to_string(),
            kind,
        }),
    }
}

/// Reads a whole regular file of at most `max_bytes` bytes. `what` names the file's role in
/// the [`FileError::TooLarge`] message (`"an ONNX model"`).
///
/// # Errors
/// As [`open_regular`]; [`FileError::TooLarge`] when the file is longer than `max_bytes`
/// (checked before reading, and again by the bytes read); [`FileError::Io`] on a read error
/// or when the buffer cannot be allocated.
pub fn read_bounded(path: &Path, max_bytes: u64, what: &'static str) -> Result<Vec<u8>, FileError> {
    let (file, len) = open_regular(path)?;
    let too_large = |size_bytes| FileError::TooLarge {
        path: path.display().to_string(),
        size_bytes,
        max_bytes,
        what,
    };
    if len > max_bytes {
        return Err(too_large(len));
    }
    let mut bytes = Vec::new();
    // `len` is at most `max_bytes`; a failed reservation is an error, not an abort.
    let capacity = usize::try_from(len).unwrap_or(usize::MAX);
    bytes
        .try_reserve_exact(capacity)
        .map_err(|_| FileError::Io {
            path: path.display().to_string(),
            cause: std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                format!("cannot allocate {len} bytes to read it"),
            ),
        })?;
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io_error(path))?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// [`read_bounded`] for UTF-8 text.
///
/// # Errors
/// As [`read_bounded`]; [`FileError::NotText`] when the bytes are not UTF-8.
pub fn read_bounded_text(
    path: &Path,
    max_bytes: u64,
    what: &'static str,
) -> Result<String, FileError> {
    let bytes = read_bounded(path, max_bytes, what)?;
    String::from_utf8(bytes).map_err(|_| FileError::NotText {
        path: path.display().to_string(),
    })
}

/// Whether [`write_new_file`] may replace an existing regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replace {
    /// An existing file is an error ([`FileError::Exists`]).
    Never,
    /// An existing regular file is replaced (atomically, by a rename).
    Allow,
}

/// What is at an output path, without following a symbolic link there.
///
/// # Errors
/// [`FileError::NotAFile`] for a symbolic link, directory or anything but a regular file;
/// [`FileError::Exists`] for a regular file under [`Replace::Never`]; [`FileError::Io`]
/// when it cannot be queried.
pub fn check_destination(path: &Path, replace: Replace) -> Result<(), FileError> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(cause) => Err(io_error(path)(cause)),
        Ok(meta) => match (FileKind::of(&meta), replace) {
            (Some(kind), _) => Err(FileError::NotAFile {
                path: path.display().to_string(),
                kind,
            }),
            (None, Replace::Never) => Err(FileError::Exists {
                path: path.display().to_string(),
            }),
            (None, Replace::Allow) => Ok(()),
        },
    }
}

/// Writes `bytes` to `path` without ever writing through what is there: into a new
/// temporary file beside it (created exclusively: an existing name or a symbolic link makes
/// the creation fail rather than be followed), then moved into place. Under
/// [`Replace::Never`] the move is a hard link that fails if anything appeared at `path`
/// (falling back to a check and a rename where the file system has no hard links); under
/// [`Replace::Allow`] a rename, which replaces a regular file (or a link created in the
/// meantime: the link itself, never its target). The temporary file is removed on failure.
///
/// # Errors
/// As [`check_destination`], before anything is written; [`FileError::Io`] when the
/// temporary file cannot be created, written or moved.
pub fn write_new_file(path: &Path, bytes: &[u8], replace: Replace) -> Result<(), FileError> {
    check_destination(path, replace)?;
    let tmp = temporary_path(path);
    let result = write_then_move(&tmp, path, bytes, replace);
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// `DIR/.NAME.<pid>.<n>.tmp` for `DIR/NAME`: hidden, unique within this process.
fn temporary_path(path: &Path) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = path
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id()))
}

fn write_then_move(
    tmp: &Path,
    path: &Path,
    bytes: &[u8],
    replace: Replace,
) -> Result<(), FileError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(tmp)
        .map_err(io_error(tmp))?;
    file.write_all(bytes).map_err(io_error(tmp))?;
    drop(file);
    match replace {
        Replace::Allow => std::fs::rename(tmp, path).map_err(io_error(path)),
        Replace::Never => match std::fs::hard_link(tmp, path) {
            Ok(()) => std::fs::remove_file(tmp).map_err(io_error(tmp)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                // Something appeared at the destination since it was checked.
                check_destination(path, Replace::Never)?;
                Err(FileError::Exists {
                    path: path.display().to_string(),
                })
            }
            Err(_) => {
                // No hard links here (FAT, some network file systems): check, then rename.
                check_destination(path, Replace::Never)?;
                std::fs::rename(tmp, path).map_err(io_error(path))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("dynrt_fileio_{name}_{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn regular_files_are_read_and_bounded() {
        let d = scratch("read");
        let p = d.join("a.txt");
        std::fs::write(&p, b"hello").unwrap();
        assert_eq!(read_bounded(&p, 5, "a test file").unwrap(), b"hello");
        assert!(matches!(
            read_bounded(&p, 4, "a test file"),
            Err(FileError::TooLarge {
                size_bytes: 5,
                max_bytes: 4,
                ..
            })
        ));
        assert!(matches!(
            read_bounded(&d, 100, "a test file"),
            Err(FileError::NotAFile {
                kind: FileKind::Directory,
                ..
            })
        ));
        assert!(matches!(
            read_bounded(&d.join("missing"), 100, "a test file"),
            Err(FileError::Io { .. })
        ));
        std::fs::write(&p, [0xff, 0xfe]).unwrap();
        assert!(matches!(
            read_bounded_text(&p, 100, "a test file"),
            Err(FileError::NotText { .. })
        ));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[cfg(unix)]
    #[test]
    fn devices_are_not_regular_files() {
        let e = read_bounded(Path::new("/dev/zero"), 100, "a test file").unwrap_err();
        assert!(matches!(
            e,
            FileError::NotAFile {
                kind: FileKind::CharDevice,
                ..
            }
        ));
        assert_eq!(
            e.to_string(),
            "/dev/zero is a character device, not a regular file"
        );
    }

    #[test]
    fn outputs_never_write_through_a_link_or_over_a_file_unasked() {
        let d = scratch("write");
        let p = d.join("out.npy");
        write_new_file(&p, b"one", Replace::Never).unwrap();
        assert!(matches!(
            write_new_file(&p, b"two", Replace::Never),
            Err(FileError::Exists { .. })
        ));
        assert_eq!(std::fs::read(&p).unwrap(), b"one");
        write_new_file(&p, b"three", Replace::Allow).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"three");
        #[cfg(unix)]
        {
            let target = d.join("target.txt");
            std::fs::write(&target, b"keep").unwrap();
            let link = d.join("link.npy");
            std::os::unix::fs::symlink(&target, &link).unwrap();
            for replace in [Replace::Never, Replace::Allow] {
                assert!(matches!(
                    write_new_file(&link, b"x", replace),
                    Err(FileError::NotAFile {
                        kind: FileKind::Symlink,
                        ..
                    })
                ));
            }
            assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        }
        // Nothing but the outputs is left: no temporary files.
        let mut names: Vec<String> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
        assert!(names.contains(&"out.npy".to_string()));
        let _ = std::fs::remove_dir_all(&d);
    }
}
