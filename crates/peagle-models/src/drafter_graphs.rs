//! CUDA graphs of the drafter's passes. A drafter pass is a few small layers, so without a
//! graph its time is mostly the launches of its kernels, and EAGLE-3 pays them K times a step.
//!
//! A pass's sequences have as many rows as they have slots, which varies with what the last
//! verification accepted, so a graph's shape pads them (`padded_pass`): every sequence to the
//! power of two at or above the rows of the longest (`ForwardBatch::with_rows_each`: new rows
//! after a sequence's own, writing nothing), then the sequences to a bucket, as the target's
//! graphs pad theirs (`ForwardBatch::padded`). Rows are batch invariant and attend only to
//! positions up to their own, so a pass's rows give the same bits padded as not. The graph
//! holds the pass up to the final norm (`Drafter::forward_states`) over every row; the head
//! then makes the logits of the pass's own logit rows outside it. Its inputs are a forward's
//! (`ForwardInputs`) and the hidden input, gathered to the padded rows before each replay
//! (`PassHidden`: in one gather also where the pass's rows are themselves picked from a table).

use crate::batch::ForwardBatch;
use crate::cuda_graphs::GraphLimits;
use crate::drafter::{DraftHidden, DraftOutput, Drafter};
use crate::forward_inputs::ForwardInputs;
use crate::kv_cache::KvCache;
use candle_core::{bail, Result, Tensor};

/// The shape a drafter pass is captured and replayed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DraftShape {
    /// Sequences, padding included: a bucket.
    pub sequences: usize,
    /// Rows of every sequence: a bucket (a power of two) of the pass's longest. A drafter's
    /// rows are cheap, and each shape keeps its graph's memory, so shapes are few.
    pub rows_each: usize,
}

/// The shape a drafter pass over `batch` runs at by a graph within `limits`; None where it
/// runs without one: a sequence longer than the bucket of `max_rows_each` (a prompt, or a
/// backlog of states the drafter has not read), a block table the padding rows would grow
/// past the graph's width, or more sequences or rows than a graph holds.
pub fn draft_shape(batch: &ForwardBatch, limits: &GraphLimits) -> Option<DraftShape> {
    let attn = &batch.attn;
    let rows = |s: usize| attn.query_start[s + 1] - attn.query_start[s];
    let rows_each = (0..attn.num_sequences()).map(rows).max()?.next_power_of_two();
    if rows_each > limits.max_rows_each.next_power_of_two() {
        return None;
    }
    // Each table grows to the positions of its sequence's padding rows.
    let width = |s: usize| {
        let reach = (attn.context_lens[s] + rows_each - rows(s)).div_ceil(attn.block_size);
        reach.max(attn.block_tables[s].len())
    };
    let fits = (0..attn.num_sequences()).all(|s| width(s) <= limits.table_width);
    let sequences = attn.num_sequences().next_power_of_two();
    let within = sequences <= limits.max_sequences.next_power_of_two() && sequences * rows_each <= limits.max_rows;
    (fits && within).then_some(DraftShape { sequences, rows_each })
}

/// A drafter pass's hidden input at the drafter's width: its rows in order, or rows picked from
/// a table (P-EAGLE's first pass: its mask rows all read the mask state), so that a pass by a
/// graph gathers its padded rows from the table at once rather than the pass's rows first.
#[derive(Clone, Copy)]
pub struct PassHidden<'a> {
    table: &'a Tensor,
    /// The table row each of the pass's rows reads; None: row i reads row i.
    picks: Option<&'a [u32]>,
}

impl<'a> PassHidden<'a> {
    /// `hidden` [the pass's rows, drafter hidden], in the pass's order.
    pub fn rows(hidden: &'a Tensor) -> Self {
        Self {
            table: hidden,
            picks: None,
        }
    }

    /// Row i of the pass reads row `picks[i]` of `table` [rows, drafter hidden].
    pub fn picked(table: &'a Tensor, picks: &'a [u32]) -> Self {
        Self {
            table,
            picks: Some(picks),
        }
    }

    /// The table row that row `row` of the pass reads.
    fn source(&self, row: u32) -> u32 {
        self.picks.map_or(row, |picks| picks[row as usize])
    }

    /// [the pass's rows, drafter hidden], gathered where they are picked.
    pub fn gather(&self) -> Result<Tensor> {
        match self.picks {
            None => Ok(self.table.clone()),
            Some(picks) => {
                let picks = Tensor::from_slice(picks, picks.len(), self.table.device())?;
                self.table.index_select(&picks, 0)
            }
        }
    }
}

/// A drafter pass laid out at a graph's shape.
pub struct PaddedPass {
    /// The pass's rows at the shape, keeping no row's outputs: the graph keeps every row's
    /// state.
    pub batch: ForwardBatch,
    /// For each row, the row of the pass's hidden input it reads.
    pub sources: Vec<u32>,
    /// Where the pass's logit rows landed, in their order.
    pub logit_rows: Vec<u32>,
}

/// `batch` padded to `shape` (see the module's documentation), its block tables to
/// `table_width` blocks.
pub fn padded_pass(batch: &ForwardBatch, shape: DraftShape, table_width: usize) -> Result<PaddedPass> {
    let (mut grown, mut sources) = batch.with_rows_each(shape.rows_each)?;
    let logit_rows = std::mem::take(&mut grown.logit_rows);
    grown.capture_rows.clear();
    let batch = grown.padded(shape.sequences, table_width)?;
    // Padding sequences read the first row's hidden input; their outputs are never kept.
    sources.resize(batch.token_ids.len(), 0);
    Ok(PaddedPass {
        batch,
        sources,
        logit_rows,
    })
}

impl PaddedPass {
    /// The inputs of the padded pass, with the pass's hidden input gathered to its rows, and
    /// the indices of its logit rows on the device: one upload of indices for both.
    pub fn inputs(&self, drafter: &Drafter, hidden: PassHidden) -> Result<(DraftInputs, Tensor)> {
        let (rows, kept) = (self.sources.len(), self.logit_rows.len());
        let sources = self.sources.iter().map(|row| hidden.source(*row));
        let indices: Vec<u32> = sources.chain(self.logit_rows.iter().copied()).collect();
        let indices = Tensor::from_vec(indices, rows + kept, hidden.table.device())?;
        let inputs = DraftInputs {
            forward: drafter.inputs(&self.batch)?,
            hidden: hidden.table.index_select(&indices.narrow(0, 0, rows)?, 0)?,
        };
        Ok((inputs, indices.narrow(0, rows, kept)?))
    }

    /// The pass's output from the last layer's output of every padded row (`states`): the
    /// head over the rows at `kept`, the indices `inputs` returned.
    pub fn output(&self, drafter: &Drafter, states: &Tensor, kept: &Tensor) -> Result<DraftOutput> {
        if self.logit_rows.is_empty() {
            return drafter.no_logits(states.dtype());
        }
        drafter.head(states.index_select(kept, 0)?)
    }
}

/// A pass of every shape `limits` allows, for capturing graphs before the first request:
/// every bucket of sequences with every bucket of rows up to the one of `max_rows_each`,
/// within the most rows (`startup_steps`' steps of those row counts).
pub fn draft_startup_steps(limits: &GraphLimits, block_size: usize) -> Result<Vec<ForwardBatch>> {
    let limits = GraphLimits {
        max_rows_each: limits.max_rows_each.next_power_of_two(),
        ..*limits
    };
    let steps = crate::cuda_graphs::startup_steps(&limits, block_size, limits.max_rows, false)?;
    Ok(steps
        .into_iter()
        .filter(|s| s.attn.query_start[1].is_power_of_two())
        .collect())
}

/// What a drafter pass's graph reads: a forward's inputs and the hidden input of every row.
pub struct DraftInputs {
    pub forward: ForwardInputs,
    /// [rows, drafter hidden].
    pub hidden: Tensor,
}

impl DraftInputs {
    /// Writes these inputs' values into `target`'s tensors, of the same shapes.
    pub fn write_into(&self, target: &DraftInputs) -> Result<()> {
        if self.hidden.shape() != target.hidden.shape() {
            bail!(
                "a hidden input of shape {:?} written into a graph's of {:?}",
                self.hidden.shape(),
                target.hidden.shape()
            );
        }
        self.forward.write_into(&target.forward)?;
        target.hidden.slice_set(&self.hidden, 0, 0)
    }
}

/// The drafter's forward up to the final norm over a graph's inputs: what a graph captures.
pub fn draft_states(drafter: &Drafter, inputs: &DraftInputs, kv: &KvCache) -> Result<Tensor> {
    drafter.forward_states(&inputs.forward, &DraftHidden::Projected(inputs.hidden.clone()), kv)
}

/// A drafter's captured passes, one per shape, on one CUDA device.
pub struct DrafterGraphs {
    #[cfg(feature = "cuda")]
    limits: GraphLimits,
    #[cfg(feature = "cuda")]
    graphs: crate::graph_capture::Graphs<DraftShape, DraftInputs, Tensor>,
    /// A build without CUDA makes none.
    #[cfg(not(feature = "cuda"))]
    never: std::convert::Infallible,
}

#[cfg(feature = "cuda")]
impl DrafterGraphs {
    /// Graphs for the passes within `limits` of `drafter`, which must be on a GPU.
    pub fn new(drafter: &Drafter, limits: GraphLimits) -> Result<Self> {
        Ok(Self {
            limits,
            graphs: crate::graph_capture::Graphs::new(drafter.device())?,
        })
    }

    /// `drafter`'s pass over `batch` with the hidden input `hidden` by a graph, captured now if
    /// its shape has none yet; None where the pass runs without one
    /// (`draft_shape`, or a capture that failed). A failed capture is the error of its first
    /// pass; the pass's keys and values are written, its outputs are not.
    pub fn forward(
        &mut self,
        drafter: &Drafter,
        batch: &ForwardBatch,
        hidden: PassHidden,
        kv: &KvCache,
    ) -> Result<Option<DraftOutput>> {
        let Some(shape) = draft_shape(batch, &self.limits) else {
            return Ok(None);
        };
        let pass = padded_pass(batch, shape, self.limits.table_width)?;
        let mut kept = None;
        let inputs = || {
            // A replay runs no op that would check the metadata.
            pass.batch.attn.validate(kv.num_blocks() * kv.block_size())?;
            let (inputs, rows) = pass.inputs(drafter, hidden)?;
            kept = Some(rows);
            Ok(inputs)
        };
        let write = |from: &DraftInputs, to: &DraftInputs| from.write_into(to);
        let forward = |inputs: &DraftInputs| draft_states(drafter, inputs, kv);
        let graph = self
            .graphs
            .get_or_capture(shape, drafter.device(), inputs, write, forward)?;
        let (Some(graph), Some(kept)) = (graph, kept) else {
            return Ok(None);
        };
        graph.launch()?;
        pass.output(drafter, &graph.outputs, &kept).map(Some)
    }

    /// Captures a graph of every shape within the limits (`draft_startup_steps`), so that no
    /// request waits on a capture; says how many were captured. Run it as
    /// `CudaGraphs::capture_at_startup`, on the thread pool the steps run on; it returns once
    /// the device has run every launch.
    pub fn capture_at_startup(&mut self, drafter: &Drafter, kv: &KvCache) -> Result<usize> {
        let limits = self.limits;
        let inputs_of = |step: &ForwardBatch, shape| {
            let pass = padded_pass(step, shape, limits.table_width)?;
            let rows = step.token_ids.len();
            let hidden = Tensor::zeros((rows, drafter.dims().hidden_size), drafter.dtype(), drafter.device())?;
            Ok(pass.inputs(drafter, PassHidden::rows(&hidden))?.0)
        };
        self.graphs.capture_at_startup(
            drafter.device(),
            draft_startup_steps(&limits, kv.block_size())?,
            |step| draft_shape(step, &limits),
            inputs_of,
            |inputs: &DraftInputs| draft_states(drafter, inputs, kv),
        )
    }
}

#[cfg(not(feature = "cuda"))]
impl DrafterGraphs {
    /// A build without CUDA has no graphs.
    pub fn new(drafter: &Drafter, _limits: GraphLimits) -> Result<Self> {
        bail!(
            "CUDA graphs need a CUDA device and a build with CUDA, not {:?}",
            drafter.device()
        )
    }

    pub fn forward(
        &mut self,
        _drafter: &Drafter,
        _batch: &ForwardBatch,
        _hidden: PassHidden,
        _kv: &KvCache,
    ) -> Result<Option<DraftOutput>> {
        match self.never {}
    }

    pub fn capture_at_startup(&mut self, _drafter: &Drafter, _kv: &KvCache) -> Result<usize> {
        match self.never {}
    }
}
