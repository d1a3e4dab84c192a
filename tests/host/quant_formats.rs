//! Every weight format's CPU decoder (`dynrt::formats`) against the Python `gguf` package's
//! `gguf.quants.dequantize`, bit for bit, on random blocks: random bytes, redrawn where a
//! block decodes to a non-finite value (an f16 scale or an f32/f16/bf16 element that is inf
//! or NaN, whose NaN payloads the two sides need not agree on). Needs the Python reference
//! (`scripts/pyenv.sh`); skipped without it, a failure under `DYNRT_REQUIRE_MODEL=1`.

use crate::common;

use dynrt::formats::FORMATS;
use dynrt::rng::SplitMix64;

/// Random blocks per format.
const BLOCKS: usize = 300;

#[test]
fn every_decoder_equals_the_python_reference_bit_for_bit() {
    let test = "every_decoder_equals_the_python_reference_bit_for_bit";
    let Some(py) = common::python_or_skip(test) else {
        return;
    };
    let dir = common::scratch(test);
    let mut rng = SplitMix64::new(19);
    let mut ours = Vec::new();
    // The GGUF formats (q4_nb has no GGUF type: tests/gpu/onnx_nbits.rs checks it against
    // ONNX Runtime).
    let formats: Vec<_> = FORMATS
        .iter()
        .filter_map(|f| f.ggml.map(|g| (f, g)))
        .collect();
    for &(f, ggml) in &formats {
        let (bb, bl) = (f.block_bytes as usize, f.block_elements as usize);
        let mut bytes = Vec::with_capacity(BLOCKS * bb);
        let mut values = vec![0f32; BLOCKS * bl];
        let mut redrawn = 0;
        for out in values.chunks_exact_mut(bl) {
            loop {
                let block: Vec<u8> = (0..bb).map(|_| rng.next_u64() as u8).collect();
                (f.decode)(&block, out);
                if out.iter().all(|v| v.is_finite()) {
                    bytes.extend(block);
                    break;
                }
                redrawn += 1;
            }
        }
        // The redraws are rare: random bytes are what is being tested.
        assert!(redrawn < BLOCKS / 2, "{}: {redrawn} redraws", f.name);
        std::fs::write(dir.join(format!("{}.bin", ggml.name())), &bytes).unwrap();
        ours.push(values);
    }
    let mut args = vec!["dequant-blocks".to_string(), "--dir".into()];
    args.push(dir.display().to_string());
    args.extend(formats.iter().map(|(_, g)| g.name().to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    common::run_reference(&py, &args);
    for (&(f, ggml), ours) in formats.iter().zip(&ours) {
        let theirs = std::fs::read(dir.join(format!("{}.f32", ggml.name()))).unwrap();
        assert_eq!(theirs.len(), ours.len() * 4, "{}", f.name);
        let mut nonzero = 0;
        for (i, (o, t)) in ours.iter().zip(theirs.chunks_exact(4)).enumerate() {
            let t = f32::from_le_bytes([t[0], t[1], t[2], t[3]]);
            assert_eq!(
                o.to_bits(),
                t.to_bits(),
                "{}: element {i} (block {}): ours {o:e}, gguf {t:e}",
                f.name,
                i / f.block_elements as usize
            );
            nonzero += usize::from(*o != 0.0);
        }
        // A decoder that wrote nothing would match a reference that read nothing.
        assert!(
            nonzero > ours.len() / 2,
            "{}: {nonzero} nonzero values",
            f.name
        );
        eprintln!("{}: {} values identical", f.name, ours.len());
    }
}
