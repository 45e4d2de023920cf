//! `peagle-train fit`: the training loop over captured samples, with validation, checkpoints
//! and `--resume` (their files in `checkpoint_files`), a final report, and export in the
//! speculators format.

use crate::blueprint::{Algo, DrafterBlueprint, NEW_DRAFTER_NORM_BEFORE_RESIDUAL};
use crate::checkpoint_files::{self, RunChoices};
use crate::cod::CodConfig;
use crate::error::TrainError;
use crate::export::export;
use crate::files::{read_json, write_json};
use crate::objective::DepthStats;
use crate::optimizer::{lr_at, AdamW, AdamWConfig};
use crate::params::Params;
use crate::plot::accuracy_plot;
use crate::sample::Sample;
use crate::step::{eagle3_sample, peagle_sample, Gradients, PeagleSetup, Prepared};
use crate::train_state::{EvalPoint, TrainState};
use crate::training_data::TrainingData;
use crate::vocab::{pick_mask_token, DraftVocab};
use crate::warm_start::Exported;
use candle_core::{DType, Device};
use peagle_models::{load_target, Drafter, DrafterConfig, LoadOptions, TargetModel};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Debug, Clone)]
pub struct FitOptions {
    pub algo: Algo,
    pub target: Option<PathBuf>,
    /// Directories written by `capture`, trained on as one dataset.
    pub data: Vec<PathBuf>,
    pub out: PathBuf,
    pub num_layers: usize,
    /// P-EAGLE: depths trained (depth 0 plus K-1 mask depths). EAGLE-3: unrolled steps.
    pub num_depths: usize,
    pub down_sample_ratio: f64,
    pub down_sample_ratio_min: f64,
    pub draft_vocab_size: usize,
    pub lr: f64,
    pub min_lr_ratio: f64,
    pub warmup_steps: usize,
    pub epochs: usize,
    pub max_steps: Option<usize>,
    pub batch_size: usize,
    pub seq_len: usize,
    pub partitions: usize,
    pub seed: u64,
    pub weight_decay: f64,
    pub max_grad_norm: f64,
    pub val_fraction: f64,
    pub eval_every: usize,
    pub resume: bool,
    /// Start from the weights, draft vocabulary and mask token of an exported drafter.
    pub init_from: Option<PathBuf>,
    pub export_dtype: DType,
    /// Where the target and the drafter live; samples are read on the CPU and moved.
    pub device: Device,
}

pub const REPORT: &str = "train_report.json";
pub const PLOT: &str = "accuracy.png";

/// Everything a run holds in memory.
struct Run {
    opts: FitOptions,
    data: TrainingData,
    target: Box<dyn TargetModel>,
    blueprint: DrafterBlueprint,
    config: DrafterConfig,
    params: Params,
    optimizer: AdamW,
    state: TrainState,
    train: Vec<usize>,
    val: Vec<usize>,
}

/// Trains a drafter; `progress(step, total, message)` is called after every step.
pub fn fit(opts: FitOptions, mut progress: impl FnMut(usize, usize, &str)) -> Result<TrainState, TrainError> {
    let mut run = Run::start(opts)?;
    let started = Instant::now() - std::time::Duration::from_secs_f64(run.state.seconds);
    let per_epoch = run.train.len().div_ceil(run.opts.batch_size);
    let mut recent = DepthStats::default();
    // Each epoch's order comes from the seed and the epoch alone, so `--resume` repeats it.
    'training: for epoch in run.state.step / per_epoch.. {
        let mut order = run.train.clone();
        order.shuffle(&mut StdRng::seed_from_u64(run.opts.seed ^ epoch as u64));
        let done_in_epoch = run.state.step - epoch * per_epoch;
        for batch in order.chunks(run.opts.batch_size).skip(done_in_epoch) {
            if run.state.step == run.state.total_steps {
                break 'training;
            }
            let lr = lr_at(
                run.state.step,
                run.state.total_steps,
                run.opts.warmup_steps,
                run.opts.lr,
                run.opts.min_lr_ratio,
            );
            let stats = run.train_step(batch, lr)?;
            recent.merge(&stats);
            run.state.step += 1;
            run.state.seconds = started.elapsed().as_secs_f64();
            let done = run.state.step == run.state.total_steps;
            if run.state.step % run.opts.eval_every == 0 || done {
                let val = run.evaluate()?;
                run.state.history.push(EvalPoint {
                    step: run.state.step,
                    lr,
                    train_loss: recent.mean_loss(),
                    val_loss: val.mean_loss(),
                    val_accuracy: val.accuracy(),
                });
                recent = DepthStats::default();
                run.save_checkpoint()?;
            }
            let acc = run.state.history.last().map_or(String::new(), |p| {
                let shown: Vec<String> = p.val_accuracy.iter().map(|a| format!("{a:.2}")).collect();
                format!(" val acc [{}]", shown.join(" "))
            });
            let message = format!("loss {:.3}{acc}", stats.mean_loss());
            progress(run.state.step, run.state.total_steps, &message);
        }
    }
    run.finish()?;
    Ok(run.state)
}

impl Run {
    fn start(opts: FitOptions) -> Result<Self, TrainError> {
        let data = TrainingData::open(&opts.data)?;
        let data_config = &data.config;
        let target_dir = opts.target.clone().unwrap_or_else(|| data_config.source.target.clone());
        validate(&opts, &data)?;
        let load = LoadOptions {
            device: opts.device.clone(),
            ..LoadOptions::default()
        };
        let mut target = load_target(&target_dir, load)?.model;
        target.set_capture_layers(data_config.source.aux_layer_ids.clone())?;
        if target.dims().hidden_size != data_config.source.target_hidden_size {
            return Err(TrainError::Invalid(format!(
                "the data was captured from a target of hidden size {}, {} has {}",
                data_config.source.target_hidden_size,
                target_dir.display(),
                target.dims().hidden_size
            )));
        }
        let counts = &data.counts;
        if opts.out.exists() && !opts.out.is_dir() {
            return Err(TrainError::Invalid(format!(
                "the output {} is a file, not a directory",
                opts.out.display()
            )));
        }
        let resumed = checkpoint_files::resumed(&opts.out, opts.resume, opts.algo)?;
        let exported = match &opts.init_from {
            Some(dir) => Some(Exported::open(
                dir,
                opts.algo,
                counts.len(),
                &data_config.source.aux_layer_ids,
                &opts.device,
            )?),
            None => None,
        };
        let choice = match (&resumed, &exported) {
            (Some(r), _) => r.choices.clone(),
            (None, Some(e)) => RunChoices {
                draft_vocab: e.draft_vocab.clone(),
                mask_token_id: e.mask_token_id,
                norm_before_residual: Some(e.norm_before_residual),
            },
            (None, None) => RunChoices {
                draft_vocab: DraftVocab::from_counts(counts, opts.draft_vocab_size).selected,
                mask_token_id: (opts.algo == Algo::Peagle).then(|| pick_mask_token(counts)),
                norm_before_residual: Some(NEW_DRAFTER_NORM_BEFORE_RESIDUAL),
            },
        };
        let vocab = DraftVocab {
            selected: choice.draft_vocab,
            target_vocab_size: counts.len(),
        };
        let mask_token_id = choice.mask_token_id;
        let norm_before_residual = choice.norm_before_residual.unwrap_or(opts.algo == Algo::Eagle3);
        let target_config: serde_json::Value = read_json(&target_dir.join("config.json"))?;
        let blueprint = DrafterBlueprint {
            algo: opts.algo,
            num_layers: opts.num_layers,
            vocab,
            mask_token_id,
            aux_layer_ids: data_config.source.aux_layer_ids.clone(),
            num_speculative_tokens: match opts.algo {
                Algo::Peagle => opts.num_depths.min(7),
                Algo::Eagle3 => 3,
            },
            norm_before_residual,
            target_dir: target_dir.clone(),
            target_config,
        };
        let config = blueprint.drafter_config(&opts.out.join("config.json"))?;
        let (params, moments) = match (&resumed, exported) {
            (Some(r), _) => checkpoint_files::load_weights(&opts.out, r.state.step, &blueprint, &opts.device)
                .map(|(weights, moments)| (weights, Some(moments)))?,
            (None, Some(e)) => (e.weights(&blueprint.weight_shapes()?)?, None),
            (None, None) => (blueprint.init_weights(target.as_ref(), opts.seed)?, None),
        };
        let params = Params::new(params)?;
        let mut optimizer = AdamW::new(
            &params,
            AdamWConfig {
                lr: opts.lr,
                beta1: 0.9,
                beta2: 0.95,
                eps: 1e-8,
                weight_decay: opts.weight_decay,
                max_grad_norm: opts.max_grad_norm,
            },
        )?;
        if let (Some(moments), Some(r)) = (moments, &resumed) {
            checkpoint_files::restore_optimizer(&mut optimizer, &params, moments, r.state.step);
        }
        // Every n-th sample is held out, n from the fraction; at least one when there are two.
        let n = data_config.num_samples;
        let stride = (1.0 / opts.val_fraction.clamp(1e-6, 0.5)).round() as usize;
        let val: Vec<usize> = (0..n).filter(|i| n > 1 && i % stride == stride - 1).collect();
        let val = if val.is_empty() && n > 1 { vec![n - 1] } else { val };
        let train: Vec<usize> = (0..n).filter(|i| !val.contains(i)).collect();
        let per_epoch = train.len().div_ceil(opts.batch_size);
        let total_steps = opts
            .max_steps
            .map_or(per_epoch * opts.epochs, |m| m.min(per_epoch * opts.epochs));
        let state = match resumed {
            // A shorter schedule than the steps already taken would never end.
            Some(r) if r.state.step > total_steps => {
                return Err(TrainError::Invalid(format!(
                    "the run is at step {}, past the {total_steps} steps these options make: resume with as \
                     many steps at least (--max-steps, --epochs, --batch-size)",
                    r.state.step
                )))
            }
            Some(r) => TrainState { total_steps, ..r.state },
            None => TrainState {
                algo: opts.algo.name().into(),
                step: 0,
                total_steps,
                seconds: 0.0,
                train_samples: train.len(),
                val_samples: val.len(),
                num_parameters: params.num_elements(),
                history: Vec::new(),
            },
        };
        Ok(Self {
            opts,
            data,
            target,
            blueprint,
            config,
            params,
            optimizer,
            state,
            train,
            val,
        })
    }

    fn prepare(&self, index: usize) -> Result<Prepared, TrainError> {
        let sample = Sample::load(&self.data.sample_path(index))?;
        Ok(Prepared::new(
            &sample,
            self.target.as_ref(),
            &self.blueprint.vocab,
            self.opts.seq_len,
        )?)
    }

    /// The COD rng of a sample at a step: fixed by the seed, so a resumed run repeats it.
    fn rng(&self, index: usize, step: usize) -> StdRng {
        StdRng::seed_from_u64(self.opts.seed ^ ((step as u64) << 32) ^ index as u64)
    }

    fn pass(
        &self,
        drafter: &Drafter,
        index: usize,
        step: usize,
        grads: Option<&mut Gradients>,
    ) -> Result<DepthStats, TrainError> {
        let data = self.prepare(index)?;
        let scale = 1.0 / self.opts.batch_size as f64;
        let grads = grads.map(|g| (g, &self.params));
        let stats = match self.opts.algo {
            Algo::Peagle => {
                let cod = CodConfig {
                    depths: self.opts.num_depths,
                    ratio: self.opts.down_sample_ratio,
                    ratio_min: self.opts.down_sample_ratio_min,
                };
                let setup = PeagleSetup {
                    drafter,
                    vocab: &self.blueprint.vocab,
                    cod: &cod,
                    partitions: self.opts.partitions,
                };
                peagle_sample(&setup, &data, &mut self.rng(index, step), scale, grads)?
            }
            Algo::Eagle3 => eagle3_sample(
                drafter,
                &self.blueprint.vocab,
                &data,
                self.opts.num_depths,
                scale,
                grads,
            )?,
        };
        Ok(stats)
    }

    fn train_step(&mut self, batch: &[usize], lr: f64) -> Result<DepthStats, TrainError> {
        let drafter = self.params.drafter(&self.config, self.target.as_ref())?;
        let mut grads = Gradients::new(&self.params);
        let mut stats = DepthStats::default();
        for &index in batch {
            stats.merge(&self.pass(&drafter, index, self.state.step, Some(&mut grads))?);
        }
        self.optimizer.update(&self.params, &grads, lr)?;
        Ok(stats)
    }

    /// Loss and per-depth accuracy on the held-out samples, with a fixed COD draw.
    fn evaluate(&self) -> Result<DepthStats, TrainError> {
        let drafter = self.params.frozen_drafter(&self.config, self.target.as_ref())?;
        let mut stats = DepthStats::default();
        for &index in &self.val {
            stats.merge(&self.pass(&drafter, index, usize::MAX, None)?);
        }
        Ok(stats)
    }

    fn save_checkpoint(&self) -> Result<(), TrainError> {
        checkpoint_files::save(
            &self.opts.out,
            &self.state,
            &self.params,
            &self.optimizer,
            &self.blueprint,
        )
    }

    fn finish(&self) -> Result<(), TrainError> {
        export(
            &self.blueprint,
            &self.params.snapshot(),
            &self.opts.out,
            self.opts.export_dtype,
        )?;
        write_json(&self.opts.out.join(REPORT), &self.state)?;
        let title = format!(
            "{} drafter, {} layers: validation accuracy per depth",
            self.state.algo, self.opts.num_layers
        );
        accuracy_plot(&self.state.history, &title, &self.opts.out.join(PLOT))
    }
}

fn validate(opts: &FitOptions, data: &TrainingData) -> Result<(), TrainError> {
    let invalid = |m: String| Err(TrainError::Invalid(m));
    if data.config.num_samples == 0 {
        return invalid(format!("{} holds no samples", data.describe()));
    }
    if opts.num_layers == 0 || opts.num_depths == 0 || opts.batch_size == 0 || opts.epochs == 0 {
        return invalid(
            "the drafter's layers, the depths, the batch size and the epochs must each be at least 1".into(),
        );
    }
    if opts.max_steps == Some(0) {
        return invalid("the most steps must be at least 1".into());
    }
    if !(0.0..=1.0).contains(&opts.down_sample_ratio) || !(0.0..=1.0).contains(&opts.down_sample_ratio_min) {
        return invalid("the COD down-sample ratio and its floor must lie in [0, 1]".into());
    }
    if opts.partitions == 0 || (opts.algo == Algo::Eagle3 && opts.partitions > 1) {
        return invalid("the partitions must be at least 1, and 1 for eagle3".into());
    }
    if opts.seq_len < 3 || opts.eval_every == 0 || opts.draft_vocab_size == 0 {
        return invalid(
            "the sequence length must be at least 3, the evaluation interval and the draft vocabulary at least 1"
                .into(),
        );
    }
    if opts.lr <= 0.0 || !opts.lr.is_finite() {
        return invalid("the learning rate must be positive".into());
    }
    let fractions_ok = opts.val_fraction > 0.0 && opts.val_fraction < 1.0 && (0.0..=1.0).contains(&opts.min_lr_ratio);
    if !fractions_ok {
        return invalid(
            "the validation fraction must lie in (0, 1) and the minimum learning-rate ratio in [0, 1]".into(),
        );
    }
    if opts.resume && opts.init_from.is_some() {
        return invalid(
            "resuming continues the run in the output directory, starting from a drafter begins a new one: choose one"
                .into(),
        );
    }
    Ok(())
}
