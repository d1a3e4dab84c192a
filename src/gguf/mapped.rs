//! Opening a GGUF file natively by memory map.

use super::{Gguf, GgufError};
use std::path::{Path, PathBuf};

/// A GGUF file mapped read-only into memory, with its parsed index. Tensor bytes are read
/// straight from the map (the kernel pages them in on demand), so opening a 100 MB model
/// costs its metadata, not its weights. The map is released when this is dropped.
#[derive(Debug)]
pub struct MappedGguf {
    path: PathBuf,
    map: memmap2::Mmap,
    gguf: Gguf,
}

impl MappedGguf {
    /// Maps `path` and parses it.
    ///
    /// # Safety argument
    /// `memmap2::Mmap::map` is `unsafe` because the bytes of a mapped file can change under
    /// the program if another process writes or truncates that file while it is mapped
    /// (Rust would then see a `&[u8]` change, and a truncation raises `SIGBUS`). dynrt maps
    /// files read-only and never writes them; the model cache is only ever replaced by an
    /// atomic rename (`dynrt fetch`), which leaves a mapped old file intact. Writing to a
    /// model file while dynrt has it open is outside dynrt's contract, as it is for every
    /// program that maps its inputs (llama.cpp does the same).
    ///
    /// # Errors
    /// [`GgufError::Io`] when the file cannot be opened or mapped, [`GgufError::File`] when it
    /// is not a regular file (a directory, a FIFO, a device); every error of
    /// [`Gguf::parse`].
    pub fn open(path: impl AsRef<Path>) -> Result<MappedGguf, GgufError> {
        let path = path.as_ref().to_path_buf();
        let io = |source| GgufError::Io {
            path: path.display().to_string(),
            cause: source,
        };
        // Checked to be a regular file before it is opened: opening a FIFO would wait for a
        // writer.
        let (file, _) = crate::fileio::open_regular(&path).map_err(|e| match e {
            crate::fileio::FileError::Io { cause, .. } => io(cause),
            other => GgufError::File(other),
        })?;
        // SAFETY: see the safety argument above: read-only map of a file nobody writes.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let gguf = Gguf::parse(&map)?;
        Ok(MappedGguf { path, map, gguf })
    }

    /// The parsed index.
    pub fn gguf(&self) -> &Gguf {
        &self.gguf
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The bytes of tensor `name`.
    ///
    /// # Errors
    /// [`GgufError::MissingTensor`].
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8], GgufError> {
        self.gguf.tensor_bytes(&self.map, name)
    }

    /// Tensor `name` dequantized to `f32` (see [`Gguf::dequantize_tensor`]).
    ///
    /// # Errors
    /// As [`Gguf::dequantize_tensor`].
    pub fn dequantize_tensor(&self, name: &str) -> Result<Vec<f32>, GgufError> {
        self.gguf.dequantize_tensor(&self.map, name)
    }
}
