//! CUDA graphs of the drafter's passes. A drafter pass is a few small layers, so without a
//! graph its time is mostly the launches of its kernels, and EAGLE-3 pays them K times a step.
//!
//! A pass's sequences have as many rows as they have slots, which varies with what the last
//! verification accepted, so a graph's shape pads them (`padded_pass`): every sequence to the
//! power of two at or above the rows of the longest (`ForwardBatch::with_rows_each`: new rows
//! after a sequence's own, writing nothing), then the sequences to a bucket, as the target's
//! graphs pad theirs (`ForwardBatch::padded`). Rows are batch invariant and attend only to
//! positions up to their own, so a pass's rows give the same bits padded as not.
//!
//! The graph holds the whole pass to its greedy drafts (`draft_on_device`): the layers, the
//! head over a fixed number of rows of each sequence (its logit rows, padded to a bucket) and
//! their argmax, whose ids stay on the device (`GreedyDrafts`).
//! Its inputs are a forward's (`ForwardInputs`, whose kept rows say where each sequence's logit
//! rows are) and the hidden input, gathered to the padded rows before each replay
//! (`PassHidden`: in one gather also where the pass's rows are themselves picked from a table,
//! or are the last pass's outputs, whose drafts a chained pass also reads as its tokens).

use crate::batch::ForwardBatch;
use crate::cuda_graphs::GraphLimits;
use crate::drafter::{DraftHidden, Drafter, GreedyDrafts};
use crate::forward_inputs::ForwardInputs;
use crate::kv_cache::KvCache;
use candle_core::{bail, Result, Tensor};
use peagle_kernels::Indices;
use std::ops::RangeInclusive;

/// The shape a drafter pass is captured and replayed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DraftShape {
    /// Sequences, padding included: a bucket.
    pub sequences: usize,
    /// Rows of every sequence: a bucket (a power of two) of the pass's longest. A drafter's
    /// rows are cheap, and each shape keeps its outputs, so shapes are few.
    pub rows_each: usize,
    /// Rows of every sequence that the head runs over: a bucket of the most logit rows of a
    /// sequence (P-EAGLE's k, EAGLE-3's 1), at most `rows_each`, at which it is every row.
    pub logits_each: usize,
}

/// The shape a drafter pass over `batch` runs at by a graph within `limits`; None where it
/// runs without one: a sequence longer than the bucket of `max_rows_each` (a prompt, or a
/// backlog of states the drafter has not read), a block table the padding rows would grow
/// past the graph's width, more sequences or rows than a graph holds, or a logit row past the
/// batch's rows (which the pass without a graph refuses).
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
    if batch
        .logit_rows
        .iter()
        .any(|&row| row as usize >= batch.token_ids.len())
    {
        return None;
    }
    let mut logits = vec![0; attn.num_sequences()];
    for &row in &batch.logit_rows {
        logits[sequence_of(&attn.query_start, row)] += 1;
    }
    let logits_each = logits.into_iter().max()?.max(1usize).next_power_of_two();
    (fits && within).then_some(DraftShape {
        sequences,
        rows_each,
        logits_each,
    })
}

/// The sequence whose rows `query_start` says `row` is of.
fn sequence_of(query_start: &[usize], row: u32) -> usize {
    query_start.partition_point(|&start| start <= row as usize) - 1
}

/// A drafter pass's hidden input at the drafter's width: its rows in order, or rows picked from
/// a table and the rows past it (P-EAGLE's first pass: its mask rows all read the mask state
/// past the projected target states; EAGLE-3's later passes: the last pass's logit rows among
/// its outputs), so that a pass by a graph gathers its padded rows from them at once rather
/// than the pass's rows first. Chained (`GreedyDrafts::chained`), it is also the pass's
/// tokens: the drafts of the pass whose outputs the table holds.
#[derive(Clone, Copy)]
pub struct PassHidden<'a> {
    table: &'a Tensor,
    /// The rows past `table`'s, which picks past it read.
    more: Option<&'a Tensor>,
    /// The row each of the pass's rows reads; None: row i reads row i of `table`.
    picks: Option<&'a [u32]>,
    chain: Option<Chain<'a>>,
}

/// The tokens of a chained pass: each row's is the draft id of the table's row it reads
/// (`ids`, u32 [table rows]) mapped through `to_target`, and the pass's own rows' are written
/// to `drafts` as well.
#[derive(Clone, Copy)]
struct Chain<'a> {
    ids: &'a Tensor,
    to_target: &'a Tensor,
    drafts: &'a Tensor,
}

impl<'a> PassHidden<'a> {
    /// `hidden` [the pass's rows, drafter hidden], in the pass's order.
    pub fn rows(hidden: &'a Tensor) -> Self {
        Self {
            table: hidden,
            more: None,
            picks: None,
            chain: None,
        }
    }

    /// Row i of the pass reads row `picks[i]` of `table` [rows, drafter hidden], or of `more`
    /// past `table`'s rows.
    pub fn picked(table: &'a Tensor, more: Option<&'a Tensor>, picks: &'a [u32]) -> Self {
        Self {
            table,
            more,
            picks: Some(picks),
            chain: None,
        }
    }

    /// This input, its table being a pass's kept rows with their draft ids `ids`, as the
    /// input of a chained pass (`GreedyDrafts::chained`).
    pub(crate) fn chained(self, ids: &'a Tensor, to_target: &'a Tensor, drafts: &'a Tensor) -> Self {
        Self {
            chain: Some(Chain { ids, to_target, drafts }),
            ..self
        }
    }

    /// The row that row `row` of the pass reads.
    fn source(&self, row: u32) -> u32 {
        self.picks.map_or(row, |picks| picks[row as usize])
    }

    /// [the pass's rows, drafter hidden], gathered where they are picked.
    pub fn gather(&self) -> Result<Tensor> {
        match self.picks {
            None => Ok(self.table.clone()),
            Some(picks) => peagle_kernels::gather_rows(self.table, self.more, &Indices::new(picks)),
        }
    }

    /// The row of this input's table (past it, of `more`) that each row of a pass whose row i
    /// is row `rows[i]` of this input's pass reads (a graph's padded rows). Chained, the pass's
    /// own rows must lead, in order: their tokens are the drafts.
    pub fn picks(&self, rows: &[u32]) -> Result<Vec<u32>> {
        if let Some(chain) = self.chain {
            let own = chain.drafts.dim(0)?;
            if rows.len() < own || rows.iter().copied().take(own).ne(0..own as u32) {
                bail!("a chained pass's {own} rows must lead its {} rows", rows.len());
            }
        }
        Ok(rows.iter().map(|&row| self.source(row)).collect())
    }

    /// The hidden input of this input's pass itself, its rows as many as `tokens` holds
    /// (`feed` over them).
    pub fn feed_own_rows(&self, tokens: &Tensor) -> Result<Tensor> {
        if self.chain.is_none() {
            return self.gather();
        }
        let picks = self.picks(&(0..tokens.dim(0)? as u32).collect::<Vec<_>>())?;
        self.feed(&Indices::new(&picks), tokens, None)
    }

    /// The hidden input of a pass whose row i reads row `picks[i]` of this input's table (as
    /// `picks` gives them), written into `into` where given (a graph's input).
    /// Chained, each row's token is also written into `tokens` (the pass's ids), and the
    /// drafts of this input's rows into the chain's drafts.
    fn feed(&self, picks: &Indices, tokens: &Tensor, into: Option<&Tensor>) -> Result<Tensor> {
        let Some(chain) = self.chain else {
            return match into {
                Some(into) => {
                    peagle_kernels::gather_rows_into(into, self.table, self.more, picks).map(|()| into.clone())
                }
                None => peagle_kernels::gather_rows(self.table, self.more, picks),
            };
        };
        let last = peagle_kernels::LastPass {
            ids: chain.ids,
            hidden: self.table,
            to_target: chain.to_target,
        };
        peagle_kernels::chain_drafts(last, picks, tokens, chain.drafts, into)
    }
}

/// A drafter pass laid out at a graph's shape.
pub struct PaddedPass {
    /// The pass's rows at the shape, keeping the outputs of `logits_each` rows a sequence:
    /// every row where that is all of them, else its logit rows first, then its last row
    /// again. It keeps no row's states.
    pub batch: ForwardBatch,
    /// For each row, the row of the pass's hidden input it reads.
    pub sources: Vec<u32>,
    /// Where each of the pass's logit rows lands among the rows kept, in their order.
    pub landed: Vec<u32>,
}

/// `batch` padded to `shape` (see the module's documentation), its block tables to
/// `table_width` blocks.
pub fn padded_pass(batch: &ForwardBatch, shape: DraftShape, table_width: usize) -> Result<PaddedPass> {
    let (mut grown, mut sources) = batch.with_rows_each(shape.rows_each)?;
    let logit_rows = std::mem::take(&mut grown.logit_rows);
    grown.capture_rows.clear();
    let mut batch = grown.padded(shape.sequences, table_width)?;
    // Padding sequences read the first row's hidden input; their outputs are never kept.
    sources.resize(batch.token_ids.len(), 0);
    let (kept, landed) = kept_rows(&logit_rows, shape)?;
    batch.logit_rows = kept;
    Ok(PaddedPass { batch, sources, landed })
}

/// The rows a padded pass keeps, and where each of its logit rows `logit_rows` (in the padded
/// layout, ascending) lands among them.
fn kept_rows(logit_rows: &[u32], shape: DraftShape) -> Result<(Vec<u32>, Vec<u32>)> {
    let DraftShape {
        sequences,
        rows_each,
        logits_each,
    } = shape;
    if logits_each == rows_each {
        // Every row: a forward keeps all of them as they are.
        return Ok(((0..(sequences * rows_each) as u32).collect(), logit_rows.to_vec()));
    }
    let mut kept = Vec::with_capacity(sequences * logits_each);
    let mut landed = Vec::with_capacity(logit_rows.len());
    let mut rows = logit_rows.iter().peekable();
    for s in 0..sequences {
        let end = kept.len() + logits_each;
        while let Some(&row) = rows.next_if(|&&r| r as usize / rows_each == s) {
            if kept.len() == end {
                bail!("sequence {s} has more logit rows than its shape's {logits_each}");
            }
            landed.push(kept.len() as u32);
            kept.push(row);
        }
        // The padding keeps the sequence's last row, so that the kept rows ascend.
        kept.resize(end, ((s + 1) * rows_each - 1) as u32);
    }
    if let Some(row) = rows.next() {
        bail!("logit row {row} is out of order or past the shape's rows");
    }
    Ok((kept, landed))
}

impl PaddedPass {
    /// The inputs of the padded pass, with the pass's hidden input gathered to its rows.
    pub fn inputs(&self, drafter: &Drafter, hidden: PassHidden) -> Result<DraftInputs> {
        let indices = self.kernel_indices(&hidden)?;
        let forward = drafter.inputs(&self.batch, &indices)?;
        let picks = self.gather_indices(&forward, &indices)?;
        let hidden = hidden.feed(&picks, &forward.ids, None)?;
        Ok(DraftInputs { forward, hidden })
    }

    /// Writes the padded pass's inputs into `target`'s, laid out alike (a graph's): the
    /// hidden input gathered straight into its own, and a chained pass's tokens over the
    /// batch's.
    pub fn upload_into(&self, drafter: &Drafter, hidden: PassHidden, target: &DraftInputs) -> Result<()> {
        let indices = self.kernel_indices(&hidden)?;
        drafter.upload_inputs(&self.batch, &target.forward, &indices)?;
        let picks = self.gather_indices(&target.forward, &indices)?;
        hidden.feed(&picks, &target.forward.ids, Some(&target.hidden))?;
        Ok(())
    }

    /// The pass's greedy drafts from what its graph left (`out`) over its inputs `inputs`,
    /// left where they are.
    pub fn output(&self, inputs: &DraftInputs, out: &DeviceDrafts) -> Result<GreedyDrafts> {
        let rows = self.sources.len();
        let landed = rows..rows + self.landed.len();
        let (ids, hidden) = (out.ids.clone(), out.hidden.clone());
        Ok(match inputs.forward.uploaded_indices(landed)? {
            Some(uploaded) => GreedyDrafts::with_rows_uploaded(ids, hidden, self.landed.clone(), uploaded),
            None => GreedyDrafts::new(ids, hidden, Some(self.landed.clone())),
        })
    }

    /// The kernel indices the pass's inputs carry: the row of `hidden`'s table that each row
    /// reads, then where each logit row lands among the rows kept.
    fn kernel_indices(&self, hidden: &PassHidden) -> Result<Vec<u32>> {
        let mut indices = hidden.picks(&self.sources)?;
        indices.extend_from_slice(&self.landed);
        Ok(indices)
    }

    /// The rows of the hidden input's table that the pass's rows read, from its kernel
    /// indices `indices` as `forward` holds them.
    fn gather_indices<'a>(&self, forward: &ForwardInputs, indices: &'a [u32]) -> Result<Indices<'a>> {
        let rows = self.sources.len();
        forward.indices(0..rows, &indices[..rows])
    }
}

/// Passes a drafter runs: each sequence has a row count in `rows_each` and `logits_each`
/// logit rows (at most its fewest rows). A proposer's passes at one k are one such kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassRows {
    pub rows_each: RangeInclusive<usize>,
    pub logits_each: usize,
}

/// A pass of every shape `limits` allows to the passes `kinds`, for capturing graphs before
/// the first request: every bucket of sequences (within the most rows) with every bucket of
/// rows a kind's row counts fall in, up to the one of `max_rows_each`, with that kind's bucket
/// of logit rows.
pub fn draft_startup_steps(limits: &GraphLimits, kinds: &[PassRows], block_size: usize) -> Result<Vec<ForwardBatch>> {
    let limits = GraphLimits {
        max_rows_each: limits.max_rows_each.next_power_of_two(),
        ..*limits
    };
    let row_buckets: Vec<usize> = std::iter::successors(Some(1usize), |r| Some(2 * r))
        .take_while(|&r| r <= limits.max_rows_each)
        .collect();
    let steps = crate::cuda_graphs::startup_steps(&limits, block_size, limits.max_rows, false, &row_buckets)?;
    let bucket = |n: usize| n.max(1).next_power_of_two();
    let mut passes = Vec::new();
    for step in steps {
        let rows_each = step.attn.query_start[1];
        let mut buckets: Vec<usize> = kinds
            .iter()
            .filter(|k| (bucket(*k.rows_each.start())..=bucket(*k.rows_each.end())).contains(&rows_each))
            .map(|k| bucket(k.logits_each))
            .filter(|&logits| logits <= rows_each)
            .collect();
        buckets.sort_unstable();
        buckets.dedup();
        for logits in buckets {
            let mut pass = step.clone();
            pass.logit_rows = (0..pass.token_ids.len() as u32)
                .filter(|r| (*r as usize) % rows_each >= rows_each - logits)
                .collect();
            passes.push(pass);
        }
    }
    Ok(passes)
}

/// What a drafter pass's graph reads: a forward's inputs and the hidden input of every row.
pub struct DraftInputs {
    pub forward: ForwardInputs,
    /// [rows, drafter hidden].
    pub hidden: Tensor,
}

/// The drafter's forward up to the final norm over a graph's inputs, for every row.
pub fn draft_states(drafter: &Drafter, inputs: &DraftInputs, kv: &KvCache) -> Result<Tensor> {
    drafter.forward_states(&inputs.forward, &DraftHidden::Projected(inputs.hidden.clone()), kv)
}

/// What a drafter pass's graph leaves, for each row it keeps.
pub struct DeviceDrafts {
    /// u32 [kept rows]: the greedy draft id, in the drafter's vocabulary.
    pub ids: Tensor,
    /// [kept rows, drafter hidden]: the hidden output of a pass's logit rows.
    pub hidden: Tensor,
}

/// The drafter's pass over a graph's inputs to the greedy drafts of the rows they keep: what a
/// graph captures.
pub fn draft_on_device(drafter: &Drafter, inputs: &DraftInputs, kv: &KvCache) -> Result<DeviceDrafts> {
    let states = draft_states(drafter, inputs, kv)?;
    let Some(kept) = inputs.forward.logit_rows.apply(&states)? else {
        bail!("a drafter pass by a graph keeps rows");
    };
    let out = drafter.head(kept)?;
    Ok(DeviceDrafts {
        ids: peagle_kernels::argmax_each_row(&out.logits)?,
        hidden: out.hidden,
    })
}

/// A drafter's captured passes, one per shape, on one CUDA device.
pub struct DrafterGraphs {
    #[cfg(feature = "cuda")]
    limits: GraphLimits,
    /// The passes the drafter runs, whose shapes are captured at start-up.
    #[cfg(feature = "cuda")]
    kinds: Vec<PassRows>,
    #[cfg(feature = "cuda")]
    graphs: crate::graph_capture::Graphs<DraftShape, DraftInputs, DeviceDrafts>,
    /// A build without CUDA makes none.
    #[cfg(not(feature = "cuda"))]
    never: std::convert::Infallible,
}

#[cfg(feature = "cuda")]
impl DrafterGraphs {
    /// Graphs for the passes within `limits` of `drafter`, which must be on a GPU; those of
    /// `kinds` are captured at start-up (`capture_at_startup`), any other on its first run.
    pub fn new(drafter: &Drafter, limits: GraphLimits, kinds: Vec<PassRows>) -> Result<Self> {
        Ok(Self {
            limits,
            kinds,
            graphs: crate::graph_capture::Graphs::new(drafter.device())?,
        })
    }

    /// Shapes that have a graph, captured at start-up or on their first pass.
    pub fn count(&self) -> usize {
        self.graphs.count()
    }

    /// `drafter`'s greedy drafts of its pass over `batch` with the hidden input `hidden` by a
    /// graph, captured now if its shape has none yet; None where the pass runs without one
    /// (`draft_shape`, or a capture that failed). A failed capture is the error of its first
    /// pass; the pass's keys and values are written, its outputs are not.
    pub fn forward(
        &mut self,
        drafter: &Drafter,
        batch: &ForwardBatch,
        hidden: PassHidden,
        kv: &KvCache,
    ) -> Result<Option<GreedyDrafts>> {
        let Some(shape) = draft_shape(batch, &self.limits) else {
            return Ok(None);
        };
        let pass = padded_pass(batch, shape, self.limits.table_width)?;
        // A replay runs no op that would check the metadata.
        pass.batch.attn.validate(kv.num_blocks() * kv.block_size())?;
        let inputs = || pass.inputs(drafter, hidden);
        let write = |to: &DraftInputs| pass.upload_into(drafter, hidden, to);
        let forward = |inputs: &DraftInputs| draft_on_device(drafter, inputs, kv);
        let graph = self
            .graphs
            .get_or_capture(shape, drafter.device(), inputs, write, forward)?;
        let Some(graph) = graph else {
            return Ok(None);
        };
        graph.launch()?;
        pass.output(&graph.inputs, &graph.outputs).map(Some)
    }

    /// Captures a graph of every shape of its kinds of passes within the limits
    /// (`draft_startup_steps`), so that no request waits on a capture; says how many were captured. Run it as
    /// `CudaGraphs::capture_at_startup`, on the thread pool the steps run on; it returns once
    /// the device has run every launch.
    pub fn capture_at_startup(&mut self, drafter: &Drafter, kv: &KvCache) -> Result<usize> {
        let limits = self.limits;
        let inputs_of = |step: &ForwardBatch, shape| {
            let pass = padded_pass(step, shape, limits.table_width)?;
            let rows = step.token_ids.len();
            let hidden = Tensor::zeros((rows, drafter.dims().hidden_size), drafter.dtype(), drafter.device())?;
            pass.inputs(drafter, PassHidden::rows(&hidden))
        };
        self.graphs.capture_at_startup(
            drafter.device(),
            draft_startup_steps(&limits, &self.kinds, kv.block_size())?,
            |step| draft_shape(step, &limits),
            inputs_of,
            |inputs: &DraftInputs| draft_on_device(drafter, inputs, kv),
        )
    }
}

#[cfg(not(feature = "cuda"))]
impl DrafterGraphs {
    /// A build without CUDA has no graphs.
    pub fn new(drafter: &Drafter, _limits: GraphLimits, _kinds: Vec<PassRows>) -> Result<Self> {
        bail!(
            "CUDA graphs need a CUDA device and a build with CUDA, not {:?}",
            drafter.device()
        )
    }

    pub fn count(&self) -> usize {
        match self.never {}
    }

    pub fn forward(
        &mut self,
        _drafter: &Drafter,
        _batch: &ForwardBatch,
        _hidden: PassHidden,
        _kv: &KvCache,
    ) -> Result<Option<GreedyDrafts>> {
        match self.never {}
    }

    pub fn capture_at_startup(&mut self, _drafter: &Drafter, _kv: &KvCache) -> Result<usize> {
        match self.never {}
    }
}
