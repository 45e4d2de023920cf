//! Times paged attention (kernels/paged_attention.cu) on the GPU, bf16 queries and cache, at
//! gpt-oss-20b's heads (64 query, 8 KV, head_dim 64, sinks) and Llama-8B's (32, 8, 128): decode
//! rows, 8-row verification windows and prefill chunks over contexts of 128 to 32,768
//! positions, on a cache whose blocks interleave the sequences'. One JSON line per case: its
//! time; its time with one block for each head and row (or group of rows, under full
//! attention) walking the row's parts of the keys (`AttentionBlocks::OneARow`: where the launch
//! would give a long row's parts to several blocks, or a row's heads of one KV head to one);
//! its time with a row's heads of one KV head in one block wherever rows do not share one
//! (`AttentionBlocks::HeadGroups`: where the launch would give them a block each); the keys and
//! values its sequences hold over it (the bytes a launch must read at least); and the bytes its
//! rows attend over, over it (each
//! query row's head, its window of its KV head: what a block a row would read; the rows or
//! heads grouped in a block share those reads). Run by scripts/gpu_check.sh.
//!
//!     cargo run --release --example paged_attention --features cuda
//!     cargo run --release --example paged_attention --features cuda -- gpt-oss-20b 1 1 8192
//!
//! With `MODEL SEQUENCES ROWS CONTEXT [WINDOW]`, it times that case alone.

#[path = "common/interleaved_batch.rs"]
mod interleaved_batch;
#[path = "common/timing.rs"]
mod timing;

use candle_core::{DType, Device, Tensor};
use interleaved_batch::interleaved_batch;
use peagle_kernels::{paged_attention_by, AttentionBlocks, AttentionParams, KvScale, Sinks};
use timing::time;

const BLOCK: usize = 16;

struct Heads {
    name: &'static str,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    sinks: bool,
}

const GPT_OSS: Heads = Heads {
    name: "gpt-oss-20b",
    heads: 64,
    kv_heads: 8,
    head_dim: 64,
    sinks: true,
};
const LLAMA_8B: Heads = Heads {
    name: "llama-8b",
    heads: 32,
    kv_heads: 8,
    head_dim: 128,
    sinks: false,
};

/// One timed launch shape: `sequences` of `context` positions, the last `rows` of each the
/// batch's query rows, attending over a `window` of positions (all of them where None).
struct Case {
    heads: &'static Heads,
    sequences: usize,
    rows: usize,
    context: usize,
    window: Option<usize>,
}

fn case(device: &Device, c: &Case) -> candle_core::Result<()> {
    let Case {
        heads: h,
        sequences,
        rows,
        context,
        window,
    } = *c;
    let params = AttentionParams {
        num_heads: h.heads,
        num_kv_heads: h.kv_heads,
        head_dim: h.head_dim,
        scale: 1.0 / (h.head_dim as f32).sqrt(),
        sliding_window: window,
        kv_scale: KvScale::ONE,
    };
    let meta = interleaved_batch(&vec![(context, rows); sequences], BLOCK).on_device(device)?;
    let kv_width = h.kv_heads * h.head_dim;
    let slots = sequences * context.div_ceil(BLOCK) * BLOCK;
    let random = |shape: (usize, usize)| Tensor::randn(0f32, 1.0, shape, device)?.to_dtype(DType::BF16);
    let (k, v) = (random((slots, kv_width))?, random((slots, kv_width))?);
    let q = random((sequences * rows, h.heads * h.head_dim))?;
    let sinks = h.sinks.then(|| Sinks::new(vec![0.5; h.heads], device)).transpose()?;
    let reps = if sequences * rows * context > 1 << 20 { 5 } else { 50 };
    let timed = |blocks| {
        time(device, reps, || {
            paged_attention_by(&q, &k, &v, &meta, &params, sinks.as_ref(), blocks)
        })
    };
    let seconds = timed(AttentionBlocks::ByBatch)?;
    let one_block = timed(AttentionBlocks::OneARow)?;
    let head_groups = timed(AttentionBlocks::HeadGroups)?;
    // A row reads the positions of its window; a sequence's rows together, its last row's.
    let window_of = |pos: usize| window.map_or(pos + 1, |w| w.min(pos + 1));
    let bf16_kv = |positions: usize, width: usize| (positions * width * 2 * 2) as f64;
    let kv_bytes = bf16_kv(sequences * window_of(context - 1), kv_width);
    // What the rows attend over: each query row's head, its window of its KV head.
    let walked: usize = (context - rows..context).map(window_of).sum();
    let walked = bf16_kv(sequences * walked, h.heads * h.head_dim);
    println!(
        "{{\"model\": \"{}\", \"sequences\": {sequences}, \"rows_each\": {rows}, \"context\": {context}, \"window\": {}, \"ms\": {:.4}, \"one_block_ms\": {:.4}, \"head_groups_ms\": {:.4}, \"kv_mb\": {:.2}, \"kv_gb_per_s\": {:.1}, \"walked_gb_per_s\": {:.1}}}",
        h.name,
        window.map_or("null".to_string(), |w| w.to_string()),
        seconds * 1e3,
        one_block * 1e3,
        head_groups * 1e3,
        kv_bytes / 1e6,
        kv_bytes / seconds / 1e9,
        walked / seconds / 1e9,
    );
    Ok(())
}

/// The case that `MODEL SEQUENCES ROWS CONTEXT [WINDOW]` names.
fn named_case(args: &[String]) -> Result<Case, String> {
    let usage = "usage: paged_attention [gpt-oss-20b|llama-8b SEQUENCES ROWS CONTEXT [WINDOW]]";
    let heads = [&GPT_OSS, &LLAMA_8B]
        .into_iter()
        .find(|h| args.first().is_some_and(|name| name == h.name))
        .ok_or(usage)?;
    let numbers = args[1..]
        .iter()
        .map(|a| a.parse::<usize>().ok().filter(|n| *n > 0))
        .collect::<Option<Vec<_>>>()
        .ok_or(usage)?;
    let (sequences, rows, context, window) = match numbers[..] {
        [sequences, rows, context] => (sequences, rows, context, None),
        [sequences, rows, context, window] => (sequences, rows, context, Some(window)),
        _ => return Err(usage.to_string()),
    };
    if rows > context {
        return Err(usage.to_string());
    }
    Ok(Case {
        heads,
        sequences,
        rows,
        context,
        window,
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // One case alone, for a profiler to look at one launch of it.
    let named = (!args.is_empty()).then(|| named_case(&args)).transpose()?;
    let device = peagle_kernels::open_cuda(0)?;
    if let Some(named) = named {
        return Ok(case(&device, &named)?);
    }
    let at = |heads, sequences, rows, context, window| Case {
        heads,
        sequences,
        rows,
        context,
        window,
    };
    let mut cases = Vec::new();
    for h in [&GPT_OSS, &LLAMA_8B] {
        for context in [128, 1024, 2048, 4096, 8192, 32768] {
            cases.push(at(h, 1, 1, context, None));
        }
        for context in [1024, 8192] {
            cases.push(at(h, 1, 8, context, None));
            cases.push(at(h, 16, 1, context, None));
        }
        cases.push(at(h, 64, 8, 1024, None));
        // A prefill chunk: the first 2048 positions of a prompt.
        cases.push(at(h, 1, 2048, 2048, None));
    }
    // gpt-oss's other half of layers: a 128-position window, flat in the context.
    cases.push(at(&GPT_OSS, 1, 1, 8192, Some(128)));
    cases.push(at(&GPT_OSS, 1, 2048, 2048, Some(128)));
    for c in &cases {
        case(&device, c)?;
    }
    Ok(())
}
