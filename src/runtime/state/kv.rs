//! The KV-cache states of a request: the rows each holds, the buffer they are in and its
//! layout, the growth of this iteration (a larger buffer the past is copied into), the copies
//! of an in-place append, and the states' hand-over between requests. Device-free like the
//! rest of the request state.
//!
//! # Layout: a padded growing axis
//!
//! A state grows along the axis of its concat (`axis`): axis 0 for a `[t, dim]` cache, axis
//! 2 for the `[batch, heads, t, head_dim]` caches exported models write. Its buffer holds the
//! state's shape with that axis replaced by the buffer's *capacity* in rows (`[batch, heads,
//! capacity, head_dim]`), row-major, so every tensor of the state is a strided view of the
//! buffer: the element at `(b, h, t, d)` is at element
//! `((b * heads + h) * capacity + t) * head_dim + d`. Seen along the axis the buffer is `outer` blocks (the product of the dimensions
//! before the axis) of `capacity` rows of `block_bytes` (the product of the dimensions after
//! it, times the element size). An append writes the new rows at row `t` of each block (one
//! copy per block, only the new bytes); a growth copies the `t` rows of each block once into
//! the larger buffer. For axis 0 (`outer` = 1) both are one copy and the layout is
//! contiguous whatever the capacity.
//!
//! The capacity is what the sizer reserved: `reserved_bytes / (outer * block_bytes)` rows
//! (the predictor's look-ahead, e.g. `[1, 3, t + 10, 64]` under the openvino policy).

use super::{RequestState, Storage};
use crate::graph::{ops, Dim, Op};
use crate::memory::predictor::{Policy, Sizer};
use crate::memory::AllocKind;
use crate::runtime::compile::padded_bytes;
use crate::runtime::RunError;
use crate::shape::{DType, Shape};
use std::sync::Arc;

/// One KV-cache state of a request.
pub(crate) struct StateSlot<B> {
    /// Holds the past rows; `None` before the first append.
    pub buffer: Option<B>,
    /// Shape of the past tensor (its extent along `axis` is the rows held).
    pub shape: Shape,
    /// The growing axis.
    pub axis: usize,
    /// Element type.
    pub dtype: DType,
    /// A larger buffer allocated this iteration; the past is copied into it in order.
    pub grown: Option<B>,
    /// Rows this iteration appends.
    pub append_rows: u64,
    /// Shape after this iteration.
    pub next_shape: Shape,
    /// The past given by the caller this iteration (row-major bytes of `shape`): written into
    /// the buffer the state is in after this iteration before the submit, replacing the
    /// rows it held (so nothing is copied from the old buffer).
    pub upload: Option<Vec<u8>>,
    /// The shape held before `upload` replaced it or rows were dropped (restored when the
    /// iteration fails).
    pub restore: Option<Shape>,
    /// Oldest rows dropped since the last iteration ([`RequestState::drop_state_front`]):
    /// the buffer still holds them before the kept rows until the next iteration copies the
    /// kept rows into a new buffer.
    pub drop_front: u64,
}

/// One buffer copy, in bytes: `(source offset, destination offset, size)`.
pub(crate) type CopyRange = (u64, u64, u64);

/// Products of the dimensions before and after `axis`.
fn around(shape: &Shape, axis: usize) -> (u64, u64) {
    let d = shape.dims();
    let outer = d[..axis.min(d.len())].iter().product();
    let inner = d.get(axis + 1..).map_or(1, |r| r.iter().product());
    (outer, inner)
}

/// Appends `(src, dst, size)`, merging it into the previous copy when both ranges continue it.
fn push_merged(v: &mut Vec<CopyRange>, c: CopyRange) {
    if c.2 == 0 {
        return;
    }
    if let Some(last) = v.last_mut() {
        if last.0 + last.2 == c.0 && last.1 + last.2 == c.1 {
            last.2 += c.2;
            return;
        }
    }
    v.push(c);
}

impl<B> StateSlot<B> {
    /// The buffer the state is in after this iteration.
    pub fn current(&self) -> Option<&B> {
        self.grown.as_ref().or(self.buffer.as_ref())
    }

    /// The buffer the past is read from this iteration: the one it is in, or, when the
    /// caller gave it or rows were dropped, the one it is written (copied) into.
    pub fn past_buffer(&self) -> Option<&B> {
        if self.upload.is_some() || self.drop_front > 0 {
            self.current()
        } else {
            self.buffer.as_ref()
        }
    }

    /// Rows held (the past's extent along the axis).
    pub fn rows(&self) -> u64 {
        self.shape.dims().get(self.axis).copied().unwrap_or(0)
    }

    /// `(outer blocks, bytes per row of a block)` of the state's layout.
    pub fn blocks(&self) -> (u64, u64) {
        let (outer, inner) = around(&self.next_shape, self.axis);
        (
            outer,
            inner * self.dtype.bits().map_or(4, |b| u64::from(b).div_ceil(8)),
        )
    }

    /// Rows a buffer of `size_bytes` holds per block.
    pub fn capacity_rows(&self, size_bytes: u64) -> u64 {
        let (outer, row) = self.blocks();
        match outer.checked_mul(row) {
            Some(0) | None => 0,
            Some(per_row) => size_bytes / per_row,
        }
    }

    /// Element strides of `shape` (one of the state's tensors: the past or the present) in a
    /// buffer of `size_bytes`: row-major over the shape with the axis extent replaced by the
    /// buffer's capacity.
    pub fn strides(&self, shape: &Shape, size_bytes: u64) -> Vec<u64> {
        let mut dims = shape.dims().to_vec();
        if let Some(d) = dims.get_mut(self.axis) {
            *d = self.capacity_rows(size_bytes).max(*d);
        }
        let mut st = vec![1u64; dims.len()];
        for i in (0..dims.len().saturating_sub(1)).rev() {
            st[i] = st[i + 1].saturating_mul(dims[i + 1]);
        }
        st
    }

    /// The copies of this iteration's in-place concat, given the byte sizes of `buffer` and
    /// of the buffer the state is in after it: the growth (each block's past rows from
    /// `buffer` into `grown`, after the rows dropped; none when the past was uploaded) and
    /// the append (each block's
    /// new rows, contiguous in their tensor, into their place after the past).
    pub fn copies(&self, old_bytes: u64, current_bytes: u64) -> (Vec<CopyRange>, Vec<CopyRange>) {
        let (outer, row) = self.blocks();
        let rows = self.rows();
        let (cap_old, cap_new) = (
            self.capacity_rows(old_bytes),
            self.capacity_rows(current_bytes),
        );
        let mut growth = Vec::new();
        if self.grown.is_some() && self.buffer.is_some() && self.upload.is_none() {
            // Dropped rows stay behind: each block's kept rows start `drop_front` rows in.
            for o in 0..outer {
                push_merged(
                    &mut growth,
                    (
                        (o * cap_old + self.drop_front) * row,
                        o * cap_new * row,
                        rows * row,
                    ),
                );
            }
        }
        let mut append = Vec::new();
        let n = self.append_rows;
        for o in 0..outer {
            push_merged(
                &mut append,
                (o * n * row, (o * cap_new + rows) * row, n * row),
            );
        }
        (growth, append)
    }

    /// The writes of an uploaded past into the buffer the state is in after this iteration
    /// (of `current_bytes`): `(offset in the upload, offset in the buffer, size)` per block.
    pub fn upload_writes(&self, current_bytes: u64) -> Vec<CopyRange> {
        let (outer, row) = self.blocks();
        let rows = self.rows();
        let cap = self.capacity_rows(current_bytes);
        let mut w = Vec::new();
        for o in 0..outer {
            push_merged(&mut w, (o * rows * row, o * cap * row, rows * row));
        }
        w
    }
}

/// The strides of a view op's output from its input's strides (a transpose permutes them),
/// or `None` for an op that is not a strided view.
pub(crate) fn view_strides(op: &Op, input: &[u64]) -> Option<Vec<u64>> {
    match op {
        Op::Transpose(ops::Transpose { perm }) => {
            perm.iter().map(|&p| input.get(p).copied()).collect()
        }
        _ => None,
    }
}

/// The elements of a strided view, row-major: `data` holds the view's span from its first
/// element, each element `elem_bytes` long at `sum(index * stride)` elements.
pub(crate) fn compact(data: &[u8], shape: &Shape, strides: &[u64], elem_bytes: u64) -> Vec<u8> {
    let n = shape.checked_num_elements().unwrap_or(0);
    let e = elem_bytes as usize;
    let mut out = Vec::with_capacity(n as usize * e);
    let dims = shape.dims();
    let mut index = vec![0u64; dims.len()];
    for _ in 0..n {
        let at = index.iter().zip(strides).map(|(i, s)| i * s).sum::<u64>() as usize * e;
        out.extend_from_slice(data.get(at..at + e).unwrap_or(&[0u8; 16][..e.min(16)]));
        for a in (0..dims.len()).rev() {
            index[a] += 1;
            if index[a] < dims[a] {
                break;
            }
            index[a] = 0;
        }
    }
    out
}

/// One KV-cache tensor moving between requests: its buffer and the past it holds.
pub(crate) struct MovedState<B> {
    pub buffer: Option<B>,
    pub shape: Shape,
}

impl<S: Storage + Clone> RequestState<S> {
    /// The shape of the rows state `s` appends this iteration: its past's with the growing
    /// axis' extent the rows appended.
    pub fn kv_rows_shape(&self, s: usize) -> Shape {
        let st = &self.states[s];
        let mut dims = st.shape.dims().to_vec();
        if let Some(d) = dims.get_mut(st.axis) {
            *d = st.append_rows;
        }
        Shape(dims)
    }

    /// Rows currently held by each state.
    pub fn state_shapes(&self) -> Vec<Shape> {
        self.states.iter().map(|s| s.shape.clone()).collect()
    }

    /// The declared dimensions of state `s`'s past input.
    fn declared(&self, s: usize) -> &[Dim] {
        let c = &self.compiled;
        match &c.graph.node(c.states[s].past).op {
            Op::Input(ops::Input { dims, .. }) => dims,
            _ => &[],
        }
    }

    /// Bytes reserved by the states' buffers (each at least its valid rows).
    pub fn state_reserved_bytes(&self) -> u64 {
        self.states
            .iter()
            .filter_map(|s| s.buffer.as_ref().map(S::size_bytes))
            .sum()
    }

    /// Takes the KV cache out with the sizer that sized it (the state then starts a new
    /// sequence, with a fresh sizer).
    pub fn take_states(&mut self) -> (Vec<MovedState<S::Buffer>>, Sizer) {
        // A drop not run yet is undone: the rows are still in the buffer.
        for st in &mut self.states {
            if st.drop_front > 0 {
                if let Some(shape) = st.restore.take() {
                    st.shape = shape;
                }
                st.drop_front = 0;
            }
        }
        let sizer = std::mem::replace(&mut self.sizer, Self::fresh_sizer(&self.options));
        let leaving: Vec<u64> = self
            .states
            .iter()
            .filter_map(|s| s.buffer.as_ref().map(S::id))
            .collect();
        self.freed.extend(leaving);
        let states = self
            .states
            .iter_mut()
            .map(|s| {
                let shape = s.shape.clone();
                if let Some(d) = s.shape.0.get_mut(s.axis) {
                    *d = 0;
                }
                s.next_shape = s.shape.clone();
                MovedState {
                    buffer: s.buffer.take(),
                    shape,
                }
            })
            .collect();
        (states, sizer)
    }

    /// Continues the sequence held in `states` (from [`RequestState::take_states`]). A request state
    /// that has not sized anything yet adopts the sequence's `sizer` (its predictor history,
    /// ledger, summary and trace continue); one that has keeps its own and records the
    /// states' buffers in its ledger.
    ///
    /// # Errors
    /// [`RunError::BadState`] when the number of states differs or a state's shape does not
    /// fit its past's declaration; the state is unchanged then.
    pub fn put_states(
        &mut self,
        states: Vec<MovedState<S::Buffer>>,
        sizer: Sizer,
    ) -> Result<(), RunError> {
        let c = Arc::clone(&self.compiled);
        let bad = |i: usize, reason: String| {
            let s = &c.states[i.min(c.states.len().saturating_sub(1))];
            RunError::BadState {
                past: c.graph.node(s.past).label.clone(),
                present: c.graph.node(s.present).label.clone(),
                reason,
            }
        };
        if states.len() != self.states.len() || self.states.is_empty() {
            return Err(bad(
                0,
                format!(
                    "{} states given, the network has {}",
                    states.len(),
                    self.states.len()
                ),
            ));
        }
        for (i, (given, mine)) in states.iter().zip(&self.states).enumerate() {
            let declared = self.declared(i);
            let fits = given.shape.rank() == declared.len()
                && declared.iter().zip(given.shape.dims()).enumerate().all(
                    |(a, (d, &v))| match d {
                        Dim::Fixed(f) => *f == v,
                        Dim::Sym(s) => a == mine.axis || c.fixed(s).is_none_or(|f| f == v),
                    },
                );
            if !fits {
                return Err(bad(
                    i,
                    format!(
                        "a past of shape {} does not fit {}",
                        given.shape, mine.shape
                    ),
                ));
            }
        }
        let replaced: Vec<u64> = self
            .states
            .iter()
            .filter_map(|s| s.buffer.as_ref().map(S::id))
            .collect();
        self.freed.extend(replaced);
        let adopt = self.sizer.summary().rows == 0;
        for (si, (given, mine)) in states.into_iter().zip(&mut self.states).enumerate() {
            if !adopt {
                let present = &c.graph.node(c.states[si].present).label;
                let capacity = given.buffer.as_ref().map_or(0, |b| S::size_bytes(b));
                let held = given.shape.size_bytes(mine.dtype)?;
                self.sizer.correct(present, &given.shape, held, capacity)?;
            }
            mine.buffer = given.buffer;
            mine.shape = given.shape;
            mine.next_shape = mine.shape.clone();
        }
        if adopt {
            self.sizer = sizer;
        }
        Ok(())
    }

    /// Drops the oldest `rows` rows of state `s` (a sliding-window cache keeps only the keys
    /// its window still sees): from now on the state holds `rows` fewer, and the next
    /// iteration copies the kept rows into a new buffer sized by the sizer, the old one
    /// freed after it: never more than one layer's cache twice, and no device work until
    /// then. Only for states whose past is read by nothing but its concat (the in-place
    /// append), as a KV cache is.
    ///
    /// # Errors
    /// [`RunError::BadState`] for a state that does not exist or holds fewer rows; nothing
    /// changes then.
    pub fn drop_state_front(&mut self, s: usize, rows: u64) -> Result<(), RunError> {
        let held = self.states.get(s).map(StateSlot::rows);
        let Some(held) = held.filter(|&h| h >= rows) else {
            return Err(self.bad_state(
                s,
                format!(
                    "cannot drop {rows} rows: the state holds {}",
                    held.map_or("no rows (there is no such state)".into(), |h| h.to_string())
                ),
            ));
        };
        if rows == 0 {
            return Ok(());
        }
        let st = &mut self.states[s];
        if st.restore.is_none() {
            st.restore = Some(st.shape.clone());
        }
        st.shape.0[st.axis] = held - rows;
        st.next_shape = st.shape.clone();
        st.drop_front += rows;
        Ok(())
    }

    /// Forgets the newest `rows` rows of every state (a rolled-back step). Checked for every
    /// state before any changes.
    ///
    /// # Errors
    /// [`RunError::BadState`] for a state that holds fewer rows, or one written in place (a
    /// pool whose shape never changes); nothing changes then.
    pub fn drop_rows_back(&mut self, rows: u64) -> Result<(), RunError> {
        for (s, st) in self.states.iter().enumerate() {
            if self.compiled.states[s].in_place {
                return Err(self.bad_state(s, "written in place: it has no newest rows".into()));
            }
            if st.rows() < rows {
                return Err(self.bad_state(
                    s,
                    format!(
                        "cannot roll back {rows} rows: the state holds {}",
                        st.rows()
                    ),
                ));
            }
        }
        if rows == 0 {
            return Ok(());
        }
        for st in &mut self.states {
            let held = st.rows();
            st.shape.0[st.axis] = held - rows;
            st.next_shape = st.shape.clone();
        }
        Ok(())
    }

    /// [`RunError::BadState`] for state `s` (named by its labels when it exists).
    fn bad_state(&self, s: usize, reason: String) -> RunError {
        let c = &self.compiled;
        let (past, present) = c.states.get(s).map_or_else(
            || (format!("state {s}"), String::new()),
            |st| {
                (
                    c.graph.node(st.past).label.clone(),
                    c.graph.node(st.present).label.clone(),
                )
            },
        );
        RunError::BadState {
            past,
            present,
            reason,
        }
    }

    /// The buffer of state `s` and the byte range `(offset, bytes)` of its rows
    /// `first..first + rows`, for a state whose rows are contiguous (grown along its first
    /// axis) and held in its buffer now (not waiting for this iteration's growth or drop).
    ///
    /// # Errors
    /// [`RunError::BadState`] for no such state, a state without a buffer, with rows in
    /// blocks, a growth or drop pending, or rows past those it holds.
    pub fn state_rows(
        &self,
        s: usize,
        first: u64,
        rows: u64,
    ) -> Result<(&S::Buffer, u64, u64), RunError> {
        let st = self
            .states
            .get(s)
            .ok_or_else(|| self.bad_state(s, "there is no such state".into()))?;
        let buffer = match &st.buffer {
            Some(b) if st.grown.is_none() && st.drop_front == 0 && st.upload.is_none() => b,
            Some(_) => {
                return Err(self.bad_state(s, "its buffer changes at the next iteration".into()))
            }
            None => return Err(self.bad_state(s, "it has no buffer yet".into())),
        };
        let (outer, row) = st.blocks();
        if outer != 1 {
            return Err(self.bad_state(s, format!("its rows lie in {outer} blocks")));
        }
        match first.checked_add(rows) {
            Some(end) if end <= st.rows() => Ok((buffer, first * row, rows * row)),
            _ => Err(self.bad_state(
                s,
                format!(
                    "rows {first}..{first}+{rows} are past the {} it holds",
                    st.rows()
                ),
            )),
        }
    }

    /// Bytes of each state's buffer (0 for a state without one), in state order.
    pub fn state_buffer_bytes(&self) -> Vec<u64> {
        self.states
            .iter()
            .map(|s| s.buffer.as_ref().map_or(0, S::size_bytes))
            .collect()
    }

    /// Forgets the states (a new sequence starts); their buffers are kept for reuse.
    pub fn reset_states(&mut self) {
        for s in &mut self.states {
            if s.drop_front > 0 {
                s.drop_front = 0;
                s.restore = None;
            }
            if let Some(d) = s.shape.0.get_mut(s.axis) {
                *d = 0;
            }
            s.next_shape = s.shape.clone();
        }
    }

    /// Bytes a state growing to `new_shape` without a prediction reserves under the adaptive
    /// policy: the rows of the OpenVINO rule's iterations-ahead mode for one row per step
    /// (`iterations` rows more) or the adaptive fraction (`ratio` times the rows), the larger.
    /// `None` when a prediction sized it, or under another policy (the reference and `none`
    /// allocate what the predictor says). The sizer's ledger, summary and trace keep the
    /// predictor's decisions, so a trace still replays to the run's sizing summary: the room
    /// is the state's own, and a decision to grow a state whose buffer already has the rows
    /// keeps that buffer (the request's [`crate::runtime::RunStats`] count what was really
    /// allocated).
    ///
    /// # Errors
    /// The error of [`padded_bytes`] when the size overflows.
    fn state_headroom_bytes(
        &self,
        s: usize,
        new_shape: &Shape,
        dtype: DType,
        predicted: bool,
    ) -> Result<Option<u64>, RunError> {
        let predictor = self.sizer.predictor();
        if predicted || predictor.policy() != Policy::Adaptive {
            return Ok(None);
        }
        let options = predictor.options();
        let axis = self.states[s].axis;
        let Some(&rows) = new_shape.dims().get(axis) else {
            return Ok(None);
        };
        let by_ratio = (rows as f64 * f64::from(options.ratio).max(1.0)).ceil() as u64;
        let target = by_ratio.max(rows.saturating_add(u64::from(options.iterations)));
        if target <= rows {
            return Ok(None);
        }
        let mut dims = new_shape.dims().to_vec();
        dims[axis] = target;
        Ok(Some(padded_bytes(&Shape::new(dims), dtype)?))
    }

    /// `realloc_if_needed` for a state's in-place concat: room for `new_shape`, keeping the
    /// past. A larger buffer is taken from the storage; the past is copied into it in order.
    ///
    /// # Errors
    /// [`RunError::BadState`] for rows that are not whole 4-byte words (appends are buffer
    /// copies); [`RunError::OutOfMemory`] naming the present when no buffer fits.
    pub(super) fn realloc_state(
        &mut self,
        k: usize,
        s: usize,
        new_shape: &Shape,
    ) -> Result<(), RunError> {
        let c = Arc::clone(&self.compiled);
        let node = &c.nodes[k];
        let label = &c.graph.node(node.id).label;
        let needed = padded_bytes(new_shape, node.dtype)?.max(4);
        let st = &mut self.states[s];
        let rows = st.rows();
        let new_rows = new_shape.dims().get(st.axis).copied().unwrap_or(0);
        st.append_rows = new_rows.saturating_sub(rows);
        st.next_shape = new_shape.clone();
        let (outer, row) = st.blocks();
        if row % 4 != 0 && outer * new_rows > 0 {
            return Err(RunError::BadState {
                past: c.graph.node(c.states[s].past).label.clone(),
                present: label.clone(),
                reason: format!("rows of {row} bytes: in-place appends copy whole 4-byte words"),
            });
        }
        let capacity = st
            .buffer
            .as_ref()
            .map_or(0, |b| st.capacity_rows(S::size_bytes(b)));
        let limits = self.limits();
        let (d, size) = self.decide(label, new_shape, node.dtype, needed, &limits)?;
        // A buffer with room for the rows is kept unless the sizer shrinks it: a state's
        // room may exceed what the sizer reserved ([`Self::state_headroom_bytes`]). After a
        // drop the kept rows move into a new buffer.
        if !d.reclaimed
            && capacity >= new_rows
            && self.states[s].buffer.is_some()
            && self.states[s].drop_front == 0
        {
            self.stats.reuses += 1;
            return Ok(());
        }
        // A state allocated or grown before its id has the three shapes of history a
        // prediction needs (the first step, a past fed by the caller, the first decode steps
        // after them) would otherwise be sized exactly and grow again at each of the next
        // steps: a copy of every cache per step. The adaptive policy reserves room at once.
        let size = match self.state_headroom_bytes(s, new_shape, node.dtype, d.predicted)? {
            // An in-place state (a pool) is sized by its caller: no room beyond it.
            _ if c.states[s].in_place => needed,
            Some(room) if room > size && !d.reclaimed => {
                self.sizer.ledger().grow_to(room, size, &limits)
            }
            _ => size,
        };
        let oom = |reason: String| RunError::OutOfMemory {
            node: label.clone(),
            requested_bytes: needed,
            reason,
        };
        let buf = match self.io_storage.allocate(size, AllocKind::UsmDevice, label) {
            Ok(b) => {
                if size > needed {
                    self.stats.preallocations += 1;
                }
                b
            }
            Err(_) if size > needed => {
                self.stats.preallocation_fallbacks += 1;
                let b = self
                    .io_storage
                    .allocate(needed, AllocKind::UsmDevice, label)
                    .map_err(|e| oom(e.to_string()))?;
                self.sizer
                    .correct(label, new_shape, d.needed_bytes, S::size_bytes(&b))?;
                b
            }
            Err(e) => return Err(oom(e.to_string())),
        };
        self.count_allocation(S::size_bytes(&buf));
        if self.states[s].buffer.is_some() {
            self.stats.state_growths += 1;
        }
        self.states[s].grown = Some(buf);
        self.grow_now(s);
        Ok(())
    }

    /// Moves state `s`'s rows into its grown buffer now, and frees the old one, when the old
    /// buffers the step's work would copy from already reach
    /// [`RunOptions::growth_transient_bytes`](crate::runtime::RunOptions) and the storage
    /// copies on its own ([`Storage::copy_now`]): past that bound the states grow one after
    /// the other, each old buffer freed before the next state's new one is allocated.
    /// Otherwise (or in poison mode, which fills the grown buffer first, or with a past
    /// uploaded or rows dropped) the iteration's work copies them.
    fn grow_now(&mut self, s: usize) {
        let deferred: u64 = (self.states.iter().enumerate())
            .filter(|(i, st)| *i != s && st.grown.is_some())
            .filter_map(|(_, st)| st.buffer.as_ref().map(S::size_bytes))
            .sum();
        let st = &mut self.states[s];
        if self.options.poison || st.upload.is_some() || st.drop_front > 0 {
            return;
        }
        let old = st.buffer.as_ref().map_or(0, S::size_bytes);
        if deferred.saturating_add(old) <= self.options.growth_transient_bytes {
            return;
        }
        let (Some(old_bytes), Some(new_bytes)) = (
            st.buffer.as_ref().map(S::size_bytes),
            st.grown.as_ref().map(S::size_bytes),
        ) else {
            return;
        };
        let (growth, _) = st.copies(old_bytes, new_bytes);
        let (Some(old), Some(mut new)) = (st.buffer.take(), st.grown.take()) else {
            return;
        };
        match self.io_storage.copy_now(&old, &mut new, &growth) {
            Ok(true) => {
                self.stats.copies += growth.len() as u64;
                self.stats.copy_bytes += growth.iter().map(|c| c.2).sum::<u64>();
                self.freed.push(S::id(&old));
                st.buffer = Some(new);
            }
            _ => {
                st.buffer = Some(old);
                st.grown = Some(new);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(shape: &[u64], axis: usize) -> StateSlot<Vec<u8>> {
        StateSlot {
            buffer: Some(Vec::new()),
            shape: Shape::new(shape.to_vec()),
            axis,
            dtype: DType::F32,
            grown: None,
            append_rows: 0,
            next_shape: Shape::new(shape.to_vec()),
            upload: None,
            restore: None,
            drop_front: 0,
        }
    }

    #[test]
    fn a_padded_axis_2_cache_copies_each_block_once() {
        // [1, 3, t, 4] f32: 3 blocks of rows of 16 bytes; 5 rows held in a capacity of 8,
        // growing to 12 while appending 2.
        let mut s = slot(&[1, 3, 5, 4], 2);
        s.grown = Some(Vec::new());
        s.append_rows = 2;
        s.next_shape = Shape::new(vec![1, 3, 7, 4]);
        assert_eq!(s.blocks(), (3, 16));
        assert_eq!(s.capacity_rows(3 * 8 * 16), 8);
        assert_eq!(
            s.strides(&s.next_shape.clone(), 3 * 12 * 16),
            vec![144, 48, 4, 1]
        );
        let (growth, append) = s.copies(3 * 8 * 16, 3 * 12 * 16);
        assert_eq!(growth, vec![(0, 0, 80), (128, 192, 80), (256, 384, 80)]);
        assert_eq!(append, vec![(0, 80, 32), (32, 272, 32), (64, 464, 32)]);
    }

    #[test]
    fn compact_walks_a_strided_view_in_row_major_order() {
        // A [2, 3] view with rows padded to 4 elements, transposed to [3, 2].
        let data: Vec<u8> = (0u8..8).collect();
        let shape = Shape::new(vec![3, 2]);
        assert_eq!(compact(&data, &shape, &[1, 4], 1), vec![0, 4, 1, 5, 2, 6]);
        assert_eq!(
            view_strides(&Op::Transpose(ops::Transpose { perm: vec![1, 0] }), &[4, 1]),
            Some(vec![1, 4])
        );
    }

    #[test]
    fn an_axis_0_cache_is_one_copy_each() {
        let mut s = slot(&[5, 6], 0);
        s.grown = Some(Vec::new());
        s.append_rows = 2;
        s.next_shape = Shape::new(vec![7, 6]);
        let (growth, append) = s.copies(8 * 24, 16 * 24);
        assert_eq!(growth, vec![(0, 0, 120)]);
        assert_eq!(append, vec![(0, 120, 48)]);
        assert_eq!(s.upload_writes(16 * 24), vec![(0, 0, 120)]);
        // Without a growth nothing moves but the new rows; an uploaded past moves nothing.
        s.upload = Some(vec![0; 120]);
        assert!(s.copies(8 * 24, 16 * 24).0.is_empty());
    }

    #[test]
    fn dropped_rows_stay_behind_in_the_growth_copy() {
        // 5 rows held after dropping 3 of 8 (a sliding window): the kept rows start 3 rows
        // into the old buffer, in each block of a padded layout too.
        let mut s = slot(&[5, 6], 0);
        s.drop_front = 3;
        s.grown = Some(Vec::new());
        s.append_rows = 1;
        s.next_shape = Shape::new(vec![6, 6]);
        let (growth, append) = s.copies(8 * 24, 8 * 24);
        assert_eq!(growth, vec![(72, 0, 120)]);
        assert_eq!(append, vec![(0, 120, 24)]);
        let mut p = slot(&[1, 2, 2, 4], 2);
        p.drop_front = 1;
        p.grown = Some(Vec::new());
        let (growth, _) = p.copies(2 * 4 * 16, 2 * 4 * 16);
        assert_eq!(growth, vec![(16, 0, 32), (80, 64, 32)]);
    }
}
