//! A drafter pass padded to the fixed shape of a CUDA graph (`padded_pass`) gives its own
//! rows the bits they have unpadded, and its padding rows write nothing to the drafter's KV
//! cache: a pass run by a graph is the pass run without one (the GPU tests run the graphs).
//! Which passes run by a graph is `draft_shape`'s choice.

mod common;
use common::*;
use peagle_kernels::PAD_SLOT;
use peagle_models::drafter_graphs::draft_states;
use peagle_models::{draft_shape, padded_pass, DraftHidden, DraftShape, GraphLimits, LoadOptions};

const LIMITS: GraphLimits = DRAFT_GRAPH_LIMITS;

#[test]
fn a_padded_drafter_pass_gives_its_rows_the_same_bits_and_keeps_no_padding() {
    let d = fixture_drafter(LoadOptions::default());
    let shapes = [(4, 5), (4, 5), (4, 1)];
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
        let (inputs, kept) = pass.inputs(&d, &h).unwrap();
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
        rows_each: 5,
    };
    let pass = padded_pass(&batch, shape, 8).unwrap();
    let b = &pass.batch;
    assert_eq!(b.attn.query_start, [0, 5, 10, 15, 20]);
    assert_eq!(b.attn.context_lens, [25, 19, 34, 5]);
    assert_eq!(&b.positions[5..10], [14, 15, 16, 17, 18]);
    assert_eq!(&b.positions[10..15], [29, 30, 31, 32, 33]);
    assert_eq!(&b.token_ids[5..10], [7, 9, 9, 9, 0]);
    assert_eq!(b.attn.slot_mapping[9], PAD_SLOT);
    assert_eq!(&b.attn.slot_mapping[13..15], [PAD_SLOT, PAD_SLOT]);
    assert_eq!(b.attn.slot_mapping[12], batch.attn.slot_mapping[11]);
    assert!(b.attn.slot_mapping[15..].iter().all(|s| *s == PAD_SLOT));
    assert!(b.attn.block_tables.iter().all(|t| t.len() == 8));
    assert_eq!(
        pass.sources,
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 9, 10, 11, 11, 11, 0, 0, 0, 0, 0]
    );
    assert_eq!(pass.logit_rows, [1, 2, 3, 4, 5, 6, 7, 8]);
    assert!(b.logit_rows.is_empty() && b.capture_rows.is_empty());
}

#[test]
fn only_passes_within_the_limits_run_by_a_graph() {
    let [(_, batch), ..] = drafter_passes();
    let shape = |limits: GraphLimits| draft_shape(&batch, &limits);
    assert!(shape(LIMITS).is_some());
    // A sequence longer than the most rows (a prompt, or a backlog) runs without one.
    assert_eq!(
        shape(GraphLimits {
            max_rows_each: 4,
            ..LIMITS
        }),
        None
    );
    // Padding that would reach past the graph's block tables: sequence 2's two blocks hold
    // its rows, and its padding reaches position 33, in a third.
    assert_eq!(
        shape(GraphLimits {
            table_width: 2,
            ..LIMITS
        }),
        None
    );
    assert!(shape(GraphLimits {
        table_width: 3,
        ..LIMITS
    })
    .is_some());
    // More sequences, or rows, than a graph holds.
    assert_eq!(
        shape(GraphLimits {
            max_sequences: 2,
            ..LIMITS
        }),
        None
    );
    assert_eq!(shape(GraphLimits { max_rows: 19, ..LIMITS }), None);
    assert_eq!(
        shape(GraphLimits {
            max_sequences: 3,
            ..LIMITS
        }),
        Some(DraftShape {
            sequences: 4,
            rows_each: 5
        }),
        "three sequences take the bucket of four"
    );
}
