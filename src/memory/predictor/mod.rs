//! The shape predictor: how much to preallocate when a node's output buffer must grow.
//!
//! One [`ShapePredictor`] lives per inference request. Before a node's output buffer is
//! (re)allocated, the runtime calls [`ShapePredictor::predict_preallocation_shape`] with the
//! node's id and its current shape; the predictor records the shape and may answer with a
//! larger shape to allocate instead, so that the next iterations find the buffer big enough.
//!
//! Three [`Policy`]s:
//! - [`Policy::OpenVino`] follows the OpenVINO GPU plugin's preallocation rule
//!   (docs/design.md) bit for bit: 3 shapes of history, *iterations-ahead* mode for small
//!   linear growth,
//!   *percentage* mode (`ratio`) otherwise.
//! - [`Policy::Adaptive`] keeps the OpenVINO rule's answers where growth is small, but lets the
//!   look-ahead of a linear-growth streak grow with the buffer (geometrically, capped at
//!   `ratio - 1` of the current size), accepts steps larger than the per-dimension limit
//!   (prefill chunks) one step at a time, and answers [`ShapePredictor::should_reclaim`] when a
//!   buffer stays mostly empty.
//! - [`Policy::None`] never predicts: allocate exactly what is needed.
//!
//! [`can_preallocate`] is the one place of the "is there room for it" rule; the gpu engine
//! calls it with its own numbers. [`Ledger`] sizes every buffer of a request
//! (`realloc_if_needed`), and [`Sizer`] (predictor + ledger + summary + trace) is the one
//! sizing path: the runtime's requests call it, and [`replay()`] runs a shape trace through
//! it (the `dynrt-bench predict` command and the benchmarks use it).
//!
//! ```
//! use dynrt::memory::predictor::{Policy, PredictorOptions, ShapePredictor};
//! use dynrt::shape::Shape;
//!
//! let mut predictor = ShapePredictor::new(Policy::OpenVino, PredictorOptions::openvino_defaults());
//! for t in 1..=3 {
//!     let (predicted, shape) =
//!         predictor.predict_preallocation_shape("k_cache", &Shape::new([1, 12, t, 64]), 32, false)?;
//!     if t < 3 {
//!         assert!(!predicted); // fewer than 3 shapes: no prediction
//!     } else {
//!         assert_eq!(shape, Shape::new([1, 12, 13, 64])); // 10 iterations of +1 ahead
//!     }
//! }
//! # Ok::<(), dynrt::memory::predictor::PredictorError>(())
//! ```

pub mod adaptive;
pub mod ledger;
mod openvino;
pub mod replay;
pub mod sizer;

use crate::shape::{Shape, ShapeError};
use std::collections::{HashMap, VecDeque};
use std::fmt;

pub use ledger::{Decision, Ledger, MemoryLimits};
pub use replay::{replay, ReplayConfig, ReplayOutcome, ReplaySummary, RowOutcome, Trace, TraceRow};
pub use sizer::{Sizer, SizingSummary};

/// Name of the environment variable that overrides the predictor options
/// (`"ITERATIONS MAX_PER_ITER_BYTES MAX_PER_DIM_DIFF RATIO"`, e.g. `"10 16384 2 1.1"`).
pub const OPTIONS_ENV_VAR: &str = "DYNRT_MEM_PREALLOCATION_OPTIONS";

/// Number of shapes kept per id: the OpenVINO rule needs exactly 3 to predict.
pub const HISTORY_LEN: usize = 3;

/// Errors of the shape predictor, its options and trace replay.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PredictorError {
    /// A shape recorded for `id` has a different rank from the one recorded before it.
    #[error("shape of `{id}` changed rank from {previous_rank} to {current_rank}: an id's shapes must keep one rank")]
    RankChanged {
        /// The id (node or tensor name).
        id: String,
        /// Rank of the shape recorded before.
        previous_rank: usize,
        /// Rank of the shape given now.
        current_rank: usize,
    },
    /// Predictor options could not be parsed.
    #[error("malformed {source_name} `{value}`: {reason}; expected \"ITERATIONS MAX_PER_ITER_BYTES MAX_PER_DIM_DIFF RATIO\" such as \"10 16384 2 1.1\" (\"0 0 0 1.0\" disables preallocation)")]
    MalformedOptions {
        /// Where the text came from (`DYNRT_MEM_PREALLOCATION_OPTIONS`, `--options`, ...).
        source_name: String,
        /// The text as given.
        value: String,
        /// What was wrong with it.
        reason: String,
    },
    /// A policy name was not recognised.
    #[error("unknown predictor policy `{name}`: expected none, openvino or adaptive")]
    UnknownPolicy {
        /// The name as given.
        name: String,
    },
    /// A shape's element count or byte size (or a predicted one) overflows `u64`.
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// A predicted dimension (`current + step * iterations`) overflows `u64`.
    #[error("predicted shape for `{id}` overflows u64 (current {current}, {iterations} iterations ahead)")]
    PredictionOverflow {
        /// The id.
        id: String,
        /// The current shape, printed.
        current: String,
        /// Look-ahead in iterations.
        iterations: u64,
    },
    /// The trace has no header or a wrong one.
    #[error("trace header `{found}` is not `id,dtype,shape` or `id,dtype,shape,can_reuse`")]
    TraceHeader {
        /// The first line as found.
        found: String,
    },
    /// A trace row is malformed or cannot be replayed.
    #[error("trace row {row} (line {line}): {reason}")]
    TraceRow {
        /// 1-based data row (the header is not counted).
        row: usize,
        /// 1-based line in the file.
        line: usize,
        /// What is wrong.
        reason: String,
    },
}

/// The four preallocation knobs of the OpenVINO plugin.
///
/// `"0 0 0 1.0"` ([`PredictorOptions::disabled`]) turns preallocation off for every policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PredictorOptions {
    /// Iterations-ahead mode: how many steps of linear growth to reserve (OpenVINO: 10).
    pub iterations: u32,
    /// Iterations-ahead mode: largest unit slice, in bytes, that one step may add
    /// (OpenVINO: 16384).
    pub max_per_iter_bytes: u64,
    /// Iterations-ahead mode: largest per-dimension step (OpenVINO: 2; 2 passes, 3 does not).
    pub max_per_dim_diff: u64,
    /// Percentage mode: scale of the element count when growth is not linear and small
    /// (OpenVINO: 1.1; `<= 1.0` turns the mode off).
    pub ratio: f32,
}

impl Default for PredictorOptions {
    fn default() -> Self {
        Self::openvino_defaults()
    }
}

impl PredictorOptions {
    /// `10 16384 2 1.1`, the OpenVINO plugin's defaults.
    pub fn openvino_defaults() -> Self {
        PredictorOptions {
            iterations: 10,
            max_per_iter_bytes: 16384,
            max_per_dim_diff: 2,
            ratio: 1.1,
        }
    }

    /// `0 0 0 1.0`: no preallocation at all.
    pub fn disabled() -> Self {
        PredictorOptions {
            iterations: 0,
            max_per_iter_bytes: 0,
            max_per_dim_diff: 0,
            ratio: 1.0,
        }
    }

    /// Sets the iterations-ahead count.
    pub fn with_iterations(mut self, iterations: u32) -> Self {
        self.iterations = iterations;
        self
    }

    /// Sets the largest unit slice per iteration, in bytes.
    pub fn with_max_per_iter_bytes(mut self, max_per_iter_bytes: u64) -> Self {
        self.max_per_iter_bytes = max_per_iter_bytes;
        self
    }

    /// Sets the largest per-dimension step.
    pub fn with_max_per_dim_diff(mut self, max_per_dim_diff: u64) -> Self {
        self.max_per_dim_diff = max_per_dim_diff;
        self
    }

    /// Sets the percentage-mode ratio.
    pub fn with_ratio(mut self, ratio: f32) -> Self {
        self.ratio = ratio;
        self
    }

    /// Options from [`OPTIONS_ENV_VAR`]; `Ok(None)` when it is not set.
    ///
    /// # Errors
    /// [`PredictorError::MalformedOptions`] naming the variable when its value is not four
    /// values as [`PredictorOptions::parse`] reads them (never a silent default).
    pub fn from_env() -> Result<Option<Self>, PredictorError> {
        match std::env::var(OPTIONS_ENV_VAR) {
            Ok(value) => Self::parse_from(&value, OPTIONS_ENV_VAR).map(Some),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(raw)) => Err(PredictorError::MalformedOptions {
                source_name: OPTIONS_ENV_VAR.to_string(),
                value: raw.to_string_lossy().into_owned(),
                reason: "not valid unicode".into(),
            }),
        }
    }

    /// Parses `"ITERATIONS MAX_PER_ITER_BYTES MAX_PER_DIM_DIFF RATIO"` (whitespace separated,
    /// e.g. `"10 16384 2 1.1"`): three non-negative integers and a finite non-negative float.
    ///
    /// # Errors
    /// [`PredictorError::MalformedOptions`] when there are not exactly four values or one does
    /// not parse.
    pub fn parse(text: &str) -> Result<Self, PredictorError> {
        Self::parse_from(text, "preallocation options")
    }

    /// [`PredictorOptions::parse`], with errors naming `source_name` (a variable or a flag).
    ///
    /// # Errors
    /// As [`PredictorOptions::parse`].
    pub fn parse_from(text: &str, source_name: &str) -> Result<Self, PredictorError> {
        let bad = |reason: String| PredictorError::MalformedOptions {
            source_name: source_name.to_string(),
            value: text.to_string(),
            reason,
        };
        let fields: Vec<&str> = text.split_whitespace().collect();
        if fields.len() != 4 {
            return Err(bad(format!("found {} values, need 4", fields.len())));
        }
        let int = |i: usize, what: &str| {
            fields[i].parse::<u64>().map_err(|_| {
                bad(format!(
                    "{what} `{}` is not a non-negative integer",
                    fields[i]
                ))
            })
        };
        let iterations = int(0, "iterations")?;
        let iterations = u32::try_from(iterations)
            .map_err(|_| bad(format!("iterations {iterations} exceeds {}", u32::MAX)))?;
        let max_per_iter_bytes = int(1, "max bytes per iteration")?;
        let max_per_dim_diff = int(2, "max per-dimension step")?;
        let ratio = fields[3]
            .parse::<f32>()
            .ok()
            .filter(|r| r.is_finite() && *r >= 0.0)
            .ok_or_else(|| {
                bad(format!(
                    "ratio `{}` is not a finite non-negative number",
                    fields[3]
                ))
            })?;
        Ok(PredictorOptions {
            iterations,
            max_per_iter_bytes,
            max_per_dim_diff,
            ratio,
        })
    }
}

impl fmt::Display for PredictorOptions {
    /// The environment-variable form, `10 16384 2 1.1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} {}",
            self.iterations, self.max_per_iter_bytes, self.max_per_dim_diff, self.ratio
        )
    }
}

/// Which preallocation rule a [`ShapePredictor`] follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Never predict: buffers are allocated exactly as large as needed.
    None,
    /// The OpenVINO plugin's rule, bit for bit (docs/design.md).
    OpenVino,
    /// dynrt's rule: geometric look-ahead for linear growth, reclaim of mostly empty buffers.
    Adaptive,
}

impl Policy {
    /// Every policy, in the order the comparison table lists them.
    pub const ALL: [Policy; 3] = [Policy::None, Policy::OpenVino, Policy::Adaptive];

    /// Lower-case name, as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Policy::None => "none",
            Policy::OpenVino => "openvino",
            Policy::Adaptive => "adaptive",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Policy {
    type Err = PredictorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "none" => Ok(Policy::None),
            "openvino" => Ok(Policy::OpenVino),
            "adaptive" => Ok(Policy::Adaptive),
            other => Err(PredictorError::UnknownPolicy {
                name: other.to_string(),
            }),
        }
    }
}

/// Whether a buffer of `size_bytes` may be preallocated: it must fit in the largest buffer the
/// device allows (`size_bytes <= max_buffer_bytes`), and the device memory in use plus the
/// request must stay below 90% of the device memory budget
/// (`in_use_bytes + size_bytes < 0.9 * budget_bytes`).
///
/// This is OpenVINO's `ShapePredictor::can_preallocate` rule and its only home in dynrt:
/// the gpu engine passes its own limits and accounting here. The 90% test is computed exactly
/// in integers (`10 * (in_use + size) < 9 * budget`), so no float rounding decides near the
/// boundary.
pub fn can_preallocate(
    size_bytes: u64,
    max_buffer_bytes: u64,
    in_use_bytes: u64,
    budget_bytes: u64,
) -> bool {
    if size_bytes > max_buffer_bytes {
        return false;
    }
    let wanted = in_use_bytes as u128 + size_bytes as u128;
    wanted * 10 < budget_bytes as u128 * 9
}

/// What the predictor remembers about one id.
#[derive(Debug, Clone, Default)]
struct IdHistory {
    /// The last [`HISTORY_LEN`] shapes, oldest first.
    shapes: VecDeque<Shape>,
    /// Byte sizes of the last [`adaptive::RECLAIM_ROWS`] shapes, oldest first (adaptive only).
    recent_bytes: VecDeque<u64>,
}

/// Predicts preallocation shapes from the shape history of each id; one per inference request.
///
/// Holds at most [`HISTORY_LEN`] shapes per id (plus, for [`Policy::Adaptive`], the byte sizes
/// of the last few). Dropping it forgets everything; it owns no device memory.
#[derive(Debug, Clone)]
pub struct ShapePredictor {
    policy: Policy,
    options: PredictorOptions,
    history: HashMap<String, IdHistory>,
}

impl ShapePredictor {
    /// An empty predictor following `policy` with `options`.
    pub fn new(policy: Policy, options: PredictorOptions) -> Self {
        ShapePredictor {
            policy,
            options,
            history: HashMap::new(),
        }
    }

    /// The policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The options.
    pub fn options(&self) -> PredictorOptions {
        self.options
    }

    /// Records `current` for `id` and predicts the shape to allocate instead of it.
    ///
    /// Returns `(true, shape)` when a larger shape is predicted (the caller then checks
    /// [`can_preallocate`] on its byte size), `(false, [])` when the exact shape should be
    /// allocated. `dtype_bits` is the element width in bits. With `can_reuse_buffer` (the
    /// current buffer is big enough) the shape is only recorded and the answer is `(false, [])`.
    /// [`Policy::None`] records nothing and always answers `(false, [])`.
    ///
    /// # Errors
    /// [`PredictorError::RankChanged`] when `current` has another rank than the shape recorded
    /// before for `id` (nothing is recorded then); [`PredictorError::Shape`] or
    /// [`PredictorError::PredictionOverflow`] when a size does not fit in `u64`.
    pub fn predict_preallocation_shape(
        &mut self,
        id: &str,
        current: &Shape,
        dtype_bits: u32,
        can_reuse_buffer: bool,
    ) -> Result<(bool, Shape), PredictorError> {
        if self.policy == Policy::None {
            return Ok((false, Shape::default()));
        }
        let current_bytes = if self.policy == Policy::Adaptive {
            Some(current.size_bytes_for_bits(dtype_bits)?)
        } else {
            None
        };
        // OpenVINO records the shape before anything else, even when the buffer is reused.
        // The id's entry without allocating its key on every call (this runs for every node
        // whose shape changed, every iteration).
        if !self.history.contains_key(id) {
            self.history.insert(id.to_string(), IdHistory::default());
        }
        let Some(entry) = self.history.get_mut(id) else {
            return Ok((false, Shape::default()));
        };
        if let Some(previous) = entry.shapes.back() {
            if previous.rank() != current.rank() {
                return Err(PredictorError::RankChanged {
                    id: id.to_string(),
                    previous_rank: previous.rank(),
                    current_rank: current.rank(),
                });
            }
        }
        entry.shapes.push_back(current.clone());
        if entry.shapes.len() > HISTORY_LEN {
            entry.shapes.pop_front();
        }
        if let Some(bytes) = current_bytes {
            entry.recent_bytes.push_back(bytes);
            if entry.recent_bytes.len() > adaptive::RECLAIM_ROWS {
                entry.recent_bytes.pop_front();
            }
        }
        if can_reuse_buffer {
            return Ok((false, Shape::default()));
        }
        self.predict_from_history(id, dtype_bits)
    }

    /// The answer [`ShapePredictor::predict_preallocation_shape`] would give for the shapes
    /// already recorded for `id`, without recording anything: `(false, [])` with fewer than
    /// [`HISTORY_LEN`] shapes or under [`Policy::None`].
    ///
    /// # Errors
    /// As [`ShapePredictor::predict_preallocation_shape`], for sizes that overflow.
    pub fn predict_from_history(
        &self,
        id: &str,
        dtype_bits: u32,
    ) -> Result<(bool, Shape), PredictorError> {
        let Some(entry) = self.history.get(id) else {
            return Ok((false, Shape::default()));
        };
        if entry.shapes.len() < HISTORY_LEN {
            return Ok((false, Shape::default()));
        }
        let shapes = [&entry.shapes[0], &entry.shapes[1], &entry.shapes[2]];
        let predicted = match self.policy {
            Policy::None => None,
            Policy::OpenVino => openvino::predict(id, shapes, dtype_bits, &self.options)?,
            Policy::Adaptive => adaptive::predict(id, shapes, dtype_bits, &self.options)?,
        };
        Ok(match predicted {
            Some(shape) => (true, shape),
            None => (false, Shape::default()),
        })
    }

    /// Whether the buffer of `id`, `allocated_bytes` large, is mostly empty and may be shrunk.
    ///
    /// Only [`Policy::Adaptive`] ever answers true: when the current need and each of the last
    /// [`adaptive::RECLAIM_ROWS`] sizes recorded for `id` are under a tenth of the buffer (the
    /// OpenVINO plugin's rule "reclaim when required * 10 < allocated", held for several
    /// iterations so a buffer that is only briefly small keeps its room). Record the current
    /// shape first (`predict_preallocation_shape` with `can_reuse_buffer = true`).
    /// [`Ledger::realloc_if_needed`] asks this only while the request over-reserves, and then
    /// shrinks the buffer to [`ShapePredictor::predict_from_history`] (or the exact need).
    pub fn should_reclaim(&self, id: &str, needed_bytes: u64, allocated_bytes: u64) -> bool {
        if self.policy != Policy::Adaptive {
            return false;
        }
        let Some(entry) = self.history.get(id) else {
            return false;
        };
        adaptive::should_reclaim(&entry.recent_bytes, needed_bytes, allocated_bytes)
    }

    /// Forgets the shapes recorded for `id`.
    pub fn forget(&mut self, id: &str) {
        self.history.remove(id);
    }

    /// Forgets every recorded shape.
    pub fn clear(&mut self) {
        self.history.clear();
    }
}

/// Checked `current + step * k` per dimension.
fn add_steps(id: &str, current: &Shape, step: &[u64], k: u64) -> Result<Shape, PredictorError> {
    current
        .dims()
        .iter()
        .zip(step)
        .map(|(&c, &s)| s.checked_mul(k).and_then(|g| c.checked_add(g)))
        .collect::<Option<Vec<u64>>>()
        .map(Shape)
        .ok_or_else(|| PredictorError::PredictionOverflow {
            id: id.to_string(),
            current: current.to_string(),
            iterations: k,
        })
}

/// The two latest steps `(older, newer)` of three shapes of equal rank, or `None` when any
/// dimension decreased (no monotonic growth).
fn steps(shapes: [&Shape; 3]) -> Option<(Vec<u64>, Vec<u64>)> {
    let diff = |newer: &Shape, older: &Shape| -> Option<Vec<u64>> {
        newer
            .dims()
            .iter()
            .zip(older.dims())
            .map(|(&n, &o)| n.checked_sub(o))
            .collect()
    };
    Some((diff(shapes[1], shapes[0])?, diff(shapes[2], shapes[1])?))
}

/// Percentage mode: `[floor(elements * ratio), 1, 1, ...]`, multiplied in f32 as OpenVINO
/// does (`size_t * float` is a float multiply there) and truncated. `None` for a scalar, where
/// OpenVINO would index an empty shape.
fn percentage(current: &Shape, ratio: f32) -> Result<Option<Shape>, PredictorError> {
    if current.rank() == 0 {
        return Ok(None);
    }
    let elements = current.num_elements()?;
    // `as u64` truncates toward zero and saturates, never UB as the C++ cast could be.
    let scaled = (elements as f32 * ratio) as u64;
    let mut dims = vec![1u64; current.rank()];
    dims[0] = scaled;
    Ok(Some(Shape(dims)))
}

/// What the policies' unit tests share: feeding a shape sequence to a fresh predictor.
#[cfg(test)]
pub(crate) mod test_support {
    use super::{Policy, PredictorOptions, ShapePredictor};
    use crate::shape::Shape;

    pub(crate) fn s(d: &[u64]) -> Shape {
        Shape::new(d.to_vec())
    }

    /// Feeds `shapes` to a fresh `policy` predictor and returns the last answer.
    pub(crate) fn last_with(
        policy: Policy,
        options: PredictorOptions,
        shapes: &[&[u64]],
        bits: u32,
    ) -> (bool, Shape) {
        let mut p = ShapePredictor::new(policy, options);
        let mut out = (false, Shape::default());
        for d in shapes {
            out = p
                .predict_preallocation_shape("n", &s(d), bits, false)
                .unwrap();
        }
        out
    }

    pub(crate) fn defaults() -> PredictorOptions {
        PredictorOptions::openvino_defaults()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_name_the_source() {
        let o = PredictorOptions::parse("10 16384 2 1.1").unwrap();
        assert_eq!(o, PredictorOptions::openvino_defaults());
        assert_eq!(
            PredictorOptions::parse(" 0  0 0\t1.0 ").unwrap(),
            PredictorOptions::disabled()
        );
        assert_eq!(o.to_string(), "10 16384 2 1.1");
        for bad in [
            "",
            "10 16384 2",
            "10 16384 2 1.1 5",
            "ten 1 2 1.1",
            "-1 1 2 1.1",
            "1 1 2 nan",
            "1 1 2 -0.5",
            "1 1 2 inf",
            "5000000000 1 1 1.0",
        ] {
            let err = PredictorOptions::parse_from(bad, OPTIONS_ENV_VAR).unwrap_err();
            assert!(
                matches!(err, PredictorError::MalformedOptions { .. }),
                "{bad}: {err}"
            );
            assert!(err.to_string().contains(OPTIONS_ENV_VAR), "{err}");
        }
        let b = PredictorOptions::disabled()
            .with_iterations(3)
            .with_max_per_iter_bytes(7)
            .with_max_per_dim_diff(4)
            .with_ratio(1.5);
        assert_eq!(b.to_string(), "3 7 4 1.5");
    }

    #[test]
    fn malformed_env_var_is_an_error_naming_it() {
        // The only test in this crate that touches the variable, so no other test races it.
        std::env::set_var(OPTIONS_ENV_VAR, "10 16384 two 1.1");
        let err = PredictorOptions::from_env().unwrap_err();
        std::env::set_var(OPTIONS_ENV_VAR, "0 0 0 1.0");
        let disabled = PredictorOptions::from_env();
        std::env::remove_var(OPTIONS_ENV_VAR);
        let unset = PredictorOptions::from_env();
        assert!(err.to_string().contains(OPTIONS_ENV_VAR), "{err}");
        assert!(err.to_string().contains("two"), "{err}");
        assert_eq!(disabled.unwrap(), Some(PredictorOptions::disabled()));
        assert_eq!(unset.unwrap(), None);
    }

    #[test]
    fn policy_names_round_trip() {
        for p in Policy::ALL {
            assert_eq!(p.name().parse::<Policy>().unwrap(), p);
        }
        assert!(matches!(
            "greedy".parse::<Policy>(),
            Err(PredictorError::UnknownPolicy { .. })
        ));
    }

    #[test]
    fn can_preallocate_checks_max_buffer_and_ninety_percent() {
        assert!(can_preallocate(100, 100, 0, 1000));
        assert!(!can_preallocate(101, 100, 0, 1000));
        // 0.9 * 1000 = 900: 899 passes, 900 does not (strictly below).
        assert!(can_preallocate(99, 1000, 800, 1000));
        assert!(!can_preallocate(100, 1000, 800, 1000));
        assert!(can_preallocate(
            u64::MAX / 2,
            u64::MAX,
            u64::MAX / 4,
            u64::MAX
        ));
        assert!(!can_preallocate(1, u64::MAX, u64::MAX, u64::MAX));
    }

    #[test]
    fn none_policy_never_predicts() {
        let mut p = ShapePredictor::new(Policy::None, PredictorOptions::openvino_defaults());
        for t in 1..10 {
            let r = p
                .predict_preallocation_shape("x", &Shape::new([t]), 32, false)
                .unwrap();
            assert_eq!(r, (false, Shape::default()));
        }
        assert!(!p.should_reclaim("x", 1, 1000));
    }
}
