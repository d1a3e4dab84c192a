//! The one sizing path: [`Sizer`] is what the runtime's `realloc_if_needed` calls for every
//! node output and KV-cache state it sizes, and what `dynrt-bench predict` replays a shape trace
//! through ([`super::replay()`]). One type, one set of rules for reuse, prediction,
//! `can_preallocate` and reclaim ([`Ledger::realloc_if_needed`]), and one summary
//! ([`SizingSummary`]) computed the same way on both sides.
//!
//! With trace recording on, every decision appends its row (`id,dtype,shape`) to the
//! sizer's trace, in decision order: the runtime writes it out (`dynrt demo --trace-out`),
//! and replaying it gives the same decisions, hence the same reallocation count and peak
//! reserved bytes as the run.

use super::ledger::{Decision, Ledger, MemoryLimits};
use super::{Policy, PredictorError, PredictorOptions, ShapePredictor};
use crate::shape::{DType, Shape};
use std::fmt::Write as _;

/// Totals of a sequence of sizing decisions.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct SizingSummary {
    /// Decisions made (trace rows).
    pub rows: usize,
    /// Buffers allocated (first allocations, growth and reclaims).
    pub reallocations: u64,
    /// Of those, reclaims (shrinks).
    pub reclaims: u64,
    /// Sum of the sizes of every allocation, in bytes.
    pub bytes_allocated_total: u64,
    /// Largest sum over ids of buffer sizes, measured after each decision, in bytes.
    pub peak_reserved_bytes: u64,
    /// Largest sum over ids of the bytes their latest shape needs, after each decision.
    pub peak_needed_bytes: u64,
    /// Mean over decisions of the summed buffer sizes, in bytes.
    pub mean_reserved_bytes: f64,
    /// Mean over decisions of the summed needs, in bytes.
    pub mean_needed_bytes: f64,
}

/// A shape predictor, the ledger of the buffers it sized, the running summary, and
/// (optionally) the trace of every decision. One per inference request (a request that
/// continues another's sequence adopts its sizer, see `InferRequest::put_states`).
#[derive(Debug, Clone)]
pub struct Sizer {
    predictor: ShapePredictor,
    ledger: Ledger,
    summary: SizingSummary,
    sum_reserved: f64,
    sum_needed: f64,
    trace: Option<String>,
}

impl Sizer {
    /// A sizer following `policy` with `options`, not recording.
    pub fn new(policy: Policy, options: PredictorOptions) -> Sizer {
        Sizer {
            predictor: ShapePredictor::new(policy, options),
            ledger: Ledger::new(),
            summary: SizingSummary::default(),
            sum_reserved: 0.0,
            sum_needed: 0.0,
            trace: None,
        }
    }

    /// Starts recording every decision as a trace row (the header is written now).
    pub fn record_trace(&mut self) {
        if self.trace.is_none() {
            self.trace = Some(String::from("id,dtype,shape\n"));
        }
    }

    /// The trace recorded so far (CSV text `dynrt-bench predict` reads), if recording.
    pub fn trace(&self) -> Option<&str> {
        self.trace.as_deref()
    }

    /// The predictor (its policy and options, its history).
    pub fn predictor(&self) -> &ShapePredictor {
        &self.predictor
    }

    /// The ledger of the buffers sized so far.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The totals so far.
    pub fn summary(&self) -> SizingSummary {
        let mut s = self.summary;
        if s.rows > 0 {
            s.mean_reserved_bytes = self.sum_reserved / s.rows as f64;
            s.mean_needed_bytes = self.sum_needed / s.rows as f64;
        }
        s
    }

    /// `realloc_if_needed` for `id` at `shape` (see [`Ledger::realloc_if_needed`]); counts the
    /// decision and records its trace row.
    ///
    /// # Errors
    /// The predictor's and the ledger's errors (a rank change, a size overflow).
    pub fn realloc_if_needed(
        &mut self,
        id: &str,
        shape: &Shape,
        dtype: DType,
        limits: &MemoryLimits,
    ) -> Result<Decision, PredictorError> {
        let d = self
            .ledger
            .realloc_if_needed(&mut self.predictor, id, shape, dtype, limits)?;
        self.count(id, shape, dtype, &d)?;
        Ok(d)
    }

    /// A raw predictor call with `can_reuse` as given (a trace with a `can_reuse` column, one
    /// call per row): `false` allocates the prediction when [`super::can_preallocate`] allows it,
    /// else the exact size; `true` keeps the buffer whatever its size (the caller says it is
    /// reused), only recording the shape.
    ///
    /// # Errors
    /// The predictor's errors; [`PredictorError::TraceRow`]-free: rows are never refused.
    pub fn raw(
        &mut self,
        id: &str,
        shape: &Shape,
        dtype: DType,
        can_reuse: bool,
        limits: &MemoryLimits,
    ) -> Result<Decision, PredictorError> {
        let needed = shape.size_bytes(dtype)?;
        let old_reserved = self.ledger.reserved_bytes(id);
        let (predicted, prediction) = match dtype.bits() {
            Some(bits) => self
                .predictor
                .predict_preallocation_shape(id, shape, bits, can_reuse)?,
            None => (false, Shape::default()),
        };
        let mut reserved = old_reserved;
        if !can_reuse {
            reserved = if predicted {
                self.ledger
                    .grow_to(prediction.size_bytes(dtype)?, needed, limits)
            } else {
                needed
            };
        }
        self.ledger.set(id, shape, needed, reserved)?;
        let d = Decision {
            predicted,
            prediction,
            reallocated: !can_reuse,
            reclaimed: false,
            reserved_bytes: reserved,
            needed_bytes: needed,
        };
        self.count(id, shape, dtype, &d)?;
        Ok(d)
    }

    /// Corrects the ledger when the buffer really held differs from the decision (an
    /// allocation of the decided size failed and the exact size was taken instead). The
    /// summary keeps the decision.
    ///
    /// # Errors
    /// [`PredictorError::Shape`] when a total overflows.
    pub fn correct(
        &mut self,
        id: &str,
        shape: &Shape,
        needed_bytes: u64,
        reserved_bytes: u64,
    ) -> Result<(), PredictorError> {
        self.ledger.set(id, shape, needed_bytes, reserved_bytes)
    }

    fn count(
        &mut self,
        id: &str,
        shape: &Shape,
        dtype: DType,
        d: &Decision,
    ) -> Result<(), PredictorError> {
        let s = &mut self.summary;
        s.rows += 1;
        if d.reallocated {
            s.reallocations += 1;
            s.reclaims += u64::from(d.reclaimed);
            s.bytes_allocated_total = s.bytes_allocated_total.saturating_add(d.reserved_bytes);
        }
        s.peak_reserved_bytes = s
            .peak_reserved_bytes
            .max(self.ledger.total_reserved_bytes());
        s.peak_needed_bytes = s.peak_needed_bytes.max(self.ledger.total_needed_bytes());
        self.sum_reserved += self.ledger.total_reserved_bytes() as f64;
        self.sum_needed += self.ledger.total_needed_bytes() as f64;
        if let Some(t) = &mut self.trace {
            let dims: Vec<String> = shape.dims().iter().map(u64::to_string).collect();
            let text = if dims.is_empty() {
                "scalar".to_string()
            } else {
                dims.join("x")
            };
            let _ = writeln!(t, "{id},{dtype},{text}");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trace_of_a_sizer_replays_to_the_same_summary() {
        let mut s = Sizer::new(Policy::Adaptive, PredictorOptions::openvino_defaults());
        s.record_trace();
        let limits = MemoryLimits::unlimited();
        for t in 1..=40u64 {
            s.realloc_if_needed("kv", &Shape::new([t, 16]), DType::F32, &limits)
                .unwrap();
            s.realloc_if_needed("scores", &Shape::new([2, 1, t]), DType::F32, &limits)
                .unwrap();
        }
        s.realloc_if_needed("w", &Shape::new([2, 64]), DType::Q4_1, &limits)
            .unwrap();
        let trace = super::super::replay::Trace::parse(s.trace().unwrap()).unwrap();
        assert_eq!(trace.rows.len(), 81);
        let out = super::super::replay(
            &trace,
            &super::super::ReplayConfig::new(
                Policy::Adaptive,
                PredictorOptions::openvino_defaults(),
            ),
        )
        .unwrap();
        assert_eq!(out.summary, s.summary());
        assert!(s.summary().reallocations > 2);
        assert_eq!(
            s.ledger().reserved_bytes("w"),
            80,
            "blocks are sized exactly"
        );
    }
}
