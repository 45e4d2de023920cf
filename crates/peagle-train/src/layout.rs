//! A COD layout turned into drafter inputs: one token, position, hidden row and mask row per
//! element of the flat multi-depth sequence.

use crate::cod::CodLayout;
use candle_core::{Device, Result, Tensor};

pub struct TrainingInputs {
    pub tokens: Vec<u32>,
    pub positions: Vec<u32>,
    /// [elements, aux width]: the target state of the anchor at depth 0, `mask_hidden` deeper.
    pub hidden: Tensor,
    /// [elements, elements] additive attention mask: 0 where visible, -inf elsewhere.
    pub bias: Tensor,
}

impl CodLayout {
    /// `next_tokens[p]` is the token after position p (what depth 0 embeds there); `aux` holds
    /// the target state g(p) of every position, [n, width]; `mask_hidden` is [1, width].
    pub fn inputs(
        &self,
        next_tokens: &[u32],
        aux: &Tensor,
        mask_token: u32,
        mask_hidden: &Tensor,
    ) -> Result<TrainingInputs> {
        let n = aux.dim(0)?;
        let pick = |depth: usize, at_zero: u32, deeper: u32| if depth == 0 { at_zero } else { deeper };
        let tokens = self
            .elements
            .iter()
            .map(|e| pick(e.depth, next_tokens[e.anchor], mask_token))
            .collect();
        let positions = self.elements.iter().map(|e| e.position() as u32).collect();
        // Row n of the stacked table is mask_hidden.
        let rows: Vec<u32> = self
            .elements
            .iter()
            .map(|e| pick(e.depth, e.anchor as u32, n as u32))
            .collect();
        let table = Tensor::cat(&[aux, mask_hidden], 0)?;
        let hidden = table.index_select(&Tensor::from_vec(rows, self.len(), aux.device())?, 0)?;
        Ok(TrainingInputs {
            tokens,
            positions,
            hidden,
            bias: self.bias(aux.device())?,
        })
    }

    /// The attention mask as an additive bias [elements, elements]: 0 or -inf.
    pub fn bias(&self, device: &Device) -> Result<Tensor> {
        let bias: Vec<f32> = self
            .mask()
            .iter()
            .map(|v| if *v { 0.0 } else { f32::NEG_INFINITY })
            .collect();
        Tensor::from_vec(bias, (self.len(), self.len()), device)
    }
}
