//! Shape-trace replay: run a recorded sequence of shapes through a [`Policy`] and measure
//! reallocations and reserved memory. `dynrt-bench predict` prints what [`replay`] returns.
//!
//! A trace is CSV text with the header `id,dtype,shape` and an optional fourth column
//! `can_reuse` (`0`/`1`); `shape` is dimensions joined by `x` (`1x32x128x64`). Blank lines and
//! lines starting with `#` are skipped.
//!
//! - Without `can_reuse` each row is one [`Sizer::realloc_if_needed`], the code the runtime's
//!   `realloc_if_needed` runs: a row whose bytes exceed the id's buffer is a reallocation sized
//!   by the policy (the prediction when one is made and [`super::can_preallocate`] allows it,
//!   else the exact size); otherwise the buffer is reused and the shape recorded. With
//!   [`Policy::Adaptive`], a reused buffer that [`super::ShapePredictor::should_reclaim`]
//!   marks is shrunk while the request over-reserves (a reallocation too). The runtime writes
//!   such traces itself (`dynrt demo --trace-out`), and their replay gives its numbers.
//! - With `can_reuse` each row is one raw predictor call with that flag ([`Sizer::raw`]),
//!   whatever a simulation would hold: a `0` row allocates as above, a `1` row keeps the
//!   buffer (even one smaller than the shape: the caller said it is reused).

use super::ledger::MemoryLimits;
use super::sizer::{Sizer, SizingSummary};
use super::{Policy, PredictorError, PredictorOptions};
use crate::shape::{DType, Shape};
use std::collections::HashMap;

/// One data row of a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceRow {
    /// 1-based data row (the header, blank and comment lines are not counted).
    pub row: usize,
    /// 1-based line in the text.
    pub line: usize,
    /// The id (node or tensor name).
    pub id: String,
    /// Element type.
    pub dtype: DType,
    /// The shape at this row.
    pub shape: Shape,
    /// Bytes the shape takes, `ceil(elements * bits / 8)`.
    pub needed_bytes: u64,
    /// The `can_reuse` column, when the trace has one.
    pub can_reuse: Option<bool>,
}

/// A parsed shape trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// The data rows, in order.
    pub rows: Vec<TraceRow>,
    /// Whether the trace has the `can_reuse` column (raw predictor calls).
    pub has_can_reuse: bool,
}

impl Trace {
    /// Parses and validates a whole trace.
    ///
    /// # Errors
    /// [`PredictorError::TraceHeader`] for a missing or wrong header;
    /// [`PredictorError::TraceRow`] naming the row and line for a row with the wrong number of
    /// fields, an empty id, an unknown dtype, a malformed shape, a `can_reuse` that is not 0/1,
    /// a byte size that overflows `u64`, or a rank other than earlier rows of the same id.
    pub fn parse(text: &str) -> Result<Trace, PredictorError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim()))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
        let (_, header) = lines.next().ok_or_else(|| PredictorError::TraceHeader {
            found: String::new(),
        })?;
        let columns: Vec<&str> = header.split(',').map(str::trim).collect();
        let has_can_reuse = match columns.as_slice() {
            ["id", "dtype", "shape"] => false,
            ["id", "dtype", "shape", "can_reuse"] => true,
            _ => {
                return Err(PredictorError::TraceHeader {
                    found: header.to_string(),
                })
            }
        };
        let width = if has_can_reuse { 4 } else { 3 };
        let mut ranks: HashMap<String, usize> = HashMap::new();
        let mut rows = Vec::new();
        for (line, text) in lines {
            let row = rows.len() + 1;
            let bad = |reason: String| PredictorError::TraceRow { row, line, reason };
            let fields: Vec<&str> = text.split(',').map(str::trim).collect();
            if fields.len() != width {
                return Err(bad(format!(
                    "expected {width} comma-separated fields, found {}",
                    fields.len()
                )));
            }
            let id = fields[0];
            if id.is_empty() {
                return Err(bad("empty id".into()));
            }
            let dtype: DType = fields[1].parse().map_err(|e| bad(format!("{e}")))?;
            let shape: Shape = fields[2].parse().map_err(|e| bad(format!("{e}")))?;
            let needed_bytes = shape.size_bytes(dtype).map_err(|e| bad(format!("{e}")))?;
            let can_reuse = if has_can_reuse {
                match fields[3] {
                    "0" => Some(false),
                    "1" => Some(true),
                    other => return Err(bad(format!("can_reuse `{other}` is not 0 or 1"))),
                }
            } else {
                None
            };
            match ranks.get(id) {
                Some(&rank) if rank != shape.rank() => {
                    return Err(bad(format!(
                    "shape {shape} of `{id}` has rank {}, earlier rows of `{id}` have rank {rank}",
                    shape.rank()
                )))
                }
                Some(_) => {}
                None => {
                    ranks.insert(id.to_string(), shape.rank());
                }
            }
            rows.push(TraceRow {
                row,
                line,
                id: id.to_string(),
                dtype,
                shape,
                needed_bytes,
                can_reuse,
            });
        }
        Ok(Trace {
            rows,
            has_can_reuse,
        })
    }
}

/// How to replay a trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplayConfig {
    /// The policy.
    pub policy: Policy,
    /// The predictor options.
    pub options: PredictorOptions,
    /// Device memory budget in bytes for [`super::can_preallocate`]; `None` is unlimited.
    pub budget_bytes: Option<u64>,
    /// Largest buffer in bytes for [`super::can_preallocate`]; `None` is unlimited.
    pub max_buffer_bytes: Option<u64>,
}

impl ReplayConfig {
    /// `policy` with `options`, unlimited memory.
    pub fn new(policy: Policy, options: PredictorOptions) -> Self {
        ReplayConfig {
            policy,
            options,
            budget_bytes: None,
            max_buffer_bytes: None,
        }
    }
}

/// What happened at one row.
#[derive(Debug, Clone, PartialEq)]
pub struct RowOutcome {
    /// 1-based data row.
    pub row: usize,
    /// The id.
    pub id: String,
    /// The shape at this row.
    pub shape: Shape,
    /// Bytes the shape needs.
    pub needed_bytes: u64,
    /// Whether the predictor predicted a shape.
    pub predicted: bool,
    /// The predicted shape (empty when not predicted).
    pub prediction: Shape,
    /// Whether the id's buffer was allocated anew at this row (growth or reclaim).
    pub reallocated: bool,
    /// Whether that reallocation was a reclaim (a shrink to the exact need).
    pub reclaimed: bool,
    /// Size of the id's buffer after this row, in bytes.
    pub reserved_bytes: u64,
}

/// Totals of a replay: the same summary the runtime's sizer keeps.
pub type ReplaySummary = SizingSummary;

/// Per-row outcomes and totals.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayOutcome {
    /// One entry per data row, in order.
    pub rows: Vec<RowOutcome>,
    /// Totals.
    pub summary: ReplaySummary,
}

/// Replays `trace` under `config` (see the module docs for the rules).
///
/// # Errors
/// [`PredictorError::TraceRow`] naming the row when the predictor fails on it (a rank change,
/// a size overflow).
pub fn replay(trace: &Trace, config: &ReplayConfig) -> Result<ReplayOutcome, PredictorError> {
    let mut sizer = Sizer::new(config.policy, config.options);
    let limits = MemoryLimits {
        max_buffer_bytes: config.max_buffer_bytes.unwrap_or(u64::MAX),
        budget_bytes: config.budget_bytes.unwrap_or(u64::MAX),
        other_in_use_bytes: 0,
    };
    let mut outcomes = Vec::with_capacity(trace.rows.len());
    for r in &trace.rows {
        let decision = match r.can_reuse {
            None => sizer.realloc_if_needed(&r.id, &r.shape, r.dtype, &limits),
            Some(can_reuse) => sizer.raw(&r.id, &r.shape, r.dtype, can_reuse, &limits),
        }
        .map_err(|e| PredictorError::TraceRow {
            row: r.row,
            line: r.line,
            reason: e.to_string(),
        })?;
        outcomes.push(RowOutcome {
            row: r.row,
            id: r.id.clone(),
            shape: r.shape.clone(),
            needed_bytes: decision.needed_bytes,
            predicted: decision.predicted,
            prediction: decision.prediction,
            reallocated: decision.reallocated,
            reclaimed: decision.reclaimed,
            reserved_bytes: decision.reserved_bytes,
        });
    }
    Ok(ReplayOutcome {
        rows: outcomes,
        summary: sizer.summary(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn openvino() -> ReplayConfig {
        ReplayConfig::new(Policy::OpenVino, PredictorOptions::openvino_defaults())
    }

    #[test]
    fn parse_reports_row_and_line() {
        let err = Trace::parse("id,dtype,shape\n\na,f32,1x2\n# note\nb,f64,3\n").unwrap_err();
        assert_eq!(
            err,
            PredictorError::TraceRow {
                row: 2,
                line: 5,
                reason: "unknown dtype `f64`: expected one of f32, f16, bf16, i64, i32, u32, i8, u8, bool, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, q4_nb, q8_nb".into()
            }
        );
        for (text, row) in [
            ("id,dtype,shape\na,f32,1x2,1\n", 1),
            ("id,dtype,shape\na,f32,1x2\n,f32,3\n", 2),
            ("id,dtype,shape\na,f32,1xx2\n", 1),
            ("id,dtype,shape\na,f32,1x2\na,f32,1x2x3\n", 2),
            ("id,dtype,shape,can_reuse\na,f32,1x2,2\n", 1),
            ("id,dtype,shape\na,f32,18446744073709551615x2\n", 1),
        ] {
            match Trace::parse(text) {
                Err(PredictorError::TraceRow { row: r, .. }) => assert_eq!(r, row, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        assert!(matches!(
            Trace::parse("id,shape\n"),
            Err(PredictorError::TraceHeader { .. })
        ));
        assert!(matches!(
            Trace::parse(""),
            Err(PredictorError::TraceHeader { .. })
        ));
    }

    #[test]
    fn simulated_replay_by_hand() {
        // f32 [t]: 4 bytes per element. Rows 1-2 exact; row 3 predicts 3+10 = 13 elements;
        // rows 4-13 fit; row 14 predicts 14+10.
        let mut text = String::from("id,dtype,shape\n");
        for t in 1..=14 {
            text.push_str(&format!("k,f32,{t}\n"));
        }
        let out = replay(&Trace::parse(&text).unwrap(), &openvino()).unwrap();
        let reserved: Vec<u64> = out.rows.iter().map(|r| r.reserved_bytes).collect();
        let mut expect = vec![4, 8];
        expect.extend([52; 11]);
        expect.push(96);
        assert_eq!(reserved, expect);
        let s = out.summary;
        assert_eq!(s.reallocations, 4);
        assert_eq!(s.bytes_allocated_total, 4 + 8 + 52 + 96);
        assert_eq!(s.peak_reserved_bytes, 96);
        assert_eq!(s.peak_needed_bytes, 56);
        assert!(out.rows[2].predicted && out.rows[2].prediction == Shape::new([13]));
        assert!(!out.rows[3].predicted && !out.rows[3].reallocated);
    }

    #[test]
    fn budget_refuses_preallocation() {
        let text = "id,dtype,shape\nk,u8,1x10\nk,u8,2x10\nk,u8,3x10\n";
        let trace = Trace::parse(text).unwrap();
        let mut config = openvino();
        // At row 3, 20 bytes are in use; the prediction is [3 + 10, 10] = 130 bytes.
        // 20 + 130 < 0.9 * 167 = 150.3 passes; with a budget of 166 (149.4) it does not.
        config.budget_bytes = Some(167);
        assert_eq!(replay(&trace, &config).unwrap().rows[2].reserved_bytes, 130);
        config.budget_bytes = Some(166);
        let out = replay(&trace, &config).unwrap();
        assert!(out.rows[2].predicted);
        assert_eq!(out.rows[2].reserved_bytes, 30);
    }

    #[test]
    fn raw_rows_drive_the_predictor_whatever_a_simulation_would_hold() {
        let text = "id,dtype,shape,can_reuse\nk,u8,1,0\nk,u8,2,0\nk,u8,3,0\nk,u8,3,1\nk,u8,4,0\n";
        let out = replay(&Trace::parse(text).unwrap(), &openvino()).unwrap();
        let reserved: Vec<u64> = out.rows.iter().map(|r| r.reserved_bytes).collect();
        // Row 5 says the buffer cannot be reused though it could: the raw call still
        // reallocates, with the prediction from the history (3, 3, 4): unequal steps, so
        // percentage mode, floor(4 * 1.1) = 4 elements.
        assert_eq!(reserved, vec![1, 2, 13, 13, 4]);
        assert_eq!(out.rows[4].prediction, Shape::new([4]));
        assert_eq!(out.summary.reallocations, 4, "one per can_reuse = 0 row");
        // A `1` row keeps the buffer even when a simulation would find it too small: the raw
        // call only records the shape (1, 5, 9: equal steps of 4, above the per-dimension
        // limit of 2, so the next `0` row predicts by percentage: floor(13 * 1.1) = 14).
        let text = "id,dtype,shape,can_reuse\nk,u8,1,0\nk,u8,5,1\nk,u8,9,1\nk,u8,13,0\n";
        let out = replay(&Trace::parse(text).unwrap(), &openvino()).unwrap();
        let reserved: Vec<u64> = out.rows.iter().map(|r| r.reserved_bytes).collect();
        assert_eq!(reserved, vec![1, 1, 1, 14]);
        assert!(!out.rows[1].reallocated && !out.rows[2].reallocated);
        assert_eq!(out.summary.reallocations, 2);
    }

    #[test]
    fn adaptive_reclaims_mostly_empty_buffers_under_pressure() {
        // `x` needs 1000 bytes once, then 10; `y` then grows to 900: the request reserves
        // 1900 bytes for a peak need of 1010, so the mostly empty `x` is shrunk at its turn.
        let mut text = String::from("id,dtype,shape\nx,u8,1000\ny,u8,10\n");
        for _ in 0..12 {
            text.push_str("x,u8,10\ny,u8,900\n");
        }
        let trace = Trace::parse(&text).unwrap();
        let config = ReplayConfig::new(Policy::Adaptive, PredictorOptions::openvino_defaults());
        let out = replay(&trace, &config).unwrap();
        let x: Vec<u64> = out
            .rows
            .iter()
            .filter(|r| r.id == "x")
            .map(|r| r.reserved_bytes)
            .collect();
        // Reclaimed once 8 recorded needs of `x` are small: its 9th row; the history (10, 10,
        // 10) has zero steps, so the percentage mode sizes it: 10 * 1.1 = 11 bytes.
        let mut expect = vec![1000; 8];
        expect.extend([11; 5]);
        assert_eq!(x, expect);
        assert_eq!(out.summary.reclaims, 1);
        assert!(out
            .rows
            .iter()
            .any(|r| r.reclaimed && r.id == "x" && r.row == 17));
        // Without pressure (`y` stays small) nothing is reclaimed.
        let calm = text.replace("y,u8,900", "y,u8,10");
        let out = replay(&Trace::parse(&calm).unwrap(), &config).unwrap();
        assert_eq!(out.summary.reclaims, 0);
        // The OpenVINO rule never shrinks.
        let out = replay(&trace, &openvino()).unwrap();
        assert_eq!(out.summary.reclaims, 0);
    }
}
