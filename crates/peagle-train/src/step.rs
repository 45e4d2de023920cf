//! Forward and backward of one sample, for P-EAGLE (the COD multi-depth layout, optionally
//! in segments) and the EAGLE-3 baseline (training-time test: passes unrolled with the
//! drafter's own output fed back).

use crate::cod::{CodConfig, CodLayout, Element};
use crate::objective::{kl_loss, DepthStats, Targets};
use crate::params::Params;
use crate::partition::partition;
use crate::sample::Sample;
use crate::vocab::DraftVocab;
use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor};
use peagle_models::{DraftHidden, Drafter, TargetModel};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

/// Loss weight decay per unrolled EAGLE-3 step.
pub const TTT_DECAY: f64 = 0.8;

/// A sample ready for the drafter: anchors 0..n pair token x(p+1) with state g(p).
pub struct Prepared {
    pub next_tokens: Vec<u32>,
    /// [n, aux width].
    pub aux: Tensor,
    /// `valid[p]`: the element at position p predicts a learned token (x(p+2) is in the mask).
    pub valid: Vec<bool>,
    pub targets: Targets,
}

impl Prepared {
    pub fn new(sample: &Sample, target: &dyn TargetModel, vocab: &DraftVocab, seq_len: usize) -> Result<Self> {
        let m = sample.len().min(seq_len);
        let states = sample.hidden_states.narrow(0, 0, m)?.to_device(target.device())?;
        let layers = states.dim(1)? - 1;
        let n = m - 1;
        let aux = states.narrow(0, 0, n)?.narrow(1, 0, layers)?.flatten_from(1)?;
        let final_hidden = states.narrow(1, layers, 1)?.squeeze(1)?;
        Ok(Self {
            next_tokens: sample.token_ids[1..m].to_vec(),
            aux,
            valid: (0..n).map(|p| p + 2 < m && sample.loss_mask[p + 2]).collect(),
            targets: Targets::new(target, &final_hidden, vocab)?,
        })
    }

    pub fn positions(&self) -> usize {
        self.next_tokens.len()
    }

    pub fn supervised(&self) -> usize {
        self.valid.iter().filter(|v| **v).count()
    }

    fn is_supervised(&self, e: &Element) -> bool {
        self.valid[e.position()]
    }
}

/// Gradients summed over segments and samples, one slot per parameter.
pub struct Gradients(pub Vec<Option<Tensor>>);

impl Gradients {
    pub fn new(params: &Params) -> Self {
        Self(vec![None; params.vars.len()])
    }

    pub fn add(&mut self, store: &GradStore, params: &Params) -> Result<()> {
        for (slot, var) in self.0.iter_mut().zip(&params.vars) {
            if let Some(g) = store.get(var.as_tensor()) {
                *slot = Some(match slot.take() {
                    Some(sum) => (sum + g)?,
                    None => g.clone(),
                });
            }
        }
        Ok(())
    }
}

/// Everything a P-EAGLE pass needs besides the sample.
pub struct PeagleSetup<'a> {
    pub drafter: &'a Drafter,
    pub vocab: &'a DraftVocab,
    pub cod: &'a CodConfig,
    pub partitions: usize,
}

/// P-EAGLE on one sample: samples its COD layout, runs each segment, and (when `grads` is
/// given) backpropagates each segment's loss scaled by `scale / supervised elements`.
pub fn peagle_sample(
    setup: &PeagleSetup,
    data: &Prepared,
    rng: &mut impl Rng,
    scale: f64,
    mut grads: Option<(&mut Gradients, &Params)>,
) -> Result<DepthStats> {
    let n = data.positions();
    let layout = CodLayout::sample(&data.valid, &vec![0; n], setup.cod, rng);
    let supervised_total = layout.elements.iter().filter(|e| data.is_supervised(e)).count().max(1);
    let (mask_token, mask_hidden) = setup
        .drafter
        .parallel_inputs()
        .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    let mut stats = DepthStats::default();
    for segment in partition(&layout, n, setup.partitions) {
        let sub = layout.subset(&segment.indices);
        let inputs = sub.inputs(&data.next_tokens, &data.aux, mask_token, mask_hidden)?;
        let out = setup.drafter.forward_masked(
            &inputs.tokens,
            &inputs.positions,
            &DraftHidden::Target(inputs.hidden),
            &inputs.bias,
        )?;
        let supervised: Vec<bool> = segment
            .own()
            .zip(&sub.elements)
            .map(|(own, e)| own && data.is_supervised(e))
            .collect();
        let loss = kl_loss(
            &out.logits,
            &sub.elements,
            &supervised,
            &data.targets,
            setup.vocab,
            &mut stats,
        )?;
        if let Some((sum, params)) = grads.as_mut() {
            let scaled = (loss * (scale / supervised_total as f64))?;
            sum.add(&scaled.backward()?, params)?;
        }
    }
    Ok(stats)
}

/// EAGLE-3 training-time test on one sample over `steps` unrolled passes: pass j trains depth
/// j, whose element (a, j) embeds the true token at its position and reads the drafter's own
/// output for (a, j - 1) from pass j - 1. Each pass's mean loss is weighted by 0.8^j.
pub fn eagle3_sample(
    drafter: &Drafter,
    vocab: &DraftVocab,
    data: &Prepared,
    steps: usize,
    scale: f64,
    grads: Option<(&mut Gradients, &Params)>,
) -> Result<DepthStats> {
    let n = data.positions();
    let chains = CodConfig {
        depths: steps,
        ratio: 1.0,
        ratio_min: 1.0,
    };
    // Ratio 1 keeps every chain, so the generator is never drawn from.
    let full = CodLayout::sample(&data.valid, &vec![0; n], &chains, &mut StdRng::seed_from_u64(0));
    let fresh = drafter.project_target(&data.aux)?;
    let mut stats = DepthStats::default();
    let mut total: Option<Tensor> = None;
    let mut previous: Option<(HashMap<Element, usize>, Tensor)> = None;
    for step in 0..steps {
        let indices: Vec<usize> = (0..full.len()).filter(|i| full.elements[*i].depth <= step).collect();
        let layout = full.subset(&indices);
        // Rows [0, n) of `table` are fresh (fc) inputs, the rest the previous pass's outputs.
        let (table, rows): (Tensor, Vec<u32>) = match &previous {
            None => (fresh.clone(), layout.elements.iter().map(|e| e.anchor as u32).collect()),
            Some((index, hidden)) => (
                Tensor::cat(&[&fresh, hidden], 0)?,
                layout
                    .elements
                    .iter()
                    .map(|e| match e.depth {
                        0 => e.anchor as u32,
                        d => {
                            (n + index[&Element {
                                anchor: e.anchor,
                                depth: d - 1,
                            }]) as u32
                        }
                    })
                    .collect(),
            ),
        };
        let hidden = table.index_select(&Tensor::from_vec(rows, layout.len(), table.device())?, 0)?;
        let tokens: Vec<u32> = layout.elements.iter().map(|e| data.next_tokens[e.position()]).collect();
        let positions: Vec<u32> = layout.elements.iter().map(|e| e.position() as u32).collect();
        let bias = layout.bias(table.device())?;
        let out = drafter.forward_masked(&tokens, &positions, &DraftHidden::Projected(hidden), &bias)?;
        let supervised: Vec<bool> = layout
            .elements
            .iter()
            .map(|e| e.depth == step && data.is_supervised(e))
            .collect();
        let count = supervised.iter().filter(|s| **s).count();
        let loss = kl_loss(
            &out.logits,
            &layout.elements,
            &supervised,
            &data.targets,
            vocab,
            &mut stats,
        )?;
        let weighted = (loss * (TTT_DECAY.powi(step as i32) / count.max(1) as f64))?;
        total = Some(match total {
            Some(t) => (t + weighted)?,
            None => weighted,
        });
        let index = layout.elements.iter().enumerate().map(|(i, e)| (*e, i)).collect();
        previous = Some((index, out.hidden));
    }
    if let (Some((sum, params)), Some(total)) = (grads, total) {
        sum.add(&(total * scale)?.backward()?, params)?;
    }
    Ok(stats)
}
