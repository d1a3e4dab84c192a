//! Allocation accounting: per-kind bytes in use and peak, and the allocation history.
//!
//! Device-free (no wgpu). The GPU engine ([`crate::gpu::Engine`]) calls
//! [`Accounting::record_allocate`] / [`Accounting::record_free`] for every real buffer it
//! creates and destroys; views of an existing buffer are never recorded.
//!
//! The history line format is the reference plugin's (OpenVINO's GPU plugin prints
//! it with `OV_VERBOSE=2`; docs/design.md), where `current` and `max` are that kind's
//! bytes in use and peak *after* the event:
//!
//! ```text
//! Allocate 58982400 bytes of usm_host allocation type (current=117969612; max=117969612)
//! Free 58982400 bytes of usm_host allocation type (current=58987212; max=117969612)
//! ```
//!
//! [`AllocEvent::parse`] reads such a line back and [`check_history`] verifies the arithmetic
//! line by line, so tests (and users with a log file) can check a run.
//!
//! The counters are always kept; events only while they are printed (verbose) or a bounded
//! recorder is on ([`Accounting::record_history`]): a long-running process that allocates
//! and frees every step keeps constant memory for its history.
//!
//! ```
//! use dynrt::memory::accounting::{Accounting, AllocEvent, check_history};
//! use dynrt::memory::AllocKind;
//! let mut acc = Accounting::new();
//! acc.record_history(16); // keep the last 16 events
//! acc.record_allocate(AllocKind::UsmDevice, 64);
//! acc.record_free(AllocKind::UsmDevice, 64);
//! let lines: Vec<String> = acc.history().iter().map(|e| e.to_string()).collect();
//! assert_eq!(lines[0], "Allocate 64 bytes of usm_device allocation type (current=64; max=64)");
//! let parsed: Vec<AllocEvent> = lines.iter().map(|l| AllocEvent::parse(l).unwrap()).collect();
//! check_history(&parsed).unwrap();
//! ```

use super::kind::AllocKind;
use super::regions::Region;
use std::fmt;

/// What happened to a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum AllocOp {
    /// A buffer was created.
    Allocate,
    /// A buffer was destroyed.
    Free,
}

impl AllocOp {
    /// The word the history line starts with (`Allocate` or `Free`).
    pub fn word(self) -> &'static str {
        match self {
            AllocOp::Allocate => "Allocate",
            AllocOp::Free => "Free",
        }
    }
}

/// One line of the allocation history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct AllocEvent {
    /// Allocate or free.
    pub op: AllocOp,
    /// Size of the buffer allocated or freed, in bytes.
    pub size_bytes: u64,
    /// The buffer's allocation kind.
    pub kind: AllocKind,
    /// Bytes of this kind in use after the event.
    pub current_bytes: u64,
    /// Peak bytes of this kind in use up to and including this event.
    pub max_bytes: u64,
}

impl fmt::Display for AllocEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} bytes of {} allocation type (current={}; max={})",
            self.op.word(),
            self.size_bytes,
            self.kind.name(),
            self.current_bytes,
            self.max_bytes
        )
    }
}

/// A history line that does not have the reference format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseEventError {
    /// The line has neither `Allocate ` nor `Free ` in it.
    #[error("not an allocation history line: `{line}`")]
    NotAnEvent {
        /// The offending line.
        line: String,
    },
    /// The line starts like an event but a field is missing or malformed.
    #[error("malformed allocation history line ({what}): `{line}`")]
    Malformed {
        /// Which part was wrong.
        what: &'static str,
        /// The offending line.
        line: String,
    },
}

impl AllocEvent {
    /// Parses one history line. Text before `Allocate`/`Free` (a log prefix such as
    /// `GPU_Debug: ` or an env_logger header) is ignored.
    ///
    /// # Errors
    /// [`ParseEventError`] when the line is not in the format [`AllocEvent`] prints.
    pub fn parse(line: &str) -> Result<AllocEvent, ParseEventError> {
        let line = line.trim();
        let start = ["Allocate ", "Free "]
            .iter()
            .filter_map(|w| find_word(line, w))
            .min()
            .ok_or_else(|| ParseEventError::NotAnEvent {
                line: line.to_string(),
            })?;
        let rest = &line[start..];
        let bad = |what: &'static str| ParseEventError::Malformed {
            what,
            line: line.to_string(),
        };
        let (op, rest) = if let Some(r) = rest.strip_prefix("Allocate ") {
            (AllocOp::Allocate, r)
        } else if let Some(r) = rest.strip_prefix("Free ") {
            (AllocOp::Free, r)
        } else {
            return Err(bad("operation"));
        };
        let (size, rest) = rest.split_once(" bytes of ").ok_or_else(|| bad("size"))?;
        let size_bytes: u64 = size.parse().map_err(|_| bad("size"))?;
        let (kind, rest) = rest
            .split_once(" allocation type (current=")
            .ok_or_else(|| bad("kind"))?;
        let kind: AllocKind = kind.parse().map_err(|_| bad("kind"))?;
        let (current, rest) = rest.split_once("; max=").ok_or_else(|| bad("current"))?;
        let current_bytes: u64 = current.parse().map_err(|_| bad("current"))?;
        let max = rest.strip_suffix(')').ok_or_else(|| bad("max"))?;
        let max_bytes: u64 = max.parse().map_err(|_| bad("max"))?;
        Ok(AllocEvent {
            op,
            size_bytes,
            kind,
            current_bytes,
            max_bytes,
        })
    }
}

/// Byte index of `word` in `line` where it starts the line or follows a non-alphanumeric char.
fn find_word(line: &str, word: &str) -> Option<usize> {
    line.match_indices(word)
        .map(|(i, _)| i)
        .find(|&i| i == 0 || !line[..i].ends_with(|c: char| c.is_alphanumeric()))
}

/// Parses every history line in `text`, skipping lines that are not events (other log output).
///
/// # Errors
/// [`ParseEventError::Malformed`] for a line that starts like an event but is malformed.
pub fn parse_history(text: &str) -> Result<Vec<AllocEvent>, ParseEventError> {
    let mut events = Vec::new();
    for line in text.lines() {
        match AllocEvent::parse(line) {
            Ok(e) => events.push(e),
            Err(ParseEventError::NotAnEvent { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(events)
}

/// A history whose arithmetic does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HistoryError {
    /// `current` is not the previous current of that kind plus/minus the size.
    #[error("line {line_index}: current={found} but the previous {kind} current ± size gives {expected}")]
    Current {
        /// 0-based index of the event.
        line_index: usize,
        /// The event's kind.
        kind: AllocKind,
        /// What the arithmetic gives.
        expected: u64,
        /// What the line says.
        found: u64,
    },
    /// `max` is not the running maximum of that kind's current.
    #[error("line {line_index}: max={found} but the running {kind} peak is {expected}")]
    Max {
        /// 0-based index of the event.
        line_index: usize,
        /// The event's kind.
        kind: AllocKind,
        /// What the arithmetic gives.
        expected: u64,
        /// What the line says.
        found: u64,
    },
    /// A free of more bytes than that kind had in use.
    #[error(
        "line {line_index}: frees {size_bytes} bytes of {kind} but only {current_bytes} are in use"
    )]
    Underflow {
        /// 0-based index of the event.
        line_index: usize,
        /// The event's kind.
        kind: AllocKind,
        /// Size freed.
        size_bytes: u64,
        /// Bytes in use before the free.
        current_bytes: u64,
    },
}

/// Checks a history that starts from an empty engine: per kind, `current` = previous current
/// ± size, and `max` = running maximum of current.
///
/// # Errors
/// The first [`HistoryError`] found.
pub fn check_history(events: &[AllocEvent]) -> Result<(), HistoryError> {
    let mut current = [0u64; 4];
    let mut peak = [0u64; 4];
    for (i, e) in events.iter().enumerate() {
        let k = e.kind.index();
        let expected = match e.op {
            AllocOp::Allocate => current[k].saturating_add(e.size_bytes),
            AllocOp::Free => {
                current[k]
                    .checked_sub(e.size_bytes)
                    .ok_or(HistoryError::Underflow {
                        line_index: i,
                        kind: e.kind,
                        size_bytes: e.size_bytes,
                        current_bytes: current[k],
                    })?
            }
        };
        if e.current_bytes != expected {
            return Err(HistoryError::Current {
                line_index: i,
                kind: e.kind,
                expected,
                found: e.current_bytes,
            });
        }
        current[k] = expected;
        peak[k] = peak[k].max(expected);
        if e.max_bytes != peak[k] {
            return Err(HistoryError::Max {
                line_index: i,
                kind: e.kind,
                expected: peak[k],
                found: e.max_bytes,
            });
        }
    }
    Ok(())
}

/// Counters of one allocation kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KindStats {
    /// Bytes in use now.
    pub current_bytes: u64,
    /// Largest `current_bytes` ever reached.
    pub peak_bytes: u64,
    /// Number of allocations so far.
    pub allocations: u64,
    /// Number of frees so far.
    pub frees: u64,
    /// Sum of the sizes of every allocation so far, bytes.
    pub bytes_allocated: u64,
}

/// Counters of one device region (docs/design.md): what the runtime placed there, whole buffers or
/// ranges of a shared one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RegionStats {
    /// Bytes held now.
    pub current_bytes: u64,
    /// Largest `current_bytes` reached.
    pub peak_bytes: u64,
    /// Buffers (or ranges) held now.
    pub buffers: u64,
    /// Buffers (or ranges) placed so far.
    pub allocations: u64,
}

/// The regions [`MemoryStats::regions`] counts, in its order.
pub const COUNTED_REGIONS: [Region; 3] =
    [Region::Constants, Region::Placeholders, Region::Internal];

/// Index of a counted region in [`MemoryStats::regions`].
pub fn region_index(r: Region) -> Option<usize> {
    COUNTED_REGIONS.iter().position(|&x| x == r)
}

/// A snapshot of the counters of every kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemoryStats {
    /// Indexed by [`AllocKind::index`].
    pub per_kind: [KindStats; 4],
    /// Per region, indexed like [`COUNTED_REGIONS`] (constants, placeholders, internal);
    /// buffers of no region (staging, readback) count only by kind.
    pub regions: [RegionStats; 3],
    /// Bytes handed to `queue.write_buffer` ([`crate::gpu::Engine::queue_write`]): wgpu
    /// stages them in its own belt, outside any buffer of the engine.
    pub queue_write_bytes: u64,
    /// Number of such writes.
    pub queue_writes: u64,
    /// Largest [`MemoryStats::device_current_bytes`] ever reached: the peak of the device
    /// memory in use, all kinds together (the per-kind peaks may fall at different times).
    #[serde(default)]
    pub device_peak_bytes: u64,
}

impl MemoryStats {
    /// The counters of `kind`.
    pub fn kind(&self, kind: AllocKind) -> KindStats {
        self.per_kind[kind.index()]
    }
    /// Bytes of `kind` in use now.
    pub fn current_bytes(&self, kind: AllocKind) -> u64 {
        self.kind(kind).current_bytes
    }
    /// Peak bytes of `kind`.
    pub fn peak_bytes(&self, kind: AllocKind) -> u64 {
        self.kind(kind).peak_bytes
    }
    /// Bytes in use now over all kinds.
    pub fn total_current_bytes(&self) -> u64 {
        self.per_kind.iter().map(|k| k.current_bytes).sum()
    }
    /// Sum of the sizes of every allocation so far, over all kinds.
    pub fn bytes_allocated_total(&self) -> u64 {
        self.per_kind.iter().map(|k| k.bytes_allocated).sum()
    }
    /// Allocations so far, over all kinds.
    pub fn allocations_total(&self) -> u64 {
        self.per_kind.iter().map(|k| k.allocations).sum()
    }
    /// Bytes in use now over the kinds that count against the device budget
    /// ([`AllocKind::on_device`]).
    pub fn device_current_bytes(&self) -> u64 {
        AllocKind::ALL
            .iter()
            .filter(|k| k.on_device())
            .map(|k| self.current_bytes(*k))
            .sum()
    }
}

/// The last events, at most `capacity` of them.
#[derive(Debug, Clone, Default)]
struct Recorder {
    capacity: usize,
    events: std::collections::VecDeque<AllocEvent>,
    dropped: u64,
}

/// Per-kind counters, kept always, plus the events while they are printed or recorded. Not
/// thread-safe by itself: the engine keeps it behind a mutex.
#[derive(Debug, Clone, Default)]
pub struct Accounting {
    stats: MemoryStats,
    recorder: Option<Recorder>,
    verbose: bool,
}

impl Accounting {
    /// Empty counters, no events kept; history lines go to `log::debug!` only.
    pub fn new() -> Accounting {
        Accounting::default()
    }

    /// Keeps the last `capacity` events from now on (older ones are dropped and counted):
    /// memory for the history stays bounded however long the process runs. A capacity of 0
    /// stops recording and forgets what was kept.
    pub fn record_history(&mut self, capacity: usize) {
        if capacity == 0 {
            self.recorder = None;
            return;
        }
        let r = self.recorder.get_or_insert_with(Recorder::default);
        r.capacity = capacity;
        while r.events.len() > capacity {
            r.events.pop_front();
            r.dropped += 1;
        }
    }

    /// Events recorded and then dropped because the recorder was full.
    pub fn history_dropped(&self) -> u64 {
        self.recorder.as_ref().map_or(0, |r| r.dropped)
    }

    /// Heap bytes the kept events take (0 without a recorder; at most the capacity's worth).
    pub fn history_heap_bytes(&self) -> usize {
        self.recorder.as_ref().map_or(0, |r| {
            r.events.capacity() * std::mem::size_of::<AllocEvent>()
        })
    }

    /// Empty counters; when `verbose` is true each history line is also printed to stderr
    /// (what `DYNRT_VERBOSE=2` turns on), not kept.
    pub fn with_verbose(verbose: bool) -> Accounting {
        Accounting {
            verbose,
            ..Accounting::default()
        }
    }

    /// Whether lines are printed to stderr.
    pub fn verbose(&self) -> bool {
        self.verbose
    }

    /// Records a real allocation of `size_bytes` of `kind` and returns its history event.
    pub fn record_allocate(&mut self, kind: AllocKind, size_bytes: u64) -> AllocEvent {
        let s = &mut self.stats.per_kind[kind.index()];
        s.current_bytes = s.current_bytes.saturating_add(size_bytes);
        s.peak_bytes = s.peak_bytes.max(s.current_bytes);
        s.allocations += 1;
        s.bytes_allocated = s.bytes_allocated.saturating_add(size_bytes);
        let e = AllocEvent {
            op: AllocOp::Allocate,
            size_bytes,
            kind,
            current_bytes: s.current_bytes,
            max_bytes: s.peak_bytes,
        };
        let device = self.stats.device_current_bytes();
        self.stats.device_peak_bytes = self.stats.device_peak_bytes.max(device);
        self.emit(e);
        e
    }

    /// Records the free of a buffer of `size_bytes` of `kind` and returns its history event.
    /// A free larger than what is in use is a caller bug: it is clamped at zero and logged.
    pub fn record_free(&mut self, kind: AllocKind, size_bytes: u64) -> AllocEvent {
        let s = &mut self.stats.per_kind[kind.index()];
        if size_bytes > s.current_bytes {
            log::error!(
                "accounting: free of {size_bytes} bytes of {kind} with only {} in use",
                s.current_bytes
            );
        }
        s.current_bytes = s.current_bytes.saturating_sub(size_bytes);
        s.frees += 1;
        let e = AllocEvent {
            op: AllocOp::Free,
            size_bytes,
            kind,
            current_bytes: s.current_bytes,
            max_bytes: s.peak_bytes,
        };
        self.emit(e);
        e
    }

    fn emit(&mut self, e: AllocEvent) {
        log::debug!("{e}");
        if self.verbose {
            eprintln!("{e}");
        }
        if let Some(r) = &mut self.recorder {
            if r.events.len() == r.capacity {
                r.events.pop_front();
                r.dropped += 1;
            }
            r.events.push_back(e);
        }
    }

    /// Records `bytes` placed in (`placed`) or taken out of `region`: a whole buffer of that
    /// region, or a range of a shared buffer. Regions that are not counted are ignored.
    pub fn record_region(&mut self, region: Region, bytes: u64, placed: bool) {
        let Some(i) = region_index(region) else {
            return;
        };
        let r = &mut self.stats.regions[i];
        if placed {
            r.current_bytes = r.current_bytes.saturating_add(bytes);
            r.peak_bytes = r.peak_bytes.max(r.current_bytes);
            r.buffers += 1;
            r.allocations += 1;
        } else {
            r.current_bytes = r.current_bytes.saturating_sub(bytes);
            r.buffers = r.buffers.saturating_sub(1);
        }
    }

    /// Counts a write of `bytes` through the queue (no buffer of ours is involved).
    pub fn record_queue_write(&mut self, bytes: u64) {
        self.stats.queue_write_bytes = self.stats.queue_write_bytes.saturating_add(bytes);
        self.stats.queue_writes += 1;
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> MemoryStats {
        self.stats
    }

    /// The recorded events, oldest first (empty unless [`Accounting::record_history`] is on).
    pub fn history(&self) -> Vec<AllocEvent> {
        self.recorder
            .as_ref()
            .map(|r| r.events.iter().copied().collect())
            .unwrap_or_default()
    }
}

/// Whether `DYNRT_VERBOSE` asks for the history on stderr (level 2 or more). Unset, empty or
/// unparsable means no. Always false on wasm32 (no environment).
pub fn verbose_from_env() -> bool {
    #[cfg(not(target_arch = "wasm32"))]
    {
        std::env::var("DYNRT_VERBOSE")
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .is_some_and(|v| v >= 2)
    }
    #[cfg(target_arch = "wasm32")]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    #[test]
    fn line_format_is_the_reference_one() {
        let mut acc = Accounting::new();
        acc.record_history(8);
        acc.record_allocate(AllocKind::UsmHost, 58982400);
        let e = acc.record_allocate(AllocKind::UsmHost, 58987212);
        assert_eq!(
            e.to_string(),
            "Allocate 58987212 bytes of usm_host allocation type (current=117969612; max=117969612)"
        );
        let e = acc.record_free(AllocKind::UsmHost, 58982400);
        assert_eq!(
            e.to_string(),
            "Free 58982400 bytes of usm_host allocation type (current=58987212; max=117969612)"
        );
    }

    #[test]
    fn parse_accepts_prefixes_and_rejects_garbage() {
        let e = AllocEvent::parse(
            "GPU_Debug: Allocate 44621568 bytes of usm_device allocation type (current=44626380; max=44626380)",
        )
        .unwrap();
        assert_eq!(e.op, AllocOp::Allocate);
        assert_eq!(e.kind, AllocKind::UsmDevice);
        assert_eq!(
            (e.size_bytes, e.current_bytes, e.max_bytes),
            (44621568, 44626380, 44626380)
        );
        assert!(matches!(
            AllocEvent::parse("hello"),
            Err(ParseEventError::NotAnEvent { .. })
        ));
        assert!(matches!(
            AllocEvent::parse("Free x bytes of usm_host allocation type (current=1; max=2)"),
            Err(ParseEventError::Malformed { what: "size", .. })
        ));
        assert!(matches!(
            AllocEvent::parse("Free 1 bytes of gpu allocation type (current=1; max=2)"),
            Err(ParseEventError::Malformed { what: "kind", .. })
        ));
        // "Freed" inside a word must not count as an event start.
        assert!(matches!(
            AllocEvent::parse("UnFree 1 bytes"),
            Err(ParseEventError::NotAnEvent { .. })
        ));
    }

    #[test]
    fn random_histories_round_trip_and_check() {
        let mut rng = SplitMix64::new(7);
        let mut acc = Accounting::new();
        acc.record_history(1000);
        let mut live: Vec<(AllocKind, u64)> = Vec::new();
        let mut true_peak = [0u64; 4];
        let mut now = [0u64; 4];
        for _ in 0..500 {
            if live.is_empty() || rng.next_u64() % 3 != 0 {
                let kind = AllocKind::ALL[(rng.next_u64() % 4) as usize];
                let size = rng.next_u64() % 10_000;
                acc.record_allocate(kind, size);
                live.push((kind, size));
                now[kind.index()] += size;
                true_peak[kind.index()] = true_peak[kind.index()].max(now[kind.index()]);
            } else {
                let i = (rng.next_u64() % live.len() as u64) as usize;
                let (kind, size) = live.swap_remove(i);
                acc.record_free(kind, size);
                now[kind.index()] -= size;
            }
        }
        let text: String = acc
            .history()
            .iter()
            .map(|e| format!("noise\n{e}\n"))
            .collect();
        let parsed = parse_history(&text).unwrap();
        assert_eq!(parsed, acc.history());
        check_history(&parsed).unwrap();
        for k in AllocKind::ALL {
            assert_eq!(acc.stats().current_bytes(k), now[k.index()]);
            assert_eq!(acc.stats().peak_bytes(k), true_peak[k.index()]);
        }
    }

    #[test]
    fn ten_thousand_pairs_keep_the_history_bounded_and_the_counters_exact() {
        // Without a recorder nothing is kept at all.
        let mut acc = Accounting::new();
        for _ in 0..10_000 {
            acc.record_allocate(AllocKind::UsmDevice, 256);
            acc.record_free(AllocKind::UsmDevice, 256);
        }
        assert!(acc.history().is_empty());
        assert_eq!(acc.history_heap_bytes(), 0);
        let k = acc.stats().kind(AllocKind::UsmDevice);
        assert_eq!(
            (k.allocations, k.frees, k.current_bytes),
            (10_000, 10_000, 0)
        );
        assert_eq!(k.bytes_allocated, 2_560_000);
        // With a bounded recorder: the last 64 events, the rest counted as dropped.
        acc.record_history(64);
        let bound = acc
            .history_heap_bytes()
            .max(64 * std::mem::size_of::<AllocEvent>());
        for i in 0..10_000u64 {
            acc.record_allocate(AllocKind::ClMem, 4 + i % 8);
            acc.record_free(AllocKind::ClMem, 4 + i % 8);
            assert!(acc.history_heap_bytes() <= 2 * bound, "pair {i}");
        }
        let h = acc.history();
        assert_eq!(h.len(), 64);
        assert_eq!(acc.history_dropped(), 20_000 - 64);
        assert_eq!(h.last().unwrap().op, AllocOp::Free);
        assert_eq!(acc.stats().kind(AllocKind::ClMem).allocations, 10_000);
    }

    #[test]
    fn check_history_catches_bad_arithmetic() {
        let mut acc = Accounting::new();
        acc.record_history(8);
        acc.record_allocate(AllocKind::ClMem, 100);
        acc.record_allocate(AllocKind::ClMem, 50);
        acc.record_free(AllocKind::ClMem, 100);
        let good = acc.history();
        check_history(&good).unwrap();
        let mut bad = good.clone();
        bad[1].current_bytes = 149;
        assert!(matches!(
            check_history(&bad),
            Err(HistoryError::Current { line_index: 1, .. })
        ));
        let mut bad = good.clone();
        bad[2].max_bytes = 100;
        assert!(matches!(
            check_history(&bad),
            Err(HistoryError::Max { line_index: 2, .. })
        ));
        let bad = vec![good[2]];
        assert!(matches!(
            check_history(&bad),
            Err(HistoryError::Underflow { .. })
        ));
    }
}
