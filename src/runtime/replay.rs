//! A request's memory decisions replayed on host memory: the device-free half of
//! [`super::InferRequest`] (`update_shape`, then `realloc_if_needed` through the request's
//! sizer, its memory pool and its placeholders) over a sequence of inputs, with
//! [`crate::memory::pool::HostStorage`] standing for the device and no kernel run. The
//! reallocations and the bytes held are the ones a request on a device would have (the same
//! code decides them), so a trace of thousands of calls of a large model is measured in
//! seconds on any machine.

use super::compile::{Compiled, NetworkOptions, Target};
use super::placeholders::PlaceholderPool;
use super::state::RequestState;
use super::{RunError, RunOptions, RunStats};
use crate::gpu::kernels::kernel_of;
use crate::graph::Graph;
use crate::memory::pool::HostStorage;
use crate::memory::AllocKind;
use crate::tensor::HostTensor;
use std::sync::{Arc, Mutex};

/// What a replay measured.
#[derive(Debug, Clone, PartialEq)]
pub struct HostReplay {
    /// The request's counters (reallocations, reuses, shape updates, ...).
    pub stats: RunStats,
    /// The most bytes the request held after any iteration was prepared: activations,
    /// placeholders, states (constants are the network's, not counted).
    pub peak_bytes: u64,
    /// Bytes held after the last iteration.
    pub final_bytes: u64,
}

/// Replays `steps` (each the inputs of one iteration) through a request on `graph` with
/// `network` and `run`, as [`super::Network::compile`] and [`super::InferRequest::infer`]
/// would size them on a device whose storage offsets align to 256 bytes and whose inputs
/// and outputs are device memory.
///
/// # Errors
/// As [`super::Network::compile`] (but for the device's) and [`super::InferRequest::infer`].
// Host storage counts through an Rc (one thread); the pool types are shared with the engine's.
#[allow(clippy::arc_with_non_send_sync)]
pub fn replay_on_host<I>(
    graph: Graph,
    network: &NetworkOptions,
    run: RunOptions,
    steps: I,
) -> Result<HostReplay, RunError>
where
    I: IntoIterator<Item = Vec<(String, HostTensor)>>,
{
    let graph = if network.fuse {
        crate::graph::fuse::fuse(&graph)?.0
    } else {
        graph
    };
    let target = Target {
        align_bytes: 256,
        io_kind: AllocKind::UsmDevice,
        reads_strided: |op, i| kernel_of(op).is_some_and(|k| k.reads_strided(i)),
    };
    let compiled = Arc::new(Compiled::build(graph, network, target)?);
    let storage = HostStorage::new();
    let placeholders = Arc::new(Mutex::new(PlaceholderPool::new(
        None,
        AllocKind::UsmDevice,
        256,
        network.inflight,
    )));
    let mut state = RequestState::new(
        compiled,
        run,
        storage.clone(),
        storage.clone(),
        placeholders,
    )?;
    let mut peak_bytes = storage.bytes_in_use();
    for inputs in steps {
        let refs: Vec<(&str, &HostTensor)> = inputs.iter().map(|(l, t)| (l.as_str(), t)).collect();
        state.prepare(&refs)?;
        peak_bytes = peak_bytes.max(storage.bytes_in_use());
        state.commit();
        // Nothing holds bind groups here: the freed buffers need no forgetting.
        state.take_freed();
    }
    Ok(HostReplay {
        stats: state.stats(),
        peak_bytes,
        final_bytes: storage.bytes_in_use(),
    })
}
