//! The rows of a step that penalties, logit bias, held-back stop tokens, bans or a grammar
//! adjust, copied and adjusted where the logits are (on a GPU): the device gathers the values
//! each adjustment touches, the host adjusts them with the arithmetic it uses on a whole row
//! (`adjustments`), and the device scatters them back; then the tokens a grammar leaves out
//! are set to -inf there from its bits (`peagle_kernels::mask_tokens`), a few kilobytes a row
//! where its banned tokens would be most of the vocabulary. So each copy holds the host's
//! adjusted row bit for bit.

use crate::adjustments::{Adjuster, SparseLogits};
use crate::window::Window;
use candle_core::{DType, Result, Tensor};
use peagle_kernels::{mask_tokens, TOKEN_MASK_WORD_BITS};
use std::iter::repeat;

/// The rows of a step that something adjusts, copied and adjusted on the device.
pub struct AdjustedRows {
    /// [adjusted rows, vocab] in f32, None when no row is adjusted.
    pub tensor: Option<Tensor>,
    /// Each step row's row in `tensor`.
    pub index: Vec<Option<usize>>,
}

impl AdjustedRows {
    /// Copies the windows' adjusted rows of `logits`, sets the values their adjustments touch
    /// to what the host computes from the values gathered (a few values a row cross each way),
    /// then sets the tokens a grammar leaves out to -inf from its bits.
    pub fn new<'a>(logits: &Tensor, windows: impl Iterator<Item = &'a Window<'a>>, eos: &[u32]) -> Result<Self> {
        let (rows, vocab) = logits.dims2()?;
        let mut index = vec![None; rows];
        // Each window's adjuster, left at its last adjusted row, and those rows' indices in
        // the copy and in the window.
        let mut adjusters = Vec::new();
        let mut copied = Vec::new();
        let mut touched = Vec::new();
        let mut allowed = Vec::new();
        for w in windows {
            let Some(mut adjuster) = Adjuster::of(w.seq, w.drafts, eos) else {
                continue;
            };
            let mut adjusted = Vec::new();
            for i in 0..=w.drafts.len() {
                if adjuster.at_row(i) {
                    index[w.first_row + i] = Some(copied.len());
                    adjusted.push((copied.len(), i));
                    copied.push((w.first_row + i) as u32);
                    touched.push(adjuster.touched(vocab));
                    allowed.push(adjuster.allowed(vocab));
                }
            }
            adjusters.push((adjuster, adjusted));
        }
        if copied.is_empty() {
            return Ok(Self { tensor: None, index });
        }
        // Every row gathers as many values: its own tokens, then its first again (token 0
        // where it has none), which writes back the value it has.
        let width = touched.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let tokens: Vec<u32> = touched
            .iter()
            .flat_map(|t| {
                t.iter()
                    .copied()
                    .chain(repeat(t.first().copied().unwrap_or(0)))
                    .take(width)
            })
            .collect();
        let device = logits.device();
        let shape = (copied.len(), width);
        let positions = Tensor::from_vec(tokens.clone(), shape, device)?;
        // In f32, as the host adjusts a row: a GPU's logits are bf16.
        let copy = logits
            .contiguous()?
            .index_select(&Tensor::from_vec(copied, shape.0, device)?, 0)?
            .to_dtype(DType::F32)?;
        let mut values: Vec<f32> = copy.gather(&positions, 1)?.flatten_all()?.to_vec1()?;
        // Back from each window's last adjusted row, so that no history is built twice.
        for (mut adjuster, adjusted) in adjusters {
            for &(k, i) in adjusted.iter().rev() {
                adjuster.at_row(i);
                let own = std::mem::take(&mut touched[k]);
                let row = &mut values[k * width..][..width];
                let old = row[..own.len()].to_vec();
                let mut sparse = SparseLogits::new(own, old, vocab);
                adjuster.apply_but_grammar(&mut sparse);
                for (value, &token) in row.iter_mut().zip(&tokens[k * width..][..width]) {
                    *value = sparse.get(token).unwrap_or(*value);
                }
            }
        }
        let values = Tensor::from_vec(values, shape, device)?;
        let mut tensor = copy.scatter(&positions, &values, 1)?;
        if allowed.iter().any(Option::is_some) {
            let words = vocab.div_ceil(TOKEN_MASK_WORD_BITS);
            let every = vec![u32::MAX; words];
            let bits: Vec<u32> = allowed
                .into_iter()
                .flat_map(|bits| bits.unwrap_or_else(|| every.clone()))
                .collect();
            tensor = mask_tokens(&tensor, &Tensor::from_vec(bits, (shape.0, words), device)?)?;
        }
        Ok(Self {
            tensor: Some(tensor),
            index,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adjustments::Adjuster;
    use crate::penalties::Penalties;
    use crate::request::GenerateParams;
    use crate::sampling_params::SamplingParams;
    use crate::sequence::Sequence;
    use crate::structured::StructuredOutput;
    use crate::token_bans::TokenBans;
    use candle_core::Device;
    use peagle_grammar::{Constraint, Spec, Vocabulary};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::sync::Arc;

    /// bf16 logits (a GPU's) give f32 copies whose adjusted rows (penalties, bias, held-back
    /// stop tokens and bans) are the host's adjustment of the rows widened to f32, bit for bit;
    /// unadjusted rows are not copied.
    #[test]
    fn bf16_rows_are_adjusted_in_f32_as_the_host_adjusts_them() {
        const VOCAB: usize = 40;
        let mut rng = StdRng::seed_from_u64(9);
        let values: Vec<f32> = (0..5 * VOCAB).map(|_| rng.random::<f32>() * 8.0 - 4.0).collect();
        let logits = Tensor::from_vec(values, (5, VOCAB), &Device::Cpu)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let params = GenerateParams {
            max_tokens: 100,
            min_tokens: 2,
            sampling: SamplingParams {
                penalties: Penalties {
                    presence: 0.5,
                    frequency: 0.3,
                    repetition: 1.2,
                    logit_bias: vec![(13, 3.0)],
                },
                bans: TokenBans::new(Some((0..30).collect()), vec![vec![7, 2]]),
                ..SamplingParams::default()
            },
            ..GenerateParams::default()
        };
        let seq = Sequence::new(vec![1, 2, 3, 2], params);
        let plain = Sequence::new(vec![1, 2], GenerateParams::default());
        let drafts = [7, 2];
        let windows = [
            Window {
                first_row: 0,
                drafts: &[],
                position: 2,
                seq: &plain,
            },
            Window {
                first_row: 1,
                drafts: &drafts,
                position: 4,
                seq: &seq,
            },
        ];
        let eos = [0];
        let adjusted = AdjustedRows::new(&logits, windows.iter(), &eos).unwrap();
        assert_eq!(adjusted.index, [None, Some(0), Some(1), Some(2), None]);
        let copy = adjusted.tensor.unwrap();
        assert_eq!(copy.dtype(), DType::F32);
        let widened: Vec<Vec<f32>> = logits.to_dtype(DType::F32).unwrap().to_vec2().unwrap();
        let mut adjuster = Adjuster::of(&seq, &drafts, &eos).unwrap();
        for (i, got) in copy.to_vec2::<f32>().unwrap().iter().enumerate() {
            let mut want = widened[1 + i].clone();
            adjuster.at_row(i);
            adjuster.apply(&mut want[..]);
            let bits = |row: &[f32]| row.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(got), bits(&want), "row {i}");
        }
    }

    /// A grammar's rows, penalized too, are masked on the copy by the grammar's bits after the
    /// penalties: each row equals the host's adjustment of it, bit for bit, the banned tokens
    /// -inf (the regex `ab+c`, one letter a token, token 0 the end).
    #[test]
    fn grammar_rows_are_masked_as_the_host_bans_them() {
        const VOCAB: usize = 40;
        let mut tokens: Vec<Option<Vec<u8>>> = vec![None];
        tokens.extend((b'a'..=b'z').map(|c| Some(vec![c])));
        tokens.resize(VOCAB, None);
        let vocab = Arc::new(Vocabulary::new(tokens));
        let grammar = Spec::Regex("ab+c".into()).compile(&vocab).unwrap();
        let structured = StructuredOutput {
            constraint: Arc::new(Constraint::new(grammar, vocab)),
            trigger: Vec::new(),
        };
        let params = GenerateParams {
            max_tokens: 100,
            sampling: SamplingParams {
                penalties: Penalties {
                    presence: 0.5,
                    logit_bias: vec![(2, 1.5), (9, 2.0)],
                    ..Penalties::default()
                },
                structured: Some(structured),
                ..SamplingParams::default()
            },
            ..GenerateParams::default()
        };
        let seq = Sequence::new(vec![5, 6], params);
        let drafts = [1, 2, 2, 3];
        let mut rng = StdRng::seed_from_u64(4);
        let values: Vec<f32> = (0..5 * VOCAB).map(|_| rng.random::<f32>() * 8.0 - 4.0).collect();
        let logits = Tensor::from_vec(values.clone(), (5, VOCAB), &Device::Cpu).unwrap();
        let window = Window {
            first_row: 0,
            drafts: &drafts,
            position: 2,
            seq: &seq,
        };
        let eos = [0];
        let copy = AdjustedRows::new(&logits, [window].iter(), &eos)
            .unwrap()
            .tensor
            .unwrap();
        let mut adjuster = Adjuster::of(&seq, &drafts, &eos).unwrap();
        let finite: Vec<Vec<usize>> = copy
            .to_vec2::<f32>()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, got)| {
                let mut want = values[i * VOCAB..][..VOCAB].to_vec();
                adjuster.at_row(i);
                adjuster.apply(&mut want[..]);
                let bits = |row: &[f32]| row.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(got), bits(&want), "row {i}");
                (0..VOCAB).filter(|&t| got[t].is_finite()).collect()
            })
            .collect();
        assert_eq!(finite, [vec![1], vec![2], vec![2, 3], vec![2, 3], vec![0]]);
    }
}
