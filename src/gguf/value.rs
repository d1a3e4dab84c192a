//! Metadata values: the thirteen GGUF value types, arrays (nested too), and the conversions
//! the typed accessors of [`Gguf`](super::Gguf) use.

/// A GGUF metadata value type id (the `gguf_type` enum of the format).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ValueType {
    /// `u8` (id 0).
    U8,
    /// `i8` (id 1).
    I8,
    /// `u16` (id 2).
    U16,
    /// `i16` (id 3).
    I16,
    /// `u32` (id 4).
    U32,
    /// `i32` (id 5).
    I32,
    /// `f32` (id 6).
    F32,
    /// Boolean, one byte 0 or 1 (id 7).
    Bool,
    /// UTF-8 string: `u64` length, then bytes (id 8).
    Str,
    /// Array: `u32` element type, `u64` count, elements (id 9).
    Array,
    /// `u64` (id 10).
    U64,
    /// `i64` (id 11).
    I64,
    /// `f64` (id 12).
    F64,
}

impl ValueType {
    /// The type with id `id`, or `None`.
    pub fn from_id(id: u32) -> Option<ValueType> {
        Some(match id {
            0 => ValueType::U8,
            1 => ValueType::I8,
            2 => ValueType::U16,
            3 => ValueType::I16,
            4 => ValueType::U32,
            5 => ValueType::I32,
            6 => ValueType::F32,
            7 => ValueType::Bool,
            8 => ValueType::Str,
            9 => ValueType::Array,
            10 => ValueType::U64,
            11 => ValueType::I64,
            12 => ValueType::F64,
            _ => return None,
        })
    }

    /// The type's id in a file.
    pub fn id(self) -> u32 {
        match self {
            ValueType::U8 => 0,
            ValueType::I8 => 1,
            ValueType::U16 => 2,
            ValueType::I16 => 3,
            ValueType::U32 => 4,
            ValueType::I32 => 5,
            ValueType::F32 => 6,
            ValueType::Bool => 7,
            ValueType::Str => 8,
            ValueType::Array => 9,
            ValueType::U64 => 10,
            ValueType::I64 => 11,
            ValueType::F64 => 12,
        }
    }

    /// The fewest bytes one value of this type takes in a file (a string: its `u64` length;
    /// an array: its element type and count). Never zero, so a count can be checked against
    /// the bytes left before anything is allocated.
    pub fn min_size_bytes(self) -> u64 {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
            ValueType::U16 | ValueType::I16 => 2,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
            ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::Str => 8,
            ValueType::Array => 12,
        }
    }

    /// A short name for messages (`"u32"`, `"string"`).
    pub fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::Str => "string",
            ValueType::Array => "array",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        }
    }
}

/// One metadata value. Serializes (serde) as the bare value: `42`, `"llama"`, `[1, 2]`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
#[non_exhaustive]
pub enum MetaValue {
    /// `u8`.
    U8(u8),
    /// `i8`.
    I8(i8),
    /// `u16`.
    U16(u16),
    /// `i16`.
    I16(i16),
    /// `u32`.
    U32(u32),
    /// `i32`.
    I32(i32),
    /// `f32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// A UTF-8 string.
    Str(String),
    /// An array.
    Array(MetaArray),
    /// `u64`.
    U64(u64),
    /// `i64`.
    I64(i64),
    /// `f64`.
    F64(f64),
}

/// A metadata array: one element type, stored unboxed (the 49152 token strings of a
/// vocabulary are one `Vec<String>`, not 49152 values). Serializes as a bare list.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
#[non_exhaustive]
pub enum MetaArray {
    /// `u8` elements.
    U8(Vec<u8>),
    /// `i8` elements.
    I8(Vec<i8>),
    /// `u16` elements.
    U16(Vec<u16>),
    /// `i16` elements.
    I16(Vec<i16>),
    /// `u32` elements.
    U32(Vec<u32>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `f32` elements.
    F32(Vec<f32>),
    /// `bool` elements.
    Bool(Vec<bool>),
    /// String elements.
    Str(Vec<String>),
    /// Arrays of arrays (each inner array has its own element type).
    Array(Vec<MetaArray>),
    /// `u64` elements.
    U64(Vec<u64>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `f64` elements.
    F64(Vec<f64>),
}

impl MetaValue {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            MetaValue::U8(_) => ValueType::U8,
            MetaValue::I8(_) => ValueType::I8,
            MetaValue::U16(_) => ValueType::U16,
            MetaValue::I16(_) => ValueType::I16,
            MetaValue::U32(_) => ValueType::U32,
            MetaValue::I32(_) => ValueType::I32,
            MetaValue::F32(_) => ValueType::F32,
            MetaValue::Bool(_) => ValueType::Bool,
            MetaValue::Str(_) => ValueType::Str,
            MetaValue::Array(_) => ValueType::Array,
            MetaValue::U64(_) => ValueType::U64,
            MetaValue::I64(_) => ValueType::I64,
            MetaValue::F64(_) => ValueType::F64,
        }
    }

    /// The value as a signed 128-bit integer when it is one of the eight integer types
    /// (every one fits, so callers range-check once).
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            MetaValue::U8(v) => v.into(),
            MetaValue::I8(v) => v.into(),
            MetaValue::U16(v) => v.into(),
            MetaValue::I16(v) => v.into(),
            MetaValue::U32(v) => v.into(),
            MetaValue::I32(v) => v.into(),
            MetaValue::U64(v) => v.into(),
            MetaValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as `f64` when it is `f32` or `f64`.
    pub fn as_float(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => None,
        }
    }
}

impl MetaArray {
    /// The element type.
    pub fn element_type(&self) -> ValueType {
        match self {
            MetaArray::U8(_) => ValueType::U8,
            MetaArray::I8(_) => ValueType::I8,
            MetaArray::U16(_) => ValueType::U16,
            MetaArray::I16(_) => ValueType::I16,
            MetaArray::U32(_) => ValueType::U32,
            MetaArray::I32(_) => ValueType::I32,
            MetaArray::F32(_) => ValueType::F32,
            MetaArray::Bool(_) => ValueType::Bool,
            MetaArray::Str(_) => ValueType::Str,
            MetaArray::Array(_) => ValueType::Array,
            MetaArray::U64(_) => ValueType::U64,
            MetaArray::I64(_) => ValueType::I64,
            MetaArray::F64(_) => ValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            MetaArray::U8(v) => v.len(),
            MetaArray::I8(v) => v.len(),
            MetaArray::U16(v) => v.len(),
            MetaArray::I16(v) => v.len(),
            MetaArray::U32(v) => v.len(),
            MetaArray::I32(v) => v.len(),
            MetaArray::F32(v) => v.len(),
            MetaArray::Bool(v) => v.len(),
            MetaArray::Str(v) => v.len(),
            MetaArray::Array(v) => v.len(),
            MetaArray::U64(v) => v.len(),
            MetaArray::I64(v) => v.len(),
            MetaArray::F64(v) => v.len(),
        }
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
