//! `peagle-train capture` writes training data from a target model; `peagle-train fit` trains
//! a P-EAGLE drafter (or the EAGLE-3 baseline) on it and exports it for peagle and vLLM.

use anyhow::{Context, Result};
use candle_core::DType;
use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use peagle_engine::{Generator, GeneratorOptions, SamplingParams};
use peagle_models::{load_target, DTypeSpec, DeviceSpec, LoadOptions};
use peagle_train::capture::{capture, read_examples, CaptureOptions};
use peagle_train::files::read_json;
use peagle_train::step_bench::{bench_step, StepBenchOptions};
use peagle_train::{fit, Algo, CodConfig, FitOptions};
use std::path::PathBuf;

#[derive(Parser)]
#[command(version, about = "Train P-EAGLE drafters (and the EAGLE-3 baseline)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum StoreDtype {
    Bf16,
    F32,
}

impl From<StoreDtype> for DType {
    fn from(d: StoreDtype) -> Self {
        match d {
            StoreDtype::Bf16 => DType::BF16,
            StoreDtype::F32 => DType::F32,
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run the target over a JSONL file and store token ids, captured states and loss masks.
    Capture {
        /// Target model directory.
        #[arg(long)]
        model: PathBuf,
        /// One JSON object a line: {"text"}, {"prompt","response"} or {"prompt"} with --generate.
        #[arg(long)]
        data: PathBuf,
        #[arg(long)]
        out: PathBuf,
        /// Let the target write each response, up to N tokens (on-policy data).
        #[arg(long, value_name = "N")]
        generate: Option<usize>,
        /// Sampling temperature of --generate (0 = greedy).
        #[arg(long, default_value_t = 0.0)]
        temperature: f32,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Examples are cut to this many tokens.
        #[arg(long, default_value_t = 2048)]
        max_len: usize,
        /// Storage dtype of the captured states.
        #[arg(long, value_enum, default_value = "bf16")]
        dtype: StoreDtype,
        /// Where the target runs: cpu, cuda, cuda:N or auto (GPU 0 where there is one).
        #[arg(long, default_value_t = DeviceSpec::Cpu)]
        device: DeviceSpec,
        /// Capture only the first N examples.
        #[arg(long)]
        limit: Option<usize>,
        /// Continue an interrupted capture into the same --out.
        #[arg(long)]
        resume: bool,
    },
    /// Train a drafter on captured data and export it in the speculators format.
    Fit(Box<FitArgs>),
    /// Time and peak memory of one P-EAGLE training step on a synthetic sample (one
    /// configuration per process: the peak is the process's).
    Bench {
        /// Target model directory whose shape the drafter takes.
        #[arg(long)]
        model: PathBuf,
        #[arg(long, default_value_t = 2048)]
        seq_len: usize,
        #[command(flatten)]
        shape: Shape,
        #[arg(long, default_value_t = 4096)]
        draft_vocab_size: usize,
        /// `cpu`, or `cuda` / `cuda:N` in a build with `--features cuda`, or `auto` (GPU 0 where
        /// there is one).
        #[arg(long, default_value_t = DeviceSpec::Cpu)]
        device: DeviceSpec,
        /// Compute dtype: auto or f32 (training computes in f32).
        #[arg(long, default_value_t = DTypeSpec::Auto)]
        dtype: DTypeSpec,
    },
}

/// The drafter and the multi-depth layout it trains on.
#[derive(clap::Args)]
struct Shape {
    #[arg(long, default_value_t = 4)]
    num_layers: usize,
    /// P-EAGLE: depths trained per position. EAGLE-3: training-time-test steps.
    #[arg(long, default_value_t = 8)]
    num_depths: usize,
    /// COD keeps this share of positions per depth (r^d); 1 with --down-sample-ratio-min 1
    /// trains every depth at every position.
    #[arg(long, default_value_t = 0.7)]
    down_sample_ratio: f64,
    #[arg(long, default_value_t = 0.2)]
    down_sample_ratio_min: f64,
    /// Sequence partitioning: segments per sample, each forward and backward on its own.
    #[arg(long, default_value_t = 1)]
    partitions: usize,
}

#[derive(clap::Args)]
struct FitArgs {
    #[arg(long, value_enum, default_value = "peagle")]
    algo: Algo,
    /// Target model directory (default: the one the data was captured from).
    #[arg(long)]
    target: Option<PathBuf>,
    /// A directory written by `peagle-train capture`; several (repeat the flag) are trained
    /// on as one dataset.
    #[arg(long, required = true)]
    data: Vec<PathBuf>,
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    shape: Shape,
    #[arg(long, default_value_t = 32000)]
    draft_vocab_size: usize,
    #[arg(long, default_value_t = 3e-4)]
    lr: f64,
    /// The cosine schedule ends at this share of --lr.
    #[arg(long, default_value_t = 0.1)]
    min_lr_ratio: f64,
    #[arg(long, default_value_t = 50)]
    warmup_steps: usize,
    #[arg(long, default_value_t = 1)]
    epochs: usize,
    /// Stop after this many optimizer steps (the schedule spans them).
    #[arg(long)]
    max_steps: Option<usize>,
    /// Samples per optimizer step.
    #[arg(long, default_value_t = 4)]
    batch_size: usize,
    #[arg(long, default_value_t = 2048)]
    seq_len: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, default_value_t = 0.0)]
    weight_decay: f64,
    #[arg(long, default_value_t = 1.0)]
    max_grad_norm: f64,
    /// Share of samples held out for validation.
    #[arg(long, default_value_t = 0.05)]
    val_fraction: f64,
    /// Validate and checkpoint every N steps.
    #[arg(long, default_value_t = 100)]
    eval_every: usize,
    /// Continue from the checkpoint in --out.
    #[arg(long)]
    resume: bool,
    /// Start from a drafter `fit` exported: its weights, draft vocabulary (--draft-vocab-size
    /// is then ignored) and mask token, with a fresh optimizer and schedule.
    #[arg(long)]
    init_from: Option<PathBuf>,
    /// Storage dtype of the exported weights.
    #[arg(long, value_enum, default_value = "bf16")]
    export_dtype: StoreDtype,
    /// `cpu`, or `cuda` / `cuda:N` in a build with `--features cuda`, or `auto` (GPU 0 where
    /// there is one).
    #[arg(long, default_value_t = DeviceSpec::Cpu)]
    device: DeviceSpec,
    /// Compute dtype: auto or f32 (training computes in f32).
    #[arg(long, default_value_t = DTypeSpec::Auto)]
    dtype: DTypeSpec,
}

fn bar(total: usize) -> Result<ProgressBar> {
    let bar = ProgressBar::new(total as u64);
    bar.set_style(ProgressStyle::with_template(
        "{elapsed_precise} [{bar:30}] {pos}/{len} eta {eta} {msg}",
    )?);
    Ok(bar)
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .init();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("peagle-train: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Capture {
            model,
            data,
            out,
            generate,
            temperature,
            seed,
            max_len,
            dtype,
            device,
            limit,
            resume,
        } => {
            if max_len < 3 || limit == Some(0) {
                anyhow::bail!("--max-len must be at least 3 (a drafter learns from pairs of following tokens) and --limit at least 1");
            }
            let mut examples = read_examples(&data)?;
            examples.truncate(limit.unwrap_or(usize::MAX));
            let gen_opts = GeneratorOptions {
                max_model_len: Some(max_len.max(2)),
                ..GeneratorOptions::default()
            };
            let load = LoadOptions::place(device, DTypeSpec::Auto).context("--device")?;
            let mut generator = Generator::from_dir(&model, None, load, &gen_opts)
                .with_context(|| format!("loading the target {}", model.display()))?;
            let opts = CaptureOptions {
                generate,
                sampling: SamplingParams {
                    temperature,
                    seed: Some(seed),
                    ..SamplingParams::default()
                },
                max_len,
                dtype: dtype.into(),
                resume,
            };
            let progress = bar(examples.len())?;
            let every = examples.len().div_ceil(20) as u64;
            let config = capture(&model, &mut generator, &examples, &out, &opts, |n| {
                progress.inc(n as u64);
                if progress.is_hidden() && progress.position() % every == 0 {
                    eprintln!("{}/{} examples", progress.position(), examples.len());
                }
            })?;
            progress.finish();
            println!(
                "{} samples, {} tokens ({} learned), layers {:?}, written to {}",
                config.num_samples,
                config.num_tokens,
                config.num_loss_tokens,
                config.source.aux_layer_ids,
                out.display()
            );
        }
        Command::Bench {
            model,
            seq_len,
            shape,
            draft_vocab_size,
            device,
            dtype,
        } => {
            let load = LoadOptions::for_training(device, dtype)?;
            if shape.num_layers == 0 || shape.num_depths == 0 || shape.partitions == 0 || draft_vocab_size == 0 {
                anyhow::bail!("--num-layers, --num-depths, --partitions and --draft-vocab-size must be at least 1");
            }
            let loaded =
                load_target(&model, load).with_context(|| format!("loading the target {}", model.display()))?;
            let context = loaded.config.max_position_embeddings.unwrap_or(usize::MAX);
            if !(3..=context).contains(&seq_len) {
                anyhow::bail!("--seq-len must lie between 3 and the target's context ({context}), got {seq_len}");
            }
            let target = loaded.model;
            let target_config = read_json(&model.join("config.json"))?;
            let opts = StepBenchOptions {
                seq_len,
                num_layers: shape.num_layers,
                cod: CodConfig {
                    depths: shape.num_depths,
                    ratio: shape.down_sample_ratio,
                    ratio_min: shape.down_sample_ratio_min,
                },
                partitions: shape.partitions,
                draft_vocab_size,
            };
            let result = bench_step(&model, target.as_ref(), target_config, &opts)?;
            println!("{}", serde_json::to_string(&result)?);
        }
        Command::Fit(args) => {
            let a = *args;
            let opts = FitOptions {
                algo: a.algo,
                target: a.target,
                data: a.data,
                out: a.out.clone(),
                num_layers: a.shape.num_layers,
                num_depths: a.shape.num_depths,
                down_sample_ratio: a.shape.down_sample_ratio,
                down_sample_ratio_min: a.shape.down_sample_ratio_min,
                draft_vocab_size: a.draft_vocab_size,
                lr: a.lr,
                min_lr_ratio: a.min_lr_ratio,
                warmup_steps: a.warmup_steps,
                epochs: a.epochs,
                max_steps: a.max_steps,
                batch_size: a.batch_size,
                seq_len: a.seq_len,
                partitions: a.shape.partitions,
                seed: a.seed,
                weight_decay: a.weight_decay,
                max_grad_norm: a.max_grad_norm,
                val_fraction: a.val_fraction,
                eval_every: a.eval_every,
                resume: a.resume,
                init_from: a.init_from,
                export_dtype: a.export_dtype.into(),
                device: LoadOptions::for_training(a.device, a.dtype)?.device,
            };
            let progress = bar(0)?;
            let state = fit(opts, |step, total, message| {
                progress.set_length(total as u64);
                progress.set_position(step as u64);
                progress.set_message(message.to_owned());
                // Without a terminal the bar is hidden: log twenty lines over the run instead.
                if progress.is_hidden() && (step % total.div_ceil(20) == 0 || step == total) {
                    eprintln!("step {step}/{total} {message}");
                }
            })?;
            progress.finish();
            let last = state.history.last();
            println!(
                "{} steps in {:.0} s; val loss {:.4}, per-depth accuracy {:?}; drafter written to {}",
                state.step,
                state.seconds,
                last.map_or(f64::NAN, |p| p.val_loss),
                last.map(|p| p.val_accuracy.clone()).unwrap_or_default(),
                a.out.display()
            );
        }
    }
    Ok(())
}
