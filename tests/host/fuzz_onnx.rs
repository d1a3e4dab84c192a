//! Fuzz target for the ONNX loader (and the `.npy` and test-data readers) on the stable
//! toolchain: a mutation loop over seed files that asserts nothing panics.
//!
//! Seeds: `fixtures/onnx/*.onnx` and `*.npy`, the hostile models `tests/hostile/onnx.rs`
//! generates (variadic nodes of many inputs, gathers of indices out of range), plus up to 200
//! models of the ONNX node tests when they are fetched (`scripts/fetch_onnx_tests.sh`). Mutations (SplitMix64, seeded): bit flips,
//! interesting bytes (0, 0x7f, 0x80, 0xff), random runs, truncation, insertion and deletion of
//! byte ranges, duplicated chunks, large varints written over a byte, and splices of two seeds.
//! Each input goes through `OnnxFile::from_bytes` (external data from a `BytesResolver` that
//! holds `external.bin`) and, when it loads, the importer (`onnx::import`),
//! `testdata::decode_tensor` and `npy::read_npy`, inside
//! `catch_unwind`; a panic is a finding, written to `<target tmp>/onnx_fuzz/finding-N.bin` and
//! failing the test.
//!
//! By default the loop runs for 3 seconds (part of `cargo test`); `DYNRT_FUZZ_SECS=600` runs
//! it for ten minutes, `DYNRT_FUZZ_SEED` changes the seed. It prints executions and the
//! outcome counts.

use bytes::Bytes;
use dynrt::onnx::external::BytesResolver;
use dynrt::onnx::{testdata, LoadOptions, OnnxFile};
use dynrt::rng::SplitMix64;
use std::cell::Cell;
use std::sync::Once;
use std::time::{Duration, Instant};

#[path = "../hostile/onnx/models.rs"]
mod hostile;

fn seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    let fixtures = crate::common::repo().join("fixtures/onnx");
    let mut names: Vec<_> = std::fs::read_dir(&fixtures)
        .expect("fixtures/onnx")
        .map(|e| e.unwrap().path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("onnx" | "npy")))
        .collect();
    names.sort();
    for p in names {
        seeds.push(std::fs::read(p).unwrap());
    }
    assert!(
        seeds.len() >= 4,
        "fixtures/onnx has {} seed files",
        seeds.len()
    );
    seeds.extend([
        hostile::sum_of_inputs(300),
        hostile::sum_of_one_input(3000),
        hostile::gather(hostile::Indices::Fed),
        hostile::gather(hostile::Indices::Added),
        hostile::gather(hostile::Indices::Cast),
        hostile::gather_in_shape_chain(),
    ]);
    let node = testdata::default_dir();
    if let Ok(cases) = testdata::list_cases(&node) {
        let step = (cases.len() / 200).max(1);
        for case in cases.iter().step_by(step) {
            if let Ok(b) = std::fs::read(case.join("model.onnx")) {
                seeds.push(b);
            }
            if let Ok(b) = std::fs::read(case.join("test_data_set_0/input_0.pb")) {
                seeds.push(b);
            }
        }
    }
    seeds
}

fn mutate(rng: &mut SplitMix64, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut b = seeds[rng.range(0, seeds.len() as u64) as usize].clone();
    let rounds = 1 + rng.range(0, 4);
    for _ in 0..rounds {
        let len = b.len() as u64;
        let at = |rng: &mut SplitMix64| {
            if len == 0 {
                0
            } else {
                rng.range(0, len) as usize
            }
        };
        match rng.range(0, 9) {
            0 if len > 0 => {
                let i = at(rng);
                b[i] ^= 1 << rng.range(0, 8);
            }
            1 if len > 0 => {
                let i = at(rng);
                b[i] = [0x00, 0x7f, 0x80, 0xff, 0x01, 0x08][rng.range(0, 6) as usize];
            }
            2 if len > 0 => {
                let i = at(rng);
                let n = (rng.range(1, 9) as usize).min(b.len() - i);
                for v in &mut b[i..i + n] {
                    *v = rng.next_u64() as u8;
                }
            }
            3 => b.truncate(at(rng)),
            4 => {
                let i = at(rng);
                let extra: Vec<u8> = (0..rng.range(1, 17))
                    .map(|_| rng.next_u64() as u8)
                    .collect();
                b.splice(i..i, extra);
            }
            5 if len > 1 => {
                let i = at(rng);
                let n = (rng.range(1, 65) as usize).min(b.len() - i);
                b.drain(i..i + n);
            }
            6 if len > 1 => {
                let i = at(rng);
                let n = (rng.range(1, 65) as usize).min(b.len() - i);
                let chunk = b[i..i + n].to_vec();
                let j = at(rng);
                b.splice(j..j, chunk);
            }
            7 if len > 0 => {
                // A large varint over one byte: lengths and counts that promise too much.
                let i = at(rng);
                let v = [0xff, 0xff, 0xff, 0xff, 0x0f];
                let n = v.len().min(b.len() - i);
                b[i..i + n].copy_from_slice(&v[..n]);
            }
            _ => {
                let other = &seeds[rng.range(0, seeds.len() as u64) as usize];
                if !other.is_empty() {
                    let from = rng.range(0, other.len() as u64) as usize;
                    let i = at(rng);
                    b.truncate(i);
                    b.extend_from_slice(&other[from..]);
                }
            }
        }
    }
    b
}

thread_local! {
    static QUIET_PANICS: Cell<bool> = const { Cell::new(false) };
}

/// Turns the printing of panics off (or back on) on the calling thread. The panic hook is
/// process-wide: the one installed here (once) passes the panics of every other thread to the
/// hook it replaced.
fn quiet_panics_on_this_thread(quiet: bool) {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET_PANICS.with(Cell::get) {
                hook(info);
            }
        }));
    });
    QUIET_PANICS.with(|q| q.set(quiet));
}

#[test]
fn loader_never_panics_on_mutated_files() {
    let secs: u64 = std::env::var("DYNRT_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let seed: u64 = std::env::var("DYNRT_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x0dd5_eed5);
    let seeds = seeds();
    let mut resolver = BytesResolver::new();
    let ext = crate::common::repo().join("fixtures/onnx/external.bin");
    resolver.insert("external.bin", Bytes::from(std::fs::read(ext).unwrap()));
    let options = LoadOptions::default();
    let findings_dir = crate::common::tmpdir().join("onnx_fuzz");

    // Every seed model must load (or the loop only exercises error paths).
    let loaded_seeds = seeds
        .iter()
        .filter(|s| OnnxFile::from_bytes(Bytes::from((*s).clone()), &resolver, &options).is_ok())
        .count();
    assert!(loaded_seeds >= 2, "only {loaded_seeds} seeds load");

    let mut rng = SplitMix64::new(seed);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (mut execs, mut ok, mut errors, mut findings) = (0u64, 0u64, 0u64, Vec::new());
    while Instant::now() < deadline {
        for _ in 0..64 {
            let input = mutate(&mut rng, &seeds);
            // Panics are caught and counted; keep the hook from printing each one.
            quiet_panics_on_this_thread(true);
            let result = std::panic::catch_unwind(|| {
                let bytes = Bytes::from(input.clone());
                let model = OnnxFile::from_bytes(bytes.clone(), &resolver, &options);
                if let Ok(m) = &model {
                    // Walk what was loaded: constants, summaries, the import into a graph.
                    let _ = dynrt::onnx::InspectReport::new(m).to_text();
                    for n in m.graph.walk_nodes() {
                        if n.op_type == "Constant" {
                            let _ = n.constant_value();
                        }
                    }
                    let _ = dynrt::onnx::import(m);
                }
                let _ = testdata::decode_tensor(bytes, "fuzz");
                let _ = dynrt::npy::read_npy(&input);
                model.is_ok()
            });
            quiet_panics_on_this_thread(false);
            execs += 1;
            match result {
                Ok(true) => ok += 1,
                Ok(false) => errors += 1,
                Err(_) => {
                    std::fs::create_dir_all(&findings_dir).unwrap();
                    let path = findings_dir.join(format!("finding-{}.bin", findings.len()));
                    std::fs::write(&path, &input).unwrap();
                    findings.push(path.display().to_string());
                }
            }
        }
    }
    eprintln!(
        "onnx fuzz: {execs} executions in {secs} s from {} seeds (seed {seed:#x}): {ok} loaded, {errors} typed errors, {} panics",
        seeds.len(),
        findings.len()
    );
    assert!(execs > 100, "only {execs} executions");
    assert!(findings.is_empty(), "panics on: {findings:?}");
}
