//! A validating reader of safetensors files (the weights format of Hugging Face models:
//! `model.safetensors` in a sentence-transformers folder).
//!
//! The layout: an 8-byte little-endian header length `N`, `N` bytes of UTF-8 JSON mapping
//! each tensor name to `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets relative to
//! the end of the header) plus an optional `"__metadata__"` map of strings, then the tensor
//! bytes, little-endian and row-major.
//!
//! Nothing is trusted. [`SafeTensors::parse`] refuses a header length above
//! [`MAX_HEADER_BYTES`] or past the end of the file before it reads the header, parses the
//! JSON only within that bound, knows every dtype name of the format (and says which ones
//! dynrt cannot hold), checks each shape's byte size for overflow and against its offsets,
//! keeps every range inside the file, and refuses ranges that overlap. Only the index is
//! built: tensor bytes stay where they are, in the caller's buffer or (natively)
//! in the memory map of [`MappedSafeTensors`], and a constant points into them
//! ([`crate::tensor::ConstData`]) without a copy.
//!
//! ```
//! use dynrt::safetensors::SafeTensors;
//! let header = br#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
//! let mut file = (header.len() as u64).to_le_bytes().to_vec();
//! file.extend_from_slice(header);
//! file.extend_from_slice(&[0, 0, 128, 63, 0, 0, 0, 64]);
//! let st = SafeTensors::parse(&file)?;
//! assert_eq!(st.f32_values(&file, "w")?, vec![1.0, 2.0]);
//! # Ok::<(), dynrt::safetensors::SafetensorsError>(())
//! ```

#[cfg(not(target_arch = "wasm32"))]
mod mapped;

#[cfg(not(target_arch = "wasm32"))]
pub use mapped::MappedSafeTensors;

use crate::shape::{DType, Shape, ShapeError};
use std::collections::BTreeMap;
use std::ops::Range;

/// The largest header accepted, in bytes (the bound of the format's own reader).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The most dimensions a tensor may have.
pub const MAX_RANK: usize = 16;

/// Every dtype name of the format: dynrt's type where it has one.
const DTYPES: &[(&str, Option<DType>)] = &[
    ("F32", Some(DType::F32)),
    ("F16", Some(DType::F16)),
    ("BF16", Some(DType::BF16)),
    ("I64", Some(DType::I64)),
    ("I32", Some(DType::I32)),
    ("U32", Some(DType::U32)),
    ("I8", Some(DType::I8)),
    ("U8", Some(DType::U8)),
    ("BOOL", Some(DType::Bool)),
    ("F64", None),
    ("U64", None),
    ("I16", None),
    ("U16", None),
    ("F8_E4M3", None),
    ("F8_E5M2", None),
    ("F8_E8M0", None),
    ("F6_E2M3", None),
    ("F6_E3M2", None),
    ("F4", None),
    ("E8M0", None),
];

/// What is wrong with a safetensors file. Every variant names the tensor or the field.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SafetensorsError {
    /// The file is shorter than the 8-byte header length.
    #[error("{file_bytes} bytes: a safetensors file starts with an 8-byte header length")]
    TooShort {
        /// The file's length.
        file_bytes: u64,
    },
    /// The header length is above [`MAX_HEADER_BYTES`] or past the end of the file.
    #[error(
        "header of {header_bytes} bytes: the file has {file_bytes} bytes and at most {max_bytes} \
         are accepted for a header"
    )]
    HeaderLength {
        /// The length the file declares.
        header_bytes: u64,
        /// The file's length.
        file_bytes: u64,
        /// [`MAX_HEADER_BYTES`].
        max_bytes: u64,
    },
    /// The header is not a JSON object in UTF-8.
    #[error("header: {reason}")]
    Header {
        /// What the JSON parser or the structure check said.
        reason: String,
    },
    /// A tensor entry lacks a field or has one of the wrong type.
    #[error("tensor `{name}`: {reason}")]
    Entry {
        /// The tensor's name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A dtype name the format does not have.
    #[error("tensor `{name}`: unknown dtype `{dtype}`")]
    UnknownDType {
        /// The tensor's name.
        name: String,
        /// The name given.
        dtype: String,
    },
    /// A dtype of the format that dynrt cannot hold.
    #[error("tensor `{name}`: dtype {dtype} is not supported (F32, F16, BF16, I64, I32, U32, I8, U8, BOOL are)")]
    UnsupportedDType {
        /// The tensor's name.
        name: String,
        /// The format's name of the type.
        dtype: String,
    },
    /// The shape's byte size overflows.
    #[error("tensor `{name}`: {cause}")]
    Shape {
        /// The tensor's name.
        name: String,
        /// The overflow.
        cause: ShapeError,
    },
    /// The offsets do not span the shape's bytes, or reach past the file.
    #[error(
        "tensor `{name}`: data_offsets [{begin}, {end}] for {expected_bytes} bytes of data in a \
         data section of {data_bytes} bytes"
    )]
    Offsets {
        /// The tensor's name.
        name: String,
        /// First offset.
        begin: u64,
        /// Second offset.
        end: u64,
        /// The shape's byte size.
        expected_bytes: u64,
        /// Bytes after the header.
        data_bytes: u64,
    },
    /// Two tensors share bytes.
    #[error("tensors `{first}` and `{second}` overlap")]
    Overlap {
        /// The one that starts first.
        first: String,
        /// The one that starts inside it.
        second: String,
    },
    /// A tensor the caller asked for is not in the file.
    #[error("no tensor `{name}` in the file")]
    Missing {
        /// The name asked for.
        name: String,
    },
    /// A tensor has another type or shape than the caller needs.
    #[error("tensor `{name}` is {dtype} {shape}, expected {expected}")]
    Mismatch {
        /// The tensor's name.
        name: String,
        /// Its type.
        dtype: DType,
        /// Its shape.
        shape: Shape,
        /// What was needed.
        expected: String,
    },
    /// The file cannot be opened or mapped.
    #[cfg(not(target_arch = "wasm32"))]
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: String,
        /// The operating system's error.
        cause: std::io::Error,
    },
    /// The path is not a regular file.
    #[cfg(not(target_arch = "wasm32"))]
    #[error(transparent)]
    File(#[from] crate::fileio::FileError),
}

/// One tensor of the index.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Its name.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its shape.
    pub shape: Shape,
    /// Its bytes in the whole file (header included in the offsets).
    pub range: Range<usize>,
}

/// The checked index of a safetensors file: tensors by name and the metadata strings.
#[derive(Debug, Clone)]
pub struct SafeTensors {
    tensors: BTreeMap<String, TensorInfo>,
    metadata: BTreeMap<String, String>,
    file_bytes: usize,
}

fn entry(name: &str, reason: impl Into<String>) -> SafetensorsError {
    SafetensorsError::Entry {
        name: name.to_string(),
        reason: reason.into(),
    }
}

impl SafeTensors {
    /// Parses and checks the header of `bytes` (the whole file).
    ///
    /// # Errors
    /// [`SafetensorsError::TooShort`], [`SafetensorsError::HeaderLength`],
    /// [`SafetensorsError::Header`], [`SafetensorsError::Entry`],
    /// [`SafetensorsError::UnknownDType`], [`SafetensorsError::UnsupportedDType`],
    /// [`SafetensorsError::Shape`], [`SafetensorsError::Offsets`],
    /// [`SafetensorsError::Overlap`].
    pub fn parse(bytes: &[u8]) -> Result<SafeTensors, SafetensorsError> {
        let file_bytes = bytes.len() as u64;
        let Some(len) = bytes.get(..8) else {
            return Err(SafetensorsError::TooShort { file_bytes });
        };
        let mut le = [0u8; 8];
        le.copy_from_slice(len);
        let header_bytes = u64::from_le_bytes(le);
        if header_bytes > MAX_HEADER_BYTES || header_bytes > file_bytes - 8 {
            return Err(SafetensorsError::HeaderLength {
                header_bytes,
                file_bytes,
                max_bytes: MAX_HEADER_BYTES,
            });
        }
        // Both bounds above make this fit in usize.
        let data_start = 8 + header_bytes as usize;
        let header =
            std::str::from_utf8(&bytes[8..data_start]).map_err(|e| SafetensorsError::Header {
                reason: format!("not UTF-8: {e}"),
            })?;
        let json: serde_json::Value =
            serde_json::from_str(header).map_err(|e| SafetensorsError::Header {
                reason: e.to_string(),
            })?;
        let serde_json::Value::Object(map) = json else {
            return Err(SafetensorsError::Header {
                reason: "not a JSON object".into(),
            });
        };
        let data_bytes = file_bytes - data_start as u64;
        let mut tensors = BTreeMap::new();
        let mut metadata = BTreeMap::new();
        for (name, value) in map {
            if name == "__metadata__" {
                let serde_json::Value::Object(m) = value else {
                    return Err(SafetensorsError::Header {
                        reason: "__metadata__ is not an object".into(),
                    });
                };
                for (k, v) in m {
                    let serde_json::Value::String(s) = v else {
                        return Err(SafetensorsError::Header {
                            reason: format!("__metadata__ `{k}` is not a string"),
                        });
                    };
                    metadata.insert(k, s);
                }
                continue;
            }
            let info = tensor_info(&name, &value, data_start, data_bytes)?;
            tensors.insert(name, info);
        }
        let mut by_start: Vec<&TensorInfo> = tensors.values().collect();
        by_start.sort_by_key(|t| (t.range.start, t.range.end));
        for pair in by_start.windows(2) {
            // Empty tensors take no bytes and overlap nothing.
            if pair[1].range.start < pair[0].range.end && !pair[1].range.is_empty() {
                return Err(SafetensorsError::Overlap {
                    first: pair[0].name.clone(),
                    second: pair[1].name.clone(),
                });
            }
        }
        Ok(SafeTensors {
            tensors,
            metadata,
            file_bytes: bytes.len(),
        })
    }

    /// The tensors, by name.
    pub fn tensors(&self) -> impl Iterator<Item = &TensorInfo> {
        self.tensors.values()
    }

    /// How many tensors the file holds.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the file holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The `__metadata__` strings.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// Tensor `name`.
    ///
    /// # Errors
    /// [`SafetensorsError::Missing`].
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo, SafetensorsError> {
        self.tensors
            .get(name)
            .ok_or_else(|| SafetensorsError::Missing {
                name: name.to_string(),
            })
    }

    /// Tensor `name`, which must be `dtype` with `dims`.
    ///
    /// # Errors
    /// [`SafetensorsError::Missing`], [`SafetensorsError::Mismatch`].
    pub fn expect(
        &self,
        name: &str,
        dtype: DType,
        dims: &[u64],
    ) -> Result<&TensorInfo, SafetensorsError> {
        let t = self.tensor(name)?;
        if t.dtype != dtype || t.shape.dims() != dims {
            return Err(SafetensorsError::Mismatch {
                name: name.to_string(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                expected: format!("{dtype} {}", Shape::new(dims.to_vec())),
            });
        }
        Ok(t)
    }

    /// The bytes of tensor `name` in `file` (the bytes this index was parsed from).
    ///
    /// # Errors
    /// [`SafetensorsError::Missing`]; [`SafetensorsError::TooShort`] when `file` is not the
    /// parsed file (shorter than it).
    pub fn tensor_bytes<'a>(
        &self,
        file: &'a [u8],
        name: &str,
    ) -> Result<&'a [u8], SafetensorsError> {
        let t = self.tensor(name)?;
        if file.len() != self.file_bytes {
            return Err(SafetensorsError::TooShort {
                file_bytes: file.len() as u64,
            });
        }
        Ok(&file[t.range.clone()])
    }

    /// Tensor `name` of `file` as f32 values (F32, F16 and BF16 tensors).
    ///
    /// # Errors
    /// As [`SafeTensors::tensor_bytes`]; [`SafetensorsError::Mismatch`] for other types.
    pub fn f32_values(&self, file: &[u8], name: &str) -> Result<Vec<f32>, SafetensorsError> {
        let t = self.tensor(name)?;
        let bytes = self.tensor_bytes(file, name)?;
        crate::tensor::decode_f32(t.dtype, bytes).map_err(|_| SafetensorsError::Mismatch {
            name: name.to_string(),
            dtype: t.dtype,
            shape: t.shape.clone(),
            expected: "a float tensor".into(),
        })
    }
}

fn tensor_info(
    name: &str,
    value: &serde_json::Value,
    data_start: usize,
    data_bytes: u64,
) -> Result<TensorInfo, SafetensorsError> {
    let obj = value
        .as_object()
        .ok_or_else(|| entry(name, "not a JSON object"))?;
    let dtype_name = obj
        .get("dtype")
        .and_then(|v| v.as_str())
        .ok_or_else(|| entry(name, "no string `dtype`"))?;
    let dtype = match DTYPES.iter().find(|(n, _)| *n == dtype_name) {
        None => {
            return Err(SafetensorsError::UnknownDType {
                name: name.to_string(),
                dtype: dtype_name.to_string(),
            })
        }
        Some((_, None)) => {
            return Err(SafetensorsError::UnsupportedDType {
                name: name.to_string(),
                dtype: dtype_name.to_string(),
            })
        }
        Some((_, Some(d))) => *d,
    };
    let dims_json = obj
        .get("shape")
        .and_then(|v| v.as_array())
        .ok_or_else(|| entry(name, "no array `shape`"))?;
    if dims_json.len() > MAX_RANK {
        return Err(entry(
            name,
            format!("{} dimensions (at most {MAX_RANK})", dims_json.len()),
        ));
    }
    let dims = dims_json
        .iter()
        .map(|d| d.as_u64())
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| entry(name, "a dimension is not a non-negative integer"))?;
    let shape = Shape::new(dims);
    let expected_bytes = shape
        .size_bytes(dtype)
        .map_err(|cause| SafetensorsError::Shape {
            name: name.to_string(),
            cause,
        })?;
    let offsets = obj
        .get("data_offsets")
        .and_then(|v| v.as_array())
        .filter(|a| a.len() == 2)
        .ok_or_else(|| entry(name, "no `data_offsets` pair"))?;
    let (Some(begin), Some(end)) = (offsets[0].as_u64(), offsets[1].as_u64()) else {
        return Err(entry(name, "an offset is not a non-negative integer"));
    };
    if begin > end || end > data_bytes || end - begin != expected_bytes {
        return Err(SafetensorsError::Offsets {
            name: name.to_string(),
            begin,
            end,
            expected_bytes,
            data_bytes,
        });
    }
    // `end <= data_bytes`, so both fit in usize beside `data_start`.
    Ok(TensorInfo {
        name: name.to_string(),
        dtype,
        shape,
        range: data_start + begin as usize..data_start + end as usize,
    })
}

/// A safetensors file's bytes from a header map of `(name, dtype, dims, bytes)`: the
/// writer of the tests' files (tensors in the order given, no padding).
pub fn write(tensors: &[(&str, &str, &[u64], &[u8])]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, dtype, dims, bytes) in tensors {
        header.insert(
            name.to_string(),
            serde_json::json!({
                "dtype": dtype,
                "shape": dims,
                "data_offsets": [offset, offset + bytes.len()],
            }),
        );
        offset += bytes.len();
    }
    let header = serde_json::Value::Object(header).to_string();
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    for (_, _, _, bytes) in tensors {
        out.extend_from_slice(bytes);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn a_written_file_reads_back() {
        let a = f32_bytes(&[1.0, -2.0, 3.5, 0.25, 8.0, 9.0]);
        let b = [1u8, 0, 1];
        let file = write(&[("a", "F32", &[2, 3], &a), ("b", "BOOL", &[3], &b)]);
        let st = SafeTensors::parse(&file).unwrap();
        assert_eq!(st.len(), 2);
        assert_eq!(
            st.f32_values(&file, "a").unwrap(),
            vec![1.0, -2.0, 3.5, 0.25, 8.0, 9.0]
        );
        assert_eq!(st.tensor_bytes(&file, "b").unwrap(), &b);
        assert_eq!(st.expect("a", DType::F32, &[2, 3]).unwrap().name, "a");
        assert!(matches!(
            st.expect("a", DType::F32, &[3, 2]),
            Err(SafetensorsError::Mismatch { .. })
        ));
        assert!(matches!(
            st.tensor("c"),
            Err(SafetensorsError::Missing { .. })
        ));
    }

    #[test]
    fn metadata_and_empty_tensors_are_kept() {
        let header = r#"{"__metadata__":{"format":"pt"},"e":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]},"x":{"dtype":"I64","shape":[],"data_offsets":[0,8]}}"#;
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(header.as_bytes());
        file.extend_from_slice(&7i64.to_le_bytes());
        let st = SafeTensors::parse(&file).unwrap();
        assert_eq!(st.metadata()["format"], "pt");
        assert_eq!(st.tensor("e").unwrap().range.len(), 0);
        assert_eq!(st.tensor("x").unwrap().shape.dims(), &[] as &[u64]);
    }
}
