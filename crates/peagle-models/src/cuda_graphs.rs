//! CUDA graphs of the target's forward, as vLLM has them for decode: a forward is captured
//! once per shape and replayed, so a step of many small kernels costs one launch.
//!
//! A graph replays the kernels it captured on the tensors it captured, so its shape is fixed:
//! a step runs by a graph when every sequence has the same number of rows (a decode row, or a
//! verification window of K + 1) and the step keeps the logits of all its rows, and the
//! captured states of all or none. The batch is padded (`ForwardBatch::padded`) to the next
//! bucket of sequences (1, 2, 4, 8, ... up to the scheduler's most), and every block table to
//! the longest a sequence can have. Its inputs are made as for any forward
//! (`TargetModel::inputs`) and written into the tensors the graph was captured over; the
//! outputs are the first rows of the tensors it writes, the logits valid until the shape's
//! next step. Rows' results do not depend on the rest of their batch, so a step gives the
//! same bits by a graph as without one.
//!
//! The first step of a shape is captured: one forward as usual, which fills candle's cache of
//! the shapes its own kernels upload (none may be uploaded during capture), then the same
//! forward under stream capture.

use crate::batch::ForwardBatch;
use crate::kv_cache::KvCache;
use crate::target_model::{ForwardOutput, TargetModel};
use candle_core::{bail, Device, Result};

/// The shape a step is captured and replayed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphShape {
    /// Sequences, padding included: a bucket.
    pub sequences: usize,
    pub rows_each: usize,
    /// Whether the rows' hidden states are captured (for a drafter).
    pub captures: bool,
}

/// The shape `batch` runs at by a graph whose block tables hold `table_width` blocks, with
/// at most `max_sequences` sequences; None where it runs without one.
pub fn graph_shape(batch: &ForwardBatch, table_width: usize, max_sequences: usize) -> Option<GraphShape> {
    let attn = &batch.attn;
    let rows = batch.token_ids.len();
    let rows_each = attn.query_start.get(1).copied()?;
    let uniform = attn.query_start.windows(2).all(|w| w[1] - w[0] == rows_each);
    let fits = attn.block_tables.iter().all(|t| t.len() <= table_width);
    let captures = batch.capture_rows.len() == rows;
    if !uniform || !fits || batch.logit_rows.len() != rows || !(captures || batch.capture_rows.is_empty()) {
        return None;
    }
    let sequences = attn.num_sequences().next_power_of_two();
    (sequences <= max_sequences.next_power_of_two()).then_some(GraphShape {
        sequences,
        rows_each,
        captures,
    })
}

/// A target's captured forwards, one per shape, on one CUDA device.
pub struct CudaGraphs {
    #[cfg(feature = "cuda")]
    table_width: usize,
    #[cfg(feature = "cuda")]
    max_sequences: usize,
    /// Each shape's graph; None for a shape whose capture failed, which runs without one.
    #[cfg(feature = "cuda")]
    captured: std::collections::HashMap<GraphShape, Option<captured::Captured>>,
    /// A build without CUDA makes none.
    #[cfg(not(feature = "cuda"))]
    never: std::convert::Infallible,
}

#[cfg(feature = "cuda")]
impl CudaGraphs {
    /// Graphs for steps of up to `max_sequences` sequences of up to `table_width` blocks each,
    /// on `device`, which must be a GPU.
    pub fn new(device: &Device, table_width: usize, max_sequences: usize) -> Result<Self> {
        if !device.is_cuda() {
            bail!("CUDA graphs need a CUDA device (--device cuda)");
        }
        Ok(Self {
            table_width,
            max_sequences,
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
        use std::collections::hash_map::Entry;
        let Some(shape) = graph_shape(batch, self.table_width, self.max_sequences) else {
            return Ok(None);
        };
        let padded = batch.padded(shape.sequences, self.table_width)?;
        let inputs = target.inputs(&padded, kv)?;
        // A replay runs no op that would check the metadata against the cache.
        padded.attn.validate(kv.num_blocks() * kv.block_size())?;
        let captured = match self.captured.entry(shape) {
            Entry::Occupied(e) => match e.into_mut() {
                Some(captured) => {
                    inputs.write_into(&captured.inputs)?;
                    captured
                }
                None => return Ok(None),
            },
            Entry::Vacant(e) => {
                tracing::info!(?shape, "capturing a CUDA graph of the target's forward");
                match captured::Captured::new(target, inputs, kv) {
                    Ok(captured) => e.insert(None).insert(captured),
                    Err(err) => {
                        e.insert(None);
                        return Err(err);
                    }
                }
            }
        };
        captured.replay(batch.token_ids.len()).map(Some)
    }
}

#[cfg(not(feature = "cuda"))]
impl CudaGraphs {
    /// A build without CUDA has no graphs.
    pub fn new(device: &Device, _table_width: usize, _max_sequences: usize) -> Result<Self> {
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
}

#[cfg(feature = "cuda")]
mod captured {
    use crate::forward_inputs::ForwardInputs;
    use crate::kv_cache::KvCache;
    use crate::target_model::{ForwardOutput, TargetModel};
    use candle_core::cuda_backend::cudarc::driver::{sys, CudaGraph};
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{Result, Tensor};

    /// One shape's graph with the tensors it reads and writes. Fields drop in order: the
    /// outputs, which the graph allocated, are freed before the graph is destroyed.
    pub(super) struct Captured {
        pub(super) inputs: ForwardInputs,
        output: ForwardOutput,
        graph: CudaGraph,
    }

    // SAFETY: a graph is launched by one thread at a time (`CudaGraphs::forward` takes
    // `&mut self`), and each launch binds the graph's context to the launching thread first.
    unsafe impl Send for Captured {}

    impl Captured {
        /// Captures `target`'s forward of `inputs`, which become the tensors it reads.
        pub(super) fn new(target: &dyn TargetModel, inputs: ForwardInputs, kv: &KvCache) -> Result<Self> {
            let device = target.device().as_cuda_device()?;
            let stream = device.cuda_stream();
            let _cached_shapes = device.enable_cuda_graph_htod_cache();
            target.forward_inputs(&inputs, kv)?;
            stream
                .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .w()?;
            let output = target.forward_inputs(&inputs, kv);
            // Each launch frees what the graph allocated and the last launch left: the outputs,
            // which keep their addresses.
            let flags = sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
            let graph = stream.end_capture(flags).w()?;
            let output = output?;
            let Some(graph) = graph else {
                candle_core::bail!("capturing the target's forward gave no CUDA graph");
            };
            Ok(Self { inputs, output, graph })
        }

        /// Runs the graph over its inputs as last written: the outputs of the first `rows`.
        /// The logits are a view that the shape's next replay overwrites (a step reads its
        /// logits before the next step runs); the hidden states are copies, which a drafter
        /// may keep for a later step.
        pub(super) fn replay(&self, rows: usize) -> Result<ForwardOutput> {
            self.graph.launch().w()?;
            let first = self.output.first_rows(rows)?;
            let copy = |t: Option<Tensor>| t.map(|t| t.copy()).transpose();
            Ok(ForwardOutput {
                logits: first.logits,
                aux_hidden: copy(first.aux_hidden)?,
                final_hidden: copy(first.final_hidden)?,
            })
        }
    }
}
