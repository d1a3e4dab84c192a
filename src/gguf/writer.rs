//! Writing GGUF files: small models and malformed-file fixtures for tests, fuzzing and tools.

use super::value::{MetaArray, MetaValue};
use super::{GgmlType, GgufError, DEFAULT_ALIGNMENT_BYTES};

/// Builds a GGUF file in memory: metadata in insertion order, then tensor infos, then the
/// tensors' bytes, each at the next multiple of the alignment.
///
/// ```
/// use dynrt::gguf::{GgmlType, Gguf, GgufBuilder, MetaValue};
/// let bytes = GgufBuilder::new()
///     .metadata("general.architecture", MetaValue::Str("llama".into()))
///     .tensor("w", GgmlType::F32, &[2, 3], vec![0u8; 24])
///     .build()?;
/// let gguf = Gguf::parse(&bytes)?;
/// assert_eq!(gguf.get_str("general.architecture")?, "llama");
/// assert_eq!(gguf.tensor("w").map(|t| t.dims()), Some(&[2u64, 3][..]));
/// # Ok::<(), dynrt::gguf::GgufError>(())
/// ```
#[derive(Debug, Clone)]
pub struct GgufBuilder {
    version: u32,
    alignment_bytes: u64,
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<(String, GgmlType, Vec<u64>, Vec<u8>)>,
}

impl Default for GgufBuilder {
    fn default() -> Self {
        Self::new()
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn put_array(out: &mut Vec<u8>, a: &MetaArray) {
    out.extend(a.element_type().id().to_le_bytes());
    out.extend((a.len() as u64).to_le_bytes());
    match a {
        MetaArray::U8(v) => out.extend(v),
        MetaArray::I8(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        MetaArray::U16(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        MetaArray::I16(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        MetaArray::U32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        MetaArray::I32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        MetaArray::F32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        MetaArray::U64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        MetaArray::I64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        MetaArray::F64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        MetaArray::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        MetaArray::Str(v) => v.iter().for_each(|s| put_str(out, s)),
        MetaArray::Array(v) => v.iter().for_each(|a| put_array(out, a)),
    }
}

fn put_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.extend(x.to_le_bytes()),
        MetaValue::I8(x) => out.extend(x.to_le_bytes()),
        MetaValue::U16(x) => out.extend(x.to_le_bytes()),
        MetaValue::I16(x) => out.extend(x.to_le_bytes()),
        MetaValue::U32(x) => out.extend(x.to_le_bytes()),
        MetaValue::I32(x) => out.extend(x.to_le_bytes()),
        MetaValue::F32(x) => out.extend(x.to_le_bytes()),
        MetaValue::U64(x) => out.extend(x.to_le_bytes()),
        MetaValue::I64(x) => out.extend(x.to_le_bytes()),
        MetaValue::F64(x) => out.extend(x.to_le_bytes()),
        MetaValue::Bool(b) => out.push(u8::from(*b)),
        MetaValue::Str(s) => put_str(out, s),
        MetaValue::Array(a) => put_array(out, a),
    }
}

fn pad_to(out: &mut Vec<u8>, alignment: u64) {
    let len = out.len() as u64;
    out.resize(len.next_multiple_of(alignment) as usize, 0);
}

impl GgufBuilder {
    /// An empty version-3 file with the default alignment (32 bytes).
    pub fn new() -> Self {
        GgufBuilder {
            version: 3,
            alignment_bytes: DEFAULT_ALIGNMENT_BYTES,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Sets the version field (written as given, so tests can write unsupported ones).
    pub fn version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }

    /// Aligns the data section and the tensors to `bytes` (a power of two) and records it as
    /// `general.alignment`.
    pub fn alignment(mut self, bytes: u32) -> Self {
        self.alignment_bytes = bytes.max(1).into();
        self.metadata("general.alignment", MetaValue::U32(bytes))
    }

    /// Appends a key (written as given, duplicates included).
    pub fn metadata(mut self, key: impl Into<String>, value: MetaValue) -> Self {
        self.metadata.push((key.into(), value));
        self
    }

    /// Appends a tensor with dims in ggml order (innermost first) and its bytes.
    pub fn tensor(
        mut self,
        name: impl Into<String>,
        ty: GgmlType,
        dims: &[u64],
        data: Vec<u8>,
    ) -> Self {
        self.tensors.push((name.into(), ty, dims.to_vec(), data));
        self
    }

    /// The file's bytes.
    ///
    /// # Errors
    /// [`GgufError::LengthMismatch`] when a tensor's bytes are not what its type and dims
    /// need; [`GgufError::DimsOverflow`] when the dims overflow.
    pub fn build(&self) -> Result<Vec<u8>, GgufError> {
        let align = self.alignment_bytes;
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_str(&mut out, key);
            out.extend(value.value_type().id().to_le_bytes());
            put_value(&mut out, value);
        }
        let mut relative = 0u64;
        for (name, ty, dims, data) in &self.tensors {
            let n = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            let Some(expected) = n.and_then(|n| ty.size_bytes(n)) else {
                return Err(GgufError::DimsOverflow {
                    tensor: name.clone(),
                    dims: dims.clone(),
                });
            };
            if expected != data.len() as u64 {
                return Err(GgufError::LengthMismatch {
                    what: format!("tensor `{name}` ({ty} {dims:?})"),
                    expected_bytes: expected,
                    actual_bytes: data.len() as u64,
                });
            }
            put_str(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
            out.extend(ty.id().to_le_bytes());
            out.extend(relative.to_le_bytes());
            relative = (relative + expected).next_multiple_of(align);
        }
        pad_to(&mut out, align);
        for (_, _, _, data) in &self.tensors {
            out.extend(data);
            pad_to(&mut out, align);
        }
        Ok(out)
    }
}
