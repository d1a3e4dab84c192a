//! The public ONNX API on a real adapter: an exported-style KV cache carried in place between
//! steps gives what feeding every input gives (and the CPU reference), a decode step moves
//! only the new rows, and bad inputs are typed errors naming the input with the session left
//! usable and nothing left allocated after a failed load.

use dynrt::gpu::{testing, Engine};
use dynrt::memory::predictor::Policy;
use dynrt::memory::AllocKind;
use dynrt::onnx::{
    Carry, HostTensor, LoadOptions, OnnxError, OnnxFile, OnnxSession, SessionError, SessionOptions,
    TensorDType, TensorData,
};
use dynrt::rng::SplitMix64;
use dynrt::runtime::RunOptions;
use std::path::PathBuf;

const HEADS: u64 = 2;
const HEAD_DIM: u64 = 4;

fn fixture(name: &str) -> PathBuf {
    crate::common::repo()
        .to_path_buf()
        .join("fixtures/onnx")
        .join(name)
}

fn f32s(t: &HostTensor) -> Vec<f32> {
    match t.data() {
        TensorData::Bytes(b) => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        TensorData::Strings(_) => panic!("not f32"),
    }
}

fn tensor(rng: &mut SplitMix64, t: u64) -> (Vec<f32>, HostTensor) {
    let v: Vec<f32> = (0..HEADS * t * HEAD_DIM)
        .map(|_| rng.uniform(-1.0, 1.0))
        .collect();
    let t = HostTensor::from_f32(vec![1, HEADS, t, HEAD_DIM], &v).unwrap();
    (v, t)
}

/// `[1, HEADS, a, D]` ++ `[1, HEADS, b, D]` along axis 2.
fn concat2(x: &[f32], a: u64, y: &[f32], b: u64) -> Vec<f32> {
    let (a, b, d) = (a as usize, b as usize, HEAD_DIM as usize);
    let mut out = Vec::new();
    for h in 0..HEADS as usize {
        out.extend_from_slice(&x[h * a * d..(h + 1) * a * d]);
        out.extend_from_slice(&y[h * b * d..(h + 1) * b * d]);
    }
    out
}

fn session(engine: &Engine, carry: Carry) -> OnnxSession {
    let options = SessionOptions {
        run: RunOptions::new(Policy::OpenVino),
        carry,
    };
    OnnxSession::load(engine, fixture("kv_attention.onnx"), &options).unwrap()
}

#[test]
fn carried_caches_match_feeding_every_input_and_move_only_the_new_rows() {
    let Some(gpu) = testing::gpu_or_skip("onnx_session") else {
        return;
    };
    let engine = Engine::new(gpu);
    let mut carried = session(&engine, Carry::Auto);
    assert_eq!(carried.states().len(), 2, "both caches are recognised");
    let mut fed = session(&engine, Carry::None);
    assert!(fed.states().is_empty());
    let mut rng = SplitMix64::new(17);
    let (mut keys, mut values, mut t) = (Vec::new(), Vec::new(), 0u64);
    let row_bytes = HEADS * HEAD_DIM * 4;
    for step in 0..40 {
        let seq = if step == 0 { 6 } else { 1 };
        let (_, q) = tensor(&mut rng, seq);
        let (k, kt) = tensor(&mut rng, seq);
        let (v, vt) = tensor(&mut rng, seq);
        let before = carried.stats();
        carried
            .run_blocking(&[("q", &q), ("k", &kt), ("v", &vt)])
            .unwrap();
        let after = carried.stats();
        let past_k = HostTensor::from_f32(vec![1, HEADS, t, HEAD_DIM], &keys).unwrap();
        let past_v = HostTensor::from_f32(vec![1, HEADS, t, HEAD_DIM], &values).unwrap();
        fed.run_blocking(&[
            ("q", &q),
            ("k", &kt),
            ("v", &vt),
            ("past_key_values.0.key", &past_k),
            ("past_key_values.0.value", &past_v),
        ])
        .unwrap();
        keys = concat2(&keys, t, &k, seq);
        values = concat2(&values, t, &v, seq);
        t += seq;
        for name in ["present.0.key", "present.0.value", "attn"] {
            let a = carried.read_blocking(name).unwrap();
            let b = fed.read_blocking(name).unwrap();
            assert_eq!(a.dims(), b.dims(), "step {step} {name}");
            for (x, y) in f32s(&a).iter().zip(f32s(&b)) {
                assert!((x - y).abs() <= 1e-6, "step {step} {name}: {x} vs {y}");
            }
        }
        assert_eq!(f32s(&carried.read_blocking("present.0.key").unwrap()), keys);
        if step > 0 && after.state_growths == before.state_growths {
            assert_eq!(
                after.copy_bytes - before.copy_bytes,
                2 * row_bytes,
                "step {step}"
            );
        }
    }
    // The fed session copied its whole past into each present at every step; the carried one
    // grew its caches a few times (the openvino policy reserves 10 steps ahead).
    assert!(carried.stats().state_growths <= 2 * 5);
}

#[test]
fn inputs_that_do_not_fit_are_typed_errors_naming_the_input_and_the_session_goes_on() {
    let Some(gpu) = testing::gpu_or_skip("onnx_session") else {
        return;
    };
    let engine = Engine::new(gpu);
    let mut s = session(&engine, Carry::Auto);
    let mut rng = SplitMix64::new(2);
    let (_, good) = tensor(&mut rng, 1);
    s.run_blocking(&[("q", &good), ("k", &good), ("v", &good)])
        .unwrap();
    let rows = |s: &OnnxSession| s.read_blocking("present.0.key").unwrap().dims()[2];
    assert_eq!(rows(&s), 1);
    let input_of = |e: &SessionError| match e {
        SessionError::Input(
            OnnxError::UnknownInput { input }
            | OnnxError::MissingInput { input }
            | OnnxError::InputType { input, .. }
            | OnnxError::InputRank { input, .. }
            | OnnxError::InputDim { input, .. }
            | OnnxError::SymbolConflict { input, .. },
        ) => input.clone(),
        other => panic!("not an input error: {other}"),
    };
    let ids = HostTensor::from_i64(vec![1, HEADS, 1, HEAD_DIM], &[0; 8]).unwrap();
    let rank3 = HostTensor::from_f32(vec![HEADS, 1, HEAD_DIM], &[0.0; 8]).unwrap();
    let heads3 = HostTensor::from_f32(vec![1, 3, 1, HEAD_DIM], &[0.0; 12]).unwrap();
    let (_, seq2) = tensor(&mut rng, 2);
    let cases: Vec<(Vec<(&str, &HostTensor)>, &str)> = vec![
        (vec![("q", &good), ("k", &good)], "v"),
        (
            vec![("q", &good), ("k", &good), ("v", &good), ("w", &good)],
            "w",
        ),
        (vec![("q", &ids), ("k", &good), ("v", &good)], "q"),
        (vec![("q", &good), ("k", &rank3), ("v", &good)], "k"),
        (vec![("q", &good), ("k", &good), ("v", &heads3)], "v"),
        (vec![("q", &good), ("k", &seq2), ("v", &good)], "k"),
    ];
    for (feeds, named) in cases {
        let e = s.run_blocking(&feeds).unwrap_err();
        assert_eq!(input_of(&e), named, "{e}");
        assert!(e.to_string().contains(&format!("`{named}`")), "{e}");
    }
    assert!(matches!(
        s.read_blocking("logits"),
        Err(SessionError::UnknownOutput { .. })
    ));
    // Nothing ran: the caches still hold one row, and the next step appends to them.
    assert_eq!(rows(&s), 1);
    s.run_blocking(&[("q", &good), ("k", &good), ("v", &good)])
        .unwrap();
    assert_eq!(rows(&s), 2);
    // Without carrying, the pasts are required like any input.
    let mut fed = session(&engine, Carry::None);
    let e = fed
        .run_blocking(&[("q", &good), ("k", &good), ("v", &good)])
        .unwrap_err();
    assert_eq!(input_of(&e), "past_key_values.0.key");
    // Only concat caches can be carried.
    let e = OnnxSession::load(
        &engine,
        fixture("kv_attention.onnx"),
        &SessionOptions {
            carry: Carry::Pairs(vec![("attn".into(), "q".into())]),
            ..SessionOptions::default()
        },
    )
    .unwrap_err();
    assert!(matches!(e, SessionError::Carry { .. }), "{e}");
}

#[test]
fn a_failed_load_leaves_nothing_allocated() {
    let Some(gpu) = testing::gpu_or_skip("onnx_session") else {
        return;
    };
    let engine = Engine::new(gpu);
    let in_use = |e: &Engine| -> u64 {
        AllocKind::ALL
            .iter()
            .map(|&k| e.stats().current_bytes(k))
            .sum()
    };
    // Truncated protobuf, an op the importer refuses, a kernel refused when compiling.
    let bytes = std::fs::read(fixture("kv_attention.onnx")).unwrap();
    let resolver = dynrt::onnx::external::BytesResolver::new();
    let e = OnnxSession::from_bytes(
        &engine,
        bytes::Bytes::from(bytes[..bytes.len() / 2].to_vec()),
        &resolver,
        &SessionOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(e, SessionError::Load(_)), "{e}");
    let e = OnnxSession::load(&engine, fixture("int_div.onnx"), &SessionOptions::default())
        .unwrap_err();
    assert!(matches!(e, SessionError::Run(_)), "{e}");
    assert!(e.to_string().contains("node `q` (div)"), "{e}");
    assert_eq!(in_use(&engine), 0);
    // A model that loads allocates, and frees it all when dropped.
    let model = OnnxFile::load(fixture("kv_attention.onnx"), &LoadOptions::default()).unwrap();
    let s = OnnxSession::from_model(&engine, &model, &SessionOptions::default()).unwrap();
    assert!(in_use(&engine) > 0);
    drop(s);
    assert_eq!(in_use(&engine), 0);
    assert_eq!(TensorDType::F32.name(), "f32");
}

#[test]
fn a_kept_input_is_written_once_and_gives_what_feeding_it_gives() {
    let Some(gpu) = testing::gpu_or_skip("onnx_session") else {
        return;
    };
    let engine = Engine::new(gpu);
    let mut kept = session(&engine, Carry::Auto);
    let mut fed = session(&engine, Carry::Auto);
    let mut rng = SplitMix64::new(5);
    let (_, mut q) = tensor(&mut rng, 1);
    kept.keep_input("q", &q).unwrap();
    assert_eq!(kept.kept_inputs().collect::<Vec<_>>(), ["q"]);
    let one = HEADS * HEAD_DIM * 4; // bytes of q, k or v for one position
    let same = |a: &OnnxSession, b: &OnnxSession, what: &str| {
        let (x, y) = (
            a.read_blocking("attn").unwrap(),
            b.read_blocking("attn").unwrap(),
        );
        assert_eq!(x.dims(), y.dims(), "{what}");
        assert_eq!(f32s(&x), f32s(&y), "{what}");
    };
    for step in 0..8 {
        // Step 5 feeds a new q to the kept session: it replaces the kept one from then on.
        let refeed = step == 5;
        if refeed {
            q = tensor(&mut rng, 1).1;
        }
        let (_, k) = tensor(&mut rng, 1);
        let (_, v) = tensor(&mut rng, 1);
        let before = kept.stats().input_bytes_written;
        if refeed {
            kept.run_blocking(&[("q", &q), ("k", &k), ("v", &v)])
                .unwrap();
        } else {
            kept.run_blocking(&[("k", &k), ("v", &v)]).unwrap();
        }
        fed.run_blocking(&[("q", &q), ("k", &k), ("v", &v)])
            .unwrap();
        let written = kept.stats().input_bytes_written - before;
        let q_written = step == 0 || refeed;
        assert_eq!(
            written,
            if q_written { 3 * one } else { 2 * one },
            "step {step}: bytes of inputs written"
        );
        same(&kept, &fed, &format!("step {step}"));
    }
    assert_eq!(fed.stats().input_bytes_written, 8 * 3 * one);

    // What cannot be kept is refused, naming the input, and the kept q stays.
    let rank3 = HostTensor::from_f32(vec![HEADS, 1, HEAD_DIM], &[0.0; 8]).unwrap();
    let e = kept.keep_input("q", &rank3).unwrap_err();
    assert!(
        matches!(&e, SessionError::Input(OnnxError::InputRank { input, .. }) if input == "q"),
        "{e}"
    );
    let e = kept.keep_input("w", &q).unwrap_err();
    assert!(
        matches!(&e, SessionError::Input(OnnxError::UnknownInput { input }) if input == "w"),
        "{e}"
    );
    let e = kept.keep_input("past_key_values.0.key", &q).unwrap_err();
    assert!(matches!(e, SessionError::Keep { .. }), "{e}");
    let (_, k) = tensor(&mut rng, 1);
    let (_, v) = tensor(&mut rng, 1);
    kept.run_blocking(&[("k", &k), ("v", &v)]).unwrap();
    fed.run_blocking(&[("q", &q), ("k", &k), ("v", &v)])
        .unwrap();
    same(&kept, &fed, "after the refusals");

    // Released, it must be fed again; the session goes on.
    assert!(kept.release_input("q"));
    assert!(!kept.release_input("q"));
    let e = kept.run_blocking(&[("k", &k), ("v", &v)]).unwrap_err();
    assert!(
        matches!(&e, SessionError::Input(OnnxError::MissingInput { input }) if input == "q"),
        "{e}"
    );
    kept.run_blocking(&[("q", &q), ("k", &k), ("v", &v)])
        .unwrap();
    fed.run_blocking(&[("q", &q), ("k", &k), ("v", &v)])
        .unwrap();
    same(&kept, &fed, "after the release");
}

#[test]
fn a_fed_past_is_written_once_into_the_carried_cache() {
    let Some(gpu) = testing::gpu_or_skip("onnx_session") else {
        return;
    };
    let engine = Engine::new(gpu);
    let mut carried = session(&engine, Carry::Auto);
    let mut fed = session(&engine, Carry::None);
    let mut rng = SplitMix64::new(9);
    let (_, q) = tensor(&mut rng, 1);
    let (_, k) = tensor(&mut rng, 1);
    let (_, v) = tensor(&mut rng, 1);
    let (_, past_k) = tensor(&mut rng, 5);
    let (_, past_v) = tensor(&mut rng, 5);
    let feeds = [
        ("q", &q),
        ("k", &k),
        ("v", &v),
        ("past_key_values.0.key", &past_k),
        ("past_key_values.0.value", &past_v),
    ];
    carried.run_blocking(&feeds).unwrap();
    fed.run_blocking(&feeds).unwrap();
    for name in ["attn", "present.0.key", "present.0.value"] {
        let (a, b) = (
            carried.read_blocking(name).unwrap(),
            fed.read_blocking(name).unwrap(),
        );
        assert_eq!(a.dims(), b.dims(), "{name}");
        assert_eq!(f32s(&a), f32s(&b), "{name}");
    }
    // Every fed byte once: a carried past goes straight into the padded cache, block by
    // block (it was also written whole at the cache's start, in the wrong layout, and only
    // the order of the writes hid it).
    let fed_bytes = (3 + 2 * 5) * HEADS * HEAD_DIM * 4;
    assert_eq!(carried.stats().input_bytes_written, fed_bytes);
    assert_eq!(fed.stats().input_bytes_written, fed_bytes);
}
