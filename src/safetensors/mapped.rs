//! Opening a safetensors file natively by memory map.

use super::{SafeTensors, SafetensorsError};
use crate::tensor::{Backing, ConstData};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A safetensors file mapped read-only into memory, with its checked index. Constants made
/// from it ([`MappedSafeTensors::const_data`]) share the map, so the weights are paged in
/// when they are uploaded and never copied whole on the host.
#[derive(Clone)]
pub struct MappedSafeTensors {
    path: PathBuf,
    map: Arc<memmap2::Mmap>,
    index: SafeTensors,
}

impl std::fmt::Debug for MappedSafeTensors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedSafeTensors")
            .field("path", &self.path)
            .field("tensors", &self.index.len())
            .finish()
    }
}

impl MappedSafeTensors {
    /// Maps `path` and checks its header.
    ///
    /// # Safety argument
    /// As for [`crate::gguf::MappedGguf::open`]: the file is mapped read-only, dynrt never
    /// writes it, and the model cache only replaces files by atomic rename.
    ///
    /// # Errors
    /// [`SafetensorsError::File`] when `path` is not a regular file, [`SafetensorsError::Io`]
    /// when it cannot be opened or mapped; every error of [`SafeTensors::parse`].
    pub fn open(path: impl AsRef<Path>) -> Result<MappedSafeTensors, SafetensorsError> {
        let path = path.as_ref().to_path_buf();
        let io = |cause| SafetensorsError::Io {
            path: path.display().to_string(),
            cause,
        };
        let (file, _) = crate::fileio::open_regular(&path).map_err(|e| match e {
            crate::fileio::FileError::Io { cause, .. } => io(cause),
            other => SafetensorsError::File(other),
        })?;
        // SAFETY: see the safety argument above: read-only map of a file nobody writes.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let index = SafeTensors::parse(&map)?;
        Ok(MappedSafeTensors {
            path,
            map: Arc::new(map),
            index,
        })
    }

    /// The checked index.
    pub fn index(&self) -> &SafeTensors {
        &self.index
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The map as a shared backing for constants.
    pub fn backing(&self) -> Backing {
        self.map.clone()
    }

    /// The bytes of tensor `name` as a constant's data: a range of the map, no copy.
    ///
    /// # Errors
    /// [`SafetensorsError::Missing`].
    pub fn const_data(&self, name: &str) -> Result<ConstData, SafetensorsError> {
        let t = self.index.tensor(name)?;
        ConstData::slice(self.backing(), t.range.clone()).map_err(|_| SafetensorsError::Missing {
            name: name.to_string(),
        })
    }
}
