//! CUDA graphs of the target's forward, as vLLM has them for decode: a forward is captured
//! once per shape and replayed, so a step of many small kernels costs one launch.
//!
//! A graph replays the kernels it captured on the tensors it captured, so its shape is fixed:
//! a step runs by a graph when every sequence has the same number of rows, at most K + 1 (a
//! decode row, or a verification window), and the step keeps the logits of all its rows, and
//! the captured states of all or none. The batch is padded (`ForwardBatch::padded`) to the next
//! bucket of sequences (1, 2, 4, 8, ... up to the scheduler's most), and every block table to
//! the longest a sequence can have. Its inputs are made as for any forward
//! (`TargetModel::inputs`) and written into the tensors the graph was captured over. The graph
//! is the forward up to the LM head (`TargetModel::forward_states`); the head then makes the
//! logits of the batch's own rows outside it, so no shape keeps [rows, vocab] of logits. Rows'
//! results do not depend on the rest of their batch, so a step gives the same bits by a graph
//! as without one.
//!
//! A shape is captured on its first step: one forward as usual, which fills candle's cache of
//! the shapes its own kernels upload (none may be uploaded during capture), then the same
//! forward under stream capture. An engine captures every shape its scheduler's steps can take,
//! up to `max_rows` rows, at start-up (`startup_steps`, as vLLM does), so that no request waits
//! on a capture.

use crate::batch::{BatchBuilder, ForwardBatch, Rows};
use crate::kv_cache::KvCache;
use crate::target_model::{ForwardOutput, TargetModel};
use candle_core::{bail, Device, Result};
use peagle_kernels::PAD_SLOT;

/// The shape a step is captured and replayed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphShape {
    /// Sequences, padding included: a bucket.
    pub sequences: usize,
    pub rows_each: usize,
    /// Whether the rows' hidden states are captured (for a drafter).
    pub captures: bool,
}

/// The steps graphs are captured for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphLimits {
    /// Blocks in every block table: the most a sequence can have.
    pub table_width: usize,
    /// The most sequences a step has.
    pub max_sequences: usize,
    /// The most rows of a sequence: a verification window's K + 1 (1 with no drafter). A
    /// uniform step of longer rows, a prefill chunk whose prompt is scored, runs without a
    /// graph, so that prompt lengths do not each capture one and keep its outputs.
    pub max_rows_each: usize,
    /// The most rows of a step run by a graph, padding included (vLLM's largest capture
    /// size): a larger step gains little from a graph, and each shape keeps its outputs.
    pub max_rows: usize,
}

/// vLLM's largest capture size, in rows.
pub const DEFAULT_GRAPH_MAX_ROWS: usize = 512;

/// The shape `batch` runs at by a graph within `limits`; None where it runs without one.
pub fn graph_shape(batch: &ForwardBatch, limits: &GraphLimits) -> Option<GraphShape> {
    let attn = &batch.attn;
    let rows = batch.token_ids.len();
    let rows_each = attn.query_start.get(1).copied()?;
    let uniform = attn.query_start.windows(2).all(|w| w[1] - w[0] == rows_each);
    let fits = rows_each <= limits.max_rows_each && attn.block_tables.iter().all(|t| t.len() <= limits.table_width);
    let captures = batch.capture_rows.len() == rows;
    if !uniform || !fits || batch.logit_rows.len() != rows || !(captures || batch.capture_rows.is_empty()) {
        return None;
    }
    let sequences = attn.num_sequences().next_power_of_two();
    let within = sequences <= limits.max_sequences.next_power_of_two() && sequences * rows_each <= limits.max_rows;
    within.then_some(GraphShape {
        sequences,
        rows_each,
        captures,
    })
}

/// A step of every shape `limits` allows to a scheduler whose steps have at most `budget`
/// rows, for capturing graphs before the first request (as vLLM does): every bucket of
/// sequences with every row count up to `max_rows_each`, keeping every row's logits. With
/// `drafter` (a drafter is loaded) they capture every row's states, and the one-row steps
/// come also without, for decoding the requests that do not speculate. Each row is token 0 at
/// positions from 0, reading block 0 and writing nothing (`PAD_SLOT`).
pub fn startup_steps(
    limits: &GraphLimits,
    block_size: usize,
    budget: usize,
    drafter: bool,
) -> Result<Vec<ForwardBatch>> {
    let table = vec![0; limits.table_width];
    let mut steps = Vec::new();
    for rows_each in 1..=limits.max_rows_each {
        let captures: &[bool] = match (drafter, rows_each) {
            (false, _) => &[false],
            (true, 1) => &[true, false],
            (true, _) => &[true],
        };
        // The most sequences of this many rows a step can hold, and so the largest bucket.
        let most = limits.max_sequences.min(budget / rows_each);
        let buckets = std::iter::successors(Some(1usize), |s| Some(2 * s))
            .take_while(|&s| most > 0 && s <= most.next_power_of_two() && s * rows_each <= limits.max_rows);
        for &captures in captures {
            let capture = if captures { Rows::All } else { Rows::None };
            for sequences in buckets.clone() {
                let mut batch = BatchBuilder::new(block_size);
                for _ in 0..sequences {
                    batch.add(&vec![0; rows_each], 0, &table, Rows::All, capture)?;
                }
                let mut batch = batch.build();
                batch.attn.slot_mapping.fill(PAD_SLOT);
                steps.push(batch);
            }
        }
    }
    Ok(steps)
}

/// A target's captured forwards, one per shape, on one CUDA device.
pub struct CudaGraphs {
    #[cfg(feature = "cuda")]
    limits: GraphLimits,
    /// Each shape's graph; None for a shape whose capture failed, which runs without one.
    #[cfg(feature = "cuda")]
    captured: std::collections::HashMap<GraphShape, Option<captured::Captured>>,
    /// A build without CUDA makes none.
    #[cfg(not(feature = "cuda"))]
    never: std::convert::Infallible,
}

#[cfg(feature = "cuda")]
impl CudaGraphs {
    /// Graphs for the steps within `limits` on `device`, which must be a GPU.
    pub fn new(device: &Device, limits: GraphLimits) -> Result<Self> {
        if !device.is_cuda() {
            bail!("CUDA graphs need a CUDA device (--device cuda)");
        }
        Ok(Self {
            limits,
            captured: Default::default(),
        })
    }

    /// `target`'s forward of `batch` by a graph, captured now if its shape has none yet;
    /// None where the batch's shape runs without one (`graph_shape`, or a capture that
    /// failed). A failed capture is the error of its first step; the step's keys and values
    /// are written, its outputs are not.
    pub fn forward(
        &mut self,
        target: &dyn TargetModel,
        batch: &ForwardBatch,
        kv: &KvCache,
    ) -> Result<Option<ForwardOutput>> {
        let Some(shape) = graph_shape(batch, &self.limits) else {
            return Ok(None);
        };
        let rows = batch.token_ids.len();
        match self.captured.get(&shape) {
            Some(None) => Ok(None),
            Some(Some(captured)) => {
                self.inputs(target, batch, shape, kv)?.write_into(&captured.inputs)?;
                captured.replay(target, rows).map(Some)
            }
            None => self.capture(target, batch, shape, kv)?.replay(target, rows).map(Some),
        }
    }

    /// Captures a graph of every shape `startup_steps` makes for steps of at most `budget`
    /// rows (with `drafter`: a drafter is loaded), so that no request waits on a capture; says
    /// how many were captured. A shape whose capture or first launch fails is logged and runs
    /// without a graph. Run it on a thread that lives as long as the graphs (rayon's pool):
    /// candle keeps the inputs a capture uploads per thread. It returns once the device has
    /// run every launch, so that a step on another thread's stream follows them.
    pub fn capture_at_startup(
        &mut self,
        target: &dyn TargetModel,
        kv: &KvCache,
        budget: usize,
        drafter: bool,
    ) -> Result<usize> {
        let mut captured = 0;
        for step in startup_steps(&self.limits, kv.block_size(), budget, drafter)? {
            let Some(shape) = graph_shape(&step, &self.limits) else {
                continue;
            };
            if self.captured.contains_key(&shape) {
                continue;
            }
            // Launched once, so that its outputs are allocated before anything frees them.
            match self.capture(target, &step, shape, kv).and_then(|graph| graph.launch()) {
                Ok(()) => captured += 1,
                Err(e) => {
                    // A failed capture is kept as None already. A graph whose launch failed
                    // never allocated its outputs, and freeing them would fail a later call:
                    // it is left as it is.
                    if let Some(Some(graph)) = self.captured.insert(shape, None) {
                        std::mem::forget(graph);
                    }
                    tracing::warn!(?shape, "this step shape runs without a CUDA graph: {e}");
                }
            }
        }
        target.device().synchronize()?;
        Ok(captured)
    }

    /// `batch`'s inputs padded to `shape`, checked against the cache (a replay runs no op
    /// that would check them).
    fn inputs(
        &self,
        target: &dyn TargetModel,
        batch: &ForwardBatch,
        shape: GraphShape,
        kv: &KvCache,
    ) -> Result<crate::forward_inputs::ForwardInputs> {
        let padded = batch.padded(shape.sequences, self.limits.table_width)?;
        let inputs = target.inputs(&padded, kv)?;
        padded.attn.validate(kv.num_blocks() * kv.block_size())?;
        Ok(inputs)
    }

    /// Captures `shape`'s graph over `batch`'s inputs and keeps it; a shape whose capture
    /// fails is kept as running without one, and its error returned.
    fn capture(
        &mut self,
        target: &dyn TargetModel,
        batch: &ForwardBatch,
        shape: GraphShape,
        kv: &KvCache,
    ) -> Result<&captured::Captured> {
        let inputs = self.inputs(target, batch, shape, kv)?;
        tracing::debug!(?shape, "capturing a CUDA graph of the target's forward");
        // candle unwraps some allocations, which a capture gone invalid refuses: that panic
        // fails this shape's capture (the capture is ended as it unwinds), not the engine.
        let captured = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            captured::Captured::new(target, inputs, kv)
        }))
        .unwrap_or_else(|_| candle_core::bail!("capturing the target's forward panicked"));
        match captured {
            Ok(captured) => Ok(self.captured.entry(shape).or_default().insert(captured)),
            Err(e) => {
                self.captured.insert(shape, None);
                Err(e)
            }
        }
    }
}

#[cfg(not(feature = "cuda"))]
impl CudaGraphs {
    /// A build without CUDA has no graphs.
    pub fn new(device: &Device, _limits: GraphLimits) -> Result<Self> {
        bail!("CUDA graphs need a CUDA device and a build with CUDA, not {device:?}")
    }

    pub fn forward(
        &mut self,
        _target: &dyn TargetModel,
        _batch: &ForwardBatch,
        _kv: &KvCache,
    ) -> Result<Option<ForwardOutput>> {
        match self.never {}
    }

    pub fn capture_at_startup(
        &mut self,
        _target: &dyn TargetModel,
        _kv: &KvCache,
        _budget: usize,
        _drafter: bool,
    ) -> Result<usize> {
        match self.never {}
    }
}

#[cfg(feature = "cuda")]
mod captured {
    use crate::forward_inputs::ForwardInputs;
    use crate::kv_cache::KvCache;
    use crate::target_model::{ForwardOutput, ForwardStates, TargetModel};
    use candle_core::cuda_backend::cudarc::driver::{sys, CudaGraph, CudaStream};
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{Result, Tensor};
    use std::sync::Arc;

    /// One shape's graph with the tensors it reads and writes: the forward up to the LM head
    /// (`TargetModel::forward_states`), whose outputs are small. Fields drop in order: the
    /// outputs, which the graph allocated, are freed before the graph is destroyed.
    pub(super) struct Captured {
        pub(super) inputs: ForwardInputs,
        states: ForwardStates,
        graph: CudaGraph,
    }

    /// A capture in progress on a stream, ended on every path: a stream left capturing fails
    /// every later launch of its thread.
    struct Capture {
        stream: Arc<CudaStream>,
        open: bool,
    }

    impl Capture {
        fn begin(stream: Arc<CudaStream>) -> Result<Self> {
            stream
                .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .w()?;
            Ok(Self { stream, open: true })
        }

        /// Ends the capture and instantiates its graph, whose every launch frees what the
        /// graph allocated and the last launch left: the outputs, which keep their addresses.
        fn end(mut self) -> Result<Option<CudaGraph>> {
            self.open = false;
            Self::forget_stale_error(&self.stream);
            let flags = sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
            self.stream.end_capture(flags).w()
        }

        /// Drops the error cudarc kept from a call that could not return one, such as a free
        /// refused by a capture gone invalid: it would otherwise fail the next call, ending
        /// the capture included, before that call runs. Errors kept before the capture
        /// failed its beginning, so this one is the capture's own.
        fn forget_stale_error(stream: &CudaStream) {
            if let Err(e) = stream.context().check_err() {
                tracing::debug!("an error recorded during a CUDA graph capture: {e}");
            }
        }
    }

    impl Drop for Capture {
        /// Ends a capture a panic left open; its graph is dropped.
        fn drop(&mut self) {
            if self.open {
                Self::forget_stale_error(&self.stream);
                let _ = self.stream.end_capture(sys::CUgraphInstantiate_flags(0));
            }
        }
    }

    // SAFETY: a graph is launched by one thread at a time (`CudaGraphs::forward` takes
    // `&mut self`), and each launch binds the graph's context to the launching thread first.
    unsafe impl Send for Captured {}

    impl Captured {
        /// Captures `target`'s forward of `inputs`, which become the tensors it reads.
        pub(super) fn new(target: &dyn TargetModel, inputs: ForwardInputs, kv: &KvCache) -> Result<Self> {
            let device = target.device().as_cuda_device()?;
            let _cached_shapes = device.enable_cuda_graph_htod_cache();
            target.forward_states(&inputs, kv)?;
            let capture = Capture::begin(device.cuda_stream())?;
            let states = target.forward_states(&inputs, kv);
            let graph = capture.end();
            // The forward's error says why a capture failed; the capture's error follows
            // from it.
            let states = states?;
            match graph {
                Ok(Some(graph)) => Ok(Self { inputs, states, graph }),
                failed => {
                    // The outputs' addresses were the graph's, which is gone: freeing them
                    // now would fail, and the failure would surface at some later call.
                    std::mem::forget(states);
                    match failed {
                        Err(e) => Err(e),
                        _ => candle_core::bail!("capturing the target's forward gave no CUDA graph"),
                    }
                }
            }
        }

        /// Runs the graph over its inputs as last written, leaving its outputs where it
        /// writes them.
        pub(super) fn launch(&self) -> Result<()> {
            self.graph.launch().w()
        }

        /// Runs the graph over its inputs as last written: the outputs of the first `rows`,
        /// the logits made from their states by `target`'s head after the graph. The outputs
        /// are tensors of their own: the captured ones are overwritten by the shape's next
        /// replay, and a drafter may keep hidden states for a later step.
        pub(super) fn replay(&self, target: &dyn TargetModel, rows: usize) -> Result<ForwardOutput> {
            self.launch()?;
            let first = self.states.first_rows(rows)?;
            let copy = |t: Option<Tensor>| t.map(|t| t.force_contiguous()).transpose();
            ForwardStates {
                logit_states: first.logit_states,
                aux_hidden: copy(first.aux_hidden)?,
                final_hidden: copy(first.final_hidden)?,
            }
            .logits(target)
        }
    }
}
