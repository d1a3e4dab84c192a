//! Request-level buffer sizing: `realloc_if_needed` for every node output of one inference
//! request, under any [`Policy`].
//!
//! The ledger knows every id's buffer and need and the request's *peak need* so far, which
//! the per-id predictor cannot see. Under [`Policy::Adaptive`] it adds one rule, **reclaim
//! under pressure**: when the request reserves more than [`PRESSURE`] of the way from its peak
//! need to `ratio` times it (1.08x for the default ratio 1.1), a buffer that
//! [`ShapePredictor::should_reclaim`] marks mostly empty is shrunk at its own turn to the size
//! its history predicts (a reallocation like any other: a buffer updated in place, such as a
//! KV cache, has its live bytes copied over by the runtime).
//! Without pressure nothing is reclaimed, so a buffer that is large only now and then
//! (attention scores at each prefill) is not reallocated twice per turn for nothing; with it,
//! the request stays near `ratio` times its peak need instead of holding every buffer's
//! largest size forever (the OpenVINO rule's sum of maxima; figures of the traces:
//! docs/benchmarks/2026-11-21-predictor-traces.md).
//!
//! Growth is sized per id by the predictor (the adaptive look-ahead, at most about `ratio`
//! times the need): measured on the chat trace, letting a buffer also grow into memory that
//! other buffers needed at the peak saves reallocations only by breaking the `ratio` peak
//! bound at the next prefill, so the ledger does not do it.
//!
//! Under [`Policy::OpenVino`] and [`Policy::None`] the ledger does what the OpenVINO plugin
//! does: grow to the prediction when [`can_preallocate`] allows it, else exactly; never shrink.

use super::{can_preallocate, Policy, PredictorError, ShapePredictor};
use crate::shape::{DType, Shape};
use std::collections::HashMap;

/// Under [`Policy::Adaptive`], reclaim starts when the request reserves more than
/// `1 + PRESSURE * (ratio - 1)` times its peak need: measured on the traces, 0.8 keeps the
/// chat trace within `ratio` of its peak need without reclaiming anything on the image
/// trace, where 1.0 lets chat pass it.
pub const PRESSURE: f64 = 0.8;

/// Device limits for [`can_preallocate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimits {
    /// Largest buffer the device allows, in bytes.
    pub max_buffer_bytes: u64,
    /// Device memory budget, in bytes.
    pub budget_bytes: u64,
    /// Device memory in use outside this ledger's buffers (weights, other requests), in bytes.
    pub other_in_use_bytes: u64,
}

impl MemoryLimits {
    /// No limit at all.
    pub fn unlimited() -> Self {
        MemoryLimits {
            max_buffer_bytes: u64::MAX,
            budget_bytes: u64::MAX,
            other_in_use_bytes: 0,
        }
    }
}

/// What [`Ledger::realloc_if_needed`] decided for one node output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the predictor predicted a shape (only asked when the buffer had to grow).
    pub predicted: bool,
    /// The predicted shape, empty when not predicted.
    pub prediction: Shape,
    /// Whether the buffer is to be allocated anew: free the old one (if any), allocate
    /// `reserved_bytes`.
    pub reallocated: bool,
    /// Whether that reallocation is a reclaim (a shrink).
    pub reclaimed: bool,
    /// Size of the id's buffer after this decision, in bytes.
    pub reserved_bytes: u64,
    /// Bytes the current shape needs.
    pub needed_bytes: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    reserved_bytes: u64,
    needed_bytes: u64,
}

/// The buffers of one inference request: per id, the size reserved and the size needed now.
///
/// It only does arithmetic; the runtime allocates and frees what a [`Decision`] says.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    entries: HashMap<String, Entry>,
    total_reserved_bytes: u64,
    total_needed_bytes: u64,
    peak_needed_bytes: u64,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sum of every id's buffer size, in bytes.
    pub fn total_reserved_bytes(&self) -> u64 {
        self.total_reserved_bytes
    }

    /// Sum of every id's current need, in bytes.
    pub fn total_needed_bytes(&self) -> u64 {
        self.total_needed_bytes
    }

    /// Largest [`Ledger::total_needed_bytes`] seen so far.
    pub fn peak_needed_bytes(&self) -> u64 {
        self.peak_needed_bytes
    }

    /// Size of the buffer of `id`, in bytes (0 when it has none).
    pub fn reserved_bytes(&self, id: &str) -> u64 {
        self.entries.get(id).map_or(0, |e| e.reserved_bytes)
    }

    /// Decides the buffer of `id` for its new `shape` (`realloc_if_needed`, docs/design.md):
    /// reuse it when big enough (the shape is recorded anyway), else grow it as the predictor's
    /// policy says (see the module docs); under [`Policy::Adaptive`] a reused buffer may be
    /// reclaimed. Block-quantized types have no bits per element for the predictor: their
    /// buffers are sized exactly.
    ///
    /// # Errors
    /// What [`ShapePredictor::predict_preallocation_shape`] returns, and
    /// [`PredictorError::Shape`] when a byte size or a total overflows `u64`.
    pub fn realloc_if_needed(
        &mut self,
        predictor: &mut ShapePredictor,
        id: &str,
        shape: &Shape,
        dtype: DType,
        limits: &MemoryLimits,
    ) -> Result<Decision, PredictorError> {
        let needed = shape.size_bytes(dtype)?;
        let Some(dtype_bits) = dtype.bits() else {
            let old = self.entries.get(id).copied().unwrap_or_default();
            let reallocated = needed > old.reserved_bytes;
            let reserved = if reallocated {
                needed
            } else {
                old.reserved_bytes
            };
            self.record(id, old, needed, reserved, shape, 8)?;
            return Ok(Decision {
                predicted: false,
                prediction: Shape::default(),
                reallocated,
                reclaimed: false,
                reserved_bytes: reserved,
                needed_bytes: needed,
            });
        };
        let old = self.entries.get(id).copied().unwrap_or_default();
        let needed_now = (self.total_needed_bytes - old.needed_bytes)
            .checked_add(needed)
            .ok_or_else(|| overflow(shape, dtype_bits))?;
        let peak_needed = self.peak_needed_bytes.max(needed_now);
        let mut decision = Decision {
            predicted: false,
            prediction: Shape::default(),
            reallocated: false,
            reclaimed: false,
            reserved_bytes: old.reserved_bytes,
            needed_bytes: needed,
        };
        if needed > old.reserved_bytes {
            let (predicted, prediction) =
                predictor.predict_preallocation_shape(id, shape, dtype_bits, false)?;
            let size = if predicted {
                self.grow_to(prediction.size_bytes_for_bits(dtype_bits)?, needed, limits)
            } else {
                needed
            };
            decision.predicted = predicted;
            decision.prediction = prediction;
            decision.reallocated = true;
            decision.reserved_bytes = size;
        } else {
            predictor.predict_preallocation_shape(id, shape, dtype_bits, true)?;
            if predictor.policy() == Policy::Adaptive
                && self.under_pressure(peak_needed, predictor.options().ratio)
                && predictor.should_reclaim(id, needed, old.reserved_bytes)
            {
                let (predicted, prediction) = predictor.predict_from_history(id, dtype_bits)?;
                let target = if predicted {
                    prediction.size_bytes_for_bits(dtype_bits)?.max(needed)
                } else {
                    needed
                };
                if target < old.reserved_bytes {
                    decision.reallocated = true;
                    decision.reclaimed = true;
                    decision.reserved_bytes = target;
                }
            }
        }
        self.record(id, old, needed, decision.reserved_bytes, shape, dtype_bits)?;
        Ok(decision)
    }

    /// Records a decision taken outside [`Ledger::realloc_if_needed`] (raw replay rows): `id`
    /// now needs `needed_bytes` and holds a buffer of `reserved_bytes`.
    ///
    /// # Errors
    /// [`PredictorError::Shape`] when a total overflows `u64`.
    pub fn set(
        &mut self,
        id: &str,
        shape: &Shape,
        needed_bytes: u64,
        reserved_bytes: u64,
    ) -> Result<(), PredictorError> {
        let old = self.entries.get(id).copied().unwrap_or_default();
        self.record(id, old, needed_bytes, reserved_bytes, shape, 8)
    }

    /// The size a predicted buffer gets: `predicted_bytes` when [`can_preallocate`] allows it
    /// (the old buffer still counts as in use while the new one is requested), else `needed`;
    /// never below `needed`.
    pub fn grow_to(&self, predicted_bytes: u64, needed: u64, limits: &MemoryLimits) -> u64 {
        let in_use = self
            .total_reserved_bytes
            .saturating_add(limits.other_in_use_bytes);
        if can_preallocate(
            predicted_bytes,
            limits.max_buffer_bytes,
            in_use,
            limits.budget_bytes,
        ) {
            predicted_bytes.max(needed)
        } else {
            needed
        }
    }

    /// Whether the request reserves more than `1 + PRESSURE * (ratio - 1)` times its peak need.
    fn under_pressure(&self, peak_needed: u64, ratio: f32) -> bool {
        let threshold = 1.0 + PRESSURE * (f64::from(ratio) - 1.0).max(0.0);
        self.total_reserved_bytes as f64 > peak_needed as f64 * threshold
    }

    fn record(
        &mut self,
        id: &str,
        old: Entry,
        needed: u64,
        reserved: u64,
        shape: &Shape,
        dtype_bits: u32,
    ) -> Result<(), PredictorError> {
        let total_reserved = (self.total_reserved_bytes - old.reserved_bytes)
            .checked_add(reserved)
            .ok_or_else(|| overflow(shape, dtype_bits))?;
        let total_needed = (self.total_needed_bytes - old.needed_bytes)
            .checked_add(needed)
            .ok_or_else(|| overflow(shape, dtype_bits))?;
        self.total_reserved_bytes = total_reserved;
        self.total_needed_bytes = total_needed;
        self.peak_needed_bytes = self.peak_needed_bytes.max(total_needed);
        let entry = Entry {
            reserved_bytes: reserved,
            needed_bytes: needed,
        };
        match self.entries.get_mut(id) {
            Some(e) => *e = entry,
            None => {
                self.entries.insert(id.to_string(), entry);
            }
        }
        Ok(())
    }
}

fn overflow(shape: &Shape, bits: u32) -> PredictorError {
    PredictorError::Shape(crate::shape::ShapeError::Overflow {
        shape: format!("{shape} (request total)"),
        bits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::predictor::PredictorOptions;

    fn grow(policy: Policy, limits: MemoryLimits) -> (Ledger, Vec<Decision>) {
        let mut predictor = ShapePredictor::new(policy, PredictorOptions::openvino_defaults());
        let mut ledger = Ledger::new();
        let decisions = (1..=4)
            .map(|t| {
                ledger
                    .realloc_if_needed(
                        &mut predictor,
                        "k",
                        &Shape::new([t, 10]),
                        DType::U8,
                        &limits,
                    )
                    .unwrap()
            })
            .collect();
        (ledger, decisions)
    }

    #[test]
    fn openvino_grows_to_the_prediction_and_keeps_totals() {
        let (ledger, d) = grow(Policy::OpenVino, MemoryLimits::unlimited());
        let sizes: Vec<u64> = d.iter().map(|d| d.reserved_bytes).collect();
        // [3, 10] with step [1, 0]: [13, 10] = 130 bytes; [4, 10] then fits.
        assert_eq!(sizes, vec![10, 20, 130, 130]);
        assert_eq!(
            d.iter().map(|d| d.reallocated).collect::<Vec<_>>(),
            [true, true, true, false]
        );
        assert_eq!(ledger.total_reserved_bytes(), 130);
        assert_eq!(ledger.total_needed_bytes(), 40);
        assert_eq!(ledger.peak_needed_bytes(), 40);
        assert_eq!(ledger.reserved_bytes("k"), 130);
        assert_eq!(ledger.reserved_bytes("other"), 0);
    }

    #[test]
    fn memory_in_use_elsewhere_counts_against_the_budget() {
        // At [3, 10]: 20 bytes held + 130 wanted + 850 elsewhere = 1000, not below 90% of 1100.
        let limits = MemoryLimits {
            max_buffer_bytes: u64::MAX,
            budget_bytes: 1100,
            other_in_use_bytes: 850,
        };
        let (_, d) = grow(Policy::OpenVino, limits);
        assert!(d[2].predicted);
        assert_eq!(d[2].reserved_bytes, 30);
        let limits = MemoryLimits {
            max_buffer_bytes: 129,
            ..MemoryLimits::unlimited()
        };
        assert_eq!(grow(Policy::OpenVino, limits).1[2].reserved_bytes, 30);
    }

    #[test]
    fn none_allocates_exactly() {
        let (_, d) = grow(Policy::None, MemoryLimits::unlimited());
        let sizes: Vec<u64> = d.iter().map(|d| d.reserved_bytes).collect();
        assert_eq!(sizes, vec![10, 20, 30, 40]);
    }
}
