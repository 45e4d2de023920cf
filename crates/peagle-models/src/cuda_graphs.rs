//! CUDA graphs of the target's forward, as vLLM has them for decode: a forward is captured
//! once per shape and replayed, so a step of many small kernels costs one launch.
//!
//! A graph replays the kernels it captured on the tensors it captured, so its shape is fixed:
//! a step runs by a graph when every sequence has the same number of rows, at most K + 1 (a
//! decode row, or a verification window), and the step keeps the logits of all its rows, and
//! the captured states of all or none. The batch is padded (`ForwardBatch::padded`) to the next
//! bucket of sequences (1, 2, 4, 8, ... up to the scheduler's most), and every block table to
//! the longest a sequence can have. A replay uploads its inputs straight into the tensors the
//! graph was captured over (`TargetModel::upload_inputs`). The graph
//! is the forward up to the LM head (`TargetModel::forward_states`); the head then makes the
//! logits of the batch's own rows outside it, so no shape keeps [rows, vocab] of logits. Rows'
//! results do not depend on the rest of their batch, so a step gives the same bits by a graph
//! as without one.
//!
//! A shape is captured on its first step: one forward as usual, which fills candle's cache of
//! the shapes its own kernels upload (none may be uploaded during capture), then the same
//! forward under stream capture. An engine captures, at start-up (`startup_steps`, as vLLM
//! does), every shape of up to `max_rows` rows its steps take at the k its speculation policy
//! may choose, so that no request waits on a capture; not every row count up to K + 1, since
//! each graph keeps its outputs and takes time to capture.

use crate::batch::{BatchBuilder, ForwardBatch, Rows};
use crate::kv_cache::KvCache;
use crate::target_model::{ForwardOutput, TargetModel};
#[cfg(feature = "cuda")]
use crate::{forward_inputs::ForwardInputs, target_model::ForwardStates};
use candle_core::{Device, Result};
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
/// sequences with each row count of `rows_each` up to `max_rows_each` (the row counts a
/// sequence's steps can have: a decode row, and the windows of each k the speculation policy
/// may choose), keeping every row's logits. With
/// `drafter` (a drafter is loaded) they capture every row's states, and the one-row steps
/// come also without, for decoding the requests that do not speculate. Each row is token 0 at
/// positions from 0, reading block 0 and writing nothing (`PAD_SLOT`).
pub fn startup_steps(
    limits: &GraphLimits,
    block_size: usize,
    budget: usize,
    drafter: bool,
    rows_each: &[usize],
) -> Result<Vec<ForwardBatch>> {
    let table = vec![0; limits.table_width];
    let mut steps = Vec::new();
    let mut counts: Vec<usize> = rows_each
        .iter()
        .copied()
        .filter(|&r| r > 0 && r <= limits.max_rows_each)
        .collect();
    counts.sort_unstable();
    counts.dedup();
    for rows_each in counts {
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
    #[cfg(feature = "cuda")]
    graphs: crate::graph_capture::Graphs<GraphShape, ForwardInputs, ForwardStates>,
    /// A build without CUDA makes none.
    #[cfg(not(feature = "cuda"))]
    never: std::convert::Infallible,
}

#[cfg(feature = "cuda")]
impl CudaGraphs {
    /// Graphs for the steps within `limits` on `device`, which must be a GPU.
    pub fn new(device: &Device, limits: GraphLimits) -> Result<Self> {
        Ok(Self {
            limits,
            graphs: crate::graph_capture::Graphs::new(device)?,
        })
    }

    /// Shapes that have a graph, captured at start-up or on their first step.
    pub fn count(&self) -> usize {
        self.graphs.count()
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
        let table_width = self.limits.table_width;
        let inputs = || padded_inputs(target, batch, shape, table_width, kv);
        let write = |to: &ForwardInputs| {
            let padded = padded_batch(batch, shape, table_width, kv)?;
            target.upload_inputs(&padded, kv, to)
        };
        let forward = |inputs: &ForwardInputs| target.forward_states(inputs, kv);
        match self
            .graphs
            .get_or_capture(shape, target.device(), inputs, write, forward)?
        {
            Some(graph) => replay(graph, target, batch.token_ids.len()).map(Some),
            None => Ok(None),
        }
    }

    /// Captures a graph of every shape `startup_steps` makes for steps of at most `budget`
    /// rows whose sequences have `rows_each` rows (with `drafter`: a drafter is loaded), so
    /// that no request waits on a capture; says how many were captured. A shape whose capture
    /// or first launch fails is logged and runs without a graph. Run it on a thread that lives
    /// as long as the graphs (rayon's pool): candle keeps the inputs a capture uploads per
    /// thread. It returns once the device has run every launch, so that a step on another
    /// thread's stream follows them.
    pub fn capture_at_startup(
        &mut self,
        target: &dyn TargetModel,
        kv: &KvCache,
        budget: usize,
        drafter: bool,
        rows_each: &[usize],
    ) -> Result<usize> {
        let limits = self.limits;
        self.graphs.capture_at_startup(
            target.device(),
            startup_steps(&limits, kv.block_size(), budget, drafter, rows_each)?,
            |step| graph_shape(step, &limits),
            |step, shape| padded_inputs(target, step, shape, limits.table_width, kv),
            |inputs: &ForwardInputs| target.forward_states(inputs, kv),
        )
    }
}

/// `batch`'s inputs padded to `shape`, its block tables to `table_width` (`padded_batch`).
#[cfg(feature = "cuda")]
fn padded_inputs(
    target: &dyn TargetModel,
    batch: &ForwardBatch,
    shape: GraphShape,
    table_width: usize,
    kv: &KvCache,
) -> Result<ForwardInputs> {
    target.inputs(&padded_batch(batch, shape, table_width, kv)?, kv)
}

/// `batch` padded to `shape`, its block tables to `table_width`, checked against the cache (a
/// replay runs no op that would check them).
#[cfg(feature = "cuda")]
fn padded_batch(batch: &ForwardBatch, shape: GraphShape, table_width: usize, kv: &KvCache) -> Result<ForwardBatch> {
    let padded = batch.padded(shape.sequences, table_width)?;
    padded.attn.validate(kv.num_blocks() * kv.block_size())?;
    Ok(padded)
}

/// Runs `graph` over its inputs as last written: the outputs of the first `rows`, the logits
/// made from their states by `target`'s head after the graph. The captured states lie in the
/// graph's outputs, which the shape's next replay overwrites: the engine projects them for its
/// drafter before then, and keeps only the projection. No final states (`ForwardOutput::final_hidden`) are returned:
/// only training reads them, and it runs no graph.
#[cfg(feature = "cuda")]
fn replay(
    graph: &crate::graph_capture::Captured<ForwardInputs, ForwardStates>,
    target: &dyn TargetModel,
    rows: usize,
) -> Result<ForwardOutput> {
    graph.launch()?;
    let first = graph.outputs.first_rows(rows)?;
    ForwardStates {
        logit_states: first.logit_states,
        aux_hidden: first.aux_hidden,
        final_hidden: None,
    }
    .logits(target)
}

#[cfg(not(feature = "cuda"))]
impl CudaGraphs {
    /// A build without CUDA has no graphs.
    pub fn new(device: &Device, _limits: GraphLimits) -> Result<Self> {
        candle_core::bail!("CUDA graphs need a CUDA device and a build with CUDA, not {device:?}")
    }

    pub fn count(&self) -> usize {
        match self.never {}
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
        _rows_each: &[usize],
    ) -> Result<usize> {
        match self.never {}
    }
}
