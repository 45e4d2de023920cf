//! peagle-generate: stream a completion of one prompt to stdout; tokens/s to stderr.

use anyhow::{bail, Context, Result};
use clap::Parser;
use peagle_cli::{demo_model_dir, init_tracing};
use peagle_engine::{GenerateParams, Generator, GeneratorOptions, SamplingParams};
use peagle_models::LoadOptions;
use std::io::Write;
use std::path::PathBuf;

#[derive(Parser)]
#[command(version, about = "Generate a completion with a local Hugging Face model")]
struct Args {
    /// Model directory (config.json, safetensors, tokenizer.json). Default: the bundled demo model.
    #[arg(long)]
    model: Option<PathBuf>,
    #[arg(long)]
    prompt: String,
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// 0 is greedy decoding.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    temperature: f32,
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    top_p: f32,
    /// 0 disables the top-k cut.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long)]
    seed: Option<u64>,
    /// Continue past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Longest prefill chunk, in tokens.
    #[arg(long, default_value_t = 512)]
    max_batched_tokens: usize,
}

fn main() {
    init_tracing();
    if let Err(e) = run(Args::parse()) {
        eprintln!("peagle-generate: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<()> {
    let dir = match args.model {
        Some(dir) => dir,
        None => demo_model_dir()?,
    };
    if args.prompt.is_empty() {
        bail!("--prompt is empty");
    }
    let opts = GeneratorOptions {
        max_batched_tokens: args.max_batched_tokens,
        ..Default::default()
    };
    let mut generator = Generator::from_dir(&dir, LoadOptions::default(), &opts)
        .with_context(|| format!("cannot load model from {}", dir.display()))?;
    let params = GenerateParams {
        max_tokens: args.max_tokens,
        sampling: SamplingParams {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            seed: args.seed,
        },
        ignore_eos: args.ignore_eos,
    };
    let mut stdout = std::io::stdout().lock();
    let mut write_error = None;
    let out = generator.generate_text(&args.prompt, &params, |text| {
        if write_error.is_none() {
            write_error = stdout.write_all(text.as_bytes()).and_then(|_| stdout.flush()).err();
        }
    })?;
    if let Some(e) = write_error {
        return Err(e).context("writing to stdout");
    }
    writeln!(stdout)?;
    let generated = out.token_ids.len();
    let decode_steps = generated.saturating_sub(1);
    eprintln!(
        "{} prompt tokens, {generated} generated ({:?}); prefill {:.1} ms; decode {:.1} tokens/s",
        out.prompt_tokens,
        out.finish_reason,
        out.prefill_seconds * 1e3,
        if out.decode_seconds > 0.0 {
            decode_steps as f64 / out.decode_seconds
        } else {
            0.0
        },
    );
    Ok(())
}
