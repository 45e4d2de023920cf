//! The target model over its paged KV cache: one forward for every scheduled prefill chunk and
//! verification window `[b, d1..dK]`, as one flattened batch. A window takes drafts that are
//! still on the device there (`Sequence::drafts_on_device`).

use crate::error::GenerateError;
use crate::scheduler::Work;
use crate::sequence::Sequence;
use peagle_models::{BatchBuilder, CudaGraphs, ForwardOutput, KvCache, Rows, SequenceRows, TargetModel};
use std::sync::Mutex;

pub struct ModelRunner {
    target: Box<dyn TargetModel>,
    kv: KvCache,
    /// Steps whose shape has a graph run by it (a GPU with CUDA graphs on).
    graphs: Option<Mutex<CudaGraphs>>,
}

/// One target forward: its output and where each scheduled sequence's rows landed in it.
pub struct TargetOutput {
    pub forward: ForwardOutput,
    pub rows: Vec<SequenceRows>,
}

impl ModelRunner {
    pub fn new(target: Box<dyn TargetModel>, kv: KvCache, graphs: Option<CudaGraphs>) -> Self {
        Self {
            target,
            kv,
            graphs: graphs.map(Mutex::new),
        }
    }

    pub fn target(&self) -> &dyn TargetModel {
        self.target.as_ref()
    }

    /// Runs the target over every scheduled sequence (block tables already grown). Logits
    /// come for the rows that choose a token (and for every prompt row when the request
    /// scores its prompt); hidden states for the sequences `captures` selects.
    pub fn run(
        &self,
        work: &[(&mut Sequence, Work)],
        captures: impl Fn(&Sequence) -> bool,
    ) -> Result<TargetOutput, GenerateError> {
        let mut batch = BatchBuilder::new(self.kv.block_size());
        let mut rows = Vec::with_capacity(work.len());
        for (seq, w) in work {
            if *w == Work::Decode && seq.num_cached + 1 != seq.len() {
                return Err(GenerateError::Config(format!(
                    "decode scheduled with {} of {} tokens cached",
                    seq.num_cached,
                    seq.len()
                )));
            }
            let (start, n) = w.span(seq);
            let logits = match w {
                Work::Prefill(_) if seq.scores_prompt() => Rows::All,
                Work::Prefill(_) if seq.samples_after(start + n) => Rows::Tail(1),
                Work::Prefill(_) => Rows::None,
                Work::Decode => Rows::All,
            };
            let capture = if captures(seq) { Rows::All } else { Rows::None };
            let table = &seq.block_table;
            rows.push(match (w, &seq.drafts_on_device) {
                (Work::Prefill(_), _) => batch.add(&seq.token_ids[start..start + n], start, table, logits, capture),
                (Work::Decode, Some(drafts)) => {
                    batch.add_then(&seq.token_ids[start..], drafts, start, table, logits, capture)
                }
                (Work::Decode, None) => {
                    let tokens = [&seq.token_ids[start..], &seq.drafts[..]].concat();
                    batch.add(&tokens, start, table, logits, capture)
                }
            }?);
        }
        let batch = batch.build();
        if let Some(graphs) = &self.graphs {
            let mut graphs = graphs
                .lock()
                .map_err(|_| GenerateError::Config("a CUDA graph capture failed earlier".into()))?;
            match graphs.forward(self.target.as_ref(), &batch, &self.kv) {
                Ok(Some(forward)) => return Ok(TargetOutput { forward, rows }),
                Ok(None) => {}
                // A forward that cannot be captured (one that reads values back) runs as it is.
                Err(e) => tracing::warn!("this step's shape runs without a CUDA graph: {e}"),
            }
        }
        let forward = self.target.forward(&batch, &self.kv)?;
        Ok(TargetOutput { forward, rows })
    }
}
