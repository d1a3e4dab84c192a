//! Weight formats as data: one [`Format`] per element type a weight can be stored in (plain
//! floats, ggml's block quantizations, and the blocks ONNX Runtime's 4-bit `MatMulNBits`
//! weights and ONNX exports' 8-bit ones are imported into), holding everything the rest of
//! dynrt needs to know about it.
//!
//! A [`Format`] is a table row: its [`DType`] and [`GgmlType`] (none for `q4_nb` and
//! `q8_nb`, which no GGUF file holds), how many elements a block
//! holds in how many bytes, the CPU decoder of one block (the reference, equal bit for bit to
//! the Python `gguf` package's `gguf.quants.dequantize`), a simple quantizer (for building test
//! models and kernel inputs), and the WGSL function that decodes it on the device. The
//! [`DType`] variants of the block formats, their block sizes, the list of supported types in
//! error messages, the `linear` and embedding kernels' specialisations (one per row, the
//! row's index in [`FORMATS`] being the shader's `WEIGHT_FORMAT`) and the GGUF types a model
//! may use are all derived from the table.
//!
//! Adding a block format is one file here (decoder, quantizer), its WGSL decoder in
//! `shaders/formats/<name>.wgsl` (loaded by the row with `format_wgsl!`) and one row in
//! `block_format_table!` below.
//!
//! # The WGSL contract
//! A block format's `wgsl` defines `fn <name>_block(wo: u32, blk: u32, dm: ptr<function,
//! vec2<f32>>) -> array<vec4<f32>, 8>`: the 32 values of 32-element chunk `blk` of a tensor
//! that starts at word `wo` of the weight buffer `w` (`array<u32>`), in element order, as raw
//! values `q` and a `(scale, offset)` pair in `dm` such that value = `dm.x * q + dm.y`
//! (formats whose 32 values do not share one scale return the values themselves with
//! `dm = (1, 0)`). Chunk `blk` of a 256-element k-quant is chunk `blk % 8` of super-block
//! `blk / 8`. A plain format's `wgsl` defines `fn <name>_element(wo: u32, e: u32) -> f32` and
//! `fn <name>_run(wo: u32, e: u32) -> array<vec4<f32>, 8>` (elements `e .. e + 32`). Both may
//! use the helpers of `shaders/quant.wgsl`: `byte_at`, `word_at`, `f16_at`, `nibbles`,
//! `bytes_i8`, `bits4`. Each is the text of its file, `shaders/formats/<name>.wgsl`.

use crate::shape::DType;
use half::f16;

mod ggml;
pub use ggml::GgmlType;

/// The text of `shaders/formats/<stem>.wgsl`: a format's WGSL decoder, which the `quant`
/// family appends to its kernels (so each backend and the browser compile the same text).
macro_rules! format_wgsl {
    ($stem:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/shaders/formats/",
            $stem,
            ".wgsl"
        ))
    };
}

mod bf16;
mod float16;
mod float32;

/// One weight format: a row of the table.
#[derive(Debug, Clone, Copy)]
pub struct Format {
    /// The element type of a tensor in this format.
    pub dtype: DType,
    /// The GGUF type; `None` for a format no GGUF file holds (`q4_nb` and `q8_nb`, made by
    /// the ONNX importer from `MatMulNBits` weights and from dequantized `int8` ones).
    pub ggml: Option<GgmlType>,
    /// Lower-case name (`q4_k`), as [`DType::name`] and WGSL function names use it.
    pub name: &'static str,
    /// Elements per block (1 for plain floats).
    pub block_elements: u32,
    /// Bytes per block.
    pub block_bytes: u32,
    /// Decodes one block (`block_bytes` bytes) into `block_elements` floats.
    pub decode: fn(block: &[u8], out: &mut [f32]),
    /// Appends the bytes of one block quantized from `block_elements` floats (a simple
    /// quantizer, for test models and kernel inputs; not ggml's search for the best scales).
    pub quantize: fn(values: &[f32], out: &mut Vec<u8>),
    /// The WGSL decoder, `shaders/formats/<name>.wgsl` (see the module docs for its contract).
    pub wgsl: &'static str,
    /// The grouped-planes layout the kernels may read this format in instead of the file's
    /// (see [`Grouped`]); `None` where the file's blocks are already word-aligned or a block
    /// spans several chunks.
    pub grouped: Option<Grouped>,
}

/// A second device layout of a block format, "grouped planes": the blocks of a tensor in
/// groups of [`GROUP_BLOCKS`], each group holding the first field of its blocks one after
/// another, then the second field of each, and so on. A group has exactly the bytes of its
/// blocks in the file, and every field of a block starts on a word (q8_0's 34-byte blocks,
/// q4_0's 18 and q5_0's 22 start 2 bytes off a word every other block in the file, so their
/// decoders read two words and shift for every word of quants). The runtime reorders a
/// weight into it on the device once, when every kernel reading that weight takes it
/// (`crate::runtime`'s weight layouts); the kernels read it through the `wgsl` decoder.
#[derive(Debug, Clone, Copy)]
pub struct Grouped {
    /// The fields of one block in the file, as `(byte offset, bytes)`, in block order; each
    /// a multiple of 2 bytes, so that 8 of them fill whole words.
    pub fields: &'static [(u32, u32)],
    /// `fn <name>_block_g8(wo: u32, blk: u32, dm: ptr<function, vec2<f32>>) ->
    /// array<vec4<f32>, 8>`: block `blk` of a grouped tensor starting at word `wo`, with the
    /// contract of the file decoder; `shaders/formats/<name>_g8.wgsl`.
    pub wgsl: &'static str,
}

/// Blocks per group of the [`Grouped`] layout.
pub const GROUP_BLOCKS: usize = 8;

/// Where the byte at `at` of a group in the [`Grouped`] layout of `format` comes from: its
/// offset in the same group's blocks in the file.
pub fn grouped_source(format: &Format, grouped: &Grouped, at: usize) -> usize {
    let mut plane = 0;
    for &(offset, bytes) in grouped.fields {
        let (offset, bytes) = (offset as usize, bytes as usize);
        if at < plane + GROUP_BLOCKS * bytes {
            let (block, byte) = ((at - plane) / bytes, (at - plane) % bytes);
            return block * format.block_bytes as usize + offset + byte;
        }
        plane += GROUP_BLOCKS * bytes;
    }
    at
}

/// A tensor's bytes in `format`'s file layout rearranged into its [`Grouped`] layout (the
/// CPU reference of the device's reorder kernel); `None` when the format has no such layout
/// or the bytes are not a whole number of groups.
pub fn regroup(format: &Format, bytes: &[u8]) -> Option<Vec<u8>> {
    permute_groups(format, bytes, true)
}

/// The inverse of [`regroup`]: grouped bytes back in the file layout.
pub fn ungroup(format: &Format, bytes: &[u8]) -> Option<Vec<u8>> {
    permute_groups(format, bytes, false)
}

/// Moves every byte of every group between the file layout and the grouped one.
fn permute_groups(format: &Format, bytes: &[u8], to_grouped: bool) -> Option<Vec<u8>> {
    let grouped = format.grouped.as_ref()?;
    let group = GROUP_BLOCKS * format.block_bytes as usize;
    if bytes.is_empty() || bytes.len() % group != 0 {
        return None;
    }
    let mut out = vec![0u8; bytes.len()];
    for (src, dst) in bytes.chunks_exact(group).zip(out.chunks_exact_mut(group)) {
        for at in 0..group {
            let file = grouped_source(format, grouped, at);
            if to_grouped {
                dst[at] = src[file];
            } else {
                dst[file] = src[at];
            }
        }
    }
    Some(out)
}

impl Format {
    /// Whether blocks hold more than one element.
    pub fn is_block(&self) -> bool {
        self.block_elements > 1
    }

    /// `values` quantized block by block with [`Format::quantize`]; `None` when they are not
    /// a whole number of blocks.
    pub fn quantize_all(&self, values: &[f32]) -> Option<Vec<u8>> {
        let bl = self.block_elements as usize;
        if values.len() % bl != 0 {
            return None;
        }
        let mut out = Vec::with_capacity(values.len() / bl * self.block_bytes as usize);
        for block in values.chunks_exact(bl) {
            (self.quantize)(block, &mut out);
        }
        Some(out)
    }
}

/// The block formats: `DType variant, module`. [`FORMATS`] gets the module's `FORMAT`; the
/// [`DType`] variant is written out in [`crate::shape`] (which imports nothing from here), and
/// `the_table_covers_every_block_dtype_and_no_other` checks that the two agree.
macro_rules! block_format_table {
    ($callback:ident) => {
        $callback! {
            Q4_0 q4_0,
            Q4_1 q4_1,
            Q5_0 q5_0,
            Q5_1 q5_1,
            Q8_0 q8_0,
            Q2_K q2_k,
            Q3_K q3_k,
            Q4_K q4_k,
            Q5_K q5_k,
            Q6_K q6_k,
            Q4_NB q4_nb,
            Q8_NB q8_nb,
        }
    };
}

macro_rules! format_list {
    ($($variant:ident $module:ident,)*) => {
        $(mod $module;)*

        /// Every format, plain floats first; a format's index is the `WEIGHT_FORMAT`
        /// specialisation of the `quant` kernels.
        pub const FORMATS: &[Format] = &[
            float32::FORMAT,
            float16::FORMAT,
            bf16::FORMAT,
            $($module::FORMAT,)*
        ];

        /// The block dtypes of the table, in its order.
        #[cfg(test)]
        const BLOCK_DTYPES: &[DType] = &[$(DType::$variant,)*];
    };
}
block_format_table!(format_list);

pub(crate) use q4_nb::push_block as push_q4_nb_block;
pub(crate) use q8_nb::push_block as push_q8_nb_block;

/// The format of `dtype`, `None` for types no weight is stored in (integers, bool).
pub fn of_dtype(dtype: DType) -> Option<&'static Format> {
    FORMATS.iter().find(|f| f.dtype == dtype)
}

/// The format of GGUF type `ty`, `None` for the types dynrt does not decode.
pub fn of_ggml(ty: GgmlType) -> Option<&'static Format> {
    FORMATS.iter().find(|f| f.ggml == Some(ty))
}

/// The GGUF names of every format a GGUF file can hold (`"F32, F16, BF16, Q4_0, ..."`), for
/// messages.
pub fn ggml_names() -> &'static str {
    static NAMES: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAMES.get_or_init(|| {
        FORMATS
            .iter()
            .filter_map(|f| f.ggml.map(GgmlType::name))
            .collect::<Vec<_>>()
            .join(", ")
    })
}

/// The lower-case names of every format (`"f32, f16, bf16, q4_0, ..."`), for messages.
pub fn dtype_names() -> &'static str {
    static NAMES: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAMES.get_or_init(|| {
        FORMATS
            .iter()
            .map(|f| f.name)
            .collect::<Vec<_>>()
            .join(", ")
    })
}

/// The f16 at byte `at` of `b` widened to f32 (exact).
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// `x` as f16 bytes.
fn f16_bytes(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_le_bytes()
}

/// `x` rounded to f16 and back: the scale a decoder will see.
fn f16_round(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// `1 / d`, 0 for a zero scale.
fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// The value of largest magnitude (its sign kept), 0 for an empty slice.
fn signed_absmax(x: &[f32]) -> f32 {
    x.iter()
        .copied()
        .fold(0f32, |a, v| if v.abs() > a.abs() { v } else { a })
}

/// Quantizes `x` to `0..=levels` with scale `d` and offset `-m` (value ~ `d * q - m`).
fn level(x: f32, d: f32, m: f32, levels: u8) -> u8 {
    let q = ((x + m) * inverse(d)).round();
    q.clamp(0.0, f32::from(levels)) as u8
}

/// Packs 4-bit values two to a byte, element `i` of the first half in the low nibble of byte
/// `i`, element `i + half` in the high one (ggml's 32-element blocks).
fn pack_nibbles(q: &[u8], out: &mut Vec<u8>) {
    let half = q.len() / 2;
    out.extend((0..half).map(|i| (q[i] & 15) | (q[i + half] << 4)));
}

/// Rounds `x * (1 / d)` to an integer in `lo..=hi` (a symmetric grid of step `d`).
fn level_signed(x: f32, d: f32, lo: i8, hi: i8) -> i8 {
    (x * inverse(d)).round().clamp(f32::from(lo), f32::from(hi)) as i8
}

/// The step of a grid `-below..=above` that reaches both the most negative and the most
/// positive value of `g`.
fn signed_step(g: &[f32], below: f32, above: f32) -> f32 {
    let lo = g.iter().copied().fold(0f32, f32::min);
    let hi = g.iter().copied().fold(0f32, f32::max);
    (-lo / below).max(hi / above)
}

/// Per-group `(scale, offset)` of an asymmetric grid of `levels` steps covering each group of
/// `x` and 0 (k-quants store minimums as non-negative offsets: value = `scale * q - offset`).
fn group_ranges(x: &[f32], group: usize, levels: f32) -> Vec<(f32, f32)> {
    x.chunks_exact(group)
        .map(|g| {
            let lo = g.iter().copied().fold(0f32, f32::min);
            let hi = g.iter().copied().fold(lo, f32::max);
            ((hi - lo) / levels, -lo)
        })
        .collect()
}

/// Quantizes non-negative per-group values to `0..=max` integers against a shared scale
/// (the super-block scale `largest / max`, rounded to f16 as stored). Returns the f16 scale
/// and the integers.
fn quantize_scales(values: impl Iterator<Item = f32> + Clone, max: u8) -> (f32, Vec<u8>) {
    let largest = values.clone().fold(0f32, f32::max);
    let d = f16_round(largest / f32::from(max));
    let q = values.map(|v| level(v, d, 0.0, max)).collect();
    (d, q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_layouts_cover_their_blocks_and_go_back() {
        let mut with = Vec::new();
        for f in FORMATS {
            let Some(g) = f.grouped.as_ref() else {
                continue;
            };
            with.push(f.name);
            // The fields tile the block, each whole words over a group.
            let mut next = 0;
            for &(offset, bytes) in g.fields {
                assert_eq!(offset, next, "{}", f.name);
                assert_eq!(bytes % 2, 0, "{}", f.name);
                next += bytes;
            }
            assert_eq!(next, f.block_bytes, "{}", f.name);
            assert!(
                g.wgsl.contains(&format!("fn {}_block_g8(", f.name)),
                "{}",
                f.name
            );
            // Two groups of distinct bytes: a permutation, undone by ungroup.
            let n = 2 * GROUP_BLOCKS * f.block_bytes as usize;
            let file: Vec<u8> = (0..n).map(|i| (i * 7 + i / 251) as u8).collect();
            let grouped = regroup(f, &file).unwrap();
            assert_ne!(grouped, file, "{}", f.name);
            assert_eq!(ungroup(f, &grouped).unwrap(), file, "{}", f.name);
            // Block j's scale is the j-th f16 of its group.
            let group = GROUP_BLOCKS * f.block_bytes as usize;
            for j in 0..GROUP_BLOCKS {
                let at = group + j * f.block_bytes as usize;
                assert_eq!(grouped[group + 2 * j..group + 2 * j + 2], file[at..at + 2]);
            }
            assert!(regroup(f, &file[..n - 2]).is_none(), "{}", f.name);
        }
        assert_eq!(with, ["q4_0", "q5_0", "q8_0"]);
        assert!(regroup(of_dtype(DType::Q4_1).unwrap(), &[0; 160]).is_none());
    }

    #[test]
    fn the_table_is_consistent() {
        assert_eq!(FORMATS.len(), 15);
        let mut seen_block = false;
        for (i, f) in FORMATS.iter().enumerate() {
            assert_eq!(f.dtype.name(), f.name, "{i}");
            if let Some(g) = f.ggml {
                assert_eq!(g.name().to_lowercase(), f.name);
                assert_eq!(u64::from(f.block_elements), g.block_len(), "{}", f.name);
                assert_eq!(u64::from(f.block_bytes), g.block_bytes(), "{}", f.name);
                assert_eq!(of_ggml(g).map(|g| g.name), Some(f.name));
            } else {
                assert!(["q4_nb", "q8_nb"].contains(&f.name), "{}", f.name);
            }
            assert_eq!(of_dtype(f.dtype).map(|g| g.name), Some(f.name));
            // Plain formats come first: the kernels tell them apart by index.
            assert!(!seen_block || f.is_block(), "{}", f.name);
            seen_block |= f.is_block();
            let fn_name = if f.is_block() {
                format!("fn {}_block(", f.name)
            } else {
                format!("fn {}_run(", f.name)
            };
            assert!(f.wgsl.contains(&fn_name), "{}: no `{fn_name}`", f.name);
            assert_eq!(f.dtype.block().is_some(), f.is_block(), "{}", f.name);
            if let Some(b) = f.dtype.block() {
                assert_eq!((b.elements, b.bytes), (f.block_elements, f.block_bytes));
            }
        }
        assert!(ggml_names().starts_with("F32, F16, BF16, Q4_0"));
        assert!(!ggml_names().contains("NB") && dtype_names().ends_with("q4_nb, q8_nb"));
    }

    /// `shaders/formats/` holds exactly the rows' decoders: a file per row (and one per grouped
    /// layout), each the text its row compiles, and no file that no row loads.
    #[test]
    fn every_decoder_file_is_a_row() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders/formats");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        files.sort();
        let mut rows = Vec::new();
        for f in FORMATS {
            let mut sources = vec![(f.name.to_string(), f.wgsl)];
            if let Some(g) = &f.grouped {
                sources.push((format!("{}_g8", f.name), g.wgsl));
            }
            for (stem, wgsl) in sources {
                let file = format!("{stem}.wgsl");
                let text = std::fs::read_to_string(dir.join(&file)).unwrap();
                assert_eq!(text, wgsl, "{file}");
                assert!(text.starts_with("//"), "{file}: no header comment");
                rows.push(file);
            }
        }
        rows.sort();
        assert_eq!(rows.len(), FORMATS.len() + 3);
        assert_eq!(files, rows, "files in {} that no row loads", dir.display());
    }

    /// A smooth row with one outlier per block: every format must come close.
    #[test]
    fn quantize_then_decode_is_close() {
        for f in FORMATS {
            let n = 512usize;
            let x: Vec<f32> = (0..n)
                .map(|i| {
                    ((i * 37 % 101) as f32 - 50.0) / 16.0 + if i % 97 == 0 { 4.0 } else { 0.0 }
                })
                .collect();
            let bl = f.block_elements as usize;
            let bytes = f.quantize_all(&x).unwrap();
            assert_eq!(bytes.len(), n / bl * f.block_bytes as usize, "{}", f.name);
            let mut y = vec![0f32; n];
            for (b, o) in bytes
                .chunks_exact(f.block_bytes as usize)
                .zip(y.chunks_exact_mut(bl))
            {
                (f.decode)(b, o);
            }
            let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
            // Half a step of the coarsest grid (2 bits over the range), scale rounding included.
            let tol = match f.name {
                "q2_k" => amax / 2.5,
                "q3_k" => amax / 5.0,
                "q4_0" | "q4_1" | "q4_k" | "q4_nb" => amax / 10.0,
                "q5_0" | "q5_1" | "q5_k" => amax / 20.0,
                _ => amax / 60.0,
            };
            let worst = x
                .iter()
                .zip(&y)
                .fold(0f32, |a, (p, q)| a.max((p - q).abs()));
            assert!(worst <= tol, "{}: worst {worst} > {tol}", f.name);
        }
    }

    #[test]
    fn the_table_covers_every_block_dtype_and_no_other() {
        let mut blocks = 0;
        for &d in DType::ALL {
            let row = of_dtype(d).filter(|f| f.is_block());
            assert_eq!(row.is_some(), BLOCK_DTYPES.contains(&d), "{d}");
            match (d.block(), row) {
                (Some(b), Some(f)) => {
                    blocks += 1;
                    assert_eq!(f.dtype, d);
                    assert_eq!(
                        (b.elements, b.bytes),
                        (f.block_elements, f.block_bytes),
                        "{d}"
                    );
                    assert!(f.is_block(), "{d}");
                }
                (None, None) => {}
                (b, f) => panic!("{d}: DType::block {b:?}, table row {:?}", f.map(|f| f.name)),
            }
            assert_eq!(d.is_float(), of_dtype(d).is_some(), "{d}");
        }
        let rows = FORMATS.iter().filter(|f| f.is_block()).count();
        assert_eq!(blocks, rows, "block dtypes against block rows of FORMATS");
        assert_eq!(
            blocks,
            BLOCK_DTYPES.len(),
            "block dtypes against the table's rows"
        );
        assert!(blocks >= 12, "{blocks} block dtypes");
    }
}
