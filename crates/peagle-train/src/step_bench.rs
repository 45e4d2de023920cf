//! `peagle-train bench`: time and peak memory of one P-EAGLE training step on a synthetic
//! sample, to compare layouts (COD against every depth at every position) and partitioning.
//! Peak memory is the process's high-water RSS (host memory only), so run one configuration
//! per process.

use crate::blueprint::{Algo, DrafterBlueprint, NEW_DRAFTER_NORM_BEFORE_RESIDUAL};
use crate::cod::CodConfig;
use crate::error::TrainError;
use crate::objective::Targets;
use crate::params::Params;
use crate::step::{peagle_sample, Gradients, PeagleSetup, Prepared};
use crate::vocab::DraftVocab;
use candle_core::Tensor;
use peagle_models::TargetModel;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::path::Path;
use std::time::Instant;

pub struct StepBenchOptions {
    pub seq_len: usize,
    pub num_layers: usize,
    pub cod: CodConfig,
    pub partitions: usize,
    pub draft_vocab_size: usize,
}

#[derive(Debug, Serialize)]
pub struct StepBenchResult {
    pub seq_len: usize,
    pub depths: usize,
    pub ratio: f64,
    pub ratio_min: f64,
    pub partitions: usize,
    pub elements: usize,
    pub step_seconds: f64,
    pub rss_before_mib: f64,
    pub peak_rss_mib: f64,
}

pub fn bench_step(
    target_dir: &Path,
    target: &dyn TargetModel,
    target_config: serde_json::Value,
    opts: &StepBenchOptions,
) -> Result<StepBenchResult, TrainError> {
    let dims = target.dims();
    let counts: Vec<i64> = (0..dims.vocab_size as i64).rev().collect();
    let blueprint = DrafterBlueprint {
        algo: Algo::Peagle,
        num_layers: opts.num_layers,
        vocab: DraftVocab::from_counts(&counts, opts.draft_vocab_size),
        mask_token_id: Some(dims.vocab_size as u32 - 1),
        aux_layer_ids: target.capture_layers().to_vec(),
        num_speculative_tokens: opts.cod.depths,
        norm_before_residual: NEW_DRAFTER_NORM_BEFORE_RESIDUAL,
        target_dir: target_dir.to_owned(),
        target_config,
    };
    let config = blueprint.drafter_config(&target_dir.join("bench-drafter.json"))?;
    let params = Params::new(blueprint.init_weights(target, 0)?)?;
    let drafter = params.drafter(&config, target)?;
    let mut rng = StdRng::seed_from_u64(1);
    let device = target.device();
    let m = opts.seq_len + 1;
    let width = blueprint.aux_layer_ids.len() * dims.hidden_size;
    let data = Prepared {
        next_tokens: (1..m)
            .map(|_| rng.random_range(0..dims.vocab_size as u32 - 1))
            .collect(),
        aux: Tensor::randn(0f32, 1.0, (m - 1, width), device)?,
        valid: vec![true; m - 1],
        targets: Targets::new(
            target,
            &Tensor::randn(0f32, 1.0, (m, dims.hidden_size), device)?,
            &blueprint.vocab,
        )?,
    };
    let setup = PeagleSetup {
        drafter: &drafter,
        vocab: &blueprint.vocab,
        cod: &opts.cod,
        partitions: opts.partitions,
    };
    let rss_before_mib = peak_rss_mib();
    // The first step also pays one-time costs (allocations, GPU kernel loading): time the second.
    let mut step = || -> Result<_, TrainError> {
        let mut grads = Gradients::new(&params);
        let stats = peagle_sample(&setup, &data, &mut rng, 1.0, Some((&mut grads, &params)))?;
        // GPU work is asynchronous: wait for the backward before reading the clock.
        device.synchronize()?;
        Ok(stats)
    };
    step()?;
    let start = Instant::now();
    let stats = step()?;
    Ok(StepBenchResult {
        seq_len: opts.seq_len,
        depths: opts.cod.depths,
        ratio: opts.cod.ratio,
        ratio_min: opts.cod.ratio_min,
        partitions: opts.partitions,
        elements: stats.count.iter().sum::<usize>(),
        step_seconds: start.elapsed().as_secs_f64(),
        rss_before_mib,
        peak_rss_mib: peak_rss_mib(),
    })
}

/// The process's peak resident set (Linux `VmHWM`); NaN where /proc is unavailable.
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}
