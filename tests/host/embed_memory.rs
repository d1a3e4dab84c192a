//! Issue 34's memory targets for sentence embeddings, as counts and bytes: over 1,000 calls of
//! random `[batch, seq]`, all-MiniLM-L6-v2 run the way `SentenceModel` runs calls (one
//! request per envelope, sized for it at each growth) reallocates at most a tenth as often
//! as exact allocation, and holds at most 1.3x what the largest call of the trace needs
//! alone. Replayed on host memory through the request's own sizer and pool
//! (`runtime::replay_on_host`): the decisions a device request makes, without kernels.

use dynrt::fetch;
use dynrt::memory::predictor::Policy;
use dynrt::rng::SplitMix64;
use dynrt::sentence::{folder_graph, trace_memory};

#[test]
fn a_thousand_random_calls_reallocate_a_tenth_of_exact_allocation_within_1_3x_of_the_largest() {
    let test =
        "a_thousand_random_calls_reallocate_a_tenth_of_exact_allocation_within_1_3x_of_the_largest";
    let Some(folder) = fetch::embedding_or_skip(&fetch::ALL_MINILM_L6_V2, test) else {
        return;
    };
    let (graph, vocab, pad) = folder_graph(&folder).unwrap();
    let (max_batch, max_seq) = (32, 128);
    let mut rng = SplitMix64::new(3434);
    let shapes: Vec<(usize, usize)> = (0..1000)
        .map(|_| {
            (
                rng.range(1, max_batch as u64 + 1) as usize,
                rng.range(2, max_seq as u64 + 1) as usize,
            )
        })
        .collect();
    for policy in [Policy::None, Policy::OpenVino, Policy::Adaptive] {
        let m = trace_memory(&graph, vocab, pad, &shapes, (max_batch, max_seq), policy).unwrap();
        eprintln!(
            "{test}: {policy:?}: {} growths, {} reallocations against {} by exact allocation; \
             peak {} bytes, the largest call alone {} ({:.2}x); one growing request {} \
             reallocations, {:.2}x",
            m.growths,
            m.reallocations,
            m.exact_reallocations,
            m.peak_bytes,
            m.largest_call_need_bytes,
            m.peak_bytes as f64 / m.largest_call_need_bytes as f64,
            m.one_request.stats.reallocations,
            m.one_request.peak_bytes as f64 / m.largest_call_need_bytes as f64,
        );
        assert_eq!(m.calls, 1000);
        // The trace really changes shapes, and every call ran: the comparison is not empty.
        assert!(m.exact_reallocations > 100_000, "{test}: {m:?}");
        assert_eq!(m.one_request.stats.iterations, 1000, "{test}: {policy:?}");
        assert!(m.allocations > 0 && m.largest_call_need_bytes > 0);
        assert!(
            m.reallocations * 10 <= m.exact_reallocations,
            "{test}: {policy:?}: {} reallocations against {} by exact allocation",
            m.reallocations,
            m.exact_reallocations
        );
        assert!(
            m.peak_bytes as f64 <= 1.3 * m.largest_call_need_bytes as f64,
            "{test}: {policy:?}: peak {} bytes, the largest call needs {}",
            m.peak_bytes,
            m.largest_call_need_bytes
        );
    }
}
