//! Property tests of the request state on host storage: every output sized, no conflicting nodes in
//! one pool record, the KV bookkeeping adding up, nothing left after a drop.

use super::*;
use crate::demo::decoder::{build_graph, labels, DecoderConfig, DecoderWeights};
use crate::graph::{Bindings, Graph};
use crate::memory::pool::HostStorage;
use crate::memory::predictor::Policy;
use crate::runtime::compile::{NetworkOptions, StateBinding, Target};
use crate::tensor::HostTensor;
use proptest::prelude::*;
use std::collections::BTreeMap;

fn decoder() -> (Graph, Vec<StateBinding>) {
    let config = DecoderConfig {
        layers: 1,
        heads: 2,
        dim: 8,
        vocab: 16,
        max_positions: 256,
        seed: 1,
    };
    let g = build_graph(&config, &DecoderWeights::generate(&config)).unwrap();
    let states = g.state_bindings();
    (g.graph, states)
}

/// The decoder compiled with its states and the default options (the device-free half).
fn compiled_decoder() -> Arc<Compiled> {
    let (graph, states) = decoder();
    let options = NetworkOptions {
        states,
        ..NetworkOptions::default()
    };
    let target = Target {
        align_bytes: 256,
        io_kind: AllocKind::UsmDevice,
        reads_strided: |_, _| false,
    };
    Arc::new(Compiled::build(graph, &options, target).unwrap())
}

// Host storage counts through an Rc (single-threaded); production pools hold engine
// buffers, which are Send and Sync on native targets.
#[allow(clippy::arc_with_non_send_sync)]
fn host_state(
    compiled: Arc<Compiled>,
    run: RunOptions,
    storage: HostStorage,
) -> RequestState<HostStorage> {
    let pool = Arc::new(Mutex::new(PlaceholderPool::new(
        None,
        AllocKind::UsmDevice,
        256,
        2,
    )));
    RequestState::new(compiled, run, storage.clone(), storage, pool).unwrap()
}

fn step_inputs(seq: u64, at: u64) -> (HostTensor, HostTensor) {
    let ids: Vec<i32> = (0..seq as i32).map(|i| i % 16).collect();
    let pos: Vec<i32> = (at as i32..(at + seq) as i32).collect();
    (
        HostTensor::i32(Shape::new(vec![seq]), &ids),
        HostTensor::i32(Shape::new(vec![seq]), &pos),
    )
}

/// Checks what the executor relies on after `prepare`: every output the device writes
/// has a buffer range at least as large as its shape, nodes that must not share memory
/// do not share a pool record, and the states' bookkeeping adds up.
fn check_prepared(s: &RequestState<HostStorage>) -> Result<(), TestCaseError> {
    let c = Arc::clone(&s.compiled);
    let mut record_of: BTreeMap<usize, crate::memory::pool::RecordId> = BTreeMap::new();
    for (k, node) in c.nodes.iter().enumerate() {
        let needed = s.shape(node.id).size_bytes(node.dtype).unwrap();
        match node.role {
            Role::Kernel | Role::Copy | Role::ConcatCopy | Role::HostValue => {
                let v = s
                    .view(node.id)
                    .ok_or_else(|| TestCaseError::fail(format!("node {k} has no buffer")))?;
                prop_assert!(
                    v.size_bytes >= needed,
                    "node {k}: {} < {needed}",
                    v.size_bytes
                );
                prop_assert!(
                    v.offset_bytes + needed <= v.buffer.data.len() as u64,
                    "node {k} runs past its buffer"
                );
            }
            Role::StateConcat { state } => {
                let st = &s.states[state];
                let cap = st.current().map_or(0, |b| b.data.len() as u64);
                prop_assert!(cap >= needed, "state {state}: capacity {cap} < {needed}");
                prop_assert_eq!(st.rows() + st.append_rows, s.shape(node.id).dims()[st.axis]);
            }
            _ => {}
        }
        if let Mem::Pool(v) = &s.slots[k].mem {
            record_of.insert(k, v.record);
        }
    }
    for (&k, r) in &record_of {
        for p in &c.nodes[k].restrictions {
            if let Some(r2) = record_of.get(&p.index()) {
                prop_assert!(
                    r != r2,
                    "positions {k} and {} conflict but share a record",
                    p
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn request_states_on_host_storage_size_every_output_and_keep_the_kv_cache(
        chunks in prop::collection::vec(1u64..6, 1..12),
        policy in prop::sample::select(vec![Policy::None, Policy::OpenVino, Policy::Adaptive]),
        pool in any::<bool>(),
        planner in any::<bool>(),
        fixed_seq in any::<bool>(),
    ) {
        let (graph, states) = decoder();
        let mut fixed = Bindings::new();
        let chunks: Vec<u64> = if fixed_seq {
            fixed.insert("seq".into(), 1);
            chunks.iter().map(|_| 1).collect()
        } else {
            chunks
        };
        let options = NetworkOptions { planner, fixed, states, io_kind: None, inflight: 2, fuse: true, regroup_weights: true, kernels: None, weight_copies_bytes: None };
        let target = Target { align_bytes: 256, io_kind: AllocKind::UsmDevice, reads_strided: |_, _| false };
        let compiled = Arc::new(Compiled::build(graph, &options, target).unwrap());
        let storage = HostStorage::new();
        let mut run = RunOptions::new(policy);
        run.pool = pool;
        let mut s = host_state(compiled, run, storage.clone());
        let mut rows = 0u64;
        for &seq in &chunks {
            let (ids, pos) = step_inputs(seq, rows);
            s.prepare(&[(labels::TOKENS, &ids), (labels::POSITIONS, &pos)]).unwrap();
            check_prepared(&s)?;
            s.commit();
            rows += seq;
            for shape in s.state_shapes() {
                prop_assert_eq!(shape.dims(), &[rows, 8]);
            }
        }
        prop_assert!(storage.bytes_in_use() > 0);
        drop(s);
        prop_assert_eq!(storage.bytes_in_use(), 0, "dropping the state frees everything");
    }
}

#[test]
fn a_failed_step_leaves_the_states_as_they_were() {
    let compiled = compiled_decoder();
    // A host budget that holds a short prefill but not a long one.
    let storage = HostStorage::with_budget(200_000);
    let mut s = host_state(compiled, RunOptions::new(Policy::OpenVino), storage);
    let (ids, pos) = step_inputs(4, 0);
    s.prepare(&[(labels::TOKENS, &ids), (labels::POSITIONS, &pos)])
        .unwrap();
    s.commit();
    let (ids, pos) = step_inputs(200, 4);
    let e = s
        .prepare(&[(labels::TOKENS, &ids), (labels::POSITIONS, &pos)])
        .unwrap_err();
    assert!(matches!(e, RunError::OutOfMemory { .. }), "{e}");
    s.abort();
    assert!(s.state_shapes().iter().all(|sh| sh.dims() == [4, 8]));
    let (ids, pos) = step_inputs(1, 4);
    s.prepare(&[(labels::TOKENS, &ids), (labels::POSITIONS, &pos)])
        .unwrap();
    s.commit();
    assert!(s.state_shapes().iter().all(|sh| sh.dims() == [5, 8]));
}

#[test]
fn past_the_growth_bound_each_state_frees_its_old_buffer_before_the_next_grows() {
    // Bytes in use once a step that grows every state is prepared (before its submit).
    let prepared_growth = |bound: u64| {
        let compiled = compiled_decoder();
        let storage = HostStorage::new();
        let run = RunOptions {
            growth_transient_bytes: bound,
            ..RunOptions::new(Policy::None)
        };
        let mut s = host_state(compiled, run, storage.clone());
        let (ids, pos) = step_inputs(4, 0);
        s.prepare(&[(labels::TOKENS, &ids), (labels::POSITIONS, &pos)])
            .unwrap();
        s.commit();
        let old: u64 = s.state_buffer_bytes().iter().sum();
        let (ids, pos) = step_inputs(1, 4);
        s.prepare(&[(labels::TOKENS, &ids), (labels::POSITIONS, &pos)])
            .unwrap();
        let moved_now = s.states.iter().all(|st| st.grown.is_none());
        let in_use = storage.bytes_in_use();
        s.commit();
        assert!(s.state_shapes().iter().all(|sh| sh.dims() == [5, 8]));
        (in_use, old, moved_now)
    };
    // No bound: every state moved alone, its old buffer gone before the submit.
    let (alone, old, moved) = prepared_growth(0);
    assert!(moved && old > 0);
    // Unbounded: the step's work copies them, every old buffer held until then.
    let (together, _, moved) = prepared_growth(u64::MAX);
    assert!(!moved);
    assert_eq!(together - alone, old);
}
