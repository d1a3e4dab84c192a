//! A graph compiled for one device: the device-free plan ([`super::compile`]) plus what lives
//! on the device: the constants and the pipeline cache. See the module docs of
//! [`crate::runtime`] for the design.

use super::compile::{padded_bytes, Compiled, NetworkOptions, Role, Target};
use super::placeholders::{PlaceholderPool, RegionHighEnd};
use super::weights::{WeightCache, WeightCacheStats, WeightKey, WeightRef};
use super::RunError;
use crate::gpu::kernels::{kernel_of, Kernels, WeightLayout};
use crate::gpu::{AllocError, Buffer, BufferDesc, Engine, Frame, KindRequest};
use crate::graph::{Graph, NodeId, Op};
use crate::memory::regions::{BidirectionalAllocator, End, Region};
use crate::memory::AllocKind;
use crate::shape::DType;
use std::sync::{Arc, Mutex, MutexGuard};

/// The placeholder pool of a network family (engine buffers).
pub(crate) type Placeholders = Arc<Mutex<PlaceholderPool<Buffer>>>;

pub(crate) struct Inner {
    pub engine: Engine,
    pub compiled: Arc<Compiled>,
    /// The constants on the device (shared by every request, and by the networks
    /// specialised from this one): freed with the last of them.
    pub data: Arc<DataRegion>,
    /// Input and output slots, per inference, pooled per network (shared by the family: it
    /// may hold the data region's high end).
    pub placeholders: Placeholders,
    /// The pipeline cache, shared by the requests and the specialised networks (recording a
    /// dispatch may compile one).
    pub kernels: Arc<Mutex<Kernels>>,
}

impl Inner {
    /// The kernels (a poisoned lock only means a panic elsewhere; the cache stays consistent).
    pub fn kernels(&self) -> MutexGuard<'_, Kernels> {
        self.kernels.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The data region of a network family (the constants region, docs/design.md): device buffers
/// ("segments", each at most the device's largest buffer) holding every constant the device
/// reads, placed from the low end with the bidirectional allocator, read-only, uploaded
/// once in bounded staging chunks straight from the constants' bytes (a loader's shared
/// backing is never copied whole or expanded on the host). Where placeholders may share it
/// (see [`super::placeholders`]), the last segment keeps room at its high end for them.
pub(crate) struct DataRegion {
    engine: Engine,
    segments: Vec<Arc<Buffer>>,
    /// Per node id: `(segment, offset, size)` of a constant on the device.
    placed: Vec<Option<(usize, u64, u64)>>,
    /// The region whose constants this one reads ([`Network::compile_sharing`]): kept alive,
    /// and its bytes stay counted once, by it.
    borrowed_from: Option<Arc<DataRegion>>,
    /// The layout each weight is in and the reordered copies (`update_weights`), shared by
    /// every region over the same segments.
    weights: Arc<Mutex<WeightCache>>,
}

impl DataRegion {
    /// Where constant `id` is on the device: its segment, offset and size.
    pub fn constant(&self, id: NodeId) -> Option<(&Buffer, u64, u64)> {
        let (seg, off, size) = (*self.placed.get(id.index())?)?;
        Some((self.segments.get(seg)?, off, size))
    }

    /// The layout of constant `id`'s blocks in the data region.
    pub fn layout(&self, id: NodeId) -> WeightLayout {
        match self.placed.get(id.index()).copied().flatten() {
            Some((seg, off, _)) => self.weights().resident((seg, off)),
            None => WeightLayout::File,
        }
    }

    /// Bytes of constants held in the grouped layout in the data region.
    pub fn grouped_bytes(&self) -> u64 {
        let w = self.weights();
        self.placed
            .iter()
            .flatten()
            .filter(|(seg, off, _)| w.resident((*seg, *off)) == WeightLayout::Grouped)
            .map(|(_, _, size)| size)
            .sum()
    }

    /// Puts every weight of this region back in the file layout in the cache's record (after
    /// a conversion that failed validation: its bytes were not changed).
    #[cfg(not(target_arch = "wasm32"))]
    fn reset_layouts(&self) {
        let mut w = self.weights();
        for &(seg, off, _) in self.placed.iter().flatten() {
            w.set_resident((seg, off), WeightLayout::File);
        }
    }

    /// The reordered-weights cache (a poisoned lock only means a panic elsewhere).
    pub fn weights(&self) -> MutexGuard<'_, WeightCache> {
        self.weights.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Constant `id` (of `dtype`) as a kernel that reads layout `want` best gets it
    /// ([`WeightCache::lookup`]), recording the reorder into `frame` when needed; `None` for
    /// a node that is not a constant on the device.
    ///
    /// # Errors
    /// As [`WeightCache::lookup`].
    pub fn weight(
        &self,
        id: NodeId,
        dtype: DType,
        want: WeightLayout,
        frame: &mut Frame<'_>,
    ) -> Result<Option<WeightRef>, RunError> {
        let Some((segment, key, size)) = self.placed_weight(id) else {
            return Ok(None);
        };
        self.weights()
            .lookup(&self.engine, segment, key, size, dtype, want, frame)
            .map(Some)
    }

    /// Constant `id`'s segment, key and size in the data region.
    fn placed_weight(&self, id: NodeId) -> Option<(&Arc<Buffer>, WeightKey, u64)> {
        let (seg, off, size) = self.placed.get(id.index()).copied().flatten()?;
        Some((self.segments.get(seg)?, (seg, off), size))
    }
}

impl DataRegion {
    /// Constant `id` (of `dtype`) converted in place to layout `want`, recorded into `frame`
    /// ([`WeightCache::convert_in_place`]); `None` for a node that is not a constant on the
    /// device.
    ///
    /// # Errors
    /// As [`WeightCache::convert_in_place`].
    #[cfg(not(target_arch = "wasm32"))]
    fn convert_weight(
        &self,
        id: NodeId,
        dtype: DType,
        want: WeightLayout,
        frame: &mut Frame<'_>,
    ) -> Result<Option<WeightRef>, RunError> {
        let Some((segment, key, size)) = self.placed_weight(id) else {
            return Ok(None);
        };
        self.weights()
            .convert_in_place(&self.engine, segment, key, size, dtype, want, frame)
            .map(Some)
    }
}

/// Whether every kernel that reads constant `id` on the device takes the grouped layout:
/// it is the weight of a `linear` or `fused_linear` or the table of a `gather` (the `quant`
/// kernels) wherever it is read. Today no other kernel accepts a block-quantized input
/// (`check_kernel_dtypes` refuses it before anything is placed), so this holds for every
/// q4_0 and q5_0 constant, in this graph and in a graph that shares its weights
/// ([`Network::compile_sharing`], which reads them in the donor's layout). It is checked
/// for the graph whose weights are reordered, so that a kernel added later that reads block
/// types keeps its weights in the file layout there.
fn reads_grouped(c: &Compiled, users: &[Vec<NodeId>], id: NodeId) -> bool {
    users[id.index()].iter().all(|&u| {
        if c.node(c.pos(u)).role == Role::ShapeOnly {
            return true;
        }
        let node = c.graph.node(u);
        node.inputs.iter().enumerate().all(|(pos, &i)| {
            i != id
                || matches!((&node.op, pos), (Op::Linear(_), 1) | (Op::Gather(_), 0))
                || matches!(&node.op, Op::FusedLinear(f) if (1..=f.weights()).contains(&pos))
        })
    })
}

/// `update_weights` for the data region just uploaded: every weight that only the
/// quantized kernels read may be converted in place later ([`WeightCache`]), and those that
/// the decode kernel of this adapter class reads best in another layout than the file's
/// ([`crate::gpu::kernels::quant::QuantLayout::weight_layout`] at M = 1: q4_0 and q5_0, whose
/// file blocks are not word-aligned) are converted now, on the device, in pieces of at most
/// [`super::weights::SCRATCH_BYTES`] through one scratch buffer: the converted weight takes
/// the original's place and bytes, so device weight bytes stay those of the file. Kernels read
/// the layout from each operand ([`crate::gpu::kernels::Operand::layout`]) and specialise
/// their pipelines on it. Nothing changes when the conversion cannot be recorded or fails
/// validation: the weights then stay in their file layout. Native only: the web build
/// converts on first use, in an iteration (it cannot wait for the validation inside a
/// synchronous compile).
fn regroup_weights(engine: &Engine, c: &Compiled, data: &mut DataRegion, kernels: &mut Kernels) {
    let graph = &c.graph;
    let users = graph.users();
    let mut todo: Vec<(NodeId, DType)> = Vec::new();
    for node in &c.nodes {
        let Op::Constant(k) = &graph.node(node.id).op else {
            continue;
        };
        let Some((seg, off, _)) = data.placed.get(node.id.index()).copied().flatten() else {
            continue;
        };
        if crate::gpu::kernels::quant::can_group(k.dtype, k.data.len() as u64)
            && reads_grouped(c, &users, node.id)
        {
            data.weights().allow_conversion((seg, off));
            todo.push((node.id, k.dtype));
        }
    }
    #[cfg(target_arch = "wasm32")]
    {
        let _ = (engine, kernels, todo);
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        let class = kernels.quant_layout();
        let uniforms = crate::gpu::kernels::UniformArena::new(engine);
        let mut frame = Frame::begin(engine, kernels, uniforms, "dynrt weight reorder");
        let mut done = Vec::new();
        for (id, dtype) in todo {
            let want = class.weight_layout(1, dtype);
            if want == WeightLayout::File {
                continue;
            }
            match data.convert_weight(id, dtype, want, &mut frame) {
                Ok(Some(w)) if w.layout == want => done.push(id),
                Ok(_) => {}
                Err(_) => {
                    frame.abandon();
                    data.reset_layouts();
                    return;
                }
            }
        }
        let (submitted, _, _) = frame.submit();
        if pollster::block_on(submitted.check()).is_err() {
            data.reset_layouts();
        }
        let _ = done;
    }
}

impl Drop for DataRegion {
    fn drop(&mut self) {
        if self.borrowed_from.is_some() {
            return;
        }
        for &(_, _, size) in self.placed.iter().flatten() {
            self.engine.note_region(Region::Constants, size, false);
        }
    }
}

/// A compiled network. Cheap to clone (an `Arc`); clones share constants and the pipeline
/// cache. Create [`InferRequest`](super::InferRequest)s from it to run it.
#[derive(Clone)]
pub struct Network {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.inner.compiled;
        f.debug_struct("Network")
            .field("nodes", &c.nodes.len())
            .field("states", &c.states.len())
            .field("arena_bytes", &c.arena_bytes)
            .finish()
    }
}

/// What specialised networks share: the data region, the placeholder pool and the pipeline
/// cache.
type Shared = (Arc<DataRegion>, Placeholders, Arc<Mutex<Kernels>>);

impl Network {
    /// Compiles `graph` for `engine`'s device.
    ///
    /// # Errors
    /// [`RunError::BadState`] for a state that does not name a past input and a concat of it;
    /// [`RunError::Graph`] when static shape inference fails; [`RunError::UnsupportedDType`]
    /// for a node whose kernel does not run on its element types (named);
    /// [`RunError::Alloc`] when the constants cannot be uploaded; [`RunError::Plan`] when the
    /// static plan fails.
    pub fn compile(
        engine: &Engine,
        graph: Graph,
        options: NetworkOptions,
    ) -> Result<Network, RunError> {
        let gpu = engine.gpu();
        gpu.check_alive()?;
        Self::compile_inner(engine, graph, options, None).map_err(|e| e.or_lost(gpu))
    }

    /// The same graph compiled again with other options (typically other fixed symbols: a
    /// prefill network with `seq = P, past = 0` beside a decode network with `seq = 1`),
    /// sharing this network's device constants and pipeline cache: nothing is uploaded twice.
    /// A request's KV cache moves between such siblings with
    /// [`InferRequest::take_states`](super::InferRequest::take_states) and
    /// [`InferRequest::put_states`](super::InferRequest::put_states).
    ///
    /// # Errors
    /// As [`Network::compile`].
    pub fn specialize(&self, options: NetworkOptions) -> Result<Network, RunError> {
        self.inner.engine.gpu().check_alive()?;
        let shared = (
            Arc::clone(&self.inner.data),
            Arc::clone(&self.inner.placeholders),
            Arc::clone(&self.inner.kernels),
        );
        Self::compile_inner(
            &self.inner.engine,
            self.inner.compiled.graph.clone(),
            options,
            Some(shared),
        )
    }

    /// Compiles another graph over the same weights: every constant the device reads in
    /// `graph` must be a constant of this network with the same label, type and bytes, and
    /// reads this network's copy (nothing is uploaded again; the weights are counted once).
    /// The pipeline cache and the placeholder pool are shared too. A model's batched network
    /// over a paged KV cache ([`crate::llm::BatchEngine`]) reads the weights of its single-session
    /// networks this way.
    ///
    /// # Errors
    /// [`RunError::Plan`] naming a constant this network does not hold on the device; the
    /// errors of [`Network::compile`].
    pub fn compile_sharing(
        &self,
        graph: Graph,
        options: NetworkOptions,
    ) -> Result<Network, RunError> {
        let engine = &self.inner.engine;
        engine.gpu().check_alive()?;
        let target = target(
            engine,
            options.io_kind.unwrap_or(self.inner.compiled.io_kind),
        );
        // Rewritten as the donor's graph was (its fused constants are the ones shared).
        let graph = if options.fuse {
            fuse(&graph, &options)?
        } else {
            graph
        };
        let compiled = Compiled::build(graph, &options, target)?;
        check_kernel_dtypes(&compiled)?;
        let (donor, new) = (&self.inner.compiled.graph, &compiled.graph);
        let users = new.users();
        let mut placed = vec![None; new.len()];
        for node in &compiled.nodes {
            let gn = new.node(node.id);
            let Op::Constant(k) = &gn.op else {
                continue;
            };
            let on_device = users[node.id.index()]
                .iter()
                .any(|u| compiled.node(compiled.pos(*u)).role != Role::ShapeOnly);
            if !on_device {
                continue;
            }
            let held = donor
                .find(&gn.label)
                .and_then(|at| match &donor.node(at).op {
                    Op::Constant(d)
                        if d.dtype == k.dtype && same_bytes(d.data.bytes(), k.data.bytes()) =>
                    {
                        self.inner.data.placed.get(at.index()).copied().flatten()
                    }
                    _ => None,
                });
            placed[node.id.index()] = Some(held.ok_or_else(|| {
                RunError::Plan(format!(
                    "constant `{}` is not on the device in the network whose weights are shared",
                    gn.label
                ))
            })?);
        }
        let data = DataRegion {
            engine: engine.clone(),
            segments: self.inner.data.segments.clone(),
            placed,
            borrowed_from: Some(Arc::clone(&self.inner.data)),
            weights: Arc::clone(&self.inner.data.weights),
        };
        Ok(Network {
            inner: Arc::new(Inner {
                engine: engine.clone(),
                compiled: Arc::new(compiled),
                data: Arc::new(data),
                placeholders: Arc::clone(&self.inner.placeholders),
                kernels: Arc::clone(&self.inner.kernels),
            }),
        })
    }

    fn compile_inner(
        engine: &Engine,
        graph: Graph,
        options: NetworkOptions,
        shared: Option<Shared>,
    ) -> Result<Network, RunError> {
        let gpu = engine.gpu();
        // The reference kind rule: memory the host locks goes to usm_shared where the adapter
        // maps storage buffers; kernels bind inputs and outputs, so where it cannot, they are
        // usm_device with staging (usm_host is not bindable on wgpu).
        let io_kind = options.io_kind.unwrap_or_else(|| {
            engine.preferred_kind(&KindRequest {
                host_access: true,
                kernel_access: true,
                kernel_io_bytes: 0,
            })
        });
        let target = target(engine, io_kind);
        // A specialised network compiles its parent's graph, already rewritten (the constants
        // they share are placed by node id).
        let graph = if options.fuse && shared.is_none() {
            fuse(&graph, &options)?
        } else {
            graph
        };
        let compiled = Compiled::build(graph, &options, target)?;
        check_kernel_dtypes(&compiled)?;
        let (data, placeholders, kernels) = match shared {
            Some(shared) => shared,
            None => {
                let (mut data, region) = build_data_region(
                    engine,
                    &compiled,
                    options.inflight,
                    options.weight_copies_bytes,
                )?;
                let mut kernels = Kernels::new(gpu);
                if let Some(class) = options.kernels {
                    kernels.set_quant_layout(class);
                }
                if options.regroup_weights {
                    regroup_weights(engine, &compiled, &mut data, &mut kernels);
                }
                let pool = PlaceholderPool::new(
                    region,
                    AllocKind::UsmDevice,
                    target.align_bytes,
                    options.inflight,
                );
                (
                    Arc::new(data),
                    Arc::new(Mutex::new(pool)),
                    Arc::new(Mutex::new(kernels)),
                )
            }
        };
        Ok(Network {
            inner: Arc::new(Inner {
                engine: engine.clone(),
                compiled: Arc::new(compiled),
                data,
                placeholders,
                kernels,
            }),
        })
    }

    /// Bytes of this network's weights the device holds in the grouped layout of their
    /// formats in the data region ([`NetworkOptions::regroup_weights`]): reordered in place
    /// of the file's blocks.
    pub fn grouped_weight_bytes(&self) -> u64 {
        self.inner.data.grouped_bytes()
    }

    /// The counters of the family's reordered-weights cache (`update_weights`: the copies
    /// of weights in the layouts the kernels read, and the conversions in place).
    pub fn weight_cache_stats(&self) -> WeightCacheStats {
        self.inner.data.weights().stats()
    }

    /// The graph.
    pub fn graph(&self) -> &Graph {
        &self.inner.compiled.graph
    }

    /// The engine the network allocates from.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// Kind of the network's inputs and outputs (`usm_shared` or `usm_device`).
    pub fn io_kind(&self) -> AllocKind {
        self.inner.compiled.io_kind
    }

    /// Bytes of the static arena each request allocates (0 when nothing was planned).
    pub fn arena_bytes(&self) -> u64 {
        self.inner.compiled.arena_bytes
    }

    /// Nodes whose shapes are known at compile time (planned or pooled at request creation).
    pub fn static_nodes(&self) -> usize {
        self.inner
            .compiled
            .nodes
            .iter()
            .filter(|c| {
                c.static_shape.is_some()
                    && matches!(c.role, Role::Kernel | Role::Copy | Role::ConcatCopy)
            })
            .count()
    }

    /// Sizes in bytes of the buffers of the network family's data region (the constants,
    /// and where they share it the placeholders' room): each at most the device's
    /// `max_buffer_size`, so a model larger than one buffer takes several.
    pub fn data_region_buffers(&self) -> Vec<u64> {
        self.inner
            .data
            .segments
            .iter()
            .map(|b| b.size_bytes())
            .collect()
    }

    /// Placeholder pool counters of the network family: `(slots created, slots reused, slots
    /// that would have collided with the constants in the data region)`.
    pub fn placeholder_counts(&self) -> (u64, u64, u64) {
        let p = self
            .inner
            .placeholders
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .counts();
        (p.created, p.reused, p.collisions)
    }

    /// Pipeline cache counters `(hits, misses)` of this network (shared by its requests and
    /// its specialisations).
    pub fn pipeline_cache_counts(&self) -> (u64, u64) {
        let s = self.inner.kernels().stats();
        (s.hits, s.misses)
    }
}

/// `graph` rewritten by [`crate::graph::fuse::fuse_with_states`] with the states of `options`.
fn fuse(graph: &Graph, options: &NetworkOptions) -> Result<Graph, RunError> {
    let states: Vec<(String, String)> = options
        .states
        .iter()
        .map(|s| (s.past.clone(), s.present.clone()))
        .collect();
    Ok(crate::graph::fuse::fuse_with_states(graph, &states)?.0)
}

/// Every node the device computes must have a kernel for its element types (never float
/// maths on integer bits): refused here, naming the node, before anything is allocated.
/// The device facts compiling needs, for networks of `engine` whose inputs and outputs are
/// `io_kind`.
fn target(engine: &Engine, io_kind: AllocKind) -> Target {
    Target {
        align_bytes: u64::from(engine.gpu().limits().min_storage_buffer_offset_alignment).max(4),
        io_kind,
        reads_strided: |op, i| kernel_of(op).is_some_and(|k| k.reads_strided(i)),
    }
}

/// Whether two constants hold the same bytes: the same range of one backing (a model's
/// memory map) without reading it, else compared.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    (a.as_ptr() == b.as_ptr() && a.len() == b.len()) || a == b
}

fn check_kernel_dtypes(c: &Compiled) -> Result<(), RunError> {
    let graph = &c.graph;
    for node in &c.nodes {
        let n = graph.node(node.id);
        let inputs: Vec<DType> = n.inputs.iter().map(|i| graph.node(*i).dtype).collect();
        let refused = |reason: &'static str| RunError::UnsupportedDType {
            node: n.label.clone(),
            op: n.op.name(),
            inputs: inputs.clone(),
            output: n.dtype,
            reason,
        };
        match node.role {
            Role::Kernel => {
                let kernel = kernel_of(&n.op).ok_or_else(|| refused("a kernel"))?;
                kernel.check_dtypes(&inputs, n.dtype).map_err(refused)?;
            }
            // Byte copies; the fallback when source and destination share a buffer is the
            // whole-word copy of the views (any plain type) or the concat's own kernel.
            Role::Copy if n.dtype.bits().is_none() => {
                return Err(refused(
                    "a plain (not block-quantized) type for a device copy",
                ));
            }
            Role::ConcatCopy => {
                let kernel = kernel_of(&n.op).ok_or_else(|| refused("a kernel"))?;
                kernel.check_dtypes(&inputs, n.dtype).map_err(refused)?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Places and uploads the constants the device reads (see [`DataRegion`]). When the network's
/// inputs and outputs are device memory (no `MAPPABLE_PRIMARY_BUFFERS`: GL, the web), the
/// last segment also keeps `inflight` copies' worth of the static inputs and outputs at its
/// high end for the placeholder pool, which it returns with the segment's allocator.
fn build_data_region(
    engine: &Engine,
    c: &Compiled,
    inflight: usize,
    copies_bytes: Option<u64>,
) -> Result<(DataRegion, RegionHighEnd<Buffer>), RunError> {
    let graph = &c.graph;
    let gpu = engine.gpu();
    let align = u64::from(gpu.limits().min_storage_buffer_offset_alignment).max(4);
    let max_seg = engine.max_buffer_size();
    let alloc_err = |what: String| {
        move |source| RunError::Alloc {
            what,
            cause: source,
        }
    };
    let users = graph.users();
    // Constants read on the device (not only as shape data), in processing order.
    let mut wanted: Vec<(NodeId, u64)> = Vec::new();
    for node in &c.nodes {
        if node.role != Role::Constant {
            continue;
        }
        let on_device = users[node.id.index()]
            .iter()
            .any(|u| c.node(c.pos(*u)).role != Role::ShapeOnly);
        if let (true, Op::Constant(k)) = (on_device, &graph.node(node.id).op) {
            wanted.push((node.id, (k.data.len() as u64).div_ceil(4).max(1) * 4));
        }
    }
    // Placeholders may share the region where they are plain device memory.
    let mut reserve = 0u64;
    if c.io_kind == AllocKind::UsmDevice {
        for node in &c.nodes {
            let io = node.is_output || matches!(node.role, Role::Input { state: None });
            let state = matches!(
                node.role,
                Role::StateConcat { .. } | Role::StateScatter { .. }
            );
            if let (true, false, Some(shape)) = (io, state, &node.static_shape) {
                let b = padded_bytes(shape, node.dtype)?.max(4);
                reserve = reserve.saturating_add(b.div_ceil(align) * align);
            }
        }
        reserve = reserve.saturating_mul(inflight as u64);
    }
    // Pack into segments of at most the largest buffer.
    let mut segs: Vec<BidirectionalAllocator> = Vec::new();
    let mut placed: Vec<Option<(usize, u64, u64)>> = (0..graph.len()).map(|_| None).collect();
    // Kernels bind a constant whole: one larger than a storage binding could be placed but
    // never read, so it is refused here, before anything is allocated (the browser's default
    // `maxStorageBufferBindingSize` is 128 MiB, half its default `maxBufferSize`).
    let max_binding = gpu.limits().max_storage_buffer_binding_size;
    // The weights a kernel binds as one range (a KV split's three) go side by side, in one
    // segment: each group is placed where its first member comes.
    let size_of: std::collections::HashMap<NodeId, u64> = wanted.iter().copied().collect();
    let mut group_of: std::collections::HashMap<NodeId, Vec<NodeId>> =
        std::collections::HashMap::new();
    for node in &c.nodes {
        if let Op::FusedLinear(f) = &graph.node(node.id).op {
            let ws = &graph.node(node.id).inputs[1..1 + f.weights()];
            if ws.len() > 1 && ws.iter().all(|w| size_of.contains_key(w)) {
                for &w in ws {
                    group_of.entry(w).or_insert_with(|| ws.to_vec());
                }
            }
        }
    }
    for &(first, _) in &wanted {
        if placed[first.index()].is_some() {
            continue;
        }
        let members = group_of
            .get(&first)
            .filter(|g| g.iter().all(|m| placed[m.index()].is_none()))
            .cloned()
            .unwrap_or_else(|| vec![first]);
        let sizes: Vec<u64> = members.iter().map(|m| size_of[m]).collect();
        // Each member aligned within the group, the group bound as one range.
        let group_bytes = sizes
            .iter()
            .map(|&sz| sz.div_ceil(align) * align)
            .sum::<u64>();
        let (id, size) = match members[..] {
            [one] => (one, size_of[&one]),
            _ => (first, group_bytes),
        };
        let too_large = if size > max_seg {
            Some(AllocError::TooLarge {
                requested_bytes: size,
                max_bytes: max_seg,
            })
        } else if size > max_binding {
            Some(AllocError::BindingTooLarge {
                size_bytes: size,
                max_bytes: max_binding,
            })
        } else {
            None
        };
        if let Some(source) = too_large {
            return Err(RunError::Alloc {
                what: format!("constant `{}`", graph.node(id).label),
                cause: source,
            });
        }
        let fits = segs
            .last_mut()
            .and_then(|a| a.allocate(End::Low, size, align).ok());
        let offset = match fits {
            Some(o) => o,
            None => {
                let mut a = BidirectionalAllocator::new(max_seg);
                let o = a
                    .allocate(End::Low, size, align)
                    .map_err(|e| RunError::Plan(e.to_string()))?;
                segs.push(a);
                o
            }
        };
        let mut at = offset;
        for (&m, &sz) in members.iter().zip(&sizes) {
            placed[m.index()] = Some((segs.len() - 1, at, sz));
            at += sz.div_ceil(align) * align;
        }
    }
    let last_low = segs.last().map_or(0, |a| a.frontiers().0);
    let share = reserve > 0 && last_low.saturating_add(reserve) <= max_seg;
    if share && segs.is_empty() {
        segs.push(BidirectionalAllocator::new(max_seg));
    }
    let kind = engine.preferred_kind(&KindRequest {
        host_access: false,
        kernel_access: true,
        kernel_io_bytes: 0,
    });
    let mut segments = Vec::with_capacity(segs.len());
    let n_segs = segs.len();
    let mut region = None;
    for (i, a) in segs.iter().enumerate() {
        let low = a.frontiers().0.div_ceil(4).max(1) * 4;
        // Placeholders are aligned from the top down: the region's end is aligned too, so
        // the reserve holds its full count of slots.
        let size = if share && i + 1 == n_segs {
            low.div_ceil(align) * align + reserve
        } else {
            low
        };
        let buf = engine
            .allocate(&BufferDesc {
                label: "dynrt data region",
                size_bytes: size,
                kind,
            })
            .map_err(alloc_err("data region".into()))?;
        let buf = Arc::new(buf);
        if share && i + 1 == n_segs {
            // The same constants at the low end, the rest for placeholders.
            let mut shared = BidirectionalAllocator::new(buf.size_bytes());
            if low > 0 {
                shared
                    .allocate(End::Low, a.frontiers().0.max(1), 1)
                    .map_err(|e| RunError::Plan(e.to_string()))?;
            }
            region = Some((Arc::clone(&buf), shared));
        }
        segments.push(buf);
    }
    let constant_bytes: u64 = placed.iter().flatten().map(|(_, _, size)| size).sum();
    let budget = copies_bytes.unwrap_or(constant_bytes / 10);
    let data = DataRegion {
        engine: engine.clone(),
        segments,
        placed,
        borrowed_from: None,
        weights: Arc::new(Mutex::new(WeightCache::new(budget))),
    };
    // Upload: each constant's bytes straight from its (possibly shared) backing, through
    // the engine's bounded staging chunks; only a ragged tail is copied to pad it to 4.
    for &(id, _) in &wanted {
        let Some((seg, off, size)) = data.placed[id.index()] else {
            continue;
        };
        let Op::Constant(k) = &graph.node(id).op else {
            continue;
        };
        let label = &graph.node(id).label;
        let bytes = k.data.bytes();
        let whole = bytes.len() / 4 * 4;
        let buf = &data.segments[seg];
        engine
            .write(buf, off, &bytes[..whole])
            .map_err(alloc_err(format!("constant `{label}`")))?;
        if whole < bytes.len() || bytes.is_empty() {
            let mut tail = bytes[whole..].to_vec();
            tail.resize(4, 0);
            engine
                .write(buf, off + whole as u64, &tail)
                .map_err(alloc_err(format!("constant `{label}`")))?;
        }
        engine.note_region(Region::Constants, size, true);
    }
    Ok((data, region))
}
