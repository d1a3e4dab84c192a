//! The parser: header, metadata, tensor infos, alignment and the data section, validated
//! against the size of the bytes before anything is allocated.

use super::value::{MetaArray, MetaValue, ValueType};
use super::{GgmlType, GgufError};
use std::collections::HashMap;
use std::ops::Range;

/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT_BYTES: u64 = 32;
/// Deepest nesting of arrays in arrays that the parser follows (real files use at most 2;
/// the limit keeps a hostile file from exhausting the stack).
pub const MAX_ARRAY_NESTING: usize = 16;
/// ggml's most dimensions per tensor.
pub const MAX_DIMS: u32 = 4;

/// The bytes a tensor info takes at the least: name length, `n_dims`, type and offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;
/// The bytes a key-value pair takes at the least: key length, type and a one-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;

/// One tensor of a GGUF file: name, type, dims and where its bytes are.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    name: String,
    ggml_type: GgmlType,
    dims: Vec<u64>,
    num_elements: u64,
    offset_bytes: u64,
    size_bytes: u64,
}

impl TensorInfo {
    /// The tensor's name (`"blk.0.attn_q.weight"`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its element type.
    pub fn ggml_type(&self) -> GgmlType {
        self.ggml_type
    }

    /// Its dims in ggml order: innermost (contiguous, the row length) first. A weight of
    /// `n_out` rows of `n_in` inputs is `[n_in, n_out]`.
    pub fn dims(&self) -> &[u64] {
        &self.dims
    }

    /// Number of elements (the product of the dims; 1 for no dims).
    pub fn num_elements(&self) -> u64 {
        self.num_elements
    }

    /// Elements per row: the innermost dim.
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows: every dim but the innermost, multiplied.
    pub fn num_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }

    /// Byte offset of its data from the start of the file (not of the data section).
    pub fn offset_bytes(&self) -> u64 {
        self.offset_bytes
    }

    /// Bytes of its data in the file (blocks included).
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// `offset_bytes .. offset_bytes + size_bytes`.
    pub fn byte_range(&self) -> Range<u64> {
        self.offset_bytes..self.offset_bytes + self.size_bytes
    }
}

/// A parsed GGUF file: its metadata and tensor index, owned, without the tensor bytes.
///
/// [`Gguf::parse`] reads from a byte slice (a memory map natively, see
/// [`MappedGguf`](super::MappedGguf), or bytes fetched in the browser); tensor data is read
/// later by [`Gguf::tensor_bytes`] from the same slice, so nothing of the weights is copied.
#[derive(Debug, Clone)]
pub struct Gguf {
    version: u32,
    file_bytes: u64,
    alignment_bytes: u64,
    data_offset_bytes: u64,
    metadata: Vec<(String, MetaValue)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

/// A bounds-checked little-endian cursor over the file.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn file_bytes(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos as u64,
                needed_bytes: n,
                file_bytes: self.file_bytes(),
            });
        }
        // n <= remaining <= usize::MAX, so the cast is exact.
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufError> {
        let b = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A `u64` count of elements that each take at least `min_bytes_each` bytes, checked
    /// against what is left so that a hostile count never reaches an allocation.
    fn count(
        &mut self,
        min_bytes_each: u64,
        what: impl Fn() -> String,
    ) -> Result<usize, GgufError> {
        let count = self.u64(&what)?;
        let remaining_bytes = self.remaining();
        match count.checked_mul(min_bytes_each) {
            Some(need) if need <= remaining_bytes => Ok(count as usize),
            _ => Err(GgufError::CountTooLarge {
                what: what(),
                count,
                remaining_bytes,
                min_bytes_each,
            }),
        }
    }

    fn string(&mut self, what: impl Fn() -> String) -> Result<String, GgufError> {
        let len = self.u64(|| format!("the length of {}", what()))?;
        let offset = self.pos as u64;
        let bytes = self.take(len, &what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 {
                what: what(),
                offset,
            }),
        }
    }

    fn value_type(&mut self, key: &str) -> Result<ValueType, GgufError> {
        let id = self.u32(|| format!("the type of key `{key}`"))?;
        ValueType::from_id(id).ok_or_else(|| GgufError::UnknownValueType {
            key: key.to_owned(),
            type_id: id,
        })
    }

    fn value(&mut self, key: &str, ty: ValueType) -> Result<MetaValue, GgufError> {
        let what = || format!("the value of key `{key}`");
        Ok(match ty {
            ValueType::U8 => MetaValue::U8(u8::from_le_bytes(self.array(what)?)),
            ValueType::I8 => MetaValue::I8(i8::from_le_bytes(self.array(what)?)),
            ValueType::U16 => MetaValue::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => MetaValue::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => MetaValue::U32(u32::from_le_bytes(self.array(what)?)),
            ValueType::I32 => MetaValue::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::F32 => MetaValue::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::U64 => MetaValue::U64(u64::from_le_bytes(self.array(what)?)),
            ValueType::I64 => MetaValue::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F64 => MetaValue::F64(f64::from_le_bytes(self.array(what)?)),
            ValueType::Bool => MetaValue::Bool(self.bool(key)?),
            ValueType::Str => MetaValue::Str(self.string(what)?),
            ValueType::Array => MetaValue::Array(self.meta_array(key, 0)?),
        })
    }

    fn bool(&mut self, key: &str) -> Result<bool, GgufError> {
        let [b] = self.array(|| format!("a boolean of key `{key}`"))?;
        match b {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(GgufError::InvalidBool {
                key: key.to_owned(),
                value,
            }),
        }
    }

    /// Reads `count` fixed-size numbers at once.
    fn numbers<T, const N: usize>(
        &mut self,
        key: &str,
        count: usize,
        from_le: fn([u8; N]) -> T,
    ) -> Result<Vec<T>, GgufError> {
        // `count` passed `count()`, so count * N <= count * min_size <= remaining.
        let bytes = self.take(count as u64 * N as u64, || {
            format!("the elements of key `{key}`")
        })?;
        Ok(bytes
            .chunks_exact(N)
            .map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                from_le(a)
            })
            .collect())
    }

    fn meta_array(&mut self, key: &str, depth: usize) -> Result<MetaArray, GgufError> {
        if depth >= MAX_ARRAY_NESTING {
            return Err(GgufError::NestingTooDeep {
                key: key.to_owned(),
                max_depth: MAX_ARRAY_NESTING,
            });
        }
        let elem = self.value_type(key)?;
        let count = self.count(elem.min_size_bytes(), || {
            format!("the array of key `{key}`")
        })?;
        Ok(match elem {
            ValueType::U8 => MetaArray::U8(self.numbers(key, count, u8::from_le_bytes)?),
            ValueType::I8 => MetaArray::I8(self.numbers(key, count, i8::from_le_bytes)?),
            ValueType::U16 => MetaArray::U16(self.numbers(key, count, u16::from_le_bytes)?),
            ValueType::I16 => MetaArray::I16(self.numbers(key, count, i16::from_le_bytes)?),
            ValueType::U32 => MetaArray::U32(self.numbers(key, count, u32::from_le_bytes)?),
            ValueType::I32 => MetaArray::I32(self.numbers(key, count, i32::from_le_bytes)?),
            ValueType::F32 => MetaArray::F32(self.numbers(key, count, f32::from_le_bytes)?),
            ValueType::U64 => MetaArray::U64(self.numbers(key, count, u64::from_le_bytes)?),
            ValueType::I64 => MetaArray::I64(self.numbers(key, count, i64::from_le_bytes)?),
            ValueType::F64 => MetaArray::F64(self.numbers(key, count, f64::from_le_bytes)?),
            ValueType::Bool => {
                let mut v = Vec::with_capacity(count);
                for _ in 0..count {
                    v.push(self.bool(key)?);
                }
                MetaArray::Bool(v)
            }
            ValueType::Str => {
                let mut v = Vec::with_capacity(count);
                for i in 0..count {
                    v.push(self.string(|| format!("element {i} of key `{key}`"))?);
                }
                MetaArray::Str(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(count);
                for _ in 0..count {
                    v.push(self.meta_array(key, depth + 1)?);
                }
                MetaArray::Array(v)
            }
        })
    }

    fn tensor_info(&mut self, index: usize) -> Result<(TensorInfo, u64), GgufError> {
        let name = self.string(|| format!("the name of tensor #{index}"))?;
        let n_dims = self.u32(|| format!("the dim count of tensor `{name}`"))?;
        if n_dims > MAX_DIMS {
            return Err(GgufError::BadDimCount {
                tensor: name,
                n_dims,
                max: MAX_DIMS,
            });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(self.u64(|| format!("dim {d} of tensor `{name}`"))?);
        }
        let type_id = self.u32(|| format!("the type of tensor `{name}`"))?;
        let relative_offset = self.u64(|| format!("the offset of tensor `{name}`"))?;
        let Some(ggml_type) = GgmlType::from_id(type_id) else {
            return Err(GgufError::UnknownTensorType {
                tensor: name,
                type_id,
            });
        };
        // ggml keeps dims in int64_t: larger ones are as invalid as a product that overflows.
        let num_elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64 && dims.iter().all(|&d| d <= i64::MAX as u64));
        let Some(num_elements) = num_elements else {
            return Err(GgufError::DimsOverflow { tensor: name, dims });
        };
        let row_len = dims.first().copied().unwrap_or(1);
        if row_len % ggml_type.block_len() != 0 {
            return Err(GgufError::PartialBlock {
                tensor: name,
                ty: ggml_type,
                row_len,
                block_len: ggml_type.block_len(),
            });
        }
        let Some(size_bytes) = ggml_type.size_bytes(num_elements) else {
            return Err(GgufError::DimsOverflow { tensor: name, dims });
        };
        Ok((
            TensorInfo {
                name,
                ggml_type,
                dims,
                num_elements,
                offset_bytes: 0,
                size_bytes,
            },
            relative_offset,
        ))
    }
}

impl Gguf {
    /// Parses a whole GGUF file (version 2 or 3, little-endian) from its bytes.
    ///
    /// Validates the magic and version; every count and string length against the bytes
    /// left, before allocating; value types, booleans, UTF-8, array nesting, duplicate keys
    /// and tensor names; `general.alignment`; each tensor's dim count, dims whose product or
    /// byte size overflows, known type, whole blocks per row, aligned offset, bytes inside
    /// the file and not overlapping another tensor's.
    ///
    /// # Errors
    /// A [`GgufError`] naming the key, the tensor or the byte offset of the first problem.
    pub fn parse(bytes: &[u8]) -> Result<Gguf, GgufError> {
        let mut r = Reader { bytes, pos: 0 };
        let magic: [u8; 4] = r.array(|| "the magic".into())?;
        if &magic != b"GGUF" {
            return Err(GgufError::BadMagic { found: magic });
        }
        let version = r.u32(|| "the version".into())?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion { version });
        }
        let tensor_count = r.u64(|| "the tensor count".into())?;
        let kv_count = r.count(MIN_KV_BYTES, || "the metadata key count".into())?;
        // The tensor infos follow the metadata, so their count is checked against the bytes
        // left once the metadata is read.

        let mut metadata = Vec::with_capacity(kv_count);
        let mut key_index = HashMap::with_capacity(kv_count);
        for i in 0..kv_count {
            let key = r.string(|| format!("the name of key #{i}"))?;
            let ty = r.value_type(&key)?;
            let value = r.value(&key, ty)?;
            if key_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(GgufError::DuplicateKey { key });
            }
            metadata.push((key, value));
        }

        let alignment_bytes = match key_index.get("general.alignment") {
            None => DEFAULT_ALIGNMENT_BYTES,
            Some(&i) => {
                let value = &metadata[i].1;
                let Some(a) = value.as_integer() else {
                    return Err(GgufError::WrongType {
                        key: "general.alignment".into(),
                        expected: "an integer",
                        found: value.value_type().name(),
                    });
                };
                match u32::try_from(a) {
                    Ok(a) if a.is_power_of_two() => a as u64,
                    _ => {
                        return Err(GgufError::BadAlignment {
                            value: a.clamp(0, u64::MAX as i128) as u64,
                        })
                    }
                }
            }
        };

        let remaining_bytes = r.remaining();
        if tensor_count
            .checked_mul(MIN_TENSOR_INFO_BYTES)
            .is_none_or(|need| need > remaining_bytes)
        {
            return Err(GgufError::CountTooLarge {
                what: "the tensor count".into(),
                count: tensor_count,
                remaining_bytes,
                min_bytes_each: MIN_TENSOR_INFO_BYTES,
            });
        }
        let tensor_count = tensor_count as usize;
        let mut tensors = Vec::with_capacity(tensor_count);
        let mut relative_offsets = Vec::with_capacity(tensor_count);
        let mut tensor_index = HashMap::with_capacity(tensor_count);
        for i in 0..tensor_count {
            let (info, relative) = r.tensor_info(i)?;
            if tensor_index
                .insert(info.name.clone(), tensors.len())
                .is_some()
            {
                return Err(GgufError::DuplicateTensor { tensor: info.name });
            }
            tensors.push(info);
            relative_offsets.push(relative);
        }

        let file_bytes = r.file_bytes();
        // The data section starts at the next multiple of the alignment; a file without
        // tensors may end before it.
        let data_offset_bytes = (r.pos as u64).next_multiple_of(alignment_bytes);
        if !tensors.is_empty() && data_offset_bytes > file_bytes {
            return Err(GgufError::Truncated {
                what: "the padding before the data section".into(),
                offset: r.pos as u64,
                needed_bytes: data_offset_bytes - r.pos as u64,
                file_bytes,
            });
        }
        for (info, &relative) in tensors.iter_mut().zip(&relative_offsets) {
            if relative % alignment_bytes != 0 {
                return Err(GgufError::MisalignedTensor {
                    tensor: info.name.clone(),
                    offset: relative,
                    alignment: alignment_bytes,
                });
            }
            let start = data_offset_bytes.checked_add(relative);
            let end = start.and_then(|s| s.checked_add(info.size_bytes));
            match (start, end) {
                (Some(start), Some(end)) if end <= file_bytes => info.offset_bytes = start,
                _ => {
                    return Err(GgufError::TensorOutOfBounds {
                        tensor: info.name.clone(),
                        start: start.unwrap_or(u64::MAX),
                        end: end.unwrap_or(u64::MAX),
                        file_bytes,
                    })
                }
            }
        }
        let mut by_offset: Vec<&TensorInfo> = tensors.iter().filter(|t| t.size_bytes > 0).collect();
        by_offset.sort_by_key(|t| t.offset_bytes);
        for pair in by_offset.windows(2) {
            if pair[0].byte_range().end > pair[1].offset_bytes {
                return Err(GgufError::TensorsOverlap {
                    first: pair[0].name.clone(),
                    second: pair[1].name.clone(),
                });
            }
        }

        Ok(Gguf {
            version,
            file_bytes,
            alignment_bytes,
            data_offset_bytes,
            metadata,
            key_index,
            tensors,
            tensor_index,
        })
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Size in bytes of the file this was parsed from.
    pub fn file_bytes(&self) -> u64 {
        self.file_bytes
    }

    /// The alignment of the data section and of each tensor (`general.alignment`, else 32).
    pub fn alignment_bytes(&self) -> u64 {
        self.alignment_bytes
    }

    /// Byte offset of the data section from the start of the file.
    pub fn data_offset_bytes(&self) -> u64 {
        self.data_offset_bytes
    }

    /// Every key and value, in file order.
    pub fn metadata(&self) -> impl Iterator<Item = (&str, &MetaValue)> {
        self.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor named `name`.
    ///
    /// # Errors
    /// [`GgufError::MissingTensor`].
    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensor(name).ok_or_else(|| GgufError::MissingTensor {
            tensor: name.to_owned(),
        })
    }

    /// The bytes of tensor `name` inside `file`, which must be the bytes this was parsed from.
    ///
    /// # Errors
    /// [`GgufError::MissingTensor`]; [`GgufError::LengthMismatch`] when `file` is not as
    /// long as the parsed file.
    pub fn tensor_bytes<'a>(&self, file: &'a [u8], name: &str) -> Result<&'a [u8], GgufError> {
        let info = self.require_tensor(name)?;
        if file.len() as u64 != self.file_bytes {
            return Err(GgufError::LengthMismatch {
                what: format!("the file holding tensor `{name}`"),
                expected_bytes: self.file_bytes,
                actual_bytes: file.len() as u64,
            });
        }
        // Parsing checked that the range lies inside a file of this length.
        let r = info.byte_range();
        Ok(&file[r.start as usize..r.end as usize])
    }

    fn lookup(&self, key: &str) -> Result<&MetaValue, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_owned(),
        })
    }

    fn wrong_type(key: &str, expected: &'static str, found: &MetaValue) -> GgufError {
        GgufError::WrongType {
            key: key.to_owned(),
            expected,
            found: found.value_type().name(),
        }
    }

    fn integer<T: TryFrom<i128>>(&self, key: &str, expected: &'static str) -> Result<T, GgufError> {
        let value = self.lookup(key)?;
        let Some(i) = value.as_integer() else {
            return Err(Self::wrong_type(key, expected, value));
        };
        T::try_from(i).map_err(|_| GgufError::ValueOutOfRange {
            key: key.to_owned(),
            value: i.to_string(),
            reason: format!("does not fit in {expected}"),
        })
    }

    /// `key` as `u32`: any integer type whose value fits.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], [`GgufError::WrongType`], [`GgufError::ValueOutOfRange`].
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.integer(key, "u32")
    }

    /// `key` as `u64`: any integer type whose value fits.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], [`GgufError::WrongType`], [`GgufError::ValueOutOfRange`].
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.integer(key, "u64")
    }

    /// `key` as `i64`: any integer type whose value fits.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], [`GgufError::WrongType`], [`GgufError::ValueOutOfRange`].
    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        self.integer(key, "i64")
    }

    /// `key` as `f32`: an `f32`, or an `f64` (rounded).
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], [`GgufError::WrongType`].
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        let value = self.lookup(key)?;
        value
            .as_float()
            .map(|f| f as f32)
            .ok_or_else(|| Self::wrong_type(key, "f32", value))
    }

    /// `key` as a boolean.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], [`GgufError::WrongType`].
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.lookup(key)? {
            MetaValue::Bool(b) => Ok(*b),
            v => Err(Self::wrong_type(key, "bool", v)),
        }
    }

    /// `key` as a string.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], [`GgufError::WrongType`].
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.lookup(key)? {
            MetaValue::Str(s) => Ok(s),
            v => Err(Self::wrong_type(key, "string", v)),
        }
    }

    /// `key` as an array of any element type.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], [`GgufError::WrongType`].
    pub fn get_array(&self, key: &str) -> Result<&MetaArray, GgufError> {
        match self.lookup(key)? {
            MetaValue::Array(a) => Ok(a),
            v => Err(Self::wrong_type(key, "array", v)),
        }
    }

    /// `key` as an array of strings.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], [`GgufError::WrongType`] (also for another element type).
    pub fn get_str_array(&self, key: &str) -> Result<&[String], GgufError> {
        match self.get_array(key)? {
            MetaArray::Str(v) => Ok(v),
            _ => Err(Self::wrong_type(key, "array of strings", self.lookup(key)?)),
        }
    }

    /// `key` as an array of `i32`.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], [`GgufError::WrongType`] (also for another element type).
    pub fn get_i32_array(&self, key: &str) -> Result<&[i32], GgufError> {
        match self.get_array(key)? {
            MetaArray::I32(v) => Ok(v),
            _ => Err(Self::wrong_type(key, "array of i32", self.lookup(key)?)),
        }
    }

    /// `key` as an array of `f32` (SentencePiece token scores).
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], [`GgufError::WrongType`] (also for another element type).
    pub fn get_f32_array(&self, key: &str) -> Result<&[f32], GgufError> {
        match self.get_array(key)? {
            MetaArray::F32(v) => Ok(v),
            _ => Err(Self::wrong_type(key, "array of f32", self.lookup(key)?)),
        }
    }

    /// Like [`get_u32`](Self::get_u32) but `Ok(None)` when the key is absent.
    ///
    /// # Errors
    /// As [`get_u32`](Self::get_u32), except for a missing key.
    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        self.optional(key, Self::get_u32)
    }

    /// Like [`get_f32`](Self::get_f32) but `Ok(None)` when the key is absent.
    ///
    /// # Errors
    /// As [`get_f32`](Self::get_f32), except for a missing key.
    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        self.optional(key, Self::get_f32)
    }

    /// Like [`get_bool`](Self::get_bool) but `Ok(None)` when the key is absent.
    ///
    /// # Errors
    /// As [`get_bool`](Self::get_bool), except for a missing key.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.optional(key, Self::get_bool)
    }

    /// Like [`get_str`](Self::get_str) but `Ok(None)` when the key is absent.
    ///
    /// # Errors
    /// As [`get_str`](Self::get_str), except for a missing key.
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.optional(key, Self::get_str)
    }

    fn optional<'s, T>(
        &'s self,
        key: &str,
        get: fn(&'s Self, &str) -> Result<T, GgufError>,
    ) -> Result<Option<T>, GgufError> {
        if self.get(key).is_none() {
            return Ok(None);
        }
        get(self, key).map(Some)
    }
}
