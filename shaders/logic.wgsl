// Typed elementwise kernels: integer arithmetic, comparisons, boolean logic, where, casts and
// copies on element types other than f32-in-f32-out (f32 arithmetic is elementwise.wgsl's).
//
// Entry point (workgroup size 256, linear_index of the prelude):
//   logic_main   one invocation per output *word group*: 4 elements of a 1-byte output type
//                (bool, i8, u8) or 2 of a 2-byte one (f16, bf16) packed into one u32, 1
//                element of a 4-byte type, 1 element of i64 written as two u32 words (low,
//                high). Elements past numel in the last word are written as 0: the tensor's
//                allocation is rounded up to 4 bytes.
//
// Types (4-bit codes): 0 f32, 1 i32, 2 u32, 3 i8, 4 u8, 5 bool, 6 i64, 7 f16, 8 bf16. Every
// input element is loaded as a 64-bit pair vec2<u32>(low, high): f32 bits (high 0; f16 and
// bf16 widened to f32 exactly), i32 and i8 sign-extended, u32, u8 and bool zero-extended, i64
// as stored. A float result is stored as f16/bf16 by integer bit operations rounding to
// nearest even (NaN stays NaN, overflow gives infinity), so no SHADER_F16 is needed. Integer arithmetic runs exactly in 64 bits on
// the pairs (add, sub, mul, pow wrap; min, max and comparisons signed for i32, i8 and i64) and
// the result is truncated to the output's width when stored: the CPU reference's wrapping i64
// computation. Division runs in 32-bit WGSL integers for types up to 32 bits (0 for a zero
// divisor); i64 division is refused on the Rust side.
//
// Specialisation: one pipeline-overridable constant SPEC = op | t0 << 8 | t1 << 12 | t2 << 16
// | t_out << 20 (t0..t2 the input types), so each (op, types) gets its own pipeline with the
// switches folded away. Ops: 0 add, 1 sub, 2 mul, 3 div, 4 pow, 5 min, 6 max (the
// BinaryOp codes); 16 + k comparisons (equal, less, less_or_equal, greater, greater_or_equal);
// 32 + k logic (and, or, xor); 48 not; 49 cast (also the identity copy); 50 where (inputs
// cond, a, b).
//
// Bindings (group 0; an op with fewer inputs binds input 0 again in their place):
//   0 uniform  BroadcastParams (the prelude's; dynamic offset)
//   1 storage read_write  input 0 (u32 words)
//   2 storage read_write  input 1
//   3 storage read_write  input 2
//   4 storage read_write  output
//
// BroadcastParams' offsets (inputs) and out_offset are in u32 words from the start of each
// binding; its strides in elements of each input over the output shape.

override SPEC: u32 = 0u;

const T_F32: u32 = 0u;
const T_I32: u32 = 1u;
const T_U32: u32 = 2u;
const T_I8: u32 = 3u;
const T_U8: u32 = 4u;
const T_BOOL: u32 = 5u;
const T_I64: u32 = 6u;
const T_F16: u32 = 7u;
const T_BF16: u32 = 8u;

const OP_COMPARE: u32 = 16u;
const OP_LOGIC: u32 = 32u;
const OP_NOT: u32 = 48u;
const OP_CAST: u32 = 49u;
const OP_WHERE: u32 = 50u;

@group(0) @binding(0) var<uniform> p: BroadcastParams;
@group(0) @binding(1) var<storage, read_write> in0: array<u32>;
@group(0) @binding(2) var<storage, read_write> in1: array<u32>;
@group(0) @binding(3) var<storage, read_write> in2: array<u32>;
@group(0) @binding(4) var<storage, read_write> dst: array<u32>;

fn op() -> u32 { return SPEC & 0xffu; }
fn type_of(input: u32) -> u32 { return (SPEC >> (8u + 4u * input)) & 0xfu; }
fn out_type() -> u32 { return (SPEC >> 20u) & 0xfu; }

fn stride(input: u32, d: u32) -> u32 {
    switch input {
        case 0u: { return p.strides0[d / 4u][d % 4u]; }
        case 1u: { return p.strides1[d / 4u][d % 4u]; }
        default: { return p.strides2[d / 4u][d % 4u]; }
    }
}

// Element index in `input` of output element `e` under broadcasting.
fn source_index(input: u32, e: u32) -> u32 {
    var rem = e;
    var at = 0u;
    for (var k = 0u; k < p.rank; k++) {
        let d = p.rank - 1u - k;
        let ext = p.shape[d / 4u][d % 4u];
        at += (rem % ext) * stride(input, d);
        rem = rem / ext;
    }
    return at;
}

fn word(input: u32, w: u32) -> u32 {
    switch input {
        case 0u: { return in0[w]; }
        case 1u: { return in1[w]; }
        default: { return in2[w]; }
    }
}

fn sign_fill(negative: bool) -> u32 {
    return select(0u, 0xffffffffu, negative);
}

fn is_float(t: u32) -> bool {
    return t == T_F32 || t == T_F16 || t == T_BF16;
}

// Bytes per element of type `t`.
fn width(t: u32) -> u32 {
    switch t {
        case 3u, 4u, 5u: { return 1u; }
        case 7u, 8u: { return 2u; }
        case 6u: { return 8u; }
        default: { return 4u; }
    }
}

// f16 bits (low 16) to f32, exactly (subnormals included).
fn f16_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if e == 0u {
        let v = f32(m) * 5.9604644775390625e-8;
        return select(v, -v, sign != 0u);
    }
    if e == 31u {
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

// f32 to f16 bits, rounding to nearest even; NaN stays NaN, overflow gives infinity.
fn f32_to_f16(f: f32) -> u32 {
    let x = bitcast<u32>(f);
    let sign = (x >> 16u) & 0x8000u;
    let e = (x >> 23u) & 0xffu;
    let m = x & 0x7fffffu;
    if e == 0xffu {
        return sign | 0x7c00u | select(0u, 0x200u | (m >> 13u), m != 0u);
    }
    let exp = i32(e) - 112;
    if exp >= 31 {
        return sign | 0x7c00u;
    }
    if exp <= 0 {
        if exp < -10 {
            return sign;
        }
        let mm = m | 0x800000u;
        let shift = u32(14 - exp);
        var h = mm >> shift;
        let rest = mm & ((1u << shift) - 1u);
        let half = 1u << (shift - 1u);
        if rest > half || (rest == half && (h & 1u) != 0u) {
            h += 1u;
        }
        return sign | h;
    }
    var h = (u32(exp) << 10u) | (m >> 13u);
    let rest = m & 0x1fffu;
    // A carry out of the mantissa moves into the exponent: correct, up to infinity.
    if rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0u) {
        h += 1u;
    }
    return sign | h;
}

// f32 to bf16 bits, rounding to nearest even; NaN stays a (quiet) NaN.
fn f32_to_bf16(f: f32) -> u32 {
    let x = bitcast<u32>(f);
    if (x & 0x7fffffffu) > 0x7f800000u {
        return (x >> 16u) | 0x40u;
    }
    return (x + 0x7fffu + ((x >> 16u) & 1u)) >> 16u;
}

// Element `i` of `input` as a 64-bit pair (low, high), extended by its type.
fn load(input: u32, i: u32) -> vec2<u32> {
    let t = type_of(input);
    let base = p.offsets[input];
    switch t {
        case 7u, 8u: {
            let byte = base * 4u + 2u * i;
            let h = (word(input, byte / 4u) >> ((byte % 4u) * 8u)) & 0xffffu;
            if t == T_BF16 {
                return vec2<u32>(h << 16u, 0u);
            }
            return vec2<u32>(bitcast<u32>(f16_to_f32(h)), 0u);
        }
        case 3u, 4u, 5u: {
            let byte = base * 4u + i;
            let v = (word(input, byte / 4u) >> ((byte % 4u) * 8u)) & 0xffu;
            if t == T_I8 {
                return vec2<u32>((v ^ 0x80u) - 0x80u, sign_fill(v >= 0x80u));
            }
            return vec2<u32>(v, 0u);
        }
        case 6u: {
            let w = base + 2u * i;
            return vec2<u32>(word(input, w), word(input, w + 1u));
        }
        case 1u: {
            let v = word(input, base + i);
            return vec2<u32>(v, sign_fill((v & 0x80000000u) != 0u));
        }
        default: {
            return vec2<u32>(word(input, base + i), 0u);
        }
    }
}

fn is_signed(t: u32) -> bool {
    return t == T_I32 || t == T_I8 || t == T_I64;
}

fn truthy(v: vec2<u32>, t: u32) -> bool {
    if is_float(t) {
        // Anything but +-0.0 (NaN included) is true.
        return (v.x & 0x7fffffffu) != 0u;
    }
    return (v.x | v.y) != 0u;
}

// --- 64-bit integer arithmetic on (low, high) pairs ------------------------------------------

fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

fn sub64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}

// The full 64-bit product of two u32, through 16-bit halves.
fn mul32x32(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    let lo = (p00 & 0xffffu) | (mid << 16u);
    let hi = a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u);
    return vec2<u32>(lo, hi);
}

// The low 64 bits of a 64 x 64 product (the same for signed and unsigned operands).
fn mul64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let ll = mul32x32(a.x, b.x);
    return vec2<u32>(ll.x, ll.y + a.x * b.y + a.y * b.x);
}

fn less64(a: vec2<u32>, b: vec2<u32>, is_signed: bool) -> bool {
    if a.y != b.y {
        if is_signed {
            return bitcast<i32>(a.y) < bitcast<i32>(b.y);
        }
        return a.y < b.y;
    }
    return a.x < b.x;
}

// a^b for integers, wrapping (pairs hold the values exactly; 32-bit types are truncated when
// stored): squaring over the exponent's bits; a negative exponent truncates 1 / a^-b.
fn pow64(a: vec2<u32>, b: vec2<u32>, is_signed: bool) -> vec2<u32> {
    let one = vec2<u32>(1u, 0u);
    let minus_one = vec2<u32>(0xffffffffu, 0xffffffffu);
    if is_signed && (b.y & 0x80000000u) != 0u {
        if all(a == one) {
            return one;
        }
        if all(a == minus_one) {
            return select(minus_one, one, (b.x & 1u) == 0u);
        }
        return vec2<u32>(0u, 0u);
    }
    var acc = one;
    var base = a;
    var e = b;
    for (var k = 0u; k < 64u; k++) {
        if (e.x & 1u) != 0u {
            acc = mul64(acc, base);
        }
        e = vec2<u32>((e.x >> 1u) | (e.y << 31u), e.y >> 1u);
        if e.x == 0u && e.y == 0u {
            break;
        }
        base = mul64(base, base);
    }
    return acc;
}

fn arith(o: u32, a: vec2<u32>, b: vec2<u32>, t: u32) -> vec2<u32> {
    let s = is_signed(t);
    switch o {
        case 0u: { return add64(a, b); }
        case 1u: { return sub64(a, b); }
        case 2u: { return mul64(a, b); }
        case 3u: {
            // Only types up to 32 bits get here (i64 division is refused): 32-bit division,
            // 0 for a zero divisor (WGSL would give a), i32::MIN / -1 wraps as in 64 bits.
            if b.x == 0u {
                return vec2<u32>(0u, 0u);
            }
            if s {
                let q = bitcast<u32>(bitcast<i32>(a.x) / bitcast<i32>(b.x));
                return vec2<u32>(q, sign_fill((q & 0x80000000u) != 0u));
            }
            return vec2<u32>(a.x / b.x, 0u);
        }
        case 4u: { return pow64(a, b, s); }
        case 5u: { return select(b, a, less64(a, b, s)); }
        default: { return select(a, b, less64(a, b, s)); }
    }
}

fn compare(o: u32, a: vec2<u32>, b: vec2<u32>, t: u32) -> bool {
    if is_float(t) {
        let x = bitcast<f32>(a.x);
        let y = bitcast<f32>(b.x);
        switch o {
            case 0u: { return x == y; }
            case 1u: { return x < y; }
            case 2u: { return x <= y; }
            case 3u: { return x > y; }
            default: { return x >= y; }
        }
    }
    let s = is_signed(t);
    let eq = all(a == b);
    switch o {
        case 0u: { return eq; }
        case 1u: { return less64(a, b, s); }
        case 2u: { return eq || less64(a, b, s); }
        case 3u: { return less64(b, a, s); }
        default: { return eq || less64(b, a, s); }
    }
}

// f32 to a 64-bit integer pair: truncated toward zero, saturated to i64 (NaN gives 0).
fn f32_to_i64(f: f32) -> vec2<u32> {
    if f != f {
        return vec2<u32>(0u, 0u);
    }
    // Saturate at the largest f32 below 2^63.
    let m = min(abs(f), bitcast<f32>(0x5effffffu));
    let hi = floor(m / 4294967296.0);
    let lo = trunc(m - hi * 4294967296.0);
    var v = vec2<u32>(u32(lo), u32(hi));
    if f < 0.0 {
        v = sub64(vec2<u32>(0u, 0u), v);
    }
    return v;
}

// v >> s for 1 <= s <= 63.
fn shr64(v: vec2<u32>, s: u32) -> vec2<u32> {
    if s >= 32u {
        return vec2<u32>(v.y >> (s - 32u), 0u);
    }
    return vec2<u32>((v.x >> s) | (v.y << (32u - s)), v.y >> s);
}

// 1 << s for s <= 63.
fn bit64(s: u32) -> vec2<u32> {
    if s >= 32u {
        return vec2<u32>(0u, 1u << (s - 32u));
    }
    return vec2<u32>(1u << s, 0u);
}

// An integer pair to the nearest f32, ties to even (WGSL's own conversion may round either
// way): exact below 2^24, else the top 24 bits rounded on the bits shifted out.
fn int_to_f32(v: vec2<u32>, is_signed_value: bool) -> f32 {
    let negative = is_signed_value && (v.y & 0x80000000u) != 0u;
    var m = v;
    if negative {
        m = sub64(vec2<u32>(0u, 0u), v);
    }
    var f: f32;
    if m.y == 0u && m.x < 0x1000000u {
        f = f32(m.x);
    } else {
        var e: u32;
        if m.y != 0u {
            e = 63u - countLeadingZeros(m.y);
        } else {
            e = 31u - countLeadingZeros(m.x);
        }
        let s = e - 23u;
        var mant = shr64(m, s).x;
        // The bits shifted out, compared with half of the last kept bit.
        var low: vec2<u32>;
        if s >= 32u {
            low = vec2<u32>(m.x, m.y & ((1u << (s - 32u)) - 1u));
        } else {
            low = vec2<u32>(m.x & ((1u << s) - 1u), 0u);
        }
        let half = bit64(s - 1u);
        if less64(half, low, false) || (all(low == half) && (mant & 1u) != 0u) {
            mant += 1u;
            if mant == 0x1000000u {
                mant = mant >> 1u;
                e += 1u;
            }
        }
        f = bitcast<f32>(((e + 127u) << 23u) | (mant & 0x7fffffu));
    }
    return select(f, -f, negative);
}

fn convert(v: vec2<u32>, src_t: u32, dst_t: u32) -> vec2<u32> {
    if dst_t == T_BOOL {
        return vec2<u32>(select(0u, 1u, truthy(v, src_t)), 0u);
    }
    if is_float(src_t) {
        if is_float(dst_t) {
            return v;
        }
        return f32_to_i64(bitcast<f32>(v.x));
    }
    if is_float(dst_t) {
        return vec2<u32>(bitcast<u32>(int_to_f32(v, is_signed(src_t))), 0u);
    }
    // Integer to integer: the pair is the exact value; storing truncates to the width.
    return v;
}

fn compute(e: u32) -> vec2<u32> {
    let o = op();
    let a = load(0u, source_index(0u, e));
    if o == OP_NOT {
        return vec2<u32>(select(1u, 0u, truthy(a, type_of(0u))), 0u);
    }
    if o == OP_CAST {
        return convert(a, type_of(0u), out_type());
    }
    let b = load(1u, source_index(1u, e));
    if o == OP_WHERE {
        if truthy(a, type_of(0u)) {
            return b;
        }
        return load(2u, source_index(2u, e));
    }
    if o >= OP_LOGIC {
        let x = truthy(a, type_of(0u));
        let y = truthy(b, type_of(1u));
        var r: bool;
        switch o - OP_LOGIC {
            case 0u: { r = x && y; }
            case 1u: { r = x || y; }
            default: { r = x != y; }
        }
        return vec2<u32>(select(0u, 1u, r), 0u);
    }
    if o >= OP_COMPARE {
        return vec2<u32>(select(0u, 1u, compare(o - OP_COMPARE, a, b, type_of(0u))), 0u);
    }
    return arith(o, a, b, type_of(0u));
}

// The bits of a computed element as stored in type `t` (floats are carried as f32 bits).
fn stored(v: vec2<u32>, t: u32) -> u32 {
    switch t {
        case 7u: { return f32_to_f16(bitcast<f32>(v.x)); }
        case 8u: { return f32_to_bf16(bitcast<f32>(v.x)); }
        default: { return v.x; }
    }
}

@compute @workgroup_size(256)
fn logic_main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = linear_index(wid, nwg, lid);
    let t = out_type();
    let w = width(t);
    if w == 8u {
        if g >= p.numel {
            return;
        }
        let v = compute(g);
        dst[p.out_offset + 2u * g] = v.x;
        dst[p.out_offset + 2u * g + 1u] = v.y;
        return;
    }
    if w == 4u {
        if g >= p.numel {
            return;
        }
        dst[p.out_offset + g] = compute(g).x;
        return;
    }
    // 1- and 2-byte types: whole words, the elements packed little-endian.
    let per = 4u / w;
    let first = g * per;
    if first >= p.numel {
        return;
    }
    let mask = (1u << (8u * w)) - 1u;
    var packed = 0u;
    for (var k = 0u; k < per; k++) {
        if first + k < p.numel {
            packed |= (stored(compute(first + k), t) & mask) << (8u * w * k);
        }
    }
    dst[p.out_offset + g] = packed;
}
