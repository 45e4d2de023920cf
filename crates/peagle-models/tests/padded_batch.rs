//! A batch padded to the fixed shape of a CUDA graph (`ForwardBatch::padded`) gives its own
//! rows the bits they have unpadded, and its padding rows write nothing to the KV cache: a
//! step run by a graph is the step run without one. Which steps run by a graph is
//! `graph_shape`'s choice.

mod common;
use common::*;
use peagle_models::{graph_shape, startup_steps, BatchBuilder, ForwardBatch, GraphLimits, GraphShape, Rows};

/// The steps `steps_by_cuda_graphs_equal_steps_without` (the GPU tests) runs by graphs,
/// padded here as a graph pads them, the logits of the first rows' states made after the
/// forward as a graph's are. Padding reads block 0, sequence 0's first, and writes nothing
/// anywhere.
#[test]
fn a_padded_batch_gives_its_rows_the_same_bits_and_keeps_no_padding() {
    for name in FIXTURES {
        let f = Fixture::load(name);
        let model = f.model.as_ref();
        let (kv, padded_kv) = (f.cache(), f.cache());
        prefill_but(&f, 6, &kv);
        prefill_but(&f, 6, &padded_kv);
        for ((step, batch), sequences) in graph_steps(&f).into_iter().zip([4, 2, 2, 4]) {
            let want = model.forward(&batch, &kv).unwrap();
            let padded = batch.padded(sequences, 8).unwrap();
            let inputs = model.inputs(&padded, &padded_kv).unwrap();
            let states = model.forward_states(&inputs, &padded_kv).unwrap();
            let got = states.first_rows(batch.token_ids.len()).unwrap().logits(model).unwrap();
            assert_same_step(&format!("{name}, {step}"), got, &padded_kv, want, &kv);
        }
    }
}

#[test]
fn uniform_steps_that_keep_every_row_run_by_a_graph() {
    let f = Fixture::load("tiny-llama");
    let batch = windows(&f, 3, 3);
    let limits = |table_width, max_sequences, max_rows_each| GraphLimits {
        table_width,
        max_sequences,
        max_rows_each,
        max_rows: 8,
    };
    let shape = |batch: &ForwardBatch, max| graph_shape(batch, &limits(8, max, 4));
    let two_windows = GraphShape {
        sequences: 2,
        rows_each: 3,
        captures: true,
    };
    assert_eq!(shape(&batch, 64), Some(two_windows));
    // Three sequences take the bucket of four; beyond the most sequences, none.
    let mut b = BatchBuilder::new(BLOCK);
    for seq in 0..3 {
        b.add(&[1], 5, &blocks(seq), Rows::All, Rows::None).unwrap();
    }
    let three = b.build();
    let decode = GraphShape {
        sequences: 4,
        rows_each: 1,
        captures: false,
    };
    assert_eq!(shape(&three, 4), Some(decode));
    assert_eq!(shape(&three, 2), None);
    assert_eq!(
        graph_shape(&three, &limits(7, 4, 4)),
        None,
        "tables longer than the graph's"
    );
    // Rows longer than a verification window's (a scored prompt's chunk) run without one, as
    // do more rows than the most.
    assert_eq!(graph_shape(&batch, &limits(8, 4, 2)), None);
    let wide = GraphLimits {
        max_rows: 5,
        ..limits(8, 4, 4)
    };
    assert_eq!(graph_shape(&batch, &wide), None, "two windows of three, six rows");
    // Rows of unequal count, or outputs kept for some rows only, run without a graph.
    let mut b = BatchBuilder::new(BLOCK);
    b.add(&[1, 2], 5, &blocks(0), Rows::All, Rows::None).unwrap();
    b.add(&[1], 5, &blocks(1), Rows::All, Rows::None).unwrap();
    assert_eq!(shape(&b.build(), 64), None);
    let mut b = BatchBuilder::new(BLOCK);
    b.add(&[1, 2], 0, &blocks(0), Rows::Tail(1), Rows::None).unwrap();
    assert_eq!(shape(&b.build(), 64), None);
    let mut b = BatchBuilder::new(BLOCK);
    b.add(&[1], 5, &blocks(0), Rows::All, Rows::All).unwrap();
    b.add(&[1], 5, &blocks(1), Rows::All, Rows::None).unwrap();
    assert_eq!(shape(&b.build(), 64), None);
    // A batch cannot be padded to fewer sequences, or with tables longer than its width.
    assert!(batch.padded(1, 8).is_err());
    assert!(batch.padded(4, 7).is_err());
}

/// A graph cannot capture a forward that reads values back part-way: experts routed on the
/// host (Qwen3-MoE anywhere; gpt-oss on the CPU, where its experts run one by one).
#[test]
fn only_experts_routed_on_the_host_read_back() {
    for (name, reads_back) in [
        ("tiny-llama", false),
        ("tiny-qwen3", false),
        ("tiny-qwen3-moe", true),
        ("tiny-gpt-oss-mxfp4", true),
    ] {
        assert_eq!(Fixture::load(name).model.reads_back(), reads_back, "{name}");
    }
}

/// The steps captured at start-up are every shape the limits and the scheduler's budget allow
/// (every bucket of sequences, every row count asked for, within the most rows; with a
/// drafter, the one-row steps with captured states and without), each a graph's shape as it
/// stands, and running them writes nothing to the KV cache.
#[test]
fn startup_steps_cover_every_shape_and_write_nothing() {
    let f = Fixture::load("tiny-llama");
    let limits = GraphLimits {
        table_width: 8,
        max_sequences: 3,
        max_rows_each: 3,
        max_rows: 6,
    };
    // A budget of 5 rows a step: at most 2 sequences of 2 rows (bucket 2), 1 of 3.
    let shapes_of = |steps: &[ForwardBatch]| -> Vec<(usize, usize, bool)> {
        let shape = |s: &ForwardBatch| {
            let shape = graph_shape(s, &limits).expect("a graph's shape");
            assert_eq!(shape.sequences, s.attn.num_sequences(), "a bucket, unpadded");
            (shape.sequences, shape.rows_each, shape.captures)
        };
        steps.iter().map(shape).collect()
    };
    let budget_bound = startup_steps(&limits, BLOCK, 5, false, &[1, 2, 3]).unwrap();
    assert_eq!(
        shapes_of(&budget_bound),
        [
            (1, 1, false),
            (2, 1, false),
            (4, 1, false),
            (1, 2, false),
            (2, 2, false),
            (1, 3, false)
        ]
    );
    // Only the row counts asked for (a policy choosing 0 or 2 drafts), and none past the most.
    let narrowed = startup_steps(&limits, BLOCK, 100, false, &[3, 1, 4]).unwrap();
    assert_eq!(
        shapes_of(&narrowed),
        [
            (1, 1, false),
            (2, 1, false),
            (4, 1, false),
            (1, 3, false),
            (2, 3, false)
        ]
    );
    let steps = startup_steps(&limits, BLOCK, 100, true, &[1, 2, 3]).unwrap();
    assert_eq!(
        shapes_of(&steps),
        [
            (1, 1, true),
            (2, 1, true),
            (4, 1, true),
            (1, 1, false),
            (2, 1, false),
            (4, 1, false),
            (1, 2, true),
            (2, 2, true),
            (1, 3, true),
            (2, 3, true)
        ]
    );
    let kv = f.cache();
    for step in &steps {
        let out = f.model.forward(step, &kv).unwrap();
        assert_eq!(out.logits.dims()[0], step.token_ids.len());
    }
    let untouched = f.cache();
    for layer in 0..kv.num_layers() {
        assert_eq!(
            bits(&kv.layer(layer).k),
            bits(&untouched.layer(layer).k),
            "layer {layer} keys"
        );
        assert_eq!(
            bits(&kv.layer(layer).v),
            bits(&untouched.layer(layer).v),
            "layer {layer} values"
        );
    }
}
