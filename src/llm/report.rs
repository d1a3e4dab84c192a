//! The summary of one generation: what `dynrt generate --json` prints and what the browser
//! page shows, from one definition so the two are compared field by field.

use super::{Generation, KvUsage, Session, StopReason};
use crate::memory::AllocKind;
use crate::runtime::report::{PeakBytes, RegionReport};

/// Tokens, text, speed and memory of one generation on a session (field names are the
/// JSON contract of `dynrt generate --json`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GenerationReport {
    /// Adapter name.
    pub adapter: String,
    /// Backend, lower case (`vulkan`, `gl`, `browserwebgpu`).
    pub backend: String,
    /// The preallocation policy's name, as given.
    pub policy: String,
    /// Generated ids (a stop token included).
    pub tokens: Vec<u32>,
    /// Their text.
    pub text: String,
    /// Why the generation ended.
    pub stop: StopReason,
    /// Tokens fed as the prompt.
    pub prompt_tokens: usize,
    /// Milliseconds of the prefill.
    pub prefill_ms: f64,
    /// Prompt tokens per second of the prefill.
    pub prefill_tokens_per_s: f64,
    /// Decode steps run (one fewer than the tokens: the first comes from the prefill).
    pub decode_steps: usize,
    /// Mean milliseconds per decode step.
    pub decode_ms_per_token: f64,
    /// Peak bytes per kind on the session's engine.
    pub peak_bytes: PeakBytes,
    /// Bytes per device region now and at peak.
    pub regions: RegionReport,
    /// Kernel dispatches the session's requests encoded (prefill and decode steps: the
    /// difference of two runs with different `--max-tokens` gives a decode step's count).
    pub dispatches: u64,
    /// Real allocations of the session's requests.
    pub allocations: u64,
    /// Of those, reallocations of buffers that grew.
    pub reallocations: u64,
    /// Bytes the KV cache reserves now.
    pub kv_reserved_bytes: u64,
    /// Bytes the KV cache needs for the tokens it holds.
    pub kv_needed_bytes: u64,
    /// `kv_reserved_bytes / kv_needed_bytes` (0 when nothing is needed).
    pub kv_reserved_over_needed: f64,
    /// The KV cache of the global layers (every layer but the sliding-window ones).
    pub kv_global: KvUsage,
    /// The KV cache of the sliding-window layers (Gemma 3's local layers; 0 layers for
    /// models without them).
    pub kv_local: KvUsage,
    /// Bytes of the weights on the device.
    pub weights_device_bytes: u64,
    /// Bytes of the tensors in the GGUF file.
    pub weights_file_bytes: u64,
    /// Bytes of the weights reordered into grouped planes on the device (part of
    /// `weights_device_bytes`).
    pub weights_grouped_bytes: u64,
}

impl GenerationReport {
    /// The report of `g`, which `session` just generated under `policy`.
    pub fn new(session: &Session, g: &Generation, policy: &str) -> Self {
        let model = session.model();
        let engine = model.engine();
        let stats = engine.stats();
        let mut peak = [0u64; 4];
        for k in AllocKind::ALL {
            peak[k.index()] = stats.peak_bytes(k);
        }
        let info = engine.gpu().adapter_info();
        let ss = session.stats();
        let [kv_global, kv_local] = session.kv_by_layer_kind();
        let reserved = session.kv_reserved_bytes();
        let needed = kv_global.needed_bytes + kv_local.needed_bytes;
        GenerationReport {
            adapter: info.name.clone(),
            backend: format!("{:?}", info.backend).to_lowercase(),
            policy: policy.to_owned(),
            tokens: g.tokens.clone(),
            text: g.text.clone(),
            stop: g.stop,
            prompt_tokens: g.prompt_tokens,
            prefill_ms: g.prefill_ms,
            prefill_tokens_per_s: g.prefill_tokens_per_s(),
            decode_steps: g.decode_ms.len(),
            decode_ms_per_token: g.decode_ms_per_token(),
            peak_bytes: PeakBytes::from_array(peak),
            regions: RegionReport::from_stats(&stats),
            dispatches: ss.run.dispatches,
            allocations: ss.run.allocations,
            reallocations: ss.run.reallocations,
            kv_reserved_bytes: reserved,
            kv_needed_bytes: needed,
            kv_reserved_over_needed: if needed > 0 {
                reserved as f64 / needed as f64
            } else {
                0.0
            },
            kv_global,
            kv_local,
            weights_device_bytes: model.weight_bytes(),
            weights_file_bytes: model.file_tensor_bytes(),
            weights_grouped_bytes: model.grouped_weight_bytes(),
        }
    }
}
