//! A step's verification over its logits tensor, shaped as vLLM's rejection sampler: per
//! sequence the index slice of its window in the step's logits, its drafts and what its
//! choice depends on go in; its accepted tokens, with log-probabilities where asked for, come
//! out.
//!
//! Rows are read where they lie (`with_rows`): nothing copies the whole tensor, a row is read
//! only up to a window's first rejection, and penalties copy just the rows they change. A
//! greedy row takes an argmax; a sampled one a partial selection (`nucleus`); on a GPU, rows
//! choose on the device (`device_choices`). Drafts are greedy picks (q one-hot,
//! as both proposers draft), so each row's own choice is kept while it equals its draft, as
//! `verify` does: the tokens are those plain decoding would choose.

use crate::adjustments::Adjuster;
use crate::device_choices::IssuedChoices;
use crate::logit_rows::with_rows;
use crate::logprobs::token_outputs;
use crate::request::TokenOutput;
use crate::sequence::Sequence;
use crate::verifier::{keep_matching, Verdict};
use crate::window::{Window, WindowRows};
use candle_core::Tensor;
use std::borrow::Cow;

/// What one window commits: its verdict and the committed tokens' outputs.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    pub verdict: Verdict,
    /// One per verdict token, with log-probabilities when the sequence asked for them.
    pub outputs: Vec<TokenOutput>,
}

/// Verifies every window against `logits` ([rows, vocab]), `eos` being the tokens a
/// sequence's `min_tokens` holds back with its stop tokens. One result per window, in order.
///
/// Logits the host cannot read in place (on a GPU) cost a copy of every row read, so there
/// rows choose on the device (`IssuedChoices`), and a window reads no row but where the
/// device's values leave a cut undecided.
pub fn rejection_sample(logits: &Tensor, windows: &[Window], eos: &[u32]) -> candle_core::Result<Vec<Verified>> {
    let rows: Vec<WindowRows> = windows.iter().map(Window::rows).collect();
    rejection_sample_with(IssuedChoices::issue(logits, &rows)?, logits, windows, eos)
}

/// `rejection_sample` with the device's choices issued for the windows' rows before their
/// drafts were read (a step's, as soon as its forward is).
pub fn rejection_sample_with(
    choices: IssuedChoices,
    logits: &Tensor,
    windows: &[Window],
    eos: &[u32],
) -> candle_core::Result<Vec<Verified>> {
    let choices = choices.read(windows, eos)?;
    windows
        .iter()
        .map(|w| {
            let seq = w.seq;
            let rows = w.first_row..w.first_row + w.drafts.len() + 1;
            let chosen = &choices[rows.clone()];
            if chosen.iter().all(Option::is_some) {
                // Tokens up to the first that differs from its draft.
                let mut own = Vec::new();
                for (i, choice) in chosen.iter().flatten().enumerate() {
                    let token = choice.token(seq, w.position + i)?;
                    own.push(token);
                    if w.drafts.get(i) != Some(&token) {
                        break;
                    }
                }
                let verdict = keep_matching(w.drafts, own);
                let outputs = verdict
                    .tokens
                    .iter()
                    .zip(chosen.iter().flatten())
                    .map(|(&token, choice)| choice.output(token, seq))
                    .collect::<candle_core::Result<_>>()?;
                return Ok(Verified { verdict, outputs });
            }
            with_rows(logits, rows, |rows| {
                let adjusted = adjusted_rows(seq, w.drafts, rows.clone(), eos);
                let own = adjusted
                    .enumerate()
                    .map(|(i, row)| seq.sampler.sample(&row, &seq.params.sampling, w.position + i));
                let verdict = keep_matching(w.drafts, own);
                let outputs = token_outputs(&verdict.tokens, rows, seq.logprobs);
                Verified { verdict, outputs }
            })
        })
        .collect()
}

/// The rows of a window as the sequence's next tokens are chosen from (`Adjuster`). A row is
/// copied only where something applies to it, and only when the iterator reaches it
/// (verification stops at a rejection).
fn adjusted_rows<'a>(
    seq: &'a Sequence,
    drafts: &'a [u32],
    rows: impl ExactSizeIterator<Item = &'a [f32]>,
    eos: &[u32],
) -> impl ExactSizeIterator<Item = Cow<'a, [f32]>> {
    let mut adjuster = Adjuster::of(seq, drafts, eos);
    rows.enumerate().map(move |(i, row)| {
        let applies = adjuster.as_mut().is_some_and(|a| a.at_row(i));
        match &adjuster {
            Some(adjuster) if applies => {
                let mut row = row.to_vec();
                adjuster.apply(&mut row[..]);
                Cow::Owned(row)
            }
            _ => Cow::Borrowed(row),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::penalties::Penalties;
    use crate::request::GenerateParams;
    use crate::sampler::argmax;
    use crate::sampling_params::SamplingParams;
    use candle_core::Device;
    use peagle_kernels::{gumbel_sample, GumbelRequest};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    const VOCAB: usize = 40;

    fn sequence(sampling: SamplingParams, min_tokens: usize, logprobs: Option<usize>) -> Sequence {
        let params = GenerateParams {
            max_tokens: 100,
            sampling,
            min_tokens,
            ..GenerateParams::default()
        };
        let mut seq = Sequence::new(vec![1, 2, 3], params);
        seq.logprobs = logprobs;
        seq
    }

    /// Three windows at their rows of one logits tensor: greedy drafts rejected at the third,
    /// seeded sampling whose drafts are all its own draws (with log-probabilities), and a
    /// first token whose end-of-sequence argmax `min_tokens` holds back.
    #[test]
    fn each_window_commits_what_its_rows_choose() {
        let mut rng = StdRng::seed_from_u64(3);
        let values: Vec<f32> = (0..10 * VOCAB).map(|_| rng.random::<f32>() * 8.0).collect();
        let rows: Vec<&[f32]> = values.chunks(VOCAB).collect();
        let logits = Tensor::from_vec(values.clone(), (10, VOCAB), &Device::Cpu).unwrap();

        let greedy = sequence(SamplingParams::default(), 0, None);
        let greedy_drafts = [
            argmax(rows[1]) as u32,
            argmax(rows[2]) as u32,
            (argmax(rows[3]) as u32 + 1) % 40,
        ];
        let sampling = SamplingParams {
            temperature: 1.0,
            top_p: 0.9,
            seed: Some(7),
            ..SamplingParams::default()
        };
        let sampled = sequence(sampling, 0, Some(3));
        let own: Vec<u32> = (0..4)
            .map(|i| sampled.sampler.sample(rows[5 + i], &sampled.params.sampling, 3 + i))
            .collect();
        let held = sequence(SamplingParams::default(), 5, None);
        let eos = [argmax(rows[9]) as u32];
        let windows = [
            Window {
                first_row: 1,
                drafts: &greedy_drafts,
                position: 3,
                seq: &greedy,
            },
            Window {
                first_row: 5,
                drafts: &own[..3],
                position: 3,
                seq: &sampled,
            },
            Window {
                first_row: 9,
                drafts: &[],
                position: 3,
                seq: &held,
            },
        ];
        let verified = rejection_sample(&logits, &windows, &eos).unwrap();

        let greedy_tokens = vec![greedy_drafts[0], greedy_drafts[1], argmax(rows[3]) as u32];
        assert_eq!(
            (verified[0].verdict.accepted, &verified[0].verdict.tokens),
            (2, &greedy_tokens)
        );
        assert!(verified[0].outputs.iter().all(|o| o.logprob.is_none()));
        assert_eq!((verified[1].verdict.accepted, &verified[1].verdict.tokens), (3, &own));
        for (i, output) in verified[1].outputs.iter().enumerate() {
            let row = rows[5 + i];
            let log_sum = row.iter().map(|l| ((l - 8.0) as f64).exp()).sum::<f64>().ln();
            let expected = row[own[i] as usize] as f64 - 8.0 - log_sum;
            assert!((output.logprob.unwrap() as f64 - expected).abs() < 1e-3, "{output:?}");
            assert_eq!(output.top_logprobs.len(), 3);
            assert_eq!(output.top_logprobs[0].0, argmax(row) as u32);
        }
        let mut without_eos = rows[9].to_vec();
        without_eos[eos[0] as usize] = f32::NEG_INFINITY;
        assert_eq!(verified[2].verdict.tokens, [argmax(&without_eos) as u32]);

        // A strided tensor, which the host cannot read in place (as a GPU's logits), gives the
        // same verdicts: the greedy window through each row's argmax, the sampled one through
        // its rows' first tokens (or the rows, where those leave the cut undecided), the held
        // one through an adjusted copy of its row.
        let strided = logits.t().unwrap().contiguous().unwrap().t().unwrap();
        assert_eq!(rejection_sample(&strided, &windows, &eos).unwrap(), verified);
    }

    /// Choices issued for some windows' rows are read only for those windows: drafts read
    /// short of those counted, or another window, are refused, on either device.
    #[test]
    fn choices_are_read_only_for_the_windows_they_were_issued_for() {
        let logits = Tensor::ones((8, VOCAB), candle_core::DType::F32, &Device::Cpu).unwrap();
        let strided = logits.t().unwrap().contiguous().unwrap().t().unwrap();
        let seq = sequence(SamplingParams::default(), 0, None);
        let rows = |first_row, len| WindowRows {
            first_row,
            len,
            position: 3,
            seq: &seq,
        };
        let window = |first_row, drafts| Window {
            first_row,
            drafts,
            position: 3,
            seq: &seq,
        };
        for logits in [&logits, &strided] {
            let read = |issued: &[WindowRows], verified: &[Window]| {
                let choices = IssuedChoices::issue(logits, issued).unwrap();
                rejection_sample_with(choices, logits, verified, &[]).map(|v| v.len())
            };
            assert_eq!(read(&[rows(0, 3)], &[window(0, &[1, 1])]).unwrap(), 1);
            for verified in [&[window(0, &[1])][..], &[window(0, &[1, 1]), window(3, &[])], &[]] {
                let err = read(&[rows(0, 3)], verified).unwrap_err().to_string();
                assert!(err.contains("other windows"), "{err}");
            }
        }
    }

    /// The Gumbel-max draw of `seq`'s token at `position` from `row`.
    fn gumbel_of(seq: &Sequence, row: &[f32], temperature: f32, position: usize) -> u32 {
        let request = GumbelRequest {
            row: 0,
            temperature,
            key: seq.sampler.key(position),
        };
        let row = Tensor::from_slice(row, (1, row.len()), &Device::Cpu).unwrap();
        gumbel_sample(&row, &[request]).unwrap()[0]
    }

    /// Logits the host cannot read in place (a strided tensor stands for a GPU's) choose on
    /// the device: sampled rows with a cut commit the host's own tokens whether the device's
    /// values decide the cut (peaked rows) or the row is read (flat ones), and rows with no
    /// cut commit the Gumbel-max draws for their positions, with the stop tokens `min_tokens`
    /// holds back out of the draw.
    #[test]
    fn rows_on_a_device_choose_there_as_the_host_would() {
        const WIDE: usize = 1000;
        let mut rng = StdRng::seed_from_u64(8);
        let values: Vec<f32> = (0..12 * WIDE)
            .map(|i| rng.random::<f32>() * if (i / WIDE).is_multiple_of(2) { 12.0 } else { 0.5 })
            .collect();
        let rows: Vec<&[f32]> = values.chunks(WIDE).collect();
        let logits = Tensor::from_vec(values.clone(), (12, WIDE), &Device::Cpu).unwrap();
        let strided = logits.t().unwrap().contiguous().unwrap().t().unwrap();
        let sampled = |top_k, top_p, min_tokens| {
            let sampling = SamplingParams {
                temperature: 0.8,
                top_k,
                top_p,
                seed: Some(11),
                ..SamplingParams::default()
            };
            sequence(sampling, min_tokens, None)
        };
        let seqs = [
            sampled(0, 0.9, 0),
            sampled(20, 1.0, 0),
            sampled(0, 1.0, 0),
            sampled(0, 1.0, 2),
        ];
        let eos = [3];
        let gumbel = |seq: &Sequence, row: &[f32], position: usize| gumbel_of(seq, row, 0.8, position);
        // Each window's three rows (positions 3, 4, 5) and the token each should choose.
        let own: Vec<Vec<u32>> = seqs
            .iter()
            .enumerate()
            .map(|(w, seq)| {
                (0..3)
                    .map(|i| {
                        let (row, position) = (3 * w + i, 3 + i);
                        match w {
                            0 | 1 => seq.sampler.sample(rows[row], &seq.params.sampling, position),
                            2 => gumbel(seq, rows[row], position),
                            _ if i < 2 => {
                                let mut held = rows[row].to_vec();
                                held[eos[0] as usize] = f32::NEG_INFINITY;
                                gumbel(seq, &held, position)
                            }
                            _ => gumbel(seq, rows[row], position),
                        }
                    })
                    .collect()
            })
            .collect();
        let windows: Vec<Window> = seqs
            .iter()
            .zip(&own)
            .enumerate()
            .map(|(w, (seq, own))| Window {
                first_row: 3 * w,
                drafts: &own[..2],
                position: 3,
                seq,
            })
            .collect();
        for (w, verified) in rejection_sample(&strided, &windows, &eos).unwrap().iter().enumerate() {
            assert_eq!(
                (verified.verdict.accepted, &verified.verdict.tokens),
                (2, &own[w]),
                "window {w}"
            );
        }
        // A draft that differs from its row's own token ends the window there.
        let wrong = [own[2][0], (own[2][1] + 1) % WIDE as u32];
        let window = Window {
            drafts: &wrong,
            ..windows[2]
        };
        let verified = rejection_sample(&strided, &[window], &eos).unwrap();
        assert_eq!(verified[0].verdict.tokens, own[2][..2]);

        // Asking for log-probabilities changes no token, and the device's values give the
        // host's log-probabilities but for the last bits of the normaliser.
        let asking: Vec<Sequence> = seqs[..3]
            .iter()
            .map(|seq| sequence(seq.params.sampling.clone(), 0, Some(3)))
            .collect();
        let windows: Vec<Window> = asking
            .iter()
            .zip(&windows)
            .map(|(seq, window)| Window { seq, ..*window })
            .collect();
        for (w, verified) in rejection_sample(&strided, &windows, &eos).unwrap().iter().enumerate() {
            assert_eq!(verified.verdict.tokens, own[w], "window {w}");
            let rows = rows[3 * w..].iter().copied();
            for (got, want) in verified.outputs.iter().zip(token_outputs(&own[w], rows, Some(3))) {
                assert!(
                    (got.logprob.unwrap() - want.logprob.unwrap()).abs() < 1e-5,
                    "{got:?} vs {want:?}"
                );
                let ids = |o: &TokenOutput| o.top_logprobs.iter().map(|(t, _)| *t).collect::<Vec<_>>();
                assert_eq!(ids(got), ids(&want));
            }
        }
    }

    /// Rows that penalties, logit bias or held-back stop tokens adjust choose on the device
    /// from their adjusted copies: greedy and cut rows commit the host's tokens, rows with no
    /// cut the Gumbel-max draws from the host's adjusted rows, and log-probabilities stay
    /// those of the unadjusted rows.
    #[test]
    fn adjusted_rows_choose_on_the_device_as_the_host_would() {
        const WIDE: usize = 1000;
        let mut rng = StdRng::seed_from_u64(21);
        let values: Vec<f32> = (0..16 * WIDE)
            .map(|i| rng.random::<f32>() * if (i / WIDE).is_multiple_of(2) { 12.0 } else { 3.0 })
            .collect();
        let rows: Vec<&[f32]> = values.chunks(WIDE).collect();
        let logits = Tensor::from_vec(values.clone(), (16, WIDE), &Device::Cpu).unwrap();
        let strided = logits.t().unwrap().contiguous().unwrap().t().unwrap();
        let eos = [argmax(rows[0]) as u32, argmax(rows[4]) as u32];
        let adjusted = |temperature, top_k, top_p, min_tokens, logprobs| {
            let sampling = SamplingParams {
                temperature,
                top_k,
                top_p,
                seed: Some(5),
                penalties: Penalties {
                    presence: 0.8,
                    frequency: 0.6,
                    repetition: 1.4,
                    logit_bias: vec![(17, 4.0), (argmax(rows[8]) as u32, -100.0)],
                },
                ..SamplingParams::default()
            };
            let mut seq = sequence(sampling, min_tokens, logprobs);
            seq.token_ids.extend([argmax(rows[1]) as u32, 17, 17]);
            seq
        };
        let seqs = [
            adjusted(0.0, 0, 1.0, 0, Some(3)),
            adjusted(0.8, 0, 0.9, 5, Some(2)),
            adjusted(1.0, 20, 1.0, 0, None),
            adjusted(0.8, 0, 1.0, 7, Some(0)),
        ];
        // Each sequence's own tokens for its rows, found a row at a time on the host.
        fn window<'a>(seqs: &'a [Sequence], w: usize, drafts: &'a [u32]) -> Window<'a> {
            Window {
                first_row: 4 * w,
                drafts,
                position: 6,
                seq: &seqs[w],
            }
        }
        let own: Vec<Vec<u32>> = (0..seqs.len())
            .map(|w| {
                let mut found: Vec<u32> = Vec::new();
                for i in 0..4 {
                    let next = if w == 3 {
                        let mut adjuster = Adjuster::of(&seqs[w], &found, &eos).unwrap();
                        let mut row = rows[4 * w + i].to_vec();
                        assert!(adjuster.at_row(i));
                        adjuster.apply(&mut row[..]);
                        gumbel_of(&seqs[w], &row, 0.8, 6 + i)
                    } else {
                        let verified = rejection_sample(&logits, &[window(&seqs, w, &found)], &eos).unwrap();
                        *verified[0].verdict.tokens.last().unwrap()
                    };
                    found.push(next);
                }
                found
            })
            .collect();
        let windows: Vec<Window> = (0..seqs.len()).map(|w| window(&seqs, w, &own[w][..3])).collect();
        let on_host = rejection_sample(&logits, &windows, &eos).unwrap();
        let on_device = rejection_sample(&strided, &windows, &eos).unwrap();
        for (w, (device, host)) in on_device.iter().zip(&on_host).enumerate() {
            assert_eq!(
                (device.verdict.accepted, &device.verdict.tokens),
                (3, &own[w]),
                "window {w}"
            );
            let outputs = token_outputs(&own[w], rows[4 * w..].iter().copied(), seqs[w].logprobs);
            let expected = if w == 3 { &outputs } else { &host.outputs };
            for (got, want) in device.outputs.iter().zip(expected) {
                assert_eq!(got.id, want.id);
                let close = |a: Option<f32>, b: Option<f32>| match (a, b) {
                    (Some(a), Some(b)) => (a - b).abs() < 1e-5,
                    (a, b) => a == b,
                };
                assert!(close(got.logprob, want.logprob), "window {w}: {got:?} vs {want:?}");
                assert_eq!(got.top_logprobs.len(), want.top_logprobs.len());
                for (g, e) in got.top_logprobs.iter().zip(&want.top_logprobs) {
                    assert!(
                        g.0 == e.0 && (g.1 - e.1).abs() < 1e-5,
                        "window {w}: {got:?} vs {want:?}"
                    );
                }
            }
        }
    }
}
