use super::*;

/// Acceptance over 1000 verifications where each draft position is accepted with
/// probability `p` given the ones before were.
fn acceptance(p: f64, k: usize) -> SpecStats {
    acceptance_over(p, k, 1000)
}

fn acceptance_over(p: f64, k: usize, verifications: usize) -> SpecStats {
    let mut s = SpecStats::default();
    let mut reached = verifications as f64;
    for accepted in 0..=k {
        let stop = if accepted == k { reached } else { reached * (1.0 - p) };
        for _ in 0..stop.round() as usize {
            s.record(k, accepted);
        }
        reached -= stop;
    }
    s
}

/// Runs `steps` decode steps at `batch`, where a step with k drafts takes `seconds(k)`.
fn drive(
    p: &mut SpeculationPolicy,
    batch: usize,
    steps: usize,
    acceptance: &SpecStats,
    mut seconds: impl FnMut(usize) -> f64,
) -> Vec<usize> {
    drive_steps(p, batch, steps, acceptance, |_, k| {
        decode_step(batch, k, seconds(k), acceptance)
    })
}

/// Runs `steps` steps at `batch`; `sample(step, k)` says what step number `step` with k
/// drafts cost.
fn drive_steps(
    p: &mut SpeculationPolicy,
    batch: usize,
    steps: usize,
    acceptance: &SpecStats,
    mut sample: impl FnMut(usize, usize) -> StepSample,
) -> Vec<usize> {
    (0..steps)
        .map(|step| {
            let k = p.choose(batch, acceptance);
            p.observe(sample(step, k));
            k
        })
        .collect()
}

/// A decode-only step with k drafts that took `seconds` and committed what `acceptance`
/// expects.
fn decode_step(batch: usize, k: usize, seconds: f64, acceptance: &SpecStats) -> StepSample {
    StepSample {
        batch,
        k,
        seconds,
        decode_only: true,
        prefill_drafter_seconds: 0.0,
        after_drafter_wait: false,
        tokens: batch * acceptance.expected_tokens(k).round() as usize,
    }
}

/// How many of `ks` are `k`.
fn share(ks: &[usize], k: usize) -> f64 {
    ks.iter().filter(|x| **x == k).count() as f64 / ks.len() as f64
}

#[test]
fn picks_the_fastest_k_per_batch_size() {
    let good = acceptance(0.8, 7);
    let mut p = SpeculationPolicy::new(7, true);
    // Alone, a window costs little more than one row; at batch 8 every row costs in full.
    let alone = drive(&mut p, 1, 200, &good, |k| 1.0 + 0.05 * k as f64);
    let loaded = drive(&mut p, 8, 200, &good, |k| 8.0 * (k + 1) as f64);
    assert!(share(&alone[20..], 7) > 0.9, "{alone:?}");
    assert!(share(&loaded[20..], 0) > 0.9, "{loaded:?}");
    for k in [0, 1, 4, 7] {
        assert!(alone.contains(&k), "{k} never timed in {alone:?}");
    }
}

#[test]
fn poor_acceptance_turns_speculation_off() {
    let mut p = SpeculationPolicy::new(3, true);
    let ks = drive(&mut p, 1, 200, &acceptance(0.05, 3), |k| 1.0 + 0.2 * k as f64);
    assert!(share(&ks[20..], 0) > 0.9, "{ks:?}");
}

#[test]
fn re_measures_and_follows_a_change_in_cost() {
    let good = acceptance(0.7, 3);
    let mut p = SpeculationPolicy::new(3, true);
    drive(&mut p, 2, 100, &good, |k| 1.0 + 0.1 * k as f64);
    // The windows get expensive (longer contexts, say): plain decoding now wins.
    let after = drive(&mut p, 2, 1000, &good, |k| 1.0 + 2.0 * k as f64);
    assert!(share(&after[100..], 0) > 0.9, "{after:?}");
    assert!(
        share(&after[100..], 0) < 1.0,
        "the other candidates must be re-timed now and then"
    );
}

#[test]
fn re_measures_less_often_while_the_choice_holds() {
    let good = acceptance(0.8, 3);
    let mut p = SpeculationPolicy::new(3, true);
    let ks = drive(&mut p, 4, 8000, &good, |k| 1.0 + k as f64);
    let retimed = |range: std::ops::Range<usize>| ks[range].iter().filter(|k| **k != 0).count();
    let (early, late) = (retimed(100..2100), retimed(6000..8000));
    assert!(early > 0 && late < early, "re-timing steps: {early} early, {late} late");
}

#[test]
fn speculation_must_win_by_the_hysteresis() {
    // Three drafts give 3.7 tokens a step for 3.36x the step time: 10% ahead, not 15%.
    let mut p = SpeculationPolicy::new(3, true);
    let ks = drive(
        &mut p,
        1,
        300,
        &acceptance(0.95, 3),
        |k| if k == 0 { 1.0 } else { 3.36 },
    );
    assert!(share(&ks[50..], 0) > 0.9, "{ks:?}");
}

#[test]
fn the_drafters_prompt_passes_count_against_drafting() {
    // Three drafts give 2.95 tokens a step for 2.2x the step time: 34% ahead in decode-only
    // steps. A new prompt arrives every 20 steps; a costly drafter pass over it (12 steps'
    // worth, about 0.2 per token drafted) turns that into a loss.
    let good = acceptance(0.8, 3);
    for (pass_seconds, drafting_wins) in [(0.0, true), (12.0, false)] {
        let mut p = SpeculationPolicy::new(3, true);
        let ks = drive_steps(&mut p, 1, 1000, &good, |step, k| {
            let new_prompt = step % 20 == 0;
            StepSample {
                decode_only: !new_prompt,
                prefill_drafter_seconds: if new_prompt && k > 0 { pass_seconds } else { 0.0 },
                ..decode_step(1, k, 1.0 + 0.4 * k as f64, &good)
            }
        });
        let drafted = 1.0 - share(&ks[200..], 0);
        assert_eq!(
            drafted > 0.9,
            drafting_wins,
            "drafted {drafted:.3} with {pass_seconds} s passes"
        );
    }
}

#[test]
fn a_batch_that_dips_for_a_step_does_not_resume_drafting() {
    // Drafting wins at batch 3 and loses at batch 4. Under steady load a finished request
    // leaves batch 3 for a step until the next one arrives: resuming drafting for that
    // step would cost a catch-up for nothing.
    let good = acceptance(0.8, 3);
    let cost = |batch: usize| {
        move |k: usize| {
            if batch == 3 {
                1.0 + 0.1 * k as f64
            } else {
                1.0 + k as f64
            }
        }
    };
    let mut p = SpeculationPolicy::new(3, true);
    drive(&mut p, 3, 200, &good, cost(3));
    drive(&mut p, 4, 200, &good, cost(4));
    let mut previous = *drive(&mut p, 4, 1, &good, cost(4)).last().expect("a step");
    for _ in 0..30 {
        let dip = drive(&mut p, 3, 1, &good, cost(3))[0];
        assert!(previous > 0 || dip == 0, "drafting resumed for a one-step dip");
        previous = *drive(&mut p, 4, 20, &good, cost(4)).last().expect("20 steps");
    }
    let held = drive(&mut p, 3, 50, &good, cost(3));
    assert!(share(&held[RESUME_AFTER..], 0) < 0.1, "{held:?}");
}

#[test]
fn stray_slow_steps_do_not_flip_the_choice() {
    // A weak drafter: one draft gives 1.35 tokens for 1.3x the step time, so plain decoding
    // wins. One step in six is three times slower (the host doing something else).
    let mut p = SpeculationPolicy::new(3, true);
    let mut state = 12345u64;
    let ks = drive(&mut p, 1, 3000, &acceptance(0.35, 3), |k| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let hiccup = if (state >> 33).is_multiple_of(6) { 3.0 } else { 1.0 };
        hiccup * if k == 0 { 1.0 } else { 1.3 + 0.3 * k as f64 }
    });
    assert!(
        share(&ks[100..], 0) > 0.95,
        "drafted {:.3} of the steps",
        1.0 - share(&ks[100..], 0)
    );
}

#[test]
fn a_switch_that_a_burst_of_slow_steps_caused_is_undone_against_plain_decoding() {
    // Drafting loses at batch 4 (3 drafts: 2.95 tokens for 3.4x the step time). Fifteen
    // steps run three times slower (the host busy elsewhere): plain decoding degrades, is
    // re-timed inside the burst and loses its review to a window timed after it.
    let good = acceptance(0.8, 5);
    let mut p = SpeculationPolicy::new(5, true);
    let burst = 500..515;
    let ks = drive_steps(&mut p, 4, 3000, &good, |step, k| {
        let slow = if burst.contains(&step) { 3.0 } else { 1.0 };
        decode_step(4, k, slow * (1.0 + 0.8 * k as f64), &good)
    });
    let drafted = |range: std::ops::Range<usize>| 1.0 - share(&ks[range], 0);
    assert!(drafted(100..500) < 0.05, "{:?}", &ks[100..500]);
    // The window that won is held against plain decoding at its first re-measurement.
    assert!(drafted(515..700) < 0.5, "{:?}", &ks[515..700]);
    assert!(
        drafted(700..3000) < 0.05,
        "drafted {:.3} of the steps",
        drafted(700..3000)
    );
}

#[test]
fn candidates_timed_at_other_contexts_do_not_win_a_review() {
    // Plain decoding wins throughout. Then every step gets twice as slow (a request with a
    // long context): the incumbent degrades and is reviewed, and drafting, whose numbers
    // date from the short contexts, must not look better than it is.
    let weak = acceptance(0.35, 3);
    let mut p = SpeculationPolicy::new(3, true);
    let cost = |k: usize| 1.0 + 0.3 * k as f64;
    drive(&mut p, 1, 300, &weak, cost);
    let long = drive(&mut p, 1, 300, &weak, |k| 2.0 * cost(k));
    assert!(share(&long, 0) > 0.9, "{long:?}");
}

#[test]
fn a_batch_size_near_a_known_one_starts_from_its_choice() {
    // Plain decoding wins at batch 16. When a wave of requests drains, each smaller batch
    // size holds for a while: warming it up from the longest window would make the drafter
    // catch up on every sequence for nothing.
    let good = acceptance(0.8, 3);
    let loaded = |k: usize| 16.0 * (k + 1) as f64;
    let mut p = SpeculationPolicy::new(3, true);
    drive(&mut p, 16, 300, &good, loaded);
    let draining = drive(&mut p, 15, EXPLORE_EVERY as usize - 1, &good, loaded);
    assert!(draining.iter().all(|k| *k == 0), "{draining:?}");
}

#[test]
fn costly_re_measurements_come_less_often() {
    // Plain decoding wins. Resuming drafting costs a catch-up pass: next to nothing in one
    // run, 300 steps' worth in the other (a long backlog through a deep drafter).
    let weak = acceptance(0.3, 3);
    let resumes = |catch_up: f64| {
        let mut p = SpeculationPolicy::new(3, true);
        let (mut previous, mut resumes) = (0, 0);
        drive_steps(&mut p, 1, 20_000, &weak, |_, k| {
            let resumed = previous == 0 && k > 0;
            resumes += usize::from(resumed);
            previous = k;
            decode_step(1, k, 1.0 + 0.5 * k as f64 + if resumed { catch_up } else { 0.0 }, &weak)
        });
        resumes
    };
    let (cheap, costly) = (resumes(0.0), resumes(300.0));
    assert!(costly * 3 <= cheap, "{cheap} cheap and {costly} costly resumes");
}

#[test]
fn re_measures_often_while_a_window_that_could_win_has_little_evidence() {
    // One draft gives 1.5 tokens for 1.35x the step time: ahead, but not by the hysteresis.
    // Behind a dozen verifications the estimate may be far off (a first request's opening
    // tokens are harder to draft than the rest), so the wait must not grow yet.
    let drafted = |acceptance: &SpecStats, cost_per_draft: f64| {
        let mut policy = SpeculationPolicy::new(3, true);
        let ks = drive(&mut policy, 1, 20_000, acceptance, |k| 1.0 + cost_per_draft * k as f64);
        ks.iter().filter(|k| **k > 0).count()
    };
    let (thin, rich) = (acceptance_over(0.5, 3, 12), acceptance(0.5, 3));
    let (unsure, sure) = (drafted(&thin, 0.35), drafted(&rich, 0.35));
    assert!(
        unsure > 3 * sure,
        "{unsure} steps drafted on thin evidence, {sure} on plenty"
    );
    // Windows that would lose with every draft accepted need no more evidence.
    let (unsure, sure) = (drafted(&thin, 2.0), drafted(&rich, 2.0));
    assert!(
        unsure < 2 * sure,
        "{unsure} steps drafted on thin evidence, {sure} on plenty"
    );
}

#[test]
fn larger_batches_do_not_try_longer_windows_than_smaller_ones_chose() {
    let good = acceptance(0.8, 7);
    let mut p = SpeculationPolicy::new(7, true);
    drive(&mut p, 1, 100, &good, |k| 1.0 + 0.05 * k as f64);
    drive(&mut p, 2, 100, &good, |k| if k == 1 { 1.0 } else { 1.0 + k as f64 });
    let wide = drive(&mut p, 3, 100, &good, |k| 1.0 + 0.05 * k as f64);
    assert!(wide.iter().all(|k| *k <= 1), "{wide:?}");
    assert!(share(&wide[20..], 1) > 0.9, "{wide:?}");
}

#[test]
fn windows_that_cannot_win_even_fully_accepted_are_timed_twice() {
    let perfect = acceptance(1.0, 7);
    let mut p = SpeculationPolicy::new(7, true);
    // Compute-bound: every row of a window costs more than a plain step's row.
    let ks = drive(&mut p, 16, 300, &perfect, |k| 7.0 * (k + 1) as f64 * 1.5);
    for k in [1, 4, 7] {
        let steps = ks[..40].iter().filter(|x| **x == k).count();
        // The step that switches to k (it times nothing), then two timed steps.
        assert_eq!(steps, 1 + HOPELESS_STEPS, "k = {k}: {ks:?}");
    }
    assert!(share(&ks[40..], 0) > 0.95, "{ks:?}");
    // A window that could still win with enough accepted drafts gets its full warm-up.
    let mut p = SpeculationPolicy::new(7, true);
    let ks = drive(&mut p, 16, 40, &acceptance(0.3, 7), |k| 7.0 * (1.0 + 0.5 * k as f64));
    assert_eq!(ks.iter().filter(|x| **x == 1).count(), 1 + WARMUP_STEPS, "{ks:?}");
}

#[test]
fn ignores_prefill_steps_and_the_step_after_a_change() {
    let mut p = SpeculationPolicy::new(3, true);
    let k = p.choose(1, &SpecStats::default());
    assert_eq!(k, 0, "plain decoding is timed first");
    for decode_only in [true, false] {
        // The first step has no previous k, the second runs prefill: neither counts.
        p.observe(StepSample {
            decode_only,
            ..decode_step(1, k, 1e9, &SpecStats::default())
        });
    }
    assert!(p.by_batch[0].candidates[0].recent.is_empty());
}

/// A drafting step after a step that waited for its own drafter paid for no drafter pass, and
/// is not timed; a step at k = 0 has none to pay for, and is.
#[test]
fn a_drafting_step_after_a_drafter_wait_is_not_timed() {
    let mut p = SpeculationPolicy::new(3, true);
    p.choose(1, &SpecStats::default());
    let step = |k, after_drafter_wait| StepSample {
        after_drafter_wait,
        ..decode_step(1, k, 1.0, &SpecStats::default())
    };
    let recent = |p: &SpeculationPolicy, i: usize| p.by_batch[0].candidates[i].recent.len();
    for (k, i) in [(0, 0), (1, 1)] {
        p.observe(step(k, false));
        p.observe(step(k, true));
        assert_eq!(recent(&p, i), usize::from(k == 0), "k = {k} after a wait");
        p.observe(step(k, false));
        assert_eq!(recent(&p, i), 1 + usize::from(k == 0), "k = {k} after none");
    }
}

#[test]
fn fixed_policy_and_no_drafter() {
    let any = acceptance(0.5, 5);
    let mut fixed = SpeculationPolicy::new(5, false);
    assert_eq!(drive(&mut fixed, 16, 50, &any, |k| 1.0 + k as f64), [5; 50]);
    let mut none = SpeculationPolicy::new(0, true);
    assert_eq!(drive(&mut none, 1, 10, &any, |_| 1.0), [0; 10]);
}

/// Every k the policy chooses, warming up, re-measuring and switching between batch sizes and
/// costs, is one of `draft_counts`: the windows CUDA graphs are captured for at start-up.
#[test]
fn the_policy_chooses_only_draft_counts() {
    assert_eq!(draft_counts(7, true), [0, 1, 4, 7]);
    assert_eq!(draft_counts(7, false), [0, 7]);
    assert_eq!(draft_counts(3, true), [0, 1, 2, 3]);
    assert_eq!(draft_counts(0, true), [0]);
    for max_k in [1, 2, 5, 7] {
        let counts = draft_counts(max_k, true);
        let mut p = SpeculationPolicy::new(max_k, true);
        let mut chosen = Vec::new();
        for (batch, p_accept) in [(1, 0.8), (4, 0.5), (16, 0.1), (2, 0.9)] {
            let stats = acceptance(p_accept, max_k);
            chosen.extend(drive(&mut p, batch, 400, &stats, |k| 1.0 + 0.05 * (k * batch) as f64));
        }
        assert!(chosen.iter().all(|k| counts.contains(k)), "K = {max_k}: {chosen:?}");
        assert!(
            chosen.iter().filter(|&&k| k > 0).count() > 0,
            "K = {max_k} drafts at times"
        );
    }
}
