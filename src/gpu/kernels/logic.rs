//! The `logic` family (`shaders/logic.wgsl`): typed elementwise ops — integer arithmetic
//! (the [`BinaryOp`]s on integer types), comparisons, boolean logic, `where` on other than f32
//! values, casts and the identity copy — on f32, f16, bf16, i32, u32, i8, u8, bool and i64
//! tensors in their real bytes (1-byte types packed four to a word, 16-bit two, i64 as two
//! words). i64 arithmetic is exact (64-bit on word pairs) except division, which is refused.
//! f16 and bf16 are converted to and from f32 with integer bit operations (round to nearest
//! even), so casts, copies, `where` and comparisons run on them without `SHADER_F16`; f16
//! *arithmetic* is refused by the ops' dtype rules.

use super::layout::{broadcast_strides, check_rank, numel, pack8, u32s, INPUT_NAMES};
use super::uniforms::BroadcastParams;
use super::{Encoder, Family, Kernel, KernelError, Operand};
use crate::graph::ops::{BinaryOp, Cast, CompareOp, Identity, LogicOp, Not};
use crate::shape::DType;

/// `shaders/logic.wgsl` after the prelude.
pub const WGSL: &str = crate::gpu::pipeline::with_prelude!("logic");

/// The family: one entry point, every input binding (ops with fewer inputs leave the others
/// [`Encoder::unused`]).
pub const FAMILY: Family = Family {
    name: "logic",
    source: || WGSL,
    bindings: |_| &[1, 2, 3, 4],
    unchecked: &[],
};

/// Op codes of `shaders/logic.wgsl` beyond the [`BinaryOp`] codes.
const OP_COMPARE: u32 = 16;
const OP_LOGIC: u32 = 32;
const OP_NOT: u32 = 48;
const OP_CAST: u32 = 49;
/// `where` (inputs cond, a, b).
pub(crate) const OP_WHERE: u32 = 50;

/// What the family runs on, in words for errors.
const TYPES: &str = "f32, f16, bf16, i32, u32, i8, u8, bool or i64";

/// The element types the family runs on, in the order of the shader's type codes.
pub const FAMILY_TYPES: [DType; 9] = [
    DType::F32,
    DType::I32,
    DType::U32,
    DType::I8,
    DType::U8,
    DType::Bool,
    DType::I64,
    DType::F16,
    DType::BF16,
];

/// The shader's type code of `d` (its position in [`FAMILY_TYPES`]), `None` for a type the
/// family does not run on.
fn type_code(d: DType) -> Option<u32> {
    FAMILY_TYPES.iter().position(|&t| t == d).map(|i| i as u32)
}

/// Whether every input and the output have a type code.
fn typed(inputs: &[DType], output: DType) -> bool {
    type_code(output).is_some() && inputs.iter().all(|&d| type_code(d).is_some())
}

/// Bytes of `n` elements of `d`, rounded up to whole words (allocations are).
fn word_bytes(n: u64, d: DType) -> u64 {
    (n * u64::from(d.bits().unwrap_or(32)) / 8).div_ceil(4) * 4
}

/// Records one `logic_main` dispatch of op `code` (see `shaders/logic.wgsl`) on `inputs`
/// (1 to 3, broadcast to the output's shape) into `out`.
///
/// # Errors
/// [`KernelError`] for ranges too small, ranks above 8, limits exceeded.
pub(crate) fn encode_typed(
    e: &mut Encoder<'_, '_>,
    code: u32,
    inputs: &[Operand<'_>],
    out: &Operand<'_>,
) -> Result<usize, KernelError> {
    check_rank(out.shape)?;
    let n = numel("output", out.shape)?;
    let dtype_err = |d: DType| KernelError::DType {
        op: "logic",
        inputs: inputs.iter().map(|o| o.dtype).collect(),
        output: d,
        expected: TYPES,
    };
    let mut spec = code | type_code(out.dtype).ok_or_else(|| dtype_err(out.dtype))? << 20;
    let mut bound = Vec::with_capacity(4);
    let mut offsets = [0u32; 4];
    let mut strides = [[[0u32; 4]; 2]; 3];
    for k in 0..3 {
        // Absent inputs get the pad (the entry point declares every binding; binding input 0
        // again would alias it, which WebGPU rejects).
        let Some(inp) = inputs.get(k) else {
            bound.push(e.unused());
            continue;
        };
        let name = INPUT_NAMES[k];
        let t = type_code(inp.dtype).ok_or_else(|| dtype_err(out.dtype))?;
        let (b, o) = e.bind(
            name,
            &inp.tensor,
            word_bytes(numel(name, inp.shape)?, inp.dtype),
        )?;
        bound.push(b);
        spec |= t << (8 + 4 * k);
        offsets[k] = o;
        strides[k] = pack8(&u32s(name, &broadcast_strides(inp.shape, out.shape))?);
    }
    let (bo, oo) = e.bind("output", &out.tensor, word_bytes(n, out.dtype))?;
    bound.push(bo);
    let p = BroadcastParams {
        numel: n as u32,
        rank: out.shape.rank() as u32,
        out_offset: oo,
        flags: 0,
        offsets,
        shape: pack8(&u32s("output", out.shape.dims())?),
        strides0: strides[0],
        strides1: strides[1],
        strides2: strides[2],
    };
    let groups = match out.dtype.bits() {
        Some(8) => n.div_ceil(4),
        Some(16) => n.div_ceil(2),
        _ => n,
    };
    let key = FAMILY.key("logic_main").with("SPEC", spec);
    e.dispatch(key, &p, &bound, groups.div_ceil(256))?;
    Ok(1)
}

/// The dtype rule of [`BinaryOp`] on integer types (f32 is the elementwise family's).
pub(crate) fn check_int_binary(
    op: BinaryOp,
    inputs: &[DType],
    output: DType,
) -> Result<(), &'static str> {
    let ints = inputs.iter().all(|&d| d.is_int() && d != DType::Bool);
    if !ints || !typed(inputs, output) || output == DType::Bool {
        return Err("f32, or i32, u32, i8, u8 or i64 on both sides");
    }
    if op == BinaryOp::Div && output == DType::I64 {
        return Err(
            "a type up to 32 bits for integer division (i64 division is not on the device)",
        );
    }
    Ok(())
}

impl Kernel for CompareOp {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        if typed(inputs, output) && output == DType::Bool {
            Ok(())
        } else {
            Err(TYPES)
        }
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        encode_typed(e, OP_COMPARE + *self as u32, inputs, out)
    }
}

impl Kernel for LogicOp {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        if inputs.iter().chain([&output]).all(|&d| d == DType::Bool) {
            Ok(())
        } else {
            Err("bool tensors")
        }
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        encode_typed(e, OP_LOGIC + *self as u32, inputs, out)
    }
}

impl Kernel for Not {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        LogicOp::And.check_dtypes(inputs, output)
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        encode_typed(e, OP_NOT, inputs, out)
    }
}

impl Kernel for Cast {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        if typed(inputs, output) {
            Ok(())
        } else {
            Err(TYPES)
        }
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        encode_typed(e, OP_CAST, inputs, out)
    }
}

/// A copy is a cast to the same type.
impl Kernel for Identity {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        Cast { to: output }.check_dtypes(inputs, output)
    }
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        Cast { to: out.dtype }.encode(e, inputs, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_codes_and_word_sizes() {
        assert_eq!(type_code(DType::I64), Some(6));
        assert_eq!(type_code(DType::BF16), Some(8));
        assert_eq!(type_code(DType::Q8_0), None);
        assert_eq!(word_bytes(5, DType::Bool), 8);
        assert_eq!(word_bytes(3, DType::I64), 24);
        assert!(check_int_binary(BinaryOp::Div, &[DType::I64, DType::I64], DType::I64).is_err());
        assert!(check_int_binary(BinaryOp::Mul, &[DType::I64, DType::I64], DType::I64).is_ok());
        assert!(check_int_binary(BinaryOp::Add, &[DType::F32, DType::F32], DType::F32).is_err());
    }
}
