//! The memory of a trace of calls of `[batch, seq]`, replayed on host memory
//! ([`crate::runtime::replay_on_host`]: the request's sizer, pool and placeholders, no kernel
//! run) the way [`super::SentenceModel`] runs them, beside one request that grows buffer by
//! buffer and beside exact allocation: what `dynrt-bench embed --trace` reports and the
//! memory test checks.

use super::model::{bert_inputs, Envelope};
use crate::graph::Graph;
use crate::memory::predictor::Policy;
use crate::rng::SplitMix64;
use crate::runtime::{
    replay_on_host, HostReplay, NetworkOptions, ReplayStep, RunError, RunOptions,
};

/// What a trace held and reallocated.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceMemory {
    /// Calls in the trace.
    pub calls: usize,
    /// Bytes the call of the trace that needs the most holds alone, with exact sizes
    /// (policy none): activations, inputs and outputs; the weights are the network's.
    pub largest_call_need_bytes: u64,
    /// Node outputs whose shape changed from the call before, over the trace: what an
    /// allocator that sizes every output exactly for each call reallocates.
    pub exact_reallocations: u64,
    /// One request through every call, growing buffer by buffer.
    pub one_request: HostReplay,
    /// Envelope growths (fresh requests) as [`super::SentenceModel`] runs the trace.
    pub growths: usize,
    /// Buffers replaced after the first call, by envelope: each request's reallocations,
    /// and every buffer of a request that replaced another.
    pub reallocations: u64,
    /// Buffers allocated, by envelope.
    pub allocations: u64,
    /// The most bytes held at once, by envelope.
    pub peak_bytes: u64,
}

/// `batch` rows of `seq` token ids: `[CLS]` (101), random ids in `1000..vocab`, `[SEP]`
/// (102).
pub fn random_rows(rng: &mut SplitMix64, batch: usize, seq: usize, vocab: u64) -> Vec<Vec<u32>> {
    (0..batch)
        .map(|_| {
            (0..seq)
                .map(|j| {
                    if j == 0 {
                        101
                    } else if j + 1 == seq {
                        102
                    } else {
                        rng.range(1000, vocab.max(1001)) as u32
                    }
                })
                .collect()
        })
        .collect()
}

/// Replays `shapes` (`[batch, seq]` per call, random token ids) through `graph`
/// ([`super::folder_graph`]'s BERT, whose tokenizer has `vocab` ids and pads with `pad`)
/// under `policy`: by envelope (calls of at most `max_batch x max_seq`), as one growing
/// request, and the largest call alone.
///
/// # Errors
/// As [`replay_on_host`].
pub fn trace_memory(
    graph: &Graph,
    vocab: usize,
    pad: u32,
    shapes: &[(usize, usize)],
    (max_batch, max_seq): (usize, usize),
    policy: Policy,
) -> Result<TraceMemory, RunError> {
    let network = NetworkOptions {
        inflight: 1,
        ..NetworkOptions::default()
    };
    let inputs = |b: usize, s: usize, rng: &mut SplitMix64| {
        let rows = random_rows(rng, b, s, vocab as u64);
        let refs: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
        bert_inputs(&refs, pad)
    };
    let mut rng = SplitMix64::new(7);
    let one = replay_on_host(
        graph.clone(),
        &network,
        RunOptions::new(policy),
        shapes
            .iter()
            .map(|&(b, s)| inputs(b, s, &mut rng))
            .collect::<Vec<_>>(),
    )?;
    // The largest call: among those with the most tokens and the most attention scores (what
    // the activations grow with), the one whose need is largest.
    let mut candidates: Vec<(usize, usize)> = Vec::new();
    for key in [|b: usize, s: usize| b * s, |b: usize, s: usize| b * s * s] {
        let mut by: Vec<(usize, usize)> = shapes.to_vec();
        by.sort_by_key(|&(b, s)| std::cmp::Reverse(key(b, s)));
        candidates.extend(by.into_iter().take(4));
    }
    candidates.sort_unstable();
    candidates.dedup();
    let mut need = 0u64;
    for (b, s) in candidates {
        let alone = replay_on_host(
            graph.clone(),
            &network,
            RunOptions::new(Policy::None),
            [inputs(b, s, &mut rng)],
        )?;
        need = need.max(alone.peak_bytes);
    }
    // As `SentenceModel::run_batch` runs them: at each envelope growth a fresh request sized
    // for the envelope (reserved), then the call at its own shape.
    let mut segments: Vec<Vec<ReplayStep>> = Vec::new();
    let mut envelope = Envelope::new(max_batch, max_seq);
    for &(b, s) in shapes {
        let call = ReplayStep::Run(inputs(b, s, &mut rng));
        match envelope.fit(b, s) {
            Some((eb, es)) => {
                let rows = random_rows(&mut rng, eb, es, vocab as u64);
                let refs: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
                segments.push(vec![ReplayStep::Reserve(bert_inputs(&refs, pad)), call]);
            }
            None => match segments.last_mut() {
                Some(seg) => seg.push(call),
                None => segments.push(vec![call]),
            },
        }
    }
    let (mut peak, mut reallocations, mut allocations) = (0u64, 0u64, 0u64);
    let growths = segments.len();
    for (i, seg) in segments.into_iter().enumerate() {
        let r = replay_on_host(graph.clone(), &network, RunOptions::new(policy), seg)?;
        peak = peak.max(r.peak_bytes);
        allocations += r.stats.allocations;
        reallocations += r.stats.reallocations;
        if i > 0 {
            reallocations += r.stats.allocations.saturating_sub(r.stats.reallocations);
        }
    }
    Ok(TraceMemory {
        calls: shapes.len(),
        largest_call_need_bytes: need,
        exact_reallocations: one.stats.shape_updates,
        one_request: one,
        growths,
        reallocations,
        allocations,
        peak_bytes: peak,
    })
}
