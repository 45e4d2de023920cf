//! What a drafter is trained to match and how well it does: the target's next-token
//! distribution over the draft vocabulary, KL(p_target || q_draft) in f32, and whether the
//! drafter's greedy token is the target's.

use crate::cod::Element;
use crate::vocab::DraftVocab;
use candle_core::{DType, Result, Tensor, D};
use peagle_models::TargetModel;

/// The target's predictions along one sample, one row per position.
pub struct Targets {
    /// log p over the draft vocabulary, [seq, draft vocab].
    log_probs: Tensor,
    /// The target's greedy token (full vocabulary) at each position.
    argmax: Vec<u32>,
}

impl Targets {
    /// From the final pre-norm states [seq, hidden] captured with the sample.
    pub fn new(target: &dyn TargetModel, final_hidden: &Tensor, vocab: &DraftVocab) -> Result<Self> {
        let logits = target.logits_from_final(&final_hidden.contiguous()?)?;
        let argmax = logits.argmax(D::Minus1)?.to_vec1::<u32>()?;
        let ids = Tensor::from_slice(&vocab.selected, vocab.len(), logits.device())?;
        let draft = logits.index_select(&ids, 1)?;
        Ok(Self {
            log_probs: candle_nn::ops::log_softmax(&draft, D::Minus1)?,
            argmax,
        })
    }
}

/// Sums over supervised elements, per depth.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DepthStats {
    pub loss: Vec<f64>,
    pub correct: Vec<usize>,
    pub count: Vec<usize>,
}

impl DepthStats {
    fn grow(&mut self, depths: usize) {
        let depths = depths.max(self.count.len());
        self.loss.resize(depths, 0.0);
        self.correct.resize(depths, 0);
        self.count.resize(depths, 0);
    }

    fn record(&mut self, depth: usize, loss: f64, correct: bool) {
        self.grow(depth + 1);
        self.loss[depth] += loss;
        self.correct[depth] += correct as usize;
        self.count[depth] += 1;
    }

    pub fn merge(&mut self, other: &DepthStats) {
        self.grow(other.count.len());
        for d in 0..other.count.len() {
            self.loss[d] += other.loss[d];
            self.correct[d] += other.correct[d];
            self.count[d] += other.count[d];
        }
    }

    pub fn mean_loss(&self) -> f64 {
        self.loss.iter().sum::<f64>() / self.count.iter().sum::<usize>().max(1) as f64
    }

    pub fn accuracy(&self) -> Vec<f64> {
        self.correct
            .iter()
            .zip(&self.count)
            .map(|(c, n)| *c as f64 / (*n).max(1) as f64)
            .collect()
    }
}

/// The summed KL of the supervised rows of `logits` [rows, draft vocab]; `elements[i]` is row
/// i's element and `supervised[i]` whether it has a loss. Records per-depth loss and accuracy.
pub fn kl_loss(
    logits: &Tensor,
    elements: &[Element],
    supervised: &[bool],
    targets: &Targets,
    vocab: &DraftVocab,
    stats: &mut DepthStats,
) -> Result<Tensor> {
    let rows: Vec<u32> = (0..elements.len() as u32).filter(|i| supervised[*i as usize]).collect();
    if rows.is_empty() {
        return logits.zeros_like()?.sum_all();
    }
    let device = logits.device();
    let picked = logits.index_select(&Tensor::from_slice(&rows, rows.len(), device)?, 0)?;
    // Element at position p predicts what the target predicts at p + 1.
    let next: Vec<u32> = rows
        .iter()
        .map(|i| (elements[*i as usize].position() + 1) as u32)
        .collect();
    let log_p = targets
        .log_probs
        .index_select(&Tensor::from_slice(&next, next.len(), device)?, 0)?;
    let log_q = candle_nn::ops::log_softmax(&picked.to_dtype(DType::F32)?, D::Minus1)?;
    let per_row = (log_p.exp()? * (&log_p - &log_q)?)?.sum(D::Minus1)?;
    let losses = per_row.to_vec1::<f32>()?;
    let guesses = picked.argmax(D::Minus1)?.to_vec1::<u32>()?;
    for (k, i) in rows.iter().enumerate() {
        let e = elements[*i as usize];
        let correct = vocab.selected[guesses[k] as usize] == targets.argmax[e.position() + 1];
        stats.record(e.depth, losses[k] as f64, correct);
    }
    per_row.sum_all()
}
