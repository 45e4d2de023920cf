//! Sampling and verification of one step's logits: each scheduled sequence's rows choose its
//! tokens (a prompt's first token, or the accepted drafts and one target token of a
//! verification window), which are committed to the sequence. Every window goes through one
//! `rejection_sample_with` call over the step's logits tensor, with the device's choices issued
//! (`issue_choices`) as soon as the forward is, before the drafts are read.

use crate::device_choices::IssuedChoices;
use crate::error::GenerateError;
use crate::logprobs::score_prompt;
use crate::rejection_sampler::{rejection_sample_with, Verified};
use crate::scheduler::Work;
use crate::sequence::Sequence;
use crate::spec_stats::SpecStats;
use crate::window::{Window, WindowRows};
use candle_core::Tensor;
use peagle_models::SequenceRows;

/// What a step committed for one sequence.
#[derive(Debug, Clone, Copy)]
pub struct Committed {
    /// Position of the step's first target row for the sequence.
    pub start: usize,
    /// Leading target rows whose next tokens are now committed: the drafter's new slots.
    pub rows: usize,
    /// Whether a token was chosen (not a prompt chunk short of the prompt's end), so the
    /// sequence wants new drafts.
    pub sampled: bool,
}

/// Issues the device's choices of the step's rows of `logits` [logit rows, vocab], where
/// `rows[i]` says which rows are sequence i's: drafts still on the device are counted, not read.
pub fn issue_choices(
    work: &[(&mut Sequence, Work)],
    logits: &Tensor,
    rows: &[SequenceRows],
) -> Result<IssuedChoices, GenerateError> {
    let windows: Vec<WindowRows> = work
        .iter()
        .zip(rows)
        .filter_map(|((seq, w), placed)| window_rows(seq, *w, placed))
        .collect();
    Ok(IssuedChoices::issue(logits, &windows)?)
}

/// Chooses and commits each sequence's tokens from `logits` [logit rows, vocab], where
/// `rows[i]` says which rows are sequence i's, with the device's `choices` issued for them
/// (`issue_choices`) and the drafts read; counts every verification in `stats`.
pub fn sample_and_verify(
    work: &mut [(&mut Sequence, Work)],
    choices: IssuedChoices,
    logits: &Tensor,
    rows: &[SequenceRows],
    eos_token_ids: &[u32],
    max_model_len: usize,
    stats: &mut SpecStats,
) -> Result<Vec<Committed>, GenerateError> {
    let windows: Vec<Window> = work
        .iter()
        .zip(rows)
        .filter_map(|((seq, w), placed)| window(seq, *w, placed))
        .collect();
    let mut verified = rejection_sample_with(choices, logits, &windows, eos_token_ids)?.into_iter();
    let mut committed = Vec::with_capacity(work.len());
    for ((seq, w), placed) in work.iter_mut().zip(rows) {
        let (start, n) = w.span(seq);
        if let Work::Prefill(_) = w {
            score_prompt(seq, start, logits, placed.logits.clone())?;
        }
        committed.push(match w {
            Work::Prefill(_) if !seq.samples_after(start + n) => {
                seq.num_cached = start + n;
                Committed {
                    start,
                    rows: n,
                    sampled: false,
                }
            }
            Work::Prefill(_) => {
                let Verified { outputs, .. } = verified.next().expect("a verdict per window");
                seq.num_cached = seq.len();
                seq.commit(&outputs, eos_token_ids, max_model_len);
                Committed {
                    start,
                    rows: n,
                    sampled: true,
                }
            }
            Work::Decode => {
                let drafts = std::mem::take(&mut seq.drafts);
                let Verified { verdict, outputs } = verified.next().expect("a verdict per window");
                seq.spec_stats.record(drafts.len(), verdict.accepted);
                stats.record(drafts.len(), verdict.accepted);
                seq.num_cached = start + verdict.accepted + 1;
                seq.commit(&outputs, eos_token_ids, max_model_len);
                Committed {
                    start,
                    rows: verdict.accepted + 1,
                    sampled: true,
                }
            }
        });
    }
    Ok(committed)
}

/// The rows that choose `seq`'s tokens this step: the last row of the chunk that ends a new
/// prompt, or a whole verification window; none for a chunk short of the prompt's end.
fn window_rows<'a>(seq: &'a Sequence, work: Work, rows: &SequenceRows) -> Option<WindowRows<'a>> {
    let (start, n) = work.span(seq);
    let (first_row, len) = match work {
        Work::Prefill(_) if !seq.samples_after(start + n) => return None,
        Work::Prefill(_) => (rows.logits.end - 1, 1),
        Work::Decode => (rows.logits.start, seq.num_drafts() + 1),
    };
    Some(WindowRows {
        first_row,
        len,
        position: seq.len(),
        seq,
    })
}

/// `window_rows` with the drafts they verify, once read.
fn window<'a>(seq: &'a Sequence, work: Work, rows: &SequenceRows) -> Option<Window<'a>> {
    let drafts = match work {
        Work::Prefill(_) => &[][..],
        Work::Decode => &seq.drafts[..],
    };
    Some(window_rows(seq, work, rows)?.with_drafts(drafts))
}
