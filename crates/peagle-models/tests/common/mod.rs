//! Shared helpers of the model tests: fixture loading and running token spans in one batch;
//! checkpoints made from the fixtures (`checkpoints`) and the fixture drafter's inputs and
//! passes (`drafter`).

#![allow(dead_code)]

mod checkpoints;
mod drafter;

// Each test binary uses some of them.
#[allow(unused_imports)]
pub use checkpoints::*;
#[allow(unused_imports)]
pub use drafter::*;

use candle_core::{DType, Device, Tensor};
use peagle_models::{
    load_target, BatchBuilder, DeviceIds, DraftOutput, ForwardBatch, ForwardOutput, GreedyDrafts, KvCache, LoadOptions,
    Rows, TargetModel,
};
use std::collections::HashMap;
use std::path::PathBuf;

pub const BLOCK: usize = 16;
pub const FIXTURES: [&str; 5] = [
    "tiny-llama",
    "tiny-qwen3",
    "tiny-gpt-oss",
    "tiny-gpt-oss-mxfp4",
    "tiny-qwen3-moe",
];

pub fn fixture_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

pub struct Fixture {
    pub model: Box<dyn TargetModel>,
    pub refs: HashMap<String, Tensor>,
    options: LoadOptions,
    cache_dtype: DType,
}

impl Fixture {
    /// Loads a fixture model capturing the input of every layer, so all can be compared.
    pub fn load(name: &str) -> Self {
        Self::load_with(name, LoadOptions::default())
    }

    /// `load` on the device and in the dtype of `options`.
    pub fn load_with(name: &str, options: LoadOptions) -> Self {
        Self::load_from(&fixture_dir(name), options)
    }

    /// `load_with` from a fixture's copy in `dir`.
    pub fn load_from(dir: &std::path::Path, options: LoadOptions) -> Self {
        let mut model = load_target(dir, options.clone()).unwrap().model;
        model
            .set_capture_layers((0..model.dims().num_layers).collect())
            .unwrap();
        let refs = candle_core::safetensors::load(dir.join("reference.safetensors"), &Device::Cpu).unwrap();
        let cache_dtype = if options.device.is_cpu() {
            DType::F32
        } else {
            options.dtype
        };
        Self {
            model,
            refs,
            options,
            cache_dtype,
        }
    }

    /// The fixture with caches of `dtype` from now on.
    pub fn with_cache_dtype(self, cache_dtype: DType) -> Self {
        Self { cache_dtype, ..self }
    }

    pub fn prompt(&self, i: usize) -> Vec<u32> {
        let ids: Vec<i64> = self.refs[&format!("p{i}.input_ids")].to_vec1().unwrap();
        ids.into_iter().map(|t| t as u32).collect()
    }

    pub fn reference(&self, i: usize, what: &str) -> Tensor {
        self.refs[&format!("p{i}.{what}")].clone()
    }

    /// HF's per-layer inputs [L, n, H] laid out like our capture: [n, L * H].
    pub fn reference_aux(&self, i: usize) -> Tensor {
        let h = self.reference(i, "hidden_in");
        let (l, n, d) = h.dims3().unwrap();
        h.transpose(0, 1)
            .unwrap()
            .contiguous()
            .unwrap()
            .reshape((n, l * d))
            .unwrap()
    }

    /// A cache on the model's device: f32 (on the CPU) or the activation dtype, unless
    /// `with_cache_dtype` chose another.
    pub fn cache(&self) -> KvCache {
        self.cache_of(64)
    }

    /// A cache of `blocks` blocks.
    pub fn cache_of(&self, blocks: usize) -> KvCache {
        KvCache::new(self.model.dims(), blocks, BLOCK, self.cache_dtype, &self.options.device).unwrap()
    }
}

/// Scattered block table for sequence `seq`: blocks `seq, seq + 8, seq + 16, ...`.
pub fn blocks(seq: usize) -> Vec<u32> {
    (0..8).map(|i| (seq + 8 * i) as u32).collect()
}

/// All output rows of one forward, per span: (logits, aux hidden, final hidden).
pub type Rowset = (Tensor, Tensor, Tensor);

/// Runs `(sequence id, tokens, start position)` spans as one batch, every row wanted.
pub fn run(model: &dyn TargetModel, kv: &KvCache, spans: &[(usize, &[u32], usize)]) -> Vec<Rowset> {
    let tables: Vec<Vec<u32>> = spans.iter().map(|(seq, _, _)| blocks(*seq)).collect();
    let spans: Vec<_> = spans
        .iter()
        .zip(&tables)
        .map(|((_, tokens, start), table)| (table.as_slice(), *tokens, *start))
        .collect();
    run_tables(model, kv, &spans)
}

/// `run` over `(block table, tokens, start position)` spans.
pub fn run_tables(model: &dyn TargetModel, kv: &KvCache, spans: &[(&[u32], &[u32], usize)]) -> Vec<Rowset> {
    let mut b = BatchBuilder::new(BLOCK);
    let placed: Vec<_> = spans
        .iter()
        .map(|(table, tokens, start)| b.add(tokens, *start, table, Rows::All, Rows::All).unwrap())
        .collect();
    let out = model.forward(&b.build(), kv).unwrap();
    let (aux, fin) = (out.aux_hidden.unwrap(), out.final_hidden.unwrap());
    placed
        .iter()
        .map(|r| {
            let take = |t: &Tensor, range: &std::ops::Range<usize>| t.narrow(0, range.start, range.len()).unwrap();
            (
                take(&out.logits, &r.logits),
                take(&aux, &r.captured),
                take(&fin, &r.captured),
            )
        })
        .collect()
}

/// Caches prompts 1 and 2, but for their last `back` tokens, as sequences 0 and 1, and
/// prompt 0 whole as sequence 2.
pub fn prefill_but(f: &Fixture, back: usize, kv: &KvCache) {
    for seq in 0..2 {
        let p = f.prompt(seq + 1);
        run(f.model.as_ref(), kv, &[(seq, &p[..p.len() - back], 0)]);
    }
    run(f.model.as_ref(), kv, &[(2, &f.prompt(0), 0)]);
}

/// The step that runs `window` tokens of prompts 1 and 2 from `back` before their ends as
/// sequences 0 and 1's verification windows, every output kept.
pub fn windows(f: &Fixture, back: usize, window: usize) -> ForwardBatch {
    let mut b = BatchBuilder::new(BLOCK);
    for seq in 0..2 {
        let p = f.prompt(seq + 1);
        let start = p.len() - back;
        b.add(&p[start..start + window], start, &blocks(seq), Rows::All, Rows::All)
            .unwrap();
    }
    b.build()
}

/// The steps the CUDA graph tests run after `prefill_but(f, 6, ..)`: two verification
/// windows, the next two (the same shape over new inputs), a decode row of one sequence (a
/// shape of its own), and decode rows of three sequences (padded to a bucket of four).
pub fn graph_steps(f: &Fixture) -> [(&'static str, ForwardBatch); 4] {
    let mut decode = BatchBuilder::new(BLOCK);
    decode
        .add(&[1], f.prompt(1).len(), &blocks(0), Rows::All, Rows::All)
        .unwrap();
    let mut decodes = BatchBuilder::new(BLOCK);
    for (seq, position) in [f.prompt(1).len() + 1, f.prompt(2).len(), f.prompt(0).len()]
        .into_iter()
        .enumerate()
    {
        decodes.add(&[2], position, &blocks(seq), Rows::All, Rows::All).unwrap();
    }
    [
        ("windows", windows(f, 6, 3)),
        ("next windows", windows(f, 3, 3)),
        ("decode", decode.build()),
        ("three decodes", decodes.build()),
    ]
}

/// `batch` (every output kept) rebuilt with each sequence's tokens after its first lying on
/// `device`, as a proposer leaves its drafts for a verification window: all in one tensor, in
/// reverse order, the batch holding placeholders for them (`BatchBuilder::add_then`).
pub fn tokens_on_device(batch: &ForwardBatch, device: &Device) -> ForwardBatch {
    let spans: Vec<(usize, usize)> = batch.attn.query_start.windows(2).map(|w| (w[0], w[1])).collect();
    let later: Vec<u32> = spans
        .iter()
        .flat_map(|&(first, end)| first + 1..end)
        .map(|r| r as u32)
        .collect();
    let reversed: Vec<u32> = later.iter().rev().map(|&r| batch.token_ids[r as usize]).collect();
    let ids = Tensor::new(reversed.as_slice(), device).unwrap();
    let mut b = BatchBuilder::new(batch.attn.block_size);
    let mut taken = 0;
    for (s, &(first, end)) in spans.iter().enumerate() {
        let n = end - first - 1;
        // Element k of `later` is element len - 1 - k of the reversed tensor.
        let then = DeviceIds {
            ids: ids.clone(),
            picks: (taken..taken + n).map(|k| (later.len() - 1 - k) as u32).collect(),
        };
        taken += n;
        let (start, table) = (batch.positions[first] as usize, &batch.attn.block_tables[s]);
        let first_token = &batch.token_ids[first..first + 1];
        b.add_then(first_token, &then, start, table, Rows::All, Rows::All)
            .unwrap();
    }
    b.build()
}

/// Asserts that a step's outputs `got`, and the cache `got_kv` it left, are bit for bit those
/// of another run of it, `want` and `kv`.
pub fn assert_same_step(what: &str, got: ForwardOutput, got_kv: &KvCache, want: ForwardOutput, kv: &KvCache) {
    assert_eq!(bits(&got.logits), bits(&want.logits), "{what}: logits");
    let (got_aux, want_aux) = (got.aux_hidden.unwrap(), want.aux_hidden.unwrap());
    assert_eq!(bits(&got_aux), bits(&want_aux), "{what}: captured states");
    assert_same_cache(what, got_kv, kv);
}

/// `got` and `want` hold the same keys and values, bit for bit.
pub fn assert_same_cache(what: &str, got: &KvCache, want: &KvCache) {
    for layer in 0..want.num_layers() {
        let (a, b) = (want.layer(layer), got.layer(layer));
        assert_eq!(bits(&a.k), bits(&b.k), "{what}: layer {layer} keys");
        assert_eq!(bits(&a.v), bits(&b.v), "{what}: layer {layer} values");
    }
}

/// A drafter pass's output `got` is `want`, bit for bit, and so are the caches they wrote.
pub fn assert_same_pass(what: &str, got: DraftOutput, got_kv: &KvCache, want: DraftOutput, kv: &KvCache) {
    assert_eq!(bits(&got.logits), bits(&want.logits), "{what}: logits");
    assert_eq!(bits(&got.hidden), bits(&want.hidden), "{what}: hidden");
    assert_same_cache(what, got_kv, kv);
}

/// Greedy drafts `got` are `want`: the same ids, and the same hidden outputs bit for bit; so
/// are the caches their passes wrote.
pub fn assert_same_drafts(what: &str, got: &GreedyDrafts, got_kv: &KvCache, want: &GreedyDrafts, kv: &KvCache) {
    assert_eq!(got.ids().unwrap(), want.ids().unwrap(), "{what}: draft ids");
    let hidden = |d: &GreedyDrafts| bits(&d.hidden().gather().unwrap());
    assert_eq!(hidden(got), hidden(want), "{what}: hidden");
    assert_same_cache(what, got_kv, kv);
}

/// The last `window` rows of prompt 2 three ways: one token per forward, as one verification
/// window, and as that window in a batch with a decode of prompt 0 and a prefill of prompt 1.
pub fn window_three_ways(f: &Fixture, window: usize) -> (Rowset, Rowset, Rowset) {
    let prompt = f.prompt(2);
    let n = prompt.len();
    let model = f.model.as_ref();

    let kv = f.cache();
    let singles: Vec<Rowset> = (0..n)
        .map(|i| run(model, &kv, &[(0, &prompt[i..i + 1], i)]).remove(0))
        .collect();

    let kv = f.cache();
    run(model, &kv, &[(0, &prompt[..n - window], 0)]);
    let windowed = run(model, &kv, &[(0, &prompt[n - window..], n - window)]).remove(0);

    let kv = f.cache();
    let (p0, p1) = (f.prompt(0), f.prompt(1));
    run(
        model,
        &kv,
        &[(0, &prompt[..n - window], 0), (1, &p0[..p0.len() - 1], 0)],
    );
    let batched = run(
        model,
        &kv,
        &[
            (1, &p0[p0.len() - 1..], p0.len() - 1),
            (0, &prompt[n - window..], n - window),
            (2, &p1, 0),
        ],
    )
    .remove(1);
    (cat_rows(&singles[n - window..]), windowed, batched)
}

pub fn cat_rows(parts: &[Rowset]) -> Rowset {
    let pick = |f: fn(&Rowset) -> &Tensor| Tensor::cat(&parts.iter().map(f).collect::<Vec<_>>(), 0).unwrap();
    (pick(|r| &r.0), pick(|r| &r.1), pick(|r| &r.2))
}

pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    let f32_host = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_device(&Device::Cpu).unwrap();
    (f32_host(a) - f32_host(b))
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}

pub fn bits(t: &Tensor) -> Vec<u32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .into_iter()
        .map(f32::to_bits)
        .collect()
}
