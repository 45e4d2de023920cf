//! A drafter pass padded to the fixed shape of a CUDA graph (`padded_pass`) gives its own
//! rows the bits they have unpadded, and its padding rows write nothing to the drafter's KV
//! cache: a pass run by a graph is the pass run without one (the GPU tests run the graphs).
//! Which passes run by a graph is `draft_shape`'s choice.

mod common;
use candle_core::{Device, Tensor};
use common::*;
use peagle_kernels::PAD_SLOT;
use peagle_models::drafter_graphs::{draft_on_device, draft_states};
use peagle_models::{
    draft_shape, draft_startup_steps, padded_pass, DraftHidden, DraftShape, GraphLimits, KvCache, LoadOptions,
    PassHidden, PassRows,
};

const LIMITS: GraphLimits = DRAFT_GRAPH_LIMITS;

#[test]
fn a_padded_drafter_pass_gives_its_rows_the_same_bits_and_keeps_no_padding() {
    let d = fixture_drafter(LoadOptions::default());
    let shapes = [(4, 8, 4), (4, 8, 4), (4, 1, 1)];
    for ((what, batch), (sequences, rows_each, logits_each)) in drafter_passes().into_iter().zip(shapes) {
        let (kv, padded_kv) = (drafter_cache(&d), drafter_cache(&d));
        drafter_prefill(&d, &kv);
        drafter_prefill(&d, &padded_kv);
        let h = drafter_hidden(&d, batch.token_ids.len());
        let unpadded = || d.forward(&batch, &DraftHidden::Projected(h.clone()), &kv).unwrap();

        let shape = draft_shape(&batch, &LIMITS).expect("a graph's shape");
        let want_shape = DraftShape {
            sequences,
            rows_each,
            logits_each,
        };
        assert_eq!(shape, want_shape, "{what}");
        let pass = padded_pass(&batch, shape, LIMITS.table_width).unwrap();
        assert_eq!(pass.batch.token_ids.len(), sequences * rows_each, "{what}");
        let inputs = pass.inputs(&d, PassHidden::rows(&h)).unwrap();
        // The same rows picked from a table of other values and the rows past it, in another
        // order: the padded pass gathers them from both, to the same hidden input.
        let rows = h.dim(0).unwrap();
        let table = Tensor::cat(&[&h.narrow(0, 2, rows - 2).unwrap(), &h.affine(2.0, 1.0).unwrap()], 0).unwrap();
        let more = h.narrow(0, 0, 2).unwrap();
        let picks: Vec<u32> = (0..rows as u32)
            .map(|r| (r + 2 * rows as u32 - 2) % (2 * rows as u32))
            .collect();
        let picked = PassHidden::picked(&table, Some(&more), &picks);
        assert_eq!(bits(&picked.gather().unwrap()), bits(&h), "{what}: picked rows");
        let from_table = pass.inputs(&d, picked).unwrap();
        assert_eq!(
            bits(&from_table.hidden),
            bits(&inputs.hidden),
            "{what}: padded from a table"
        );

        // The logits of the rows the padded pass keeps, where its logit rows landed.
        let states = draft_states(&d, &inputs, &padded_kv).unwrap();
        assert_eq!(states.dims(), [sequences * rows_each, d.dims().hidden_size]);
        let kept = inputs.forward.logit_rows.apply(&states).unwrap().expect("kept rows");
        assert_eq!(kept.dim(0).unwrap(), sequences * logits_each, "{what}: kept rows");
        let landed = Tensor::new(pass.landed.as_slice(), &Device::Cpu).unwrap();
        let got = d.head(kept.index_select(&landed, 0).unwrap()).unwrap();
        assert_same_pass(what, got, &padded_kv, unpadded(), &kv);

        // What a graph captures, to the host's drafts.
        let got = pass
            .output(&inputs, &draft_on_device(&d, &inputs, &padded_kv).unwrap())
            .unwrap();
        assert_eq!(
            got.ids().unwrap().len(),
            batch.logit_rows.len(),
            "{what}: one draft a logit row"
        );
        assert_same_drafts(what, &got, &padded_kv, &d.greedy(unpadded()).unwrap(), &kv);
    }
}

/// A pass chained to EAGLE-3's pass reads that pass's drafts and hidden outputs where they are:
/// as it is and padded to a graph's shape, it drafts what the same pass does over the drafts
/// the host read back, to the same bits and cache, and writes those drafts as target ids.
#[test]
fn a_chained_pass_drafts_what_the_host_would_feed_it() {
    let d = fixture_drafter(LoadOptions::default());
    let [_, _, (_, eagle3)] = drafter_passes();
    let next = eagle3_chained_pass();
    let first_pass = |kv: &KvCache| {
        drafter_prefill(&d, kv);
        let h = drafter_hidden(&d, eagle3.token_ids.len());
        d.greedy(d.forward(&eagle3, &DraftHidden::Projected(h), kv).unwrap())
            .unwrap()
    };
    let kv = drafter_cache(&d);
    let (want_drafts, want) = chained_by_host(&d, &first_pass(&kv), &next, &kv);
    let drafts_of = |written: &Tensor| written.to_vec1::<u32>().unwrap();

    let chained_kv = drafter_cache(&d);
    let last = first_pass(&chained_kv);
    let drafts = Tensor::zeros(3, candle_core::DType::U32, &Device::Cpu).unwrap();
    let inputs = d.inputs(&next, &[]).unwrap();
    let hidden = last.chained(&d, &drafts).feed_own_rows(&inputs.ids).unwrap();
    let out = d
        .forward_inputs(&inputs, &DraftHidden::Projected(hidden), &chained_kv)
        .unwrap();
    assert_same_drafts("chained", &d.greedy(out).unwrap(), &chained_kv, &want, &kv);
    assert_eq!(drafts_of(&drafts), want_drafts, "chained: the drafts written");
    assert_eq!(drafts_of(&inputs.ids), want_drafts, "chained: the pass's tokens");

    let padded_kv = drafter_cache(&d);
    let last = first_pass(&padded_kv);
    let drafts = Tensor::zeros(3, candle_core::DType::U32, &Device::Cpu).unwrap();
    let shape = draft_shape(&next, &LIMITS).expect("a graph's shape");
    let pass = padded_pass(&next, shape, LIMITS.table_width).unwrap();
    let inputs = pass.inputs(&d, last.chained(&d, &drafts)).unwrap();
    let got = pass
        .output(&inputs, &draft_on_device(&d, &inputs, &padded_kv).unwrap())
        .unwrap();
    assert_same_drafts("chained, padded", &got, &padded_kv, &want, &kv);
    assert_eq!(drafts_of(&drafts), want_drafts, "chained, padded: the drafts written");

    // Drafts for more rows than the pass has are refused.
    let more = Tensor::zeros(4, candle_core::DType::U32, &Device::Cpu).unwrap();
    assert!(pass.inputs(&d, last.chained(&d, &more)).is_err());
}

/// How `padded_pass` lays a pass out: each sequence's rows, then its padding rows at the next
/// positions writing nothing and reading its last row's hidden input; then padding
/// sequences. It keeps no row's states, and of each sequence `logits_each` rows: its logit
/// rows at their new indices, then its last row again; or every row, where that is all.
#[test]
fn a_padded_pass_grows_each_sequence_after_its_own_rows() {
    let [(_, batch), _, (_, eagle3)] = drafter_passes();
    let shape = DraftShape {
        sequences: 4,
        rows_each: 8,
        logits_each: 4,
    };
    let pass = padded_pass(&batch, shape, 8).unwrap();
    let b = &pass.batch;
    assert_eq!(b.attn.query_start, [0, 8, 16, 24, 32]);
    assert_eq!(b.attn.context_lens, [28, 22, 37, 8]);
    assert_eq!(&b.positions[8..16], [14, 15, 16, 17, 18, 19, 20, 21]);
    assert_eq!(&b.positions[16..24], [29, 30, 31, 32, 33, 34, 35, 36]);
    assert_eq!(&b.token_ids[8..16], [7, 9, 9, 9, 0, 0, 0, 0]);
    assert!(b.attn.slot_mapping[12..16].iter().all(|s| *s == PAD_SLOT));
    assert!(b.attn.slot_mapping[19..].iter().all(|s| *s == PAD_SLOT));
    assert_eq!(b.attn.slot_mapping[18], batch.attn.slot_mapping[11]);
    assert!(b.attn.block_tables.iter().all(|t| t.len() == 8));
    let seqs: [&[u32]; 4] = [
        &[0, 1, 2, 3, 4, 4, 4, 4],
        &[5, 6, 7, 8, 8, 8, 8, 8],
        &[9, 10, 11, 11, 11, 11, 11, 11],
        &[0; 8],
    ];
    assert_eq!(pass.sources, seqs.concat());
    let kept: [&[u32]; 4] = [&[1, 2, 3, 4], &[8, 9, 10, 11], &[23; 4], &[31; 4]];
    assert_eq!(b.logit_rows, kept.concat());
    assert_eq!(pass.landed, [0, 1, 2, 3, 4, 5, 6, 7]);
    assert!(b.capture_rows.is_empty());

    // A sequence's logit row at a bucket of every row: all rows kept, each where it is.
    let mut one = eagle3;
    one.logit_rows = vec![1];
    let shape = draft_shape(&one, &LIMITS).unwrap();
    let want = DraftShape {
        sequences: 4,
        rows_each: 1,
        logits_each: 1,
    };
    assert_eq!(shape, want);
    let pass = padded_pass(&one, shape, 8).unwrap();
    assert_eq!(
        (pass.batch.logit_rows.as_slice(), pass.landed.as_slice()),
        ([0, 1, 2, 3].as_slice(), [1].as_slice())
    );
    // A sequence of more logit rows than its shape holds is refused.
    let narrow = DraftShape {
        logits_each: 2,
        ..pass_shape(&batch)
    };
    assert!(padded_pass(&batch, narrow, 8).is_err());
}

/// `batch`'s shape within `LIMITS`.
fn pass_shape(batch: &peagle_models::ForwardBatch) -> DraftShape {
    draft_shape(batch, &LIMITS).expect("a graph's shape")
}

#[test]
fn only_passes_within_the_limits_run_by_a_graph() {
    let [(_, batch), ..] = drafter_passes();
    // LIMITS with one field changed.
    let shape = |change: fn(&mut GraphLimits)| {
        let mut limits = LIMITS;
        change(&mut limits);
        draft_shape(&batch, &limits)
    };
    let bucket = Some(DraftShape {
        sequences: 4,
        rows_each: 8,
        logits_each: 4,
    });
    assert_eq!(
        shape(|_| {}),
        bucket,
        "three sequences take the bucket of four, five rows of eight"
    );
    // A sequence longer than the bucket of the most rows (a prompt, or a backlog) runs
    // without one.
    assert_eq!(shape(|l| l.max_rows_each = 4), None);
    assert_eq!(shape(|l| l.max_rows_each = 5), bucket);
    // Padding that would reach past the graph's block tables: sequence 2's two blocks hold
    // its rows, and its padding reaches position 36, in a third.
    assert_eq!(shape(|l| l.table_width = 2), None);
    assert_eq!(shape(|l| l.table_width = 3), bucket);
    // More sequences, or rows, than a graph holds.
    assert_eq!(shape(|l| l.max_sequences = 2), None);
    assert_eq!(shape(|l| l.max_sequences = 3), bucket);
    assert_eq!(shape(|l| l.max_rows = 31), None);
}

/// The passes captured at start-up are, for each kind of pass (P-EAGLE at K = 3 drafting 1
/// and 3: its slots, 1 to 4, and its k - 1 mask slots), every bucket of rows its row counts
/// fall in with its bucket of logit rows, with every bucket of sequences within the most rows;
/// each a graph's shape as it stands.
#[test]
fn startup_passes_cover_the_buckets_of_each_kind() {
    let limits = GraphLimits {
        table_width: 8,
        max_sequences: 3,
        max_rows_each: 6,
        max_rows: 16,
    };
    let kinds = [
        PassRows {
            rows_each: 1..=4,
            logits_each: 1,
        },
        PassRows {
            rows_each: 3..=6,
            logits_each: 3,
        },
    ];
    let shapes: Vec<(usize, usize, usize)> = draft_startup_steps(&limits, &kinds, BLOCK)
        .unwrap()
        .iter()
        .map(|step| {
            let shape = draft_shape(step, &limits).expect("a graph's shape");
            assert_eq!(shape.sequences * shape.rows_each, step.token_ids.len(), "unpadded");
            (shape.sequences, shape.rows_each, shape.logits_each)
        })
        .collect();
    let want = [
        (1, 1, 1),
        (2, 1, 1),
        (4, 1, 1),
        (1, 2, 1),
        (2, 2, 1),
        (4, 2, 1),
        (1, 4, 1),
        (1, 4, 4),
        (2, 4, 1),
        (2, 4, 4),
        (4, 4, 1),
        (4, 4, 4),
        (1, 8, 4),
        (2, 8, 4),
    ];
    assert_eq!(shapes, want);
}
