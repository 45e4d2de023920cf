//! A drafter pass padded to the fixed shape of a CUDA graph (`padded_pass`) gives its own
//! rows the bits they have unpadded, and its padding rows write nothing to the drafter's KV
//! cache: a pass run by a graph is the pass run without one (the GPU tests run the graphs).
//! Which passes run by a graph is `draft_shape`'s choice.

mod common;
use candle_core::Tensor;
use common::*;
use peagle_kernels::PAD_SLOT;
use peagle_models::drafter_graphs::draft_states;
use peagle_models::{
    draft_shape, draft_startup_steps, padded_pass, DraftHidden, DraftShape, GraphLimits, LoadOptions, PassHidden,
};

const LIMITS: GraphLimits = DRAFT_GRAPH_LIMITS;

#[test]
fn a_padded_drafter_pass_gives_its_rows_the_same_bits_and_keeps_no_padding() {
    let d = fixture_drafter(LoadOptions::default());
    let shapes = [(4, 8), (4, 8), (4, 1)];
    for ((what, batch), (sequences, rows_each)) in drafter_passes().into_iter().zip(shapes) {
        let (kv, padded_kv) = (drafter_cache(&d), drafter_cache(&d));
        drafter_prefill(&d, &kv);
        drafter_prefill(&d, &padded_kv);
        let h = drafter_hidden(&d, batch.token_ids.len());
        let want = d.forward(&batch, &DraftHidden::Projected(h.clone()), &kv).unwrap();

        let shape = draft_shape(&batch, &LIMITS).expect("a graph's shape");
        assert_eq!(shape, DraftShape { sequences, rows_each }, "{what}");
        let pass = padded_pass(&batch, shape, LIMITS.table_width).unwrap();
        assert_eq!(pass.batch.token_ids.len(), sequences * rows_each, "{what}");
        let (inputs, kept) = pass.inputs(&d, PassHidden::rows(&h)).unwrap();
        // The same rows picked from a table (every row after a row of another value): the
        // padded pass gathers them from it, to the same hidden input.
        let rows = h.dim(0).unwrap();
        let table = Tensor::cat(&[&h.narrow(0, rows - 1, 1).unwrap().affine(2.0, 1.0).unwrap(), &h], 0).unwrap();
        let picks: Vec<u32> = (1..=rows as u32).collect();
        let picked = PassHidden::picked(&table, &picks);
        assert_eq!(bits(&picked.gather().unwrap()), bits(&h), "{what}: picked rows");
        let (from_table, _) = pass.inputs(&d, picked).unwrap();
        assert_eq!(
            bits(&from_table.hidden),
            bits(&inputs.hidden),
            "{what}: padded from a table"
        );
        let states = draft_states(&d, &inputs, &padded_kv).unwrap();
        assert_eq!(states.dims(), [sequences * rows_each, d.dims().hidden_size]);
        let got = pass.output(&d, &states, &kept).unwrap();

        assert_same_pass(what, got, &padded_kv, want, &kv);
    }
}

/// How `padded_pass` lays a pass out: each sequence's rows, then its padding rows at the next
/// positions writing nothing and reading its last row's hidden input; then padding
/// sequences; the logit rows at their new indices, and no row's outputs kept by the graph.
#[test]
fn a_padded_pass_grows_each_sequence_after_its_own_rows() {
    let [(_, batch), ..] = drafter_passes();
    let shape = DraftShape {
        sequences: 4,
        rows_each: 8,
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
    assert_eq!(pass.logit_rows, [1, 2, 3, 4, 8, 9, 10, 11]);
    assert!(b.logit_rows.is_empty() && b.capture_rows.is_empty());
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

/// The passes captured at start-up are every bucket of rows (powers of two, up to the bucket
/// of the most rows) with every bucket of sequences within the most rows, each a graph's shape
/// as it stands.
#[test]
fn startup_passes_cover_every_bucket() {
    let limits = GraphLimits {
        table_width: 8,
        max_sequences: 3,
        max_rows_each: 6,
        max_rows: 16,
    };
    let shapes: Vec<(usize, usize)> = draft_startup_steps(&limits, BLOCK)
        .unwrap()
        .iter()
        .map(|step| {
            let shape = draft_shape(step, &limits).expect("a graph's shape");
            assert_eq!(shape.sequences * shape.rows_each, step.token_ids.len(), "unpadded");
            (shape.sequences, shape.rows_each)
        })
        .collect();
    let want = [
        (1, 1),
        (2, 1),
        (4, 1),
        (1, 2),
        (2, 2),
        (4, 2),
        (1, 4),
        (2, 4),
        (4, 4),
        (1, 8),
        (2, 8),
    ];
    assert_eq!(shapes, want);
}
