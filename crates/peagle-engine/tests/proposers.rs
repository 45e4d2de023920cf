//! The proposers' drafts. P-EAGLE's against the PyTorch reference of the drafter fixtures
//! (scripts/make_drafter_fixtures.py): the K drafts of its one pass are the reference's greedy
//! tokens at the last real slot and the mask slots after it, for every request of a batch.
//! EAGLE-3's against its drafter's passes fed one by one from the host.

use candle_core::{DType, Device, Tensor};
use peagle_engine::proposer::{DraftRequest, DrafterPasses, Eagle3Proposer, PEagleProposer, Proposer};
use peagle_engine::sampler::argmax;
use peagle_models::{load_target, BatchBuilder, DeviceIds, DraftHidden, Drafter, KvCache, LoadOptions, Rows};

mod common;
use common::fixture;
use std::path::PathBuf;

const BLOCK: usize = 16;
/// The reference replaced the last MASKS tokens of its sequence with mask slots.
const MASKS: usize = 4;
/// Tokens of the first pass, which only fills the drafter cache.
const PREFILL: usize = 5;

/// Proposed drafts copied to the host, None where a request drafts nothing.
fn read(drafts: Vec<Option<DeviceIds>>) -> Vec<Option<Vec<u32>>> {
    let read_one = |d: &DeviceIds| DeviceIds::to_host(&[d]).unwrap().remove(0);
    drafts.iter().map(|d| d.as_ref().map(read_one)).collect()
}

/// The reference's greedy draft of each of the last `MASKS + 1` rows, as target ids.
fn expected_drafts(drafter: &Drafter, mask_logits: &Tensor) -> Vec<u32> {
    let rows: Vec<Vec<f32>> = mask_logits.to_vec2().unwrap();
    let map: Vec<u32> = drafter.draft_to_target().to_vec1().unwrap();
    rows[rows.len() - MASKS - 1..]
        .iter()
        .map(|row| {
            let mut sorted = row.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            // A near tie would make the comparison depend on rounding, not on the proposer.
            assert!(
                sorted[0] - sorted[1] > 1e-3,
                "reference top-2 margin {}",
                sorted[0] - sorted[1]
            );
            map[argmax(row)]
        })
        .collect()
}

#[test]
fn peagle_drafts_match_the_reference_mask_slots_in_a_mixed_batch() {
    for name in ["tiny-llama-peagle", "tiny-llama-peagle-aws"] {
        let target = load_target(&fixture("tiny-llama"), LoadOptions::default())
            .unwrap()
            .model;
        let drafter = Drafter::load(&fixture(name), target.as_ref(), LoadOptions::default()).unwrap();
        let r = candle_core::safetensors::load(fixture(name).join("reference.safetensors"), &Device::Cpu).unwrap();
        let tokens: Vec<u32> = r["tokens"]
            .to_vec1::<i64>()
            .unwrap()
            .iter()
            .map(|t| *t as u32)
            .collect();
        let real = tokens.len() - MASKS;
        let want = expected_drafts(&drafter, &r["mask_logits"]);
        let kv = KvCache::new(drafter.dims(), 8, BLOCK, DType::F32, &Device::Cpu).unwrap();
        let mut proposer = PEagleProposer::new(DrafterPasses::new(drafter, kv, None), MASKS + 1).unwrap();
        let states = &proposer.project(&r["aux"]).unwrap();

        // Two copies of the reference sequence on their own blocks, and in the drafting pass a
        // prefill chunk of other tokens ahead of them, so every request's rows sit at an offset.
        let tables: [&[u32]; 3] = [&[2, 0], &[5, 1], &[3, 7]];
        // Every request reads its states from the reference's, projected, at the rows of its
        // positions.
        let request = |table, span: std::ops::Range<usize>, draft| DraftRequest {
            tokens: &tokens[span.clone()],
            start: span.start,
            states: span,
            block_table: table,
            draft,
        };
        let fill = [
            request(tables[0], 0..PREFILL, false),
            request(tables[1], 0..PREFILL, false),
        ];
        assert_eq!(read(proposer.propose(states, &fill, MASKS + 1).unwrap()), [None, None]);

        let other = DraftRequest {
            tokens: &tokens[PREFILL..real],
            start: 0,
            states: 0..real - PREFILL,
            block_table: tables[2],
            draft: false,
        };
        let batch = [
            other,
            request(tables[0], PREFILL..real, true),
            request(tables[1], PREFILL..real, true),
        ];
        let drafts = read(proposer.propose(states, &batch, MASKS + 1).unwrap());
        assert_eq!(drafts, [None, Some(want.clone()), Some(want.clone())], "{name}");

        // Fewer drafts than the proposer's K: the first ones, from fewer mask slots.
        let again = [request(tables[0], PREFILL..real, true)];
        let drafts = read(proposer.propose(states, &again, 2).unwrap());
        assert_eq!(drafts, [Some(want[..2].to_vec())], "{name}");

        // A request whose rows the states do not hold is refused: one past them would read the
        // mask state, which the pass's table holds past the states. So is a request of more
        // rows than slots.
        let past = [request(tables[0], real - 2..real + 1, true)];
        assert!(proposer.propose(&states.narrow(0, 0, real).unwrap(), &past, 2).is_err());
        let mut longer = request(tables[0], PREFILL..real, true);
        longer.states = PREFILL..real + 1;
        assert!(proposer.propose(states, &[longer], 2).is_err());
    }
}

/// EAGLE-3's K drafts are the drafter's autoregressive greedy drafts: each pass after the first
/// reads the last one's draft, mapped to a target id, and its hidden output. The proposer
/// chains its passes on the device; the reference here reads each pass's drafts back and feeds
/// them by the host, for a batch with a prefill chunk ahead of two drafting requests, twice,
/// and for 2 and 1 drafts. The demo drafter (bf16, the speculators layout) has a d2t that is no
/// identity; the tiny fixture is f32 in the EAGLE-3 `midlayer` layout.
#[test]
fn eagle3_drafts_are_the_drafters_autoregressive_greedy_drafts() {
    let demo = (
        common::repo("models/pystdlib-12l"),
        common::repo("models/pystdlib-12l-eagle3"),
    );
    let mapped = eagle3_drafts_against_passes_fed_by_the_host(demo);
    assert!(mapped, "the demo drafter's d2t maps ids");
    eagle3_drafts_against_passes_fed_by_the_host((fixture("tiny-qwen3"), fixture("tiny-qwen3-eagle3")));
}

/// The check above for one target and EAGLE-3 drafter; says whether the drafter's d2t maps
/// some id to another.
fn eagle3_drafts_against_passes_fed_by_the_host((target, drafter): (PathBuf, PathBuf)) -> bool {
    let target = load_target(&target, LoadOptions::default()).unwrap().model;
    let load = || Drafter::load(&drafter, target.as_ref(), LoadOptions::default()).unwrap();
    let (drafter, reference) = (load(), load());
    let vocab = reference.dims().vocab_size;
    let map: Vec<u32> = reference.draft_to_target().to_vec1().unwrap();
    let mapped = map.iter().enumerate().any(|(id, t)| *t != id as u32);
    let cache = |d: &Drafter| KvCache::new(d.dims(), 16, BLOCK, d.dtype(), &Device::Cpu).unwrap();
    let (k, kv) = (3, cache(&reference));
    let mut proposer = Eagle3Proposer::new(DrafterPasses::new(drafter, cache(&reference), None), k);

    let tokens: Vec<u32> = (0..24).map(|t| (100 + 37 * t) % vocab as u32).collect();
    let width = reference.aux_layer_ids().len() * target.dims().hidden_size;
    let values: Vec<f32> = (0..tokens.len() * width)
        .map(|i| ((i * 53 % 97) as f32 - 48.0) / 24.0)
        .collect();
    let states = Tensor::from_vec(values, (tokens.len(), width), &Device::Cpu)
        .unwrap()
        .to_dtype(reference.dtype())
        .unwrap();
    let tables: [&[u32]; 3] = [&[0, 1], &[2, 3], &[4, 5]];
    // Rows 0..8 are a prefill chunk; rows 8..15 and 15..24 two requests that draft.
    let spans = [(0..8, 0, false), (8..15, 3, true), (15..24, 5, true)];
    let requests: Vec<DraftRequest> = spans
        .iter()
        .zip(tables)
        .map(|((rows, start, draft), table)| DraftRequest {
            tokens: &tokens[rows.clone()],
            start: *start,
            states: rows.clone(),
            block_table: table,
            draft: *draft,
        })
        .collect();

    // The reference: the same first pass, then a pass a draft, fed by the host.
    let mut batch = BatchBuilder::new(BLOCK);
    for r in &requests {
        let logits = if r.draft { Rows::Tail(1) } else { Rows::None };
        batch.add(r.tokens, r.start, r.block_table, logits, Rows::None).unwrap();
    }
    let hidden = DraftHidden::Projected(reference.project_target(&states).unwrap());
    let mut out = reference
        .greedy(reference.forward(&batch.build(), &hidden, &kv).unwrap())
        .unwrap();
    let mut want = vec![Vec::new(); 2];
    for step in 0..k {
        let drafts: Vec<u32> = out.ids().unwrap().iter().map(|&id| map[id as usize]).collect();
        for (w, d) in want.iter_mut().zip(&drafts) {
            w.push(*d);
        }
        if step + 1 == k {
            break;
        }
        let mut batch = BatchBuilder::new(BLOCK);
        for (r, d) in requests[1..].iter().zip(&drafts) {
            let pos = r.start + r.tokens.len() + step;
            batch.add(&[*d], pos, r.block_table, Rows::Tail(1), Rows::None).unwrap();
        }
        let hidden = DraftHidden::Projected(out.hidden().gather().unwrap());
        out = reference
            .greedy(reference.forward(&batch.build(), &hidden, &kv).unwrap())
            .unwrap();
    }

    // Proposed again over the same slots, which it writes again: the same drafts. The passes
    // wrote the drafter's cache where the reference's did, to the same bits: each later pass
    // at its own position (argmax alone may not tell a pass one position off).
    let projected = proposer.project(&states).unwrap();
    for round in 0..2 {
        let got = read(proposer.propose(&projected, &requests, k).unwrap());
        assert_eq!(
            got,
            [None, Some(want[0].clone()), Some(want[1].clone())],
            "round {round}"
        );
        assert_same_cache(proposer.passes().kv(), &kv);
    }
    // Drafts stay as proposed while the next round of the same shape drafts otherwise: a
    // sequence that sits out a step has its drafts verified later.
    let kept = proposer.propose(&projected, &requests, k).unwrap();
    let other_states = proposer.project(&(&states * -1.0).unwrap()).unwrap();
    let other = read(proposer.propose(&other_states, &requests, k).unwrap());
    assert_ne!(other[1], Some(want[0].clone()), "the next round drafts otherwise");
    assert_eq!(read(kept), [None, Some(want[0].clone()), Some(want[1].clone())]);
    // Fewer drafts: two, then the first pass's alone.
    let got = read(proposer.propose(&projected, &requests, 2).unwrap());
    assert_eq!(got, [None, Some(want[0][..2].to_vec()), Some(want[1][..2].to_vec())]);
    let got = read(proposer.propose(&projected, &requests, 1).unwrap());
    assert_eq!(got, [None, Some(want[0][..1].to_vec()), Some(want[1][..1].to_vec())]);
    mapped
}

/// Every layer's keys and values in `got` equal `want`'s, bit for bit.
fn assert_same_cache(got: &KvCache, want: &KvCache) {
    let bits = |kv: &KvCache, layer: usize| -> Vec<f32> {
        let both = &kv.layer(layer).both;
        both.to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    for layer in 0..want.num_layers() {
        let (g, w) = (bits(got, layer), bits(want, layer));
        assert!(
            w.iter().any(|x| *x != 0.0),
            "layer {layer} of the reference's cache is written"
        );
        let same = g.iter().zip(&w).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "layer {layer} of the drafter's cache differs from the reference's"
        );
    }
}
