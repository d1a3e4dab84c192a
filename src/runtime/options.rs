//! What a request is asked to do ([`RunOptions`]) and what it counts ([`RunStats`]).

use super::RunError;
use crate::memory::predictor::{Policy, PredictorOptions};

/// [`RunOptions::growth_transient_bytes`] by default: 8 MiB.
pub const DEFAULT_GROWTH_TRANSIENT_BYTES: u64 = 8 << 20;

/// How a request manages memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunOptions {
    /// Preallocation policy of the request's shape predictor.
    pub policy: Policy,
    /// Predictor options (`DYNRT_MEM_PREALLOCATION_OPTIONS`).
    pub predictor: PredictorOptions,
    /// Share buffers between nodes without memory dependencies through the memory pool. Off:
    /// every node owns its buffer.
    pub pool: bool,
    /// Fill every buffer handed out for reuse or preallocation with NaN before use
    /// (`DYNRT_POISON=1`).
    pub poison: bool,
    /// Record every sizing decision as a shape-trace row (`dynrt demo --trace-out`; replay
    /// it with `dynrt-bench predict`).
    pub trace: bool,
    /// Bytes of old KV-cache buffers a growth step may keep beside the grown ones while the
    /// step's work copies them (one state's buffer more at most). Past that, a growing state's
    /// rows move in a submit of their own before the step and its old buffer is freed at
    /// once, so a step that grows every layer holds the cache and a bounded transient, not the
    /// cache twice. 0: every growing state moves alone.
    pub growth_transient_bytes: u64,
}

impl RunOptions {
    /// `policy` with the reference predictor options, the pool on and poison off.
    pub fn new(policy: Policy) -> Self {
        RunOptions {
            policy,
            predictor: PredictorOptions::openvino_defaults(),
            pool: true,
            poison: false,
            trace: false,
            growth_transient_bytes: DEFAULT_GROWTH_TRANSIENT_BYTES,
        }
    }

    /// [`RunOptions::new`] with `DYNRT_POISON`, `DYNRT_MEM_PREALLOCATION_OPTIONS` and
    /// `DYNRT_GROWTH_TRANSIENT_MIB` ([`RunOptions::growth_transient_bytes`]) applied.
    ///
    /// # Errors
    /// [`RunError::BadEnv`] for a `DYNRT_POISON` other than `0`/`1` or a
    /// `DYNRT_GROWTH_TRANSIENT_MIB` that is not a whole number; [`RunError::Predictor`]
    /// for malformed preallocation options.
    pub fn from_env(policy: Policy) -> Result<Self, RunError> {
        let mut o = RunOptions::new(policy);
        if let Some(p) = PredictorOptions::from_env()? {
            o.predictor = p;
        }
        if let Ok(v) = std::env::var("DYNRT_POISON") {
            o.poison = match v.trim() {
                "" | "0" | "false" => false,
                "1" | "true" => true,
                _ => {
                    return Err(RunError::BadEnv {
                        name: "DYNRT_POISON",
                        value: v,
                        reason: "expected 0 or 1",
                    })
                }
            };
        }
        if let Ok(v) = std::env::var("DYNRT_GROWTH_TRANSIENT_MIB") {
            o.growth_transient_bytes = match v.trim().parse::<u64>() {
                Ok(mib) => mib.saturating_mul(1 << 20),
                Err(_) => {
                    return Err(RunError::BadEnv {
                        name: "DYNRT_GROWTH_TRANSIENT_MIB",
                        value: v,
                        reason: "expected a whole number of MiB",
                    })
                }
            };
        }
        Ok(o)
    }
}

/// Where a request's host time went, summed over its iterations ([`InferRequest::host_time`]):
/// the work before the GPU's, which a decode step pays on top of the kernels. Wall-clock
/// time: on a busy machine it includes time the thread waited for a core.
///
/// [`InferRequest::host_time`]: crate::runtime::InferRequest::host_time
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct HostTime {
    /// Iterations timed.
    pub iterations: u64,
    /// Nanoseconds of input checks, shape updates and sizing (allocations and the copies of
    /// a growth that moves states alone included).
    pub prepare_ns: u64,
    /// Nanoseconds of input writes, encoding every node and packing the uniform slots and
    /// host writes: the runtime's own encoding, before wgpu validates the commands.
    pub encode_ns: u64,
    /// Nanoseconds of wgpu's `CommandEncoder::finish`: wgpu validates the recorded commands,
    /// tracks their buffers and encodes them for the driver (its cost per dispatch).
    pub finish_ns: u64,
    /// Nanoseconds of the queue's submit call. A software adapter (lavapipe) may run the
    /// kernels inside it, so there it holds the GPU's work too: compare the other parts.
    pub submit_ns: u64,
}

impl HostTime {
    /// Field-wise sum.
    pub fn merged(&self, o: &HostTime) -> HostTime {
        HostTime {
            iterations: self.iterations + o.iterations,
            prepare_ns: self.prepare_ns + o.prepare_ns,
            encode_ns: self.encode_ns + o.encode_ns,
            finish_ns: self.finish_ns + o.finish_ns,
            submit_ns: self.submit_ns + o.submit_ns,
        }
    }

    /// Field-wise difference (`self` later than `earlier`, saturating).
    pub fn since(&self, earlier: &HostTime) -> HostTime {
        HostTime {
            iterations: self.iterations.saturating_sub(earlier.iterations),
            prepare_ns: self.prepare_ns.saturating_sub(earlier.prepare_ns),
            encode_ns: self.encode_ns.saturating_sub(earlier.encode_ns),
            finish_ns: self.finish_ns.saturating_sub(earlier.finish_ns),
            submit_ns: self.submit_ns.saturating_sub(earlier.submit_ns),
        }
    }

    /// The runtime's and wgpu's work before the submit call (prepare, encode, finish),
    /// nanoseconds: what a step costs the host whatever the adapter.
    pub fn before_submit_ns(&self) -> u64 {
        self.prepare_ns + self.encode_ns + self.finish_ns
    }

    /// Every part, the submit call included, nanoseconds.
    pub fn total_ns(&self) -> u64 {
        self.before_submit_ns() + self.submit_ns
    }
}

/// Counters of a request since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RunStats {
    /// Iterations run.
    pub iterations: u64,
    /// Nodes whose shape was inferred again because an input shape changed.
    pub shape_updates: u64,
    /// Nodes skipped by `update_shape` because no input shape changed.
    pub shape_updates_skipped: u64,
    /// Real allocations the request made (pool records, owned buffers, KV growth, arena).
    pub allocations: u64,
    /// Real allocations after the first iteration, because a buffer was too small (or
    /// reclaimed).
    pub reallocations: u64,
    /// Sum of the sizes of the real allocations, bytes.
    pub bytes_allocated_total: u64,
    /// Buffers reused because the output fitted.
    pub reuses: u64,
    /// Allocations sized by a prediction larger than the actual output.
    pub preallocations: u64,
    /// Predicted sizes that could not be allocated; the exact size was used instead.
    pub preallocation_fallbacks: u64,
    /// Predictions refused by `can_preallocate` (over 90% of the budget or larger than the
    /// largest buffer): the exact size was allocated.
    pub preallocations_refused: u64,
    /// Buffers shrunk because they stayed mostly empty (adaptive policy).
    pub reclaims: u64,
    /// KV-cache growths (old contents copied once into a larger buffer).
    pub state_growths: u64,
    /// Kernel dispatches encoded.
    pub dispatches: u64,
    /// Of those, dispatches recorded again from a node's dispatch plan (shapes and operand
    /// ranges unchanged: no shape checks, parameter computation or cache lookups).
    pub dispatches_replayed: u64,
    /// Buffer copies encoded (reshapes, in-place appends, growth copies).
    pub copies: u64,
    /// Bytes moved by those copies (an in-place append moves only the new rows).
    pub copy_bytes: u64,
    /// Queue submits.
    pub submits: u64,
    /// NaN fills encoded (`DYNRT_POISON`).
    pub poison_fills: u64,
    /// Bytes of network inputs written from the host (an input kept on the device with
    /// [`crate::runtime::InferRequest::keep_input`] is written once, not every iteration).
    pub input_bytes_written: u64,
}

impl RunStats {
    /// Field-wise sum (counters of several requests of one run, e.g. prefill then decode).
    pub fn merged(&self, o: &RunStats) -> RunStats {
        RunStats {
            iterations: self.iterations + o.iterations,
            shape_updates: self.shape_updates + o.shape_updates,
            shape_updates_skipped: self.shape_updates_skipped + o.shape_updates_skipped,
            allocations: self.allocations + o.allocations,
            reallocations: self.reallocations + o.reallocations,
            bytes_allocated_total: self.bytes_allocated_total + o.bytes_allocated_total,
            reuses: self.reuses + o.reuses,
            preallocations: self.preallocations + o.preallocations,
            preallocation_fallbacks: self.preallocation_fallbacks + o.preallocation_fallbacks,
            preallocations_refused: self.preallocations_refused + o.preallocations_refused,
            reclaims: self.reclaims + o.reclaims,
            state_growths: self.state_growths + o.state_growths,
            dispatches: self.dispatches + o.dispatches,
            dispatches_replayed: self.dispatches_replayed + o.dispatches_replayed,
            copies: self.copies + o.copies,
            copy_bytes: self.copy_bytes + o.copy_bytes,
            submits: self.submits + o.submits,
            poison_fills: self.poison_fills + o.poison_fills,
            input_bytes_written: self.input_bytes_written + o.input_bytes_written,
        }
    }
}
