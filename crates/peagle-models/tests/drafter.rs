//! Drafter heads in both published layouts against an independent PyTorch reference
//! (scripts/make_drafter_fixtures.py), and the loader's handling of their config variants.

mod common;
use candle_core::{DType, Device, Tensor};
use common::*;
use peagle_models::{
    load_target, BatchBuilder, DraftAlgorithm, DraftHidden, Drafter, KvCache, LoadOptions, Rows, TargetModel,
};
use std::path::Path;

const PAIRS: [(&str, &str); 4] = [
    ("tiny-llama", "tiny-llama-peagle"),
    ("tiny-qwen3", "tiny-qwen3-eagle3"),
    ("tiny-llama", "tiny-llama-peagle-aws"),
    // amazon/GPT-OSS-20B-P-EAGLE's layout on an MXFP4 gpt-oss.
    ("tiny-gpt-oss-mxfp4", "tiny-gpt-oss-peagle"),
];

fn target(name: &str) -> Box<dyn TargetModel> {
    load_target(&fixture_dir(name), LoadOptions::default()).unwrap().model
}

fn drafter(target_name: &str, dir: &Path) -> Drafter {
    Drafter::load(dir, target(target_name).as_ref(), LoadOptions::default()).unwrap()
}

fn reference(drafter: &str) -> std::collections::HashMap<String, Tensor> {
    candle_core::safetensors::load(fixture_dir(drafter).join("reference.safetensors"), &Device::Cpu).unwrap()
}

fn ids(t: &Tensor) -> Vec<u32> {
    t.to_vec1::<i64>().unwrap().into_iter().map(|x| x as u32).collect()
}

/// Runs `tokens` with hidden inputs `aux` through the drafter in two chunks (positions
/// 0..5, then 5..n), so the second chunk attends to cached rows at an offset.
fn run_in_two_chunks(d: &Drafter, tokens: &[u32], aux: &Tensor) -> (Tensor, Tensor) {
    let kv = KvCache::new(d.dims(), 4, BLOCK, DType::F32, &Device::Cpu).unwrap();
    let table = [2u32, 0];
    let mut logits = Vec::new();
    let mut hidden = Vec::new();
    for (start, end) in [(0, 5), (5, tokens.len())] {
        let mut b = BatchBuilder::new(BLOCK);
        b.add(&tokens[start..end], start, &table, Rows::All, Rows::None)
            .unwrap();
        let h = DraftHidden::Target(aux.narrow(0, start, end - start).unwrap());
        let out = d.forward(&b.build(), &h, &kv).unwrap();
        logits.push(out.logits);
        hidden.push(out.hidden);
    }
    (Tensor::cat(&logits, 0).unwrap(), Tensor::cat(&hidden, 0).unwrap())
}

#[test]
fn forward_matches_the_reference_in_every_layout() {
    for (t, name) in PAIRS {
        let d = drafter(t, &fixture_dir(name));
        let r = reference(name);
        let (logits, prenorm) = run_in_two_chunks(&d, &ids(&r["tokens"]), &r["aux"]);
        let (dl, dh) = (
            max_abs_diff(&logits, &r["logits"]),
            max_abs_diff(&prenorm, &r["prenorm"]),
        );
        assert!(dl < 1e-4 && dh < 1e-4, "{name}: logits diff {dl}, pre-norm diff {dh}");
    }
}

#[test]
fn mask_slots_use_the_mask_token_and_shared_hidden_state() {
    for (t, name) in [PAIRS[0], PAIRS[2], PAIRS[3]] {
        let d = drafter(t, &fixture_dir(name));
        let r = reference(name);
        let (mask_token, mask_hidden) = d.parallel_inputs().unwrap();
        let mut tokens = ids(&r["tokens"]);
        let n = tokens.len();
        tokens[n - 4..].fill(mask_token);
        let aux = Tensor::cat(
            &[
                r["aux"].narrow(0, 0, n - 4).unwrap(),
                mask_hidden.repeat((4, 1)).unwrap(),
            ],
            0,
        )
        .unwrap();
        let (logits, _) = run_in_two_chunks(&d, &tokens, &aux);
        let diff = max_abs_diff(&logits, &r["mask_logits"]);
        assert!(diff < 1e-4, "{name}: mask logits diff {diff}");
    }
}

#[test]
fn aux_layers_come_from_the_config_or_vllms_default() {
    // vLLM's default is (2, L / 2, L - 3): (2, 12, 21) for gpt-oss-20b's 24 layers.
    let cases: [(usize, &[usize]); 4] = [(0, &[1, 2, 3]), (1, &[2, 3, 3]), (2, &[0, 2, 3]), (3, &[2, 2, 1])];
    for (pair, want) in cases {
        let (t, name) = PAIRS[pair];
        assert_eq!(drafter(t, &fixture_dir(name)).aux_layer_ids(), want, "{name}");
    }
}

/// A copy of a drafter fixture with its config.json rewritten and without the tensor `drop`.
fn edited(name: &str, config: impl Fn(&mut serde_json::Value), drop: &str) -> tempfile::TempDir {
    let src = fixture_dir(name);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config(&mut cfg);
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    copy_safetensors(
        &src.join("model.safetensors"),
        &dir.path().join("model.safetensors"),
        |n| n != drop,
    );
    dir
}

#[test]
fn all_three_mask_token_spellings_are_read() {
    let speculators = drafter("tiny-llama", &fixture_dir("tiny-llama-peagle"));
    assert_eq!(speculators.config().mask_token_id, Some(383), "mask_token_id");
    for spelling in ["ptd_token_id", "pard_token"] {
        let dir = edited(
            "tiny-llama-peagle-aws",
            |c| {
                let o = c.as_object_mut().unwrap();
                o.remove("ptd_token_id");
                o.insert(spelling.into(), 383.into());
            },
            "",
        );
        let d = drafter("tiny-llama", dir.path());
        assert_eq!(d.config().mask_token_id, Some(383), "{spelling}");
        assert_eq!(d.config().algorithm, DraftAlgorithm::PEagle, "{spelling}");
        assert_eq!(d.parallel_inputs().unwrap().0, 383);
    }
}

#[test]
fn parallel_drafting_without_mask_hidden_is_a_clear_error() {
    let dir = edited("tiny-llama-peagle", |_| {}, "mask_hidden");
    let d = drafter("tiny-llama", dir.path());
    let err = d.parallel_inputs().unwrap_err().to_string();
    assert!(err.contains("parallel drafting needs a mask_hidden tensor"), "{err}");
    let eagle3 = drafter("tiny-qwen3", &fixture_dir("tiny-qwen3-eagle3"));
    let err = eagle3.parallel_inputs().unwrap_err().to_string();
    assert!(err.contains("needs a mask_token_id") && err.contains("Eagle3"), "{err}");
}

#[test]
fn d2t_maps_draft_ids_to_the_target_ids_t2d_marks() {
    let d = drafter("tiny-llama", &fixture_dir("tiny-llama-peagle"));
    let weights = fixture_dir("tiny-llama-peagle").join("model.safetensors");
    let d2t: Vec<i64> = raw_tensor(&weights, "d2t")
        .chunks(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let t2d = raw_tensor(&weights, "t2d");
    let mapped: Vec<u32> = d.draft_to_target().to_vec1().unwrap();
    assert!(mapped.iter().enumerate().all(|(i, t)| *t as i64 == i as i64 + d2t[i]));
    let marked: Vec<u32> = (0..t2d.len() as u32).filter(|t| t2d[*t as usize] == 1).collect();
    assert_eq!(mapped, marked);
    let identity = drafter("tiny-qwen3", &fixture_dir("tiny-qwen3-eagle3"));
    let identity: Vec<u32> = identity.draft_to_target().to_vec1().unwrap();
    assert!(identity.iter().enumerate().all(|(i, t)| *t == i as u32));
}

/// A d2t that maps a draft id outside the target's vocabulary, past its end or below 0, is
/// refused at load, and so is a draft vocabulary larger than the target's without a d2t: their
/// drafts would be tokens of neither model.
#[test]
fn a_d2t_outside_the_target_vocabulary_is_refused() {
    let weights = fixture_dir("tiny-llama-peagle").join("model.safetensors");
    let d2t: Vec<i64> = raw_tensor(&weights, "d2t")
        .chunks(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let last = d2t.len() - 1;
    for (at, offset, id) in [(last, 10_000, (last + 10_000) as i64), (0, -1, -1)] {
        let mut edited_d2t = d2t.clone();
        edited_d2t[at] = offset;
        let dir = edited("tiny-llama-peagle", |_| {}, "d2t");
        let path = dir.path().join("model.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let data: Vec<u8> = edited_d2t.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut tensors = st.tensors();
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::I64, vec![d2t.len()], &data).unwrap();
        tensors.push(("d2t".into(), view));
        safetensors::serialize_to_file(tensors, None, &path).unwrap();
        let Err(err) = Drafter::load(dir.path(), target("tiny-llama").as_ref(), LoadOptions::default()) else {
            panic!("a d2t mapping draft id {at} to {id} loaded");
        };
        let err = err.to_string();
        assert!(err.contains(&format!("maps draft id {at} to {id}")), "{err}");
    }

    let wider = edited("tiny-qwen3-eagle3", |c| c["draft_vocab_size"] = 400.into(), "");
    let Err(err) = Drafter::load(wider.path(), target("tiny-qwen3").as_ref(), LoadOptions::default()) else {
        panic!("400 draft ids without a d2t over 384 target tokens loaded");
    };
    let err = err.to_string();
    assert!(
        err.contains("400 draft ids are more than the target's 384 tokens"),
        "{err}"
    );
}

#[test]
fn speculators_config_fields_and_defaults() {
    let d = drafter("tiny-llama", &fixture_dir("tiny-llama-peagle"));
    let c = d.config();
    assert_eq!(
        (c.algorithm, c.num_speculative_tokens, c.draft_vocab_size),
        (DraftAlgorithm::PEagle, Some(3), 256)
    );
    assert_eq!(c.verifier.as_deref(), Some("tests/fixtures/tiny-llama"));
    assert!(!c.norm_before_residual);
    // speculators' eagle3 norms before the residual unless told otherwise.
    let dir = edited(
        "tiny-llama-peagle",
        |c| {
            c["speculators_model_type"] = "eagle3".into();
            c.as_object_mut().unwrap().remove("norm_before_residual");
        },
        "",
    );
    let c = drafter("tiny-llama", dir.path()).config().clone();
    assert_eq!((c.algorithm, c.norm_before_residual), (DraftAlgorithm::Eagle3, true));
}

#[test]
fn mismatched_target_is_named() {
    let dir = edited("tiny-llama-peagle", |c| c["target_hidden_size"] = 128.into(), "");
    let err = Drafter::load(dir.path(), target("tiny-llama").as_ref(), LoadOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("drafter expects target hidden size 128, the target has 64"),
        "{err}"
    );
    let dir = edited("tiny-llama-peagle", |_| {}, "layers.1.mlp.down_proj.weight");
    let err = Drafter::load(dir.path(), target("tiny-llama").as_ref(), LoadOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.starts_with("tensor layers.1.mlp.down_proj.weight not found"),
        "{err}"
    );
}
