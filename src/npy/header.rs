//! The `.npy` header: a Python dict literal with exactly `'descr'`, `'fortran_order'` and
//! `'shape'`, parsed in one forward pass without recursion (see the module docs of
//! [`crate::npy`]).

use super::{malformed, quote, NpyError, MAX_DIMS};
use crate::onnx::TensorDType;

/// A `.npy` header's three keys.
#[derive(Debug, PartialEq)]
pub(super) struct Header {
    pub(super) dtype: TensorDType,
    pub(super) big_endian: bool,
    pub(super) fortran_order: bool,
    pub(super) shape: Vec<u64>,
}

/// One forward pass over the header text.
struct Cursor<'a> {
    text: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn skip_space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// A [`NpyError::Malformed`] saying what was expected here and quoting what is here.
    fn expected(&self, what: &str) -> NpyError {
        let rest = &self.text[self.at.min(self.text.len())..];
        let found = if rest.is_empty() {
            "the end of the header".to_string()
        } else {
            format!("`{}`", quote(rest))
        };
        malformed(format!(
            "header byte {}: expected {what}, found {found}",
            self.at
        ))
    }

    fn eat(&mut self, byte: u8) -> bool {
        if self.peek() == Some(byte) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    /// A quoted string without escapes (`'...'` or `"..."`), its contents.
    fn string(&mut self, what: &str) -> Result<&'a [u8], NpyError> {
        let Some(q @ (b'\'' | b'"')) = self.peek() else {
            return Err(self.expected(what));
        };
        let start = self.at + 1;
        let Some(len) = self.text[start..]
            .iter()
            .position(|&b| b == q || b == b'\\' || b == b'\n')
        else {
            return Err(self.expected("a string closed on its line"));
        };
        let end = start + len;
        if self.text[end] != q {
            self.at = end;
            return Err(self.expected("the string's closing quote (escapes are not read)"));
        }
        self.at = end + 1;
        Ok(&self.text[start..end])
    }

    /// A run of ASCII letters.
    fn word(&mut self) -> &'a [u8] {
        let start = self.at;
        while self.peek().is_some_and(|b| b.is_ascii_alphabetic()) {
            self.at += 1;
        }
        &self.text[start..self.at]
    }

    /// A non-negative decimal integer (a trailing `L`, as Python 2 wrote longs, is allowed).
    fn dim(&mut self) -> Result<u64, NpyError> {
        let start = self.at;
        let mut value = 0u64;
        while let Some(d @ b'0'..=b'9') = self.peek() {
            value = value
                .checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(d - b'0')))
                .ok_or_else(|| {
                    self.at = start;
                    self.expected("a dimension below 2^64")
                })?;
            self.at += 1;
        }
        if self.at == start {
            return Err(self.expected("a non-negative integer dimension"));
        }
        let _ = self.eat(b'L');
        Ok(value)
    }

    /// `(d0, d1, ...)`, trailing comma allowed; `()` for a scalar.
    fn shape(&mut self) -> Result<Vec<u64>, NpyError> {
        if !self.eat(b'(') {
            return Err(self.expected("a shape tuple `(...)`"));
        }
        let mut dims = Vec::new();
        loop {
            self.skip_space();
            if self.eat(b')') {
                return Ok(dims);
            }
            if dims.len() == MAX_DIMS {
                return Err(NpyError::TooManyDims { max_dims: MAX_DIMS });
            }
            dims.push(self.dim()?);
            self.skip_space();
            if self.eat(b')') {
                return Ok(dims);
            }
            if !self.eat(b',') {
                return Err(self.expected("`,` or `)` in the shape"));
            }
        }
    }
}

/// The element type and byte order of a `descr` such as `<f4`, `>i8`, `|u1` or `|b1`.
fn dtype_of(descr: &[u8]) -> Option<(TensorDType, bool)> {
    let (order, code) = match descr.first() {
        Some(&o @ (b'<' | b'>' | b'|' | b'=')) => (o, &descr[1..]),
        _ => (b'=', descr),
    };
    let dtype = match code {
        b"f2" => TensorDType::F16,
        b"f4" => TensorDType::F32,
        b"f8" => TensorDType::F64,
        b"i1" => TensorDType::I8,
        b"i2" => TensorDType::I16,
        b"i4" => TensorDType::I32,
        b"i8" => TensorDType::I64,
        b"u1" => TensorDType::U8,
        b"u2" => TensorDType::U16,
        b"u4" => TensorDType::U32,
        b"u8" => TensorDType::U64,
        b"b1" | b"?" => TensorDType::Bool,
        _ => return None,
    };
    let big_endian = match order {
        b'>' => true,
        b'<' => false,
        // `|` (no byte order) and `=` (native).
        _ => cfg!(target_endian = "big"),
    };
    Some((dtype, big_endian))
}

/// Parses the header text: a dict literal with exactly `descr`, `fortran_order` and `shape`.
pub(super) fn parse_header(text: &[u8]) -> Result<Header, NpyError> {
    let mut c = Cursor { text, at: 0 };
    let mut descr: Option<(TensorDType, bool)> = None;
    let mut fortran_order = None;
    let mut shape = None;
    c.skip_space();
    if !c.eat(b'{') {
        return Err(c.expected("`{`"));
    }
    loop {
        c.skip_space();
        if c.eat(b'}') {
            break;
        }
        let key_at = c.at;
        let key = c.string("a quoted key or `}`")?;
        let duplicate = match key {
            b"descr" => descr.is_some(),
            b"fortran_order" => fortran_order.is_some(),
            b"shape" => shape.is_some(),
            _ => {
                c.at = key_at;
                return Err(c.expected("one of the keys 'descr', 'fortran_order', 'shape'"));
            }
        };
        if duplicate {
            c.at = key_at;
            return Err(c.expected("each key once"));
        }
        c.skip_space();
        if !c.eat(b':') {
            return Err(c.expected("`:` after the key"));
        }
        c.skip_space();
        match key {
            b"descr" => {
                if c.peek() == Some(b'[') {
                    // A list of fields: a structured dtype.
                    return Err(NpyError::UnsupportedDType {
                        descr: quote(&c.text[c.at..]),
                    });
                }
                let d = c.string("a quoted dtype such as '<f4'")?;
                descr = Some(
                    dtype_of(d).ok_or_else(|| NpyError::UnsupportedDType { descr: quote(d) })?,
                );
            }
            b"fortran_order" => {
                let at = c.at;
                fortran_order = Some(match c.word() {
                    b"True" => true,
                    b"False" => false,
                    _ => {
                        c.at = at;
                        return Err(c.expected("True or False"));
                    }
                });
            }
            _ => shape = Some(c.shape()?),
        }
        c.skip_space();
        if c.eat(b'}') {
            break;
        }
        if !c.eat(b',') {
            return Err(c.expected("`,` or `}`"));
        }
    }
    c.skip_space();
    if c.at != text.len() {
        return Err(c.expected("only padding after `}`"));
    }
    let missing = |key: &str| malformed(format!("the header has no '{key}'"));
    let (dtype, big_endian) = descr.ok_or_else(|| missing("descr"))?;
    Ok(Header {
        dtype,
        big_endian,
        fortran_order: fortran_order.ok_or_else(|| missing("fortran_order"))?,
        shape: shape.ok_or_else(|| missing("shape"))?,
    })
}
