//! What adjusts the rows of a sequence's verification window before its tokens are chosen:
//! its penalties and logit bias, its stop tokens held back while fewer than `min_tokens`
//! tokens are out (`penalties` has the order and the rule for drafts), and the tokens its
//! constraints ban (`token_bans`), and those outside its grammar (`structured`). The host applies it
//! to a whole row; a row adjusted where it lies (on a GPU) has the few values the other
//! adjustments touch adjusted by the host with the same arithmetic and the grammar's bans set
//! from its bits, last as on the host, so it takes the values the host's copy would.

use crate::penalties::{History, LogitsMut, Penalties};
use crate::sequence::Sequence;
use crate::structured::{Cursor, StructuredOutput};
use crate::token_bans::TokenBans;

/// One window's adjustments, row by row: row i follows the sequence's tokens and the
/// window's first i drafts.
pub struct Adjuster<'a> {
    penalties: &'a Penalties,
    bans: &'a TokenBans,
    min_tokens: usize,
    stop_ids: Vec<u32>,
    /// End-of-sequence and stop tokens, `ignore_eos` or not: what a grammar allows where its
    /// text can only end.
    ends: Vec<u32>,
    drafts: &'a [u32],
    history: History,
    row: usize,
    structured: Option<&'a StructuredOutput>,
    /// The structured output's cursor at each row visited so far (row 0 first).
    cursors: Vec<Cursor>,
}

impl<'a> Adjuster<'a> {
    /// The adjustments of the window with `drafts` at the end of `seq`, `eos` being the tokens
    /// `min_tokens` holds back with its stop tokens; None when nothing adjusts its rows.
    pub fn of(seq: &'a Sequence, drafts: &'a [u32], eos: &[u32]) -> Option<Self> {
        if !adjusts_row(seq, 0) {
            return None;
        }
        Some(Self {
            penalties: &seq.params.sampling.penalties,
            bans: &seq.params.sampling.bans,
            min_tokens: seq.params.min_tokens,
            stop_ids: seq.stop_ids(eos),
            ends: [eos, &seq.params.stop_token_ids].concat(),
            drafts,
            history: History::new(&seq.token_ids[..seq.num_prompt_tokens], seq.generated()),
            row: 0,
            structured: seq.params.sampling.structured.as_ref(),
            cursors: seq.structured.iter().cloned().collect(),
        })
    }

    /// Moves to row `row`, forward or back, and says whether anything adjusts it.
    pub fn at_row(&mut self, row: usize) -> bool {
        assert!(
            row <= self.drafts.len(),
            "row {row} of a window of {} drafts",
            self.drafts.len()
        );
        for &draft in self.drafts.get(self.row..row).unwrap_or_default() {
            self.history.push(draft);
        }
        for &draft in self.drafts.get(row..self.row).unwrap_or_default().iter().rev() {
            self.history.pop(draft);
        }
        self.row = row;
        if let Some(s) = self.structured {
            while self.cursors.len() <= row {
                let next = s.advance(
                    self.cursors.last().expect("row 0's cursor"),
                    self.drafts[self.cursors.len() - 1],
                );
                self.cursors.push(next);
            }
        }
        adjusts(
            self.penalties,
            self.bans,
            self.structured,
            self.min_tokens,
            self.history.generated(),
        )
    }

    /// The tokens the structured output allows at the current row, as bits
    /// (`StructuredOutput::allowed`); None without a grammar or before its trigger.
    pub fn allowed(&self, vocab: usize) -> Option<Vec<u32>> {
        let (s, cursor) = self.grammar()?;
        s.allowed(cursor, self.grammar_ends(s, cursor), vocab)
    }

    /// The tokens the structured output bans at the current row.
    fn off_grammar(&self, vocab: usize) -> Vec<u32> {
        match self.grammar() {
            Some((s, cursor)) => s.banned(cursor, self.grammar_ends(s, cursor), vocab),
            None => Vec::new(),
        }
    }

    fn grammar(&self) -> Option<(&StructuredOutput, &Cursor)> {
        Some((self.structured?, &self.cursors[self.row]))
    }

    /// The tokens that end the text where the grammar allows it to end: every end where
    /// nothing else may follow, else the stop tokens.
    fn grammar_ends(&self, s: &StructuredOutput, cursor: &Cursor) -> &[u32] {
        match s.only_ends(cursor) {
            true => &self.ends,
            false => &self.stop_ids,
        }
    }

    /// Stop tokens are held back before `min_tokens`, unless a grammar's text can only end.
    fn holds_stop_tokens(&self) -> bool {
        let only_ends = self.structured.is_some_and(|s| s.only_ends(&self.cursors[self.row]));
        self.history.generated() < self.min_tokens && !only_ends
    }

    /// Adjusts the current row's `logits`, a whole row: `apply_but_grammar`, then -inf for
    /// the tokens the grammar bans (which come last, so the order gives the same values).
    pub fn apply(&self, logits: &mut (impl LogitsMut + ?Sized)) {
        self.apply_but_grammar(logits);
        for token in self.off_grammar(logits.vocab()) {
            if let Some(l) = logits.logit_mut(token) {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    /// Every adjustment but the grammar's bans, which `allowed` gives as bits: the values
    /// `touched` names change. A GPU's rows are adjusted so, then masked by those bits.
    pub fn apply_but_grammar(&self, logits: &mut (impl LogitsMut + ?Sized)) {
        self.penalties.apply(logits, &self.history);
        if self.holds_stop_tokens() {
            for &token in &self.stop_ids {
                if let Some(l) = logits.logit_mut(token) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        for token in self.bans.banned(self.history.tokens(), logits.vocab()) {
            if let Some(l) = logits.logit_mut(token) {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    /// The tokens of a `vocab`-wide row that `apply_but_grammar` may change, ascending.
    pub fn touched(&self, vocab: usize) -> Vec<u32> {
        let held = self.holds_stop_tokens().then_some(&self.stop_ids).into_iter().flatten();
        let mut tokens: Vec<u32> = self
            .penalties
            .touched(&self.history)
            .chain(held.copied())
            .chain(self.bans.banned(self.history.tokens(), vocab))
            .filter(|&t| (t as usize) < vocab)
            .collect();
        tokens.sort_unstable();
        tokens.dedup();
        tokens
    }
}

/// Whether anything adjusts row `row` of a window at the end of `seq`, as `Adjuster::at_row`
/// says: it depends on how many drafts precede the row, not on which, so it is known before
/// the drafts are read.
pub fn adjusts_row(seq: &Sequence, row: usize) -> bool {
    let params = &seq.params;
    adjusts(
        &params.sampling.penalties,
        &params.sampling.bans,
        params.sampling.structured.as_ref(),
        params.min_tokens,
        seq.generated().len() + row,
    )
}

/// Whether a row after `generated` tokens is adjusted: by its penalties, by stop tokens held
/// back while fewer than `min_tokens` are out, or by constraints or a grammar (every row of a
/// sequence that has them, banning tokens there or not, so that the answer does not depend on
/// the drafts).
fn adjusts(
    penalties: &Penalties,
    bans: &TokenBans,
    structured: Option<&StructuredOutput>,
    min_tokens: usize,
    generated: usize,
) -> bool {
    !penalties.is_off() || !bans.is_off() || structured.is_some() || generated < min_tokens
}

/// Some of a row's logits, by token: those an adjustment touches (`Adjuster::touched`).
pub struct SparseLogits {
    tokens: Vec<u32>,
    values: Vec<f32>,
    vocab: usize,
}

impl SparseLogits {
    /// `values[i]` is the logit of `tokens[i]` in a row of `vocab`; the tokens ascend.
    pub fn new(tokens: Vec<u32>, values: Vec<f32>, vocab: usize) -> Self {
        assert_eq!(tokens.len(), values.len(), "a value per token");
        Self { tokens, values, vocab }
    }

    /// The logit of `token`, if held.
    pub fn get(&self, token: u32) -> Option<f32> {
        self.tokens.binary_search(&token).ok().map(|i| self.values[i])
    }
}

impl LogitsMut for SparseLogits {
    fn logit_mut(&mut self, token: u32) -> Option<&mut f32> {
        let i = self.tokens.binary_search(&token).ok()?;
        Some(&mut self.values[i])
    }

    fn vocab(&self) -> usize {
        self.vocab
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::GenerateParams;
    use crate::sampling_params::SamplingParams;
    use crate::structured::StructuredOutput;
    use crate::token_bans::TokenBans;
    use peagle_grammar::{Constraint, Spec, Vocabulary};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::sync::Arc;

    /// `logits` adjusted at the adjuster's row, after checking that the row adjusted as a GPU
    /// adjusts it equals it bit for bit: the touched values adjusted alone (the others left
    /// alone), then the tokens outside the grammar's bits set to -inf.
    fn adjusted_as_touched(adjuster: &Adjuster, logits: &[f32], row: usize) -> Vec<f32> {
        let vocab = logits.len();
        let mut dense = logits.to_vec();
        adjuster.apply(&mut dense[..]);
        let touched = adjuster.touched(vocab);
        assert!(touched.windows(2).all(|w| w[0] < w[1]));
        let values = touched.iter().map(|&t| logits[t as usize]).collect();
        let mut sparse = SparseLogits::new(touched, values, vocab);
        adjuster.apply_but_grammar(&mut sparse);
        let allowed = adjuster.allowed(vocab);
        for token in 0..vocab as u32 {
            let value = match allowed
                .as_deref()
                .is_some_and(|bits| !peagle_kernels::allows(bits, token))
            {
                true => f32::NEG_INFINITY,
                false => sparse.get(token).unwrap_or(logits[token as usize]),
            };
            assert_eq!(
                value.to_bits(),
                dense[token as usize].to_bits(),
                "row {row}, token {token}"
            );
        }
        dense
    }

    /// On every row of a window, the touched values adjusted alone equal the whole row
    /// adjusted, bit for bit, and the row's other values are left alone.
    #[test]
    fn touched_values_adjusted_alone_equal_the_adjusted_row() {
        const VOCAB: usize = 50;
        let mut rng = StdRng::seed_from_u64(5);
        let params = GenerateParams {
            max_tokens: 100,
            min_tokens: 5,
            stop_token_ids: vec![9, 70],
            sampling: SamplingParams {
                penalties: Penalties {
                    presence: 0.3,
                    frequency: -0.7,
                    repetition: 1.3,
                    logit_bias: vec![(4, 2.5), (4, -1.0), (60, 3.0), (11, -100.0)],
                },
                ..SamplingParams::default()
            },
            ..GenerateParams::default()
        };
        let mut seq = Sequence::new(vec![1, 2, 3, 2, 40], params);
        seq.token_ids.extend([5, 6, 5]);
        let drafts = [7, 5, 8, 8];
        let eos = [0];
        let mut adjuster = Adjuster::of(&seq, &drafts, &eos).expect("penalties apply");
        for row in 0..=drafts.len() {
            assert!(adjuster.at_row(row));
            let logits: Vec<f32> = (0..VOCAB).map(|_| rng.random::<f32>() * 6.0 - 3.0).collect();
            adjusted_as_touched(&adjuster, &logits, row);
            assert_eq!(
                adjuster.touched(VOCAB).contains(&0),
                row < 2,
                "eos is held for the first two rows"
            );
        }
    }

    /// Rows visited back from the window's end are adjusted as they were on the way forward:
    /// popping a draft undoes its push, a repeated prompt token's included.
    #[test]
    fn an_adjuster_moved_back_adjusts_rows_as_it_did_forward() {
        const VOCAB: usize = 12;
        let params = GenerateParams {
            max_tokens: 100,
            min_tokens: 4,
            stop_token_ids: vec![9],
            sampling: SamplingParams {
                penalties: Penalties {
                    presence: 0.5,
                    frequency: 0.25,
                    repetition: 1.5,
                    logit_bias: vec![(4, 1.0)],
                },
                ..SamplingParams::default()
            },
            ..GenerateParams::default()
        };
        let mut seq = Sequence::new(vec![1, 2, 3], params);
        seq.token_ids.extend([5]);
        let drafts = [2, 5, 2, 7];
        let logits: Vec<f32> = (0..VOCAB).map(|t| t as f32 - 5.5).collect();
        let mut adjuster = Adjuster::of(&seq, &drafts, &[0]).expect("penalties apply");
        let mut row_at = |row: usize| {
            assert!(adjuster.at_row(row));
            let mut adjusted = logits.clone();
            adjuster.apply(&mut adjusted[..]);
            adjusted.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let forward: Vec<_> = (0..=drafts.len()).map(&mut row_at).collect();
        let back: Vec<_> = (0..=drafts.len()).rev().map(&mut row_at).collect();
        assert_eq!(back.into_iter().rev().collect::<Vec<_>>(), forward);
        assert_ne!(forward[0], forward[1], "the rows differ");
    }

    /// Bans on every row of a window: the tokens outside the allowed ones, and a bad word's
    /// last token where the drafts before the row complete the rest of it; touched alone, they
    /// are adjusted as in the whole row.
    #[test]
    fn bans_follow_the_drafts_and_are_touched_alone_as_in_the_row() {
        const VOCAB: usize = 12;
        let params = GenerateParams {
            max_tokens: 100,
            sampling: SamplingParams {
                bans: TokenBans::new(Some((0..10).collect()), vec![vec![5, 6, 7], vec![3]]),
                ..SamplingParams::default()
            },
            ..GenerateParams::default()
        };
        let mut seq = Sequence::new(vec![1, 5, 6], params);
        seq.token_ids.extend([5]);
        let drafts = [6, 7, 1];
        let mut adjuster = Adjuster::of(&seq, &drafts, &[0]).expect("bans apply");
        let logits: Vec<f32> = (0..VOCAB).map(|t| t as f32 - 5.5).collect();
        let mut banned_by_row = Vec::new();
        for row in 0..=drafts.len() {
            assert!(adjuster.at_row(row), "every row of a sequence with bans is adjusted");
            let dense = adjusted_as_touched(&adjuster, &logits, row);
            let banned: Vec<u32> = (0..VOCAB as u32)
                .filter(|&t| dense[t as usize] == f32::NEG_INFINITY)
                .collect();
            banned_by_row.push(banned);
        }
        // Row 1 follows the generated 5 and the drafted 6: 7 completes the bad word there.
        assert_eq!(
            banned_by_row,
            [vec![3, 10, 11], vec![3, 7, 10, 11], vec![3, 10, 11], vec![3, 10, 11]]
        );
    }

    /// `pattern` over five tokens: 1, 2 and 3 are "a", "b" and "c"; 0 and 4 are not text.
    fn regex_output(pattern: &str) -> StructuredOutput {
        let tokens = vec![
            None,
            Some(b"a".to_vec()),
            Some(b"b".to_vec()),
            Some(b"c".to_vec()),
            None,
        ];
        let vocab = Arc::new(Vocabulary::new(tokens));
        let grammar = Spec::Regex(pattern.into()).compile(&vocab).unwrap();
        StructuredOutput {
            constraint: Arc::new(Constraint::new(grammar, vocab)),
            trigger: Vec::new(),
        }
    }

    /// The tokens each row of the window with `drafts` after `seq` leaves finite, eos being 0
    /// (each row checked by `adjusted_as_touched`).
    fn allowed_by_row(seq: &Sequence, drafts: &[u32]) -> Vec<Vec<u32>> {
        let mut adjuster = Adjuster::of(seq, drafts, &[0]).expect("the grammar applies");
        let logits: Vec<f32> = (0..5).map(|t| t as f32).collect();
        (0..=drafts.len())
            .map(|row| {
                assert!(adjuster.at_row(row));
                let dense = adjusted_as_touched(&adjuster, &logits, row);
                (0..5).filter(|&t| dense[t as usize].is_finite()).collect()
            })
            .collect()
    }

    /// A grammar's bans on every row of a window follow the drafts before the row (here the
    /// regex `ab|ac|b`, one byte a token), stop tokens are allowed once the text is whole,
    /// and the touched values adjusted alone equal the adjusted row.
    #[test]
    fn grammar_bans_follow_the_drafts_and_are_touched_alone_as_in_the_row() {
        let params = GenerateParams {
            max_tokens: 100,
            sampling: SamplingParams {
                structured: Some(regex_output("ab|ac|b")),
                ..SamplingParams::default()
            },
            ..GenerateParams::default()
        };
        let seq = Sequence::new(vec![4, 4], params);
        // Start: a or b; after a: b or c; after "ac": only the stop token; after "acb" (off
        // the grammar, which a draft can be): only the stop token.
        assert_eq!(
            allowed_by_row(&seq, &[1, 3, 2]),
            [vec![1, 2], vec![2, 3], vec![0], vec![0]]
        );
    }

    /// Where a grammar's text can only end, end-of-sequence is allowed even under
    /// `ignore_eos` and before `min_tokens` (the regex `ab`, one byte a token; eos 0, stop 4).
    #[test]
    fn a_whole_text_may_end_under_ignore_eos_and_min_tokens() {
        let params = GenerateParams {
            max_tokens: 100,
            min_tokens: 10,
            ignore_eos: true,
            stop_token_ids: vec![4],
            sampling: SamplingParams {
                structured: Some(regex_output("ab")),
                ..SamplingParams::default()
            },
        };
        let seq = Sequence::new(vec![3], params);
        assert_eq!(allowed_by_row(&seq, &[1, 2]), [vec![1], vec![2], vec![0, 4]]);
    }

    #[test]
    fn nothing_adjusts_a_sequence_with_no_penalties_past_min_tokens() {
        let params = GenerateParams {
            min_tokens: 1,
            ..GenerateParams::default()
        };
        let mut seq = Sequence::new(vec![1, 2], params);
        let drafts = [3];
        let mut adjuster = Adjuster::of(&seq, &drafts, &[0]).expect("min_tokens holds eos");
        assert!(adjuster.at_row(0) && !adjuster.at_row(1));
        assert_eq!(adjuster.touched(10), Vec::<u32>::new());
        seq.token_ids.extend([4, 5]);
        assert!(Adjuster::of(&seq, &drafts, &[0]).is_none());
    }
}
