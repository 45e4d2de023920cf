//! Steps, and drafter passes, by CUDA graphs against the same work without them: the same
//! bits and the same KV cache, whether captured on first use or at start-up.

use super::{bf16_fixtures, on_gpu};
use crate::common::*;
use candle_core::{DType, Tensor};
use peagle_models::{
    draft_startup_steps, startup_steps, CudaGraphs, DTypeSpec, DraftHidden, DrafterGraphs, GraphLimits, PassHidden,
};

/// Graphs for the fixtures' block tables and `graph_steps`' windows.
const GRAPH_LIMITS: GraphLimits = GraphLimits {
    table_width: 8,
    max_sequences: 16,
    max_rows_each: 3,
    max_rows: 64,
};

/// Steps run by CUDA graphs give the bits, and leave the KV cache, that the same steps give
/// without: two verification windows captured, the next two replayed over new inputs, a
/// decode row of one sequence, and decode rows of three sequences padded to four.
#[test]
fn steps_by_cuda_graphs_equal_steps_without() {
    let Some(options) = on_gpu(DTypeSpec::Bf16) else { return };
    for name in bf16_fixtures() {
        let f = Fixture::load_with(name, options.clone());
        let mut graphs = CudaGraphs::new(&options.device, GRAPH_LIMITS).unwrap();
        let graph_kv = f.cache();
        assert_graph_steps_as_without(name, &f, &mut graphs, &graph_kv);
    }
}

/// A model that reads the rotary table of every position, as an engine on a GPU places it,
/// gives the bits, and leaves the KV cache, of one that uploads each forward's own tables.
#[test]
fn the_rotary_table_gives_the_bits_of_each_forwards_own() {
    let Some(options) = on_gpu(DTypeSpec::Bf16) else { return };
    let own = Fixture::load_with("tiny-llama", options.clone());
    let mut placed = Fixture::load_with("tiny-llama", options);
    placed
        .model
        .place_rotary_table(GRAPH_LIMITS.table_width * BLOCK)
        .unwrap();
    let (own_kv, placed_kv) = (own.cache(), placed.cache());
    prefill_but(&own, 6, &own_kv);
    prefill_but(&placed, 6, &placed_kv);
    for (step, batch) in graph_steps(&own) {
        let want = own.model.forward(&batch, &own_kv).unwrap();
        let got = placed.model.forward(&batch, &placed_kv).unwrap();
        assert_same_step(
            &format!("tiny-llama, {step}, by the table"),
            got,
            &placed_kv,
            want,
            &own_kv,
        );
    }
}

/// Graphs of every shape captured before the first step (as an engine captures them, over the
/// rotary table of every position) serve the steps after it with the bits those steps have
/// without graphs.
#[test]
fn graphs_captured_at_startup_serve_the_steps_after() {
    let Some(options) = on_gpu(DTypeSpec::Bf16) else { return };
    let mut f = Fixture::load_with("tiny-llama", options.clone());
    f.model.place_rotary_table(GRAPH_LIMITS.table_width * BLOCK).unwrap();
    let mut graphs = CudaGraphs::new(&options.device, GRAPH_LIMITS).unwrap();
    let graph_kv = f.cache();
    // Decode rows and windows of 3 rows (K = 2 drafting 2), the rows `graph_steps` has.
    let rows_each = [1, 3];
    let captured = graphs
        .capture_at_startup(f.model.as_ref(), &graph_kv, 64, true, &rows_each)
        .unwrap();
    let steps = startup_steps(&GRAPH_LIMITS, BLOCK, 64, true, &rows_each).unwrap();
    assert_eq!(captured, steps.len());
    assert_graph_steps_as_without("tiny-llama", &f, &mut graphs, &graph_kv);
    assert_eq!(
        graphs.count(),
        steps.len(),
        "every step's shape was captured at start-up"
    );
}

/// Runs `graph_steps` after `prefill_but` by `graphs` over `graph_kv` and without graphs over
/// a cache of its own: the same outputs and caches, bit for bit (`name`: the fixture's). Each
/// step runs again by its graph with its windows' later tokens on the device
/// (`tokens_on_device`, as a proposer leaves drafts), which the replay takes where they lie, and
/// once more without its graph.
fn assert_graph_steps_as_without(name: &str, f: &Fixture, graphs: &mut CudaGraphs, graph_kv: &peagle_models::KvCache) {
    let model = f.model.as_ref();
    let kv = f.cache();
    prefill_but(f, 6, &kv);
    prefill_but(f, 6, graph_kv);
    for (step, batch) in graph_steps(f) {
        let want = model.forward(&batch, &kv).unwrap();
        let got = graphs.forward(model, &batch, graph_kv).unwrap();
        let got = got.expect("a graph's shape");
        assert_same_step(&format!("{name}, {step}"), got, graph_kv, want, &kv);

        let want = model.forward(&batch, &kv).unwrap();
        let on_device = tokens_on_device(&batch, model.device());
        let got = graphs.forward(model, &on_device, graph_kv).unwrap();
        let got = got.expect("a graph's shape");
        let what = format!("{name}, {step}, drafts on the device");
        assert_same_step(&what, got, graph_kv, want, &kv);
        let want = model.forward(&batch, &kv).unwrap();
        let got = model.forward(&on_device, graph_kv).unwrap();
        let what = format!("{name}, {step}, drafts on the device, no graph");
        assert_same_step(&what, got, graph_kv, want, &kv);
    }
}

/// A forward that reads values back (Qwen3-MoE in f32 routes its experts on the host) fails
/// its capture with an error and leaves the stream usable: the same step then runs as it would
/// have, and its shape runs without a graph from then on.
#[test]
fn a_capture_that_reads_back_fails_and_its_shape_runs_without_a_graph() {
    let Some(options) = on_gpu(DTypeSpec::F32) else { return };
    let f = Fixture::load_with("tiny-qwen3-moe", options.clone());
    let model = f.model.as_ref();
    assert!(model.reads_back());
    let mut graphs = CudaGraphs::new(&options.device, GRAPH_LIMITS).unwrap();
    let (kv, graph_kv) = (f.cache(), f.cache());
    prefill_but(&f, 6, &kv);
    prefill_but(&f, 6, &graph_kv);
    let [(_, windows), (_, next), ..] = graph_steps(&f);
    let failed = graphs.forward(model, &windows, &graph_kv);
    assert!(failed.is_err(), "a capture that reads back");
    let want = model.forward(&windows, &kv).unwrap();
    let got = model.forward(&windows, &graph_kv).unwrap();
    assert_same_step("after a failed capture", got, &graph_kv, want, &kv);
    let again = graphs.forward(model, &next, &graph_kv).unwrap();
    assert!(again.is_none(), "the shape runs without a graph");
}

/// Drafter passes run by CUDA graphs give the drafts and hidden outputs, bit for bit, and leave
/// the drafter's KV cache, that the same passes give without: a P-EAGLE pass captured, the next
/// replayed over new inputs in the same shape, an EAGLE-3 pass of one row a sequence, and the
/// pass chained to it, which reads its drafts on the device and writes them as target ids; then
/// the same passes by graphs captured before the first pass (as an engine captures them).
#[test]
fn drafter_passes_by_cuda_graphs_equal_passes_without() {
    let Some(options) = on_gpu(DTypeSpec::Bf16) else { return };
    let d = fixture_drafter(options);
    for at_startup in [false, true] {
        let mut graphs = DrafterGraphs::new(&d, DRAFT_GRAPH_LIMITS, drafter_pass_kinds()).unwrap();
        let (kv, graph_kv) = (drafter_cache(&d), drafter_cache(&d));
        let steps = draft_startup_steps(&DRAFT_GRAPH_LIMITS, &drafter_pass_kinds(), BLOCK).unwrap();
        let steps_at_startup = steps.len();
        if at_startup {
            assert_eq!(graphs.capture_at_startup(&d, &graph_kv).unwrap(), steps_at_startup);
        }
        drafter_prefill(&d, &kv);
        drafter_prefill(&d, &graph_kv);
        let mut last = None;
        for (pass, batch) in drafter_passes() {
            let what = format!("{pass}, captured at startup: {at_startup}");
            let hidden = drafter_hidden(&d, batch.token_ids.len());
            let want = d.forward(&batch, &DraftHidden::Projected(hidden.clone()), &kv).unwrap();
            let got = graphs
                .forward(&d, &batch, PassHidden::rows(&hidden), &graph_kv)
                .unwrap();
            let got = got.expect("a graph's shape");
            let want = d.greedy(want).unwrap();
            assert_same_drafts(&what, &got, &graph_kv, &want, &kv);
            last = Some((got, want));
        }

        // A pass chained to the EAGLE-3 pass, by a graph and without.
        let (graph_last, last) = last.expect("an EAGLE-3 pass");
        let what = format!("chained, captured at startup: {at_startup}");
        let next = eagle3_chained_pass();
        let drafts = || Tensor::zeros(3, DType::U32, d.device()).unwrap();
        let (graph_drafts, want_drafts) = (drafts(), drafts());
        let got = graphs
            .forward(&d, &next, graph_last.chained(&d, &graph_drafts), &graph_kv)
            .unwrap()
            .expect("a graph's shape");
        let inputs = d.inputs(&next, &[]).unwrap();
        let hidden = last.chained(&d, &want_drafts).feed_own_rows(&inputs.ids).unwrap();
        let want = d.forward_inputs(&inputs, &DraftHidden::Projected(hidden), &kv).unwrap();
        assert_same_drafts(&what, &got, &graph_kv, &d.greedy(want).unwrap(), &kv);
        let written = |t: &Tensor| t.to_vec1::<u32>().unwrap();
        assert_eq!(
            written(&graph_drafts),
            written(&want_drafts),
            "{what}: the drafts written"
        );
        if at_startup {
            // Start-up captured every shape the passes took: none was captured on first use.
            assert_eq!(graphs.count(), steps_at_startup, "{what}: graphs");
        }
    }
}
