//! The target model over its paged KV cache: one forward for every scheduled prefill chunk and
//! verification window `[b, d1..dK]`, as one flattened batch.

use crate::error::GenerateError;
use crate::scheduler::Work;
use crate::sequence::Sequence;
use peagle_models::{BatchBuilder, ForwardOutput, KvCache, Rows, SequenceRows, TargetModel};

pub struct ModelRunner {
    target: Box<dyn TargetModel>,
    kv: KvCache,
}

/// One target forward: its output and where each scheduled sequence's rows landed in it.
pub struct TargetOutput {
    pub forward: ForwardOutput,
    pub rows: Vec<SequenceRows>,
}

impl ModelRunner {
    pub fn new(target: Box<dyn TargetModel>, kv: KvCache) -> Self {
        Self { target, kv }
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
            let tokens = match w {
                Work::Prefill(_) => seq.token_ids[start..start + n].to_vec(),
                Work::Decode => [&seq.token_ids[start..], &seq.drafts[..]].concat(),
            };
            let logits = match w {
                Work::Prefill(_) if seq.scores_prompt() => Rows::All,
                Work::Prefill(_) if seq.samples_after(start + n) => Rows::Tail(1),
                Work::Prefill(_) => Rows::None,
                Work::Decode => Rows::All,
            };
            let capture = if captures(seq) { Rows::All } else { Rows::None };
            rows.push(batch.add(&tokens, start, &seq.block_table, logits, capture)?);
        }
        let forward = self.target.forward(&batch.build(), &self.kv)?;
        Ok(TargetOutput { forward, rows })
    }
}
