//! Running an ONNX model on the device: [`OnnxSession`] loads a model (a path natively, bytes
//! and external-data bytes everywhere), imports it ([`super::import()`]), compiles it once and
//! runs steps with inputs from the host, reading outputs on demand. Its KV caches stay on the
//! device between steps: every `past → Concat → present` pair ([`crate::runtime::find_states`],
//! or the pairs the caller names) is a state of the runtime, appended in place in a padded
//! buffer (see [`crate::runtime`], "The KV cache"), so a decode loop feeds only the new token.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use dynrt::gpu::{Engine, Gpu, GpuOptions};
//! use dynrt::onnx::{HostTensor, OnnxSession, SessionOptions};
//! let engine = Engine::new(pollster::block_on(Gpu::new(GpuOptions::default()))?);
//! let mut session = OnnxSession::load(&engine, "model.onnx", &SessionOptions::default())?;
//! let ids = HostTensor::from_i64(vec![1, 3], &[1, 2, 3])?;
//! let pos = HostTensor::from_i64(vec![1, 3], &[0, 1, 2])?;
//! // The first step: the pasts are carried (empty at the start), only the tokens are fed.
//! session.run_blocking(&[("input_ids", &ids), ("position_ids", &pos)])?;
//! let logits = session.read_blocking("logits")?;
//! println!("{:?}", logits.dims());
//! # Ok(())
//! # }
//! ```
//!
//! A carried past may still be given: it replaces the rows the session holds (a first step
//! that starts from a stored cache, or a caller that feeds every input as ONNX Runtime's
//! callers do). [`OnnxSession::reset`] starts a new sequence.
//!
//! An input that stays the same from step to step (a weight fed as an input, an operand of a
//! benchmark) can be kept on the device with [`OnnxSession::keep_input`]: it is written once,
//! and steps leave it out — what ONNX Runtime's callers get by binding a device tensor.

use super::feeds::bind_inputs_carried;
use super::file::{LoadOptions, OnnxFile, OnnxGraph};
use super::import::{dtype_of, import, runtime_tensor, ImportError, ImportedValue};
use super::tensor::{HostTensor, TensorDType};
use super::{ExternalData, OnnxError};
use crate::gpu::Engine;
use crate::memory::predictor::Policy;
use crate::runtime::{
    find_states, InferRequest, Network, NetworkOptions, RunError, RunOptions, RunStats,
    StateBinding,
};
use bytes::Bytes;

/// Why a session could not be created or a step not run. Every variant names the input,
/// output, node or file it is about.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The model could not be read or decoded (a malformed or truncated protobuf, external
    /// data missing or outside the model's folder, ...).
    #[error(transparent)]
    Load(OnnxError),
    /// The model could not be imported (unsupported ops, all of them listed; unsupported
    /// types; a malformed node).
    #[error(transparent)]
    Import(Box<ImportError>),
    /// The inputs of a step do not fit the model: an unknown, duplicate or missing input, or
    /// one of the wrong element type, rank or dimensions (named).
    #[error(transparent)]
    Input(OnnxError),
    /// A carried pair the caller named is not a cache the runtime keeps in place.
    #[error("carry `{output}` -> `{input}`: {reason}")]
    Carry {
        /// The output.
        output: String,
        /// The input it should become.
        input: String,
        /// Why not.
        reason: String,
    },
    /// An input that cannot be kept on the device ([`OnnxSession::keep_input`]).
    #[error("keeping input `{input}`: {reason}")]
    Keep {
        /// The input.
        input: String,
        /// Why not.
        reason: String,
    },
    /// An output read that the model does not have.
    #[error("the model has no output `{output}`")]
    UnknownOutput {
        /// The name asked for.
        output: String,
    },
    /// Compiling or running on the device failed (out of memory, a kernel that does not run
    /// on the node's types, ...). After a failed step the session is unchanged and usable.
    #[error(transparent)]
    Run(#[from] RunError),
}

impl SessionError {
    /// Whether the device is lost ([`RunError::DeviceLost`]): the session is gone with it;
    /// create a new [`crate::gpu::Gpu`] and session.
    pub fn is_device_lost(&self) -> bool {
        matches!(self, SessionError::Run(e) if e.is_device_lost())
    }
}

impl From<ImportError> for SessionError {
    fn from(e: ImportError) -> Self {
        SessionError::Import(Box::new(e))
    }
}

/// Which outputs become which inputs of the next step.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Carry {
    /// Every `past → Concat → present` pair of the model ([`find_states`]).
    #[default]
    Auto,
    /// These `(output, input)` pairs, each of which must be such a concat.
    Pairs(Vec<(String, String)>),
    /// Nothing: every input is fed at every step (presents are computed as plain concats).
    None,
}

/// How a session runs.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionOptions {
    /// Memory options of the session's request (preallocation policy, pool, poison).
    pub run: RunOptions,
    /// The caches kept on the device.
    pub carry: Carry,
}

impl Default for SessionOptions {
    /// The adaptive policy, the pool on, every cache carried.
    fn default() -> Self {
        SessionOptions {
            run: RunOptions::new(Policy::Adaptive),
            carry: Carry::Auto,
        }
    }
}

/// The pairs of `carry` that `graph` keeps as states.
fn carried_states(
    graph: &crate::graph::Graph,
    carry: &Carry,
) -> Result<Vec<StateBinding>, SessionError> {
    let found = find_states(graph);
    match carry {
        Carry::Auto => Ok(found),
        Carry::None => Ok(Vec::new()),
        Carry::Pairs(pairs) => pairs
            .iter()
            .map(|(output, input)| {
                found
                    .iter()
                    .find(|s| &s.present == output && &s.past == input)
                    .cloned()
                    .ok_or_else(|| SessionError::Carry {
                        output: output.clone(),
                        input: input.clone(),
                        reason: "the output is not a concat of the input and new rows (the \
                                 KV-cache pattern the runtime appends in place)"
                            .into(),
                    })
            })
            .collect(),
    }
}

/// An imported ONNX model compiled for a device, with one stream of inferences (its own
/// memory, KV caches and predictor). Dropping it frees everything it allocated.
pub struct OnnxSession {
    request: InferRequest,
    /// The model's declared inputs (those without an initializer) and outputs, for checking
    /// feeds ([`bind_inputs_carried`]).
    signature: OnnxGraph,
    inputs: Vec<ImportedValue>,
    outputs: Vec<ImportedValue>,
    states: Vec<StateBinding>,
    /// The inputs kept on the device ([`OnnxSession::keep_input`]), for checking feeds.
    kept: Vec<(String, HostTensor)>,
}

impl std::fmt::Debug for OnnxSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnnxSession")
            .field("inputs", &self.inputs.len())
            .field("outputs", &self.outputs.len())
            .field("states", &self.states)
            .finish()
    }
}

impl OnnxSession {
    /// Loads `path` (external data from its folder), imports and compiles it (native only).
    ///
    /// # Errors
    /// [`SessionError::Load`], [`SessionError::Import`], [`SessionError::Carry`],
    /// [`SessionError::Run`] (compiling, uploading the weights); nothing stays allocated.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load(
        engine: &Engine,
        path: impl AsRef<std::path::Path>,
        options: &SessionOptions,
    ) -> Result<OnnxSession, SessionError> {
        let model = OnnxFile::load(path, &LoadOptions::default()).map_err(SessionError::Load)?;
        Self::from_model(engine, &model, options)
    }

    /// Decodes a model from `bytes`, its external data from `external` (e.g. a
    /// [`super::external::BytesResolver`] holding the files' bytes: the wasm32 way), then
    /// imports and compiles it.
    ///
    /// # Errors
    /// As [`OnnxSession::load`].
    pub fn from_bytes(
        engine: &Engine,
        bytes: Bytes,
        external: &dyn ExternalData,
        options: &SessionOptions,
    ) -> Result<OnnxSession, SessionError> {
        let model = OnnxFile::from_bytes(bytes, external, &LoadOptions::default())
            .map_err(SessionError::Load)?;
        Self::from_model(engine, &model, options)
    }

    /// Imports and compiles a loaded model.
    ///
    /// # Errors
    /// [`SessionError::Import`], [`SessionError::Carry`], [`SessionError::Run`]; nothing
    /// stays allocated.
    pub fn from_model(
        engine: &Engine,
        model: &OnnxFile,
        options: &SessionOptions,
    ) -> Result<OnnxSession, SessionError> {
        let imported = import(model)?;
        let states = carried_states(&imported.graph, &options.carry)?;
        let network = Network::compile(
            engine,
            imported.graph,
            NetworkOptions {
                states: states.clone(),
                // The session is the network's only request: room for one copy of its
                // inputs and outputs (the default keeps two, for a second request).
                inflight: 1,
                ..NetworkOptions::default()
            },
        )?;
        let request = InferRequest::new(&network, options.run)?;
        let g = &model.graph;
        let signature = OnnxGraph {
            name: g.name.clone(),
            inputs: g.runtime_inputs().cloned().collect(),
            outputs: g.outputs.clone(),
            value_info: Vec::new(),
            initializers: Vec::new(),
            sparse_initializers: Vec::new(),
            nodes: Vec::new(),
        };
        Ok(OnnxSession {
            request,
            signature,
            inputs: imported.inputs,
            outputs: imported.outputs,
            states,
            kept: Vec::new(),
        })
    }

    /// The inputs a step feeds (carried pasts may be left out), in model order.
    pub fn inputs(&self) -> &[ImportedValue] {
        &self.inputs
    }

    /// The outputs, in model order.
    pub fn outputs(&self) -> &[ImportedValue] {
        &self.outputs
    }

    /// The caches carried on the device: each present becomes its past at the next step.
    pub fn states(&self) -> &[StateBinding] {
        &self.states
    }

    /// The request's counters (allocations, reallocations, copies and their bytes,
    /// dispatches, submits...) since the session was created.
    pub fn stats(&self) -> RunStats {
        self.request.stats()
    }

    /// The engine the session allocates from (its memory counters: peak bytes per kind and
    /// region).
    pub fn engine(&self) -> &Engine {
        self.request.network().engine()
    }

    /// The underlying request (sizing summary and trace, state shapes, command logs).
    pub fn request(&self) -> &InferRequest {
        &self.request
    }

    /// Forgets the carried caches: the next step starts a new sequence (their buffers are kept
    /// for reuse).
    pub fn reset(&mut self) {
        self.request.reset_states();
    }

    /// Keeps `tensor` as input `name` on the device, like a device tensor bound with ONNX
    /// Runtime's IO binding: steps may leave the input out, and its bytes are written to the
    /// device once (by the next step) instead of at every step. A step that feeds the input
    /// replaces the kept value. Checked now, against the model and the other kept inputs
    /// (their symbolic dimensions must agree).
    ///
    /// # Errors
    /// [`SessionError::Keep`] for a carried past (the session keeps those itself);
    /// [`SessionError::Input`] naming the input when it is not one of the model's or does not
    /// fit; nothing changes then.
    pub fn keep_input(&mut self, name: &str, tensor: &HostTensor) -> Result<(), SessionError> {
        if self.states.iter().any(|s| s.past == name) {
            return Err(SessionError::Keep {
                input: name.to_string(),
                reason: "a carried past: the session keeps its rows on the device already".into(),
            });
        }
        let mut named: Vec<(String, HostTensor)> = self
            .kept
            .iter()
            .filter(|(n, _)| n != name)
            .cloned()
            .collect();
        named.push((name.to_string(), tensor.clone()));
        let others: Vec<&str> = self
            .signature
            .inputs
            .iter()
            .map(|i| i.name.as_str())
            .filter(|n| !named.iter().any(|(m, _)| m == n))
            .collect();
        bind_inputs_carried(&self.signature, &named, &others).map_err(SessionError::Input)?;
        let t = runtime_tensor(name, tensor)?;
        self.request.keep_input(name, t)?;
        self.kept = named;
        Ok(())
    }

    /// Stops keeping input `name` (steps must feed it again). Returns whether it was kept.
    pub fn release_input(&mut self, name: &str) -> bool {
        self.kept.retain(|(n, _)| n != name);
        self.request.release_input(name)
    }

    /// The inputs kept on the device ([`OnnxSession::keep_input`]).
    pub fn kept_inputs(&self) -> impl Iterator<Item = &str> {
        self.kept.iter().map(|(n, _)| n.as_str())
    }

    /// Checks `feeds` with the kept inputs they leave out against the model (the inputs in
    /// `carried` may be left out) and converts the fed ones for the runtime.
    fn feeds(
        &self,
        feeds: &[(&str, &HostTensor)],
        carried: &[&str],
    ) -> Result<Vec<(String, crate::tensor::HostTensor)>, SessionError> {
        let mut named: Vec<(String, HostTensor)> = feeds
            .iter()
            .map(|&(n, t)| (n.to_string(), t.clone()))
            .collect();
        for (n, t) in &self.kept {
            if !feeds.iter().any(|(f, _)| f == n) {
                named.push((n.clone(), t.clone()));
            }
        }
        bind_inputs_carried(&self.signature, &named, carried).map_err(SessionError::Input)?;
        named
            .into_iter()
            .take(feeds.len())
            .map(|(name, t)| {
                let r = runtime_tensor(&name, &t)?;
                Ok((name, r))
            })
            .collect()
    }

    /// Runs one step with `feeds` (every input but the carried pasts, which may be given to
    /// replace the rows held). Returns when the step's work is submitted and validated;
    /// outputs are read with [`OnnxSession::read`].
    ///
    /// # Errors
    /// [`SessionError::Input`] naming the input that does not fit (nothing runs then);
    /// [`SessionError::Run`] when the step fails on the device (the session is unchanged: its
    /// caches hold what they held before).
    pub async fn run(&mut self, feeds: &[(&str, &HostTensor)]) -> Result<(), SessionError> {
        let carried: Vec<String> = self.states.iter().map(|s| s.past.clone()).collect();
        let refs: Vec<&str> = carried.iter().map(String::as_str).collect();
        self.run_carried(feeds, &refs).await
    }

    /// [`OnnxSession::run`] where only the pasts named in `carried` may be left out (ONNX
    /// Runtime's protocol: a cache is carried only when the caller said so after the previous
    /// run; the others must be fed, and a fed past replaces the rows held).
    ///
    /// # Errors
    /// [`SessionError::Carry`] for a name in `carried` that is not a carried past; as
    /// [`OnnxSession::run`].
    pub async fn run_carried(
        &mut self,
        feeds: &[(&str, &HostTensor)],
        carried: &[&str],
    ) -> Result<(), SessionError> {
        if let Some(bad) = carried
            .iter()
            .find(|c| !self.states.iter().any(|s| s.past == **c))
        {
            return Err(SessionError::Carry {
                output: String::new(),
                input: bad.to_string(),
                reason: "not the past of a cache this session carries".into(),
            });
        }
        let tensors = self.feeds(feeds, carried)?;
        let inputs: Vec<(&str, &crate::tensor::HostTensor)> =
            tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        self.request.infer(&inputs, &[]).await?;
        // A kept input that was fed keeps the fed value (the request did the same).
        for (n, t) in &mut self.kept {
            if let Some(&(_, fed)) = feeds.iter().find(|(f, _)| f == n) {
                *t = fed.clone();
            }
        }
        Ok(())
    }

    /// Reads an output of the last step (a present included: its rows are gathered from the
    /// padded cache).
    ///
    /// # Errors
    /// [`SessionError::UnknownOutput`]; [`SessionError::Run`] when the readback fails.
    /// [`SessionError::Load`] for an output of a type ONNX does not have.
    pub async fn read(&self, output: &str) -> Result<HostTensor, SessionError> {
        if !self.outputs.iter().any(|o| o.name == output) {
            return Err(SessionError::UnknownOutput {
                output: output.to_string(),
            });
        }
        let t = self.request.read_output(output).await?;
        onnx_tensor(output, &t).map_err(SessionError::Load)
    }

    /// [`OnnxSession::run`], blocking (native only).
    ///
    /// # Errors
    /// As [`OnnxSession::run`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn run_blocking(&mut self, feeds: &[(&str, &HostTensor)]) -> Result<(), SessionError> {
        pollster::block_on(self.run(feeds))
    }

    /// [`OnnxSession::read`], blocking (native only).
    ///
    /// # Errors
    /// As [`OnnxSession::read`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_blocking(&self, output: &str) -> Result<HostTensor, SessionError> {
        pollster::block_on(self.read(output))
    }
}

/// A runtime tensor as an ONNX host tensor called `name` (the bytes are copied once).
///
/// # Errors
/// [`OnnxError::Type`] for an element type ONNX does not have (block-quantized);
/// [`OnnxError::Tensor`] when the bytes do not match the shape.
pub fn onnx_tensor(name: &str, t: &crate::tensor::HostTensor) -> Result<HostTensor, OnnxError> {
    let dtype = [
        TensorDType::F32,
        TensorDType::F16,
        TensorDType::BF16,
        TensorDType::I64,
        TensorDType::I32,
        TensorDType::U32,
        TensorDType::I8,
        TensorDType::U8,
        TensorDType::Bool,
    ]
    .into_iter()
    .find(|&o| dtype_of(o) == Some(t.dtype))
    .ok_or_else(|| OnnxError::Type {
        value: name.to_string(),
        reason: format!("{} has no ONNX element type", t.dtype),
    })?;
    HostTensor::from_bytes(dtype, t.shape.dims().to_vec(), Bytes::from(t.bytes.clone())).map_err(
        |cause| OnnxError::Tensor {
            tensor: name.to_string(),
            cause,
        },
    )
}
