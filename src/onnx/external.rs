//! External tensor data: initializers whose bytes live in files beside the `.onnx` file.
//!
//! A `TensorProto` with `data_location = EXTERNAL` names its bytes by `external_data` entries
//! `location` (a path relative to the model's folder), `offset` and `length` (bytes; without a
//! length, to the end of the file). The loader asks an [`ExternalData`] resolver for them:
//!
//! * [`FolderResolver`] (native): reads byte ranges of files in the model's folder. The path is
//!   checked twice: syntactically by [`check_location`] (relative, no `..`), then after
//!   resolving symbolic links (the canonical file must still be inside the canonical folder).
//! * [`BytesResolver`] (everywhere, the way in for wasm32): the caller hands over each file's
//!   bytes by location, e.g. fetched by the page; ranges are slices, not copies.
//! * [`NoExternalData`]: every request is an error (for models that must be self-contained).

use bytes::Bytes;
use std::collections::HashMap;

/// Errors about one external-data reference; the loader wraps them with the initializer's
/// name ([`crate::onnx::OnnxError::External`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExternalDataError {
    /// The location is absolute, climbs out with `..`, or resolves (through links) to a file
    /// outside the model's folder.
    #[error("external data location `{location}` is outside the model's folder")]
    OutsideFolder {
        /// The location as written in the model.
        location: String,
    },
    /// The file is not there or cannot be read.
    #[error("external data file `{location}` cannot be read: {reason}")]
    Missing {
        /// The location as written in the model.
        location: String,
        /// What the operating system (or the resolver) said.
        reason: String,
    },
    /// The byte range ends past the end of the file.
    #[error("external data range {offset}+{length} of `{location}` ends past its end ({file_bytes} bytes)")]
    OutOfRange {
        /// The location.
        location: String,
        /// Offset in bytes.
        offset: u64,
        /// Length in bytes.
        length: u64,
        /// The file's size in bytes.
        file_bytes: u64,
    },
    /// The `external_data` entries are malformed: no `location`, an unparsable number, an
    /// unknown key.
    #[error("malformed external_data entry: {reason}")]
    Malformed {
        /// What was wrong.
        reason: String,
    },
}

/// Where an external tensor's bytes are: a file relative to the model's folder and a range.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ExternalRef {
    /// The path as written in the model (`/`-separated, relative).
    pub location: String,
    /// First byte.
    pub offset: u64,
    /// Number of bytes; `None` means to the end of the file.
    pub length: Option<u64>,
}

impl ExternalRef {
    /// Reads `external_data` key/value pairs (`location`, `offset`, `length`, `checksum`).
    ///
    /// # Errors
    /// [`ExternalDataError::Malformed`] when `location` is missing, a number does not parse
    /// or a key is unknown; [`ExternalDataError::OutsideFolder`] from [`check_location`].
    pub fn from_entries<'a>(
        entries: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, ExternalDataError> {
        let mut location = None;
        let mut offset = 0u64;
        let mut length = None;
        let number = |key: &str, value: &str| {
            value
                .trim()
                .parse::<u64>()
                .map_err(|_| ExternalDataError::Malformed {
                    reason: format!("{key} `{value}` is not a non-negative integer"),
                })
        };
        for (key, value) in entries {
            match key {
                "location" => location = Some(value.to_string()),
                "offset" => offset = number(key, value)?,
                "length" => length = Some(number(key, value)?),
                // A SHA1 of the data; dynrt does not verify it.
                "checksum" => {}
                other => {
                    return Err(ExternalDataError::Malformed {
                        reason: format!("unknown key `{other}`"),
                    })
                }
            }
        }
        let location = location.ok_or_else(|| ExternalDataError::Malformed {
            reason: "no `location`".to_string(),
        })?;
        check_location(&location)?;
        Ok(ExternalRef {
            location,
            offset,
            length,
        })
    }

    /// The range `[offset, offset + length)` within a file of `file_bytes` bytes.
    ///
    /// # Errors
    /// [`ExternalDataError::OutOfRange`] when it ends past the file (or overflows).
    pub fn range_in(&self, file_bytes: u64) -> Result<(u64, u64), ExternalDataError> {
        let length = self
            .length
            .unwrap_or_else(|| file_bytes.saturating_sub(self.offset));
        match self.offset.checked_add(length) {
            Some(end) if end <= file_bytes => Ok((self.offset, length)),
            _ => Err(ExternalDataError::OutOfRange {
                location: self.location.clone(),
                offset: self.offset,
                length,
                file_bytes,
            }),
        }
    }
}

/// Checks that an external-data location stays inside the model's folder: not empty, not
/// absolute (`/x`, `\x`, `C:x`), no `..` component, no NUL.
///
/// # Errors
/// [`ExternalDataError::OutsideFolder`].
pub fn check_location(location: &str) -> Result<(), ExternalDataError> {
    let outside = || ExternalDataError::OutsideFolder {
        location: location.to_string(),
    };
    let bytes = location.as_bytes();
    if location.is_empty()
        || location.contains('\0')
        || bytes[0] == b'/'
        || bytes[0] == b'\\'
        || (bytes.len() >= 2 && bytes[1] == b':')
    {
        return Err(outside());
    }
    if location.split(['/', '\\']).any(|c| c == "..") {
        return Err(outside());
    }
    Ok(())
}

/// Supplies the bytes of external tensor data.
pub trait ExternalData {
    /// The bytes `[offset, offset + length)` of `r.location` (to the end of the file when
    /// `r.length` is `None`). The location has passed [`check_location`].
    ///
    /// # Errors
    /// [`ExternalDataError`]: the file is missing, outside the folder, or too short.
    fn read(&self, r: &ExternalRef) -> Result<Bytes, ExternalDataError>;

    /// Checks that the range exists without reading it; returns its length in bytes.
    ///
    /// # Errors
    /// As [`ExternalData::read`].
    fn check(&self, r: &ExternalRef) -> Result<u64, ExternalDataError>;
}

/// A resolver that refuses every external reference.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoExternalData;

impl ExternalData for NoExternalData {
    fn read(&self, r: &ExternalRef) -> Result<Bytes, ExternalDataError> {
        self.check(r).map(|_| Bytes::new())
    }

    fn check(&self, r: &ExternalRef) -> Result<u64, ExternalDataError> {
        Err(ExternalDataError::Missing {
            location: r.location.clone(),
            reason: "this model was loaded from bytes without external data".to_string(),
        })
    }
}

/// External data handed over in memory, one [`Bytes`] per location (the wasm32 route: the
/// page fetches `model.onnx.data` and passes it in). Reads are slices: no copy.
#[derive(Debug, Clone, Default)]
pub struct BytesResolver {
    files: HashMap<String, Bytes>,
}

impl BytesResolver {
    /// An empty resolver.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) the contents of the file at `location` (as written in the model).
    pub fn insert(&mut self, location: impl Into<String>, bytes: Bytes) {
        self.files.insert(location.into(), bytes);
    }

    fn file(&self, r: &ExternalRef) -> Result<&Bytes, ExternalDataError> {
        self.files
            .get(&r.location)
            .ok_or_else(|| ExternalDataError::Missing {
                location: r.location.clone(),
                reason: "not among the files handed to the resolver".to_string(),
            })
    }
}

impl ExternalData for BytesResolver {
    fn read(&self, r: &ExternalRef) -> Result<Bytes, ExternalDataError> {
        let file = self.file(r)?;
        let (offset, length) = r.range_in(file.len() as u64)?;
        // Both fit in usize: they are within the file's length.
        Ok(file.slice(offset as usize..(offset + length) as usize))
    }

    fn check(&self, r: &ExternalRef) -> Result<u64, ExternalDataError> {
        let file = self.file(r)?;
        r.range_in(file.len() as u64).map(|(_, len)| len)
    }
}

/// Reads external data from files in a folder (native only). Each range is read once into
/// its own buffer.
#[cfg(not(target_arch = "wasm32"))]
#[derive(Debug, Clone)]
pub struct FolderResolver {
    folder: std::path::PathBuf,
}

#[cfg(not(target_arch = "wasm32"))]
impl FolderResolver {
    /// A resolver for locations relative to `folder` (the folder of the `.onnx` file).
    pub fn new(folder: impl Into<std::path::PathBuf>) -> Self {
        FolderResolver {
            folder: folder.into(),
        }
    }

    /// Opens the file, checking that its canonical path is inside the canonical folder and
    /// that it is a regular file.
    fn open(&self, r: &ExternalRef) -> Result<(std::fs::File, u64), ExternalDataError> {
        check_location(&r.location)?;
        let missing = |e: std::io::Error| ExternalDataError::Missing {
            location: r.location.clone(),
            reason: e.to_string(),
        };
        let folder = self.folder.canonicalize().map_err(missing)?;
        let path = folder.join(&r.location).canonicalize().map_err(missing)?;
        if !path.starts_with(&folder) {
            return Err(ExternalDataError::OutsideFolder {
                location: r.location.clone(),
            });
        }
        // Checked to be a regular file before it is opened: opening a FIFO would wait for a
        // writer, and a device such as /dev/zero never ends.
        crate::fileio::open_regular(&path).map_err(|e| ExternalDataError::Missing {
            location: r.location.clone(),
            reason: match e {
                crate::fileio::FileError::NotAFile { kind, .. } => {
                    format!("it is {kind}, not a regular file")
                }
                crate::fileio::FileError::Io { cause, .. } => cause.to_string(),
                other => other.to_string(),
            },
        })
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl ExternalData for FolderResolver {
    fn read(&self, r: &ExternalRef) -> Result<Bytes, ExternalDataError> {
        use std::io::{Read, Seek, SeekFrom};
        let (mut file, file_bytes) = self.open(r)?;
        let (offset, length) = r.range_in(file_bytes)?;
        let io = |e: std::io::Error| ExternalDataError::Missing {
            location: r.location.clone(),
            reason: e.to_string(),
        };
        let len = usize::try_from(length).map_err(|_| ExternalDataError::OutOfRange {
            location: r.location.clone(),
            offset,
            length,
            file_bytes,
        })?;
        file.seek(SeekFrom::Start(offset)).map_err(io)?;
        // The range is within the file's length, which a sparse file can make huge: a failed
        // reservation is an error, not an abort.
        let mut buf = Vec::new();
        buf.try_reserve_exact(len)
            .map_err(|_| ExternalDataError::Missing {
                location: r.location.clone(),
                reason: format!("cannot allocate {len} bytes to read it"),
            })?;
        file.take(length).read_to_end(&mut buf).map_err(io)?;
        if buf.len() != len {
            return Err(ExternalDataError::OutOfRange {
                location: r.location.clone(),
                offset,
                length,
                file_bytes: offset + buf.len() as u64,
            });
        }
        Ok(Bytes::from(buf))
    }

    fn check(&self, r: &ExternalRef) -> Result<u64, ExternalDataError> {
        let (_, file_bytes) = self.open(r)?;
        r.range_in(file_bytes).map(|(_, len)| len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_outside_the_folder_are_refused() {
        for bad in [
            "",
            "/etc/passwd",
            "\\x",
            "C:x.bin",
            "../w.bin",
            "a/../../w.bin",
            "a\\..\\b",
            "a\0b",
        ] {
            assert!(
                matches!(
                    check_location(bad),
                    Err(ExternalDataError::OutsideFolder { .. })
                ),
                "{bad:?}"
            );
        }
        for good in ["w.bin", "weights/w.bin", "a..b", "./w.bin"] {
            assert_eq!(check_location(good), Ok(()), "{good:?}");
        }
    }

    #[test]
    fn entries_parse_and_ranges_are_checked() {
        let r =
            ExternalRef::from_entries([("location", "w.bin"), ("offset", "8"), ("length", "4")])
                .unwrap();
        assert_eq!(r.range_in(12), Ok((8, 4)));
        assert!(matches!(
            r.range_in(11),
            Err(ExternalDataError::OutOfRange { file_bytes: 11, .. })
        ));
        let r = ExternalRef::from_entries([("location", "w.bin"), ("offset", "3")]).unwrap();
        assert_eq!(r.range_in(10), Ok((3, 7)));
        assert!(matches!(
            ExternalRef::from_entries([("offset", "3")]),
            Err(ExternalDataError::Malformed { .. })
        ));
        assert!(matches!(
            ExternalRef::from_entries([("location", "w"), ("offset", "-3")]),
            Err(ExternalDataError::Malformed { .. })
        ));
        let huge = ExternalRef {
            location: "w".into(),
            offset: u64::MAX,
            length: Some(2),
        };
        assert!(matches!(
            huge.range_in(10),
            Err(ExternalDataError::OutOfRange { .. })
        ));
    }

    #[test]
    fn bytes_resolver_slices() {
        let mut res = BytesResolver::new();
        let data = Bytes::from(vec![1u8, 2, 3, 4, 5]);
        res.insert("w.bin", data.clone());
        let r = ExternalRef {
            location: "w.bin".into(),
            offset: 1,
            length: Some(3),
        };
        let got = res.read(&r).unwrap();
        assert_eq!(got.as_ref(), &[2, 3, 4]);
        // A slice of the handed-over buffer, not a copy.
        assert_eq!(got.as_ptr(), data[1..].as_ptr());
        let missing = ExternalRef {
            location: "other.bin".into(),
            ..r
        };
        assert!(matches!(
            res.read(&missing),
            Err(ExternalDataError::Missing { .. })
        ));
    }
}
