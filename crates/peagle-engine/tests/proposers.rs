//! The P-EAGLE proposer against the PyTorch reference of the drafter fixtures
//! (scripts/make_drafter_fixtures.py): the K drafts of its one pass are the reference's greedy
//! tokens at the last real slot and the mask slots after it, for every request of a batch.

use candle_core::{DType, Device, Tensor};
use peagle_engine::proposer::{DraftRequest, DrafterPasses, PEagleProposer, Proposer};
use peagle_engine::sampler::argmax;
use peagle_models::{load_target, Drafter, KvCache, LoadOptions};

mod common;
use common::fixture;

const BLOCK: usize = 16;
/// The reference replaced the last MASKS tokens of its sequence with mask slots.
const MASKS: usize = 4;
/// Tokens of the first pass, which only fills the drafter cache.
const PREFILL: usize = 5;

/// The reference's greedy draft of each of the last `MASKS + 1` rows, as target ids.
fn expected_drafts(drafter: &Drafter, mask_logits: &Tensor) -> Vec<u32> {
    let rows: Vec<Vec<f32>> = mask_logits.to_vec2().unwrap();
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
            drafter.to_target_id(argmax(row))
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
        let aux = &r["aux"];
        let real = tokens.len() - MASKS;
        let want = expected_drafts(&drafter, &r["mask_logits"]);
        let kv = KvCache::new(drafter.dims(), 8, BLOCK, DType::F32, &Device::Cpu).unwrap();
        let mut proposer = PEagleProposer::new(DrafterPasses::new(drafter, kv, None), MASKS + 1).unwrap();

        // Two copies of the reference sequence on their own blocks, and in the drafting pass a
        // prefill chunk of other tokens ahead of them, so every request's rows sit at an offset.
        let tables: [&[u32]; 3] = [&[2, 0], &[5, 1], &[3, 7]];
        // Every request reads its states from `aux`, the reference's, at the rows of its
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
        assert_eq!(
            proposer.propose(aux, &fill, MASKS + 1).unwrap(),
            vec![Vec::<u32>::new(); 2]
        );

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
        let drafts = proposer.propose(aux, &batch, MASKS + 1).unwrap();
        assert_eq!(drafts, vec![Vec::new(), want.clone(), want.clone()], "{name}");

        // Fewer drafts than the proposer's K: the first ones, from fewer mask slots.
        let again = [request(tables[0], PREFILL..real, true)];
        assert_eq!(
            proposer.propose(aux, &again, 2).unwrap(),
            vec![want[..2].to_vec()],
            "{name}"
        );

        // A request whose rows the states do not hold is refused.
        let past = [request(tables[0], real..real + 2, true)];
        assert!(proposer.propose(&aux.narrow(0, 0, real).unwrap(), &past, 2).is_err());
    }
}
