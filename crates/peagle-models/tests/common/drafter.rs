//! The fixture P-EAGLE drafter: its cache, inputs and prefill, EAGLE-3's chained passes and the
//! passes its CUDA graphs serve.

use super::{blocks, fixture_dir, BLOCK};
use candle_core::Tensor;
use peagle_models::{
    load_target, BatchBuilder, DraftHidden, Drafter, ForwardBatch, GraphLimits, GreedyDrafts, KvCache, LoadOptions,
    PassRows, Rows,
};

/// The P-EAGLE drafter of tiny-llama, placed by `options`.
pub fn fixture_drafter(options: LoadOptions) -> Drafter {
    let target = load_target(&fixture_dir("tiny-llama"), options.clone()).unwrap().model;
    Drafter::load(&fixture_dir("tiny-llama-peagle"), target.as_ref(), options).unwrap()
}

/// A KV cache for `d`, in its activations' dtype.
pub fn drafter_cache(d: &Drafter) -> KvCache {
    KvCache::new(d.dims(), 64, BLOCK, d.dtype(), d.device()).unwrap()
}

/// Hidden inputs at the drafter's width, distinct in every row.
pub fn drafter_hidden(d: &Drafter, rows: usize) -> Tensor {
    let width = d.dims().hidden_size;
    let values: Vec<f32> = (0..rows * width)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0)
        .collect();
    Tensor::from_vec(values, (rows, width), d.device())
        .unwrap()
        .to_dtype(d.dtype())
        .unwrap()
}

/// Caches the prefixes `drafter_passes` runs after: positions 0..20, 0..14 and 0..29 of
/// sequences 0, 1 and 2.
pub fn drafter_prefill(d: &Drafter, kv: &KvCache) {
    for (seq, len) in [(0, 20), (1, 14), (2, 29)] {
        let mut b = BatchBuilder::new(BLOCK);
        let tokens: Vec<u32> = (0..len as u32).map(|t| 3 + (t * 7 + seq as u32) % 90).collect();
        b.add(&tokens, 0, &blocks(seq), Rows::None, Rows::None).unwrap();
        d.forward(&b.build(), &DraftHidden::Projected(drafter_hidden(d, len)), kv)
            .unwrap();
    }
}

/// The pass after `drafter_passes`' EAGLE-3 pass, chained to it: a row a sequence at the next
/// position, whose token is a placeholder for that pass's draft.
pub fn eagle3_chained_pass() -> ForwardBatch {
    let mut b = BatchBuilder::new(BLOCK);
    for (seq, (start, table)) in [(26, 2), (19, 2), (34, 3)].into_iter().enumerate() {
        b.add(&[0], start, &blocks(seq)[..table], Rows::Tail(1), Rows::None)
            .unwrap();
    }
    b.build()
}

/// What a pass over `next` chained to `last` computes, by the host: `last`'s drafts as target
/// ids, and the pass over them as tokens with `last`'s hidden outputs as its hidden input.
pub fn chained_by_host(
    d: &Drafter,
    last: &GreedyDrafts,
    next: &ForwardBatch,
    kv: &KvCache,
) -> (Vec<u32>, GreedyDrafts) {
    let map: Vec<u32> = d.draft_to_target().to_vec1().unwrap();
    let tokens: Vec<u32> = last.ids().unwrap().iter().map(|&id| map[id as usize]).collect();
    let batch = ForwardBatch {
        token_ids: tokens.clone(),
        ..next.clone()
    };
    let out = d.forward(&batch, &DraftHidden::Projected(last.hidden().gather().unwrap()), kv);
    (tokens, d.greedy(out.unwrap()).unwrap())
}

/// Graphs for `drafter_passes`.
pub const DRAFT_GRAPH_LIMITS: GraphLimits = GraphLimits {
    table_width: 8,
    max_sequences: 64,
    max_rows_each: 8,
    max_rows: 64,
};

/// The kinds of `drafter_passes`, whose shapes are captured at start-up: P-EAGLE drafting 4
/// (its 1 to 5 slots and 3 mask slots, 4 logit rows), and EAGLE-3's later passes of one row.
pub fn drafter_pass_kinds() -> Vec<PassRows> {
    vec![
        PassRows {
            rows_each: 4..=8,
            logits_each: 4,
        },
        PassRows {
            rows_each: 1..=1,
            logits_each: 1,
        },
    ]
}

/// Drafter passes of three sequences after `drafter_prefill`, each at an offset:
/// - P-EAGLE: two slots and three mask slots, one slot and three, and a prefill chunk that
///   drafts nothing (its rows fill its second block, so its padding reaches a third);
/// - P-EAGLE again, a step later, in the same shape;
/// - EAGLE-3 after its first pass: one row a drafting sequence.
pub fn drafter_passes() -> [(&'static str, ForwardBatch); 3] {
    let pass = |rows: &[(&[u32], usize, usize, Rows)]| {
        let mut b = BatchBuilder::new(BLOCK);
        for (seq, (tokens, start, table, logits)) in rows.iter().enumerate() {
            b.add(tokens, *start, &blocks(seq)[..*table], *logits, Rows::None)
                .unwrap();
        }
        b.build()
    };
    [
        (
            "P-EAGLE",
            pass(&[
                (&[5, 6, 9, 9, 9], 20, 2, Rows::Tail(4)),
                (&[7, 9, 9, 9], 14, 2, Rows::Tail(4)),
                (&[11, 12, 13], 29, 2, Rows::None),
            ]),
        ),
        (
            "P-EAGLE, a step later",
            pass(&[
                (&[8, 9, 9, 9], 22, 2, Rows::Tail(4)),
                (&[3, 4, 9, 9, 9], 15, 2, Rows::Tail(4)),
                (&[14], 32, 3, Rows::None),
            ]),
        ),
        (
            "EAGLE-3",
            pass(&[
                (&[40], 25, 2, Rows::Tail(1)),
                (&[41], 18, 2, Rows::Tail(1)),
                (&[42], 33, 3, Rows::Tail(1)),
            ]),
        ),
    ]
}
