//! peagle-generate: complete one prompt (streamed to stdout) or a JSONL file of prompts (one
//! JSON result a line), optionally with EAGLE-3 or P-EAGLE speculative decoding.

use anyhow::{bail, Context, Result};
use clap::Parser;
use peagle_cli::report::{read_prompts, Report};
use peagle_cli::{demo_model_dir, init_tracing};
use peagle_engine::{
    DraftModel, GenerateParams, Generator, GeneratorOptions, Penalties, SamplingParams, StructuredOutput, TokenBans,
    DEFAULT_GPU_MEMORY_UTILIZATION,
};
use peagle_grammar::{Constraint, Spec, Vocabulary};
use peagle_kernels::cuda_profiler_range;
use peagle_models::{DTypeSpec, DeviceSpec, KvCacheDtype, LoadOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Parser)]
#[command(version, about = "Generate completions with a local Hugging Face model")]
struct Args {
    /// Model directory (config.json, safetensors, tokenizer.json). Default: the bundled demo model.
    #[arg(long)]
    model: Option<PathBuf>,
    #[arg(long, required_unless_present = "prompts_file", conflicts_with = "prompts_file")]
    prompt: Option<String>,
    /// JSONL file with one {"prompt": ...} a line; results go to stdout as JSONL.
    #[arg(long)]
    prompts_file: Option<PathBuf>,
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
    /// Drops tokens less likely than this share of the most likely one; 0 is off.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    min_p: f32,
    /// Above 1 discourages tokens of the prompt and output (vLLM's repetition_penalty).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    repetition_penalty: f32,
    /// Subtracted from the logit of every token already generated.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was generated.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    frequency_penalty: f32,
    #[arg(long)]
    seed: Option<u64>,
    /// Continue past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// The text is JSON this JSON schema accepts (given inline).
    #[arg(long, conflicts_with = "regex")]
    json_schema: Option<String>,
    /// The text matches this regex whole.
    #[arg(long)]
    regex: Option<String>,
    /// Longest prefill chunk, in tokens.
    #[arg(long, default_value_t = 512)]
    max_batched_tokens: usize,
    /// Longest sequence, prompt and output together; the KV cache is sized for one. Default:
    /// the model's max_position_embeddings.
    #[arg(long)]
    max_model_len: Option<usize>,
    /// What the KV cache stores: auto (the model's dtype: bf16 for a bf16 checkpoint such as
    /// the demo model, else f32), f32, bf16 or fp8 (e4m3, with the checkpoint's per-layer
    /// k_scale and v_scale or 1).
    #[arg(long, default_value_t = KvCacheDtype::Auto)]
    kv_cache_dtype: KvCacheDtype,
    /// Run decode and verification steps, and the drafter's passes, by CUDA graphs, captured at
    /// start-up for every batch shape of up to 512 rows (on a GPU).
    #[arg(long)]
    cuda_graphs: bool,
    /// The share of the GPU's memory the engine may fill; the KV cache gets what the weights
    /// and a step's activations leave of it, up to a full-length sequence's.
    #[arg(long, default_value_t = DEFAULT_GPU_MEMORY_UTILIZATION)]
    gpu_memory_utilization: f64,
    /// For a CUDA profiler: every prompt of --prompts-file after the first runs inside the
    /// CUDA profiler API's capture range, which `ncu --profile-from-start off` and `nsys
    /// profile --capture-range=cudaProfilerApi` record; loading and the first prompt, which
    /// warms the engine up, stay out of the profile (on a GPU).
    #[arg(long, requires = "prompts_file")]
    cuda_profile: bool,
    /// EAGLE-3 or P-EAGLE drafter directory: enables speculative decoding.
    #[arg(long)]
    draft_model: Option<PathBuf>,
    /// Draft all K tokens in one P-EAGLE pass (default: K autoregressive EAGLE-3 passes, but
    /// a P-EAGLE checkpoint always drafts in parallel).
    #[arg(long, requires = "draft_model")]
    parallel_drafting: bool,
    /// Drafts per step. Default: the drafter's published value, else 3.
    #[arg(long, requires = "draft_model")]
    k: Option<usize>,
    /// Where the model runs: auto (GPU 0 where the build has CUDA and the host a GPU, else
    /// the CPU), cpu, cuda or cuda:N.
    #[arg(long, default_value_t = DeviceSpec::Auto)]
    device: DeviceSpec,
    /// Activation dtype: auto (f32 on the CPU, bf16 on a GPU), f32, bf16 or f16.
    #[arg(long, default_value_t = DTypeSpec::Auto)]
    dtype: DTypeSpec,
    /// Write aggregate statistics (tokens/s, acceptance) as JSON here.
    #[arg(long)]
    stats_json: Option<PathBuf>,
}

fn main() {
    init_tracing();
    if let Err(e) = run(Args::parse()) {
        eprintln!("peagle-generate: {e:#}");
        std::process::exit(1);
    }
}

/// The grammar `--json-schema` or `--regex` asks the text to follow, over the model's tokens.
fn structured_output(args: &Args, generator: &Generator) -> Result<Option<StructuredOutput>> {
    let (spec, flag) = match (&args.json_schema, &args.regex) {
        (Some(schema), _) => {
            let schema = serde_json::from_str(schema).context("--json-schema is not JSON")?;
            let spec = Spec::JsonSchema {
                schema,
                whitespace: None,
            };
            (spec, "--json-schema")
        }
        (None, Some(pattern)) => (Spec::Regex(pattern.clone()), "--regex"),
        (None, None) => return Ok(None),
    };
    let tokenizer = generator
        .tokenizer()
        .with_context(|| format!("{flag} needs the model's tokenizer.json"))?;
    let vocabulary = Vocabulary::from_tokenizer(tokenizer).context(flag)?;
    let grammar = spec.compile(&vocabulary).context(flag)?;
    Ok(Some(StructuredOutput {
        constraint: Arc::new(Constraint::new(grammar, Arc::new(vocabulary))),
        trigger: Vec::new(),
    }))
}

fn run(args: Args) -> Result<()> {
    let dir = match &args.model {
        Some(dir) => dir.clone(),
        None => demo_model_dir()?,
    };
    if args.k == Some(0) {
        bail!("--k must be at least 1");
    }
    if args.max_batched_tokens == 0 {
        bail!("--max-batched-tokens must be at least 1");
    }
    // The stats are written once every prompt has run: a path that cannot take them, or that
    // would replace the prompts, fails now instead.
    if let Some(path) = &args.stats_json {
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        if parent.is_some_and(|p| !p.is_dir()) {
            bail!("--stats-json {}: no such directory", path.display());
        }
        let same_file = |a: &Path, b: &Path| a.canonicalize().ok().is_some_and(|a| Some(a) == b.canonicalize().ok());
        if args
            .prompts_file
            .as_deref()
            .is_some_and(|prompts| same_file(path, prompts))
        {
            bail!("--stats-json {} is the prompts file", path.display());
        }
    }
    let draft = args.draft_model.as_ref().map(|dir| DraftModel {
        dir: dir.clone(),
        k: args.k,
        parallel: args.parallel_drafting,
    });
    let opts = GeneratorOptions {
        max_batched_tokens: args.max_batched_tokens,
        max_model_len: args.max_model_len,
        kv_cache_dtype: args.kv_cache_dtype,
        cuda_graphs: args.cuda_graphs,
        gpu_memory_utilization: args.gpu_memory_utilization,
        ..Default::default()
    };
    let load = LoadOptions::place(args.device, args.dtype).context("--device / --dtype")?;
    if args.cuda_profile && load.device.is_cpu() {
        bail!("--cuda-profile needs a GPU, and this run is on the CPU");
    }
    let device = load.device.clone();
    let mut generator = Generator::from_dir(&dir, draft.as_ref(), load, &opts)
        .with_context(|| format!("cannot load {}", dir.display()))?;
    let params = GenerateParams {
        max_tokens: args.max_tokens,
        sampling: SamplingParams {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            min_p: args.min_p,
            seed: args.seed,
            penalties: Penalties {
                presence: args.presence_penalty,
                frequency: args.frequency_penalty,
                repetition: args.repetition_penalty,
                logit_bias: Vec::new(),
            },
            bans: TokenBans::default(),
            structured: structured_output(&args, &generator)?,
        },
        ignore_eos: args.ignore_eos,
        ..GenerateParams::default()
    };
    let mut report = Report::default();
    let mut stdout = std::io::stdout().lock();
    match (&args.prompt, &args.prompts_file) {
        (Some(prompt), _) => {
            if prompt.is_empty() {
                bail!("--prompt is empty");
            }
            let ids = generator.prompt_ids(prompt)?;
            let mut write_error = None;
            let out = generator.generate_text(&ids, &params, |text| {
                if write_error.is_none() {
                    write_error = stdout.write_all(text.as_bytes()).and_then(|_| stdout.flush()).err();
                }
            })?;
            if let Some(e) = write_error {
                return Err(e).context("writing to stdout");
            }
            writeln!(stdout)?;
            report.add(&out);
        }
        (None, Some(file)) => {
            let prompts = read_prompts(file)?;
            let at = |line: usize| format!("{}:{}", file.display(), line + 1);
            // Every prompt is tokenized and checked before any runs, so a bad one late in the
            // file costs no work.
            let ids = prompts
                .iter()
                .enumerate()
                .map(|(line, prompt)| generator.prompt_ids(prompt).with_context(|| at(line)))
                .collect::<Result<Vec<_>>>()?;
            for (line, (prompt, ids)) in prompts.iter().zip(&ids).enumerate() {
                if args.cuda_profile && line == 1 {
                    cuda_profiler_range(&device, true).context("starting the CUDA profiler's range")?;
                }
                let mut text = String::new();
                let out = generator
                    .generate_text(ids, &params, |t| text.push_str(t))
                    .with_context(|| at(line))?;
                writeln!(stdout, "{}", report.line(prompt, &text, &out))?;
                report.add(&out);
            }
        }
        (None, None) => bail!("give --prompt or --prompts-file"),
    }
    if args.cuda_profile {
        cuda_profiler_range(&device, false).context("stopping the CUDA profiler's range")?;
    }
    report.set_step_times(generator.engine().times());
    eprintln!("{}", report.summary());
    if let Some(path) = &args.stats_json {
        std::fs::write(path, report.json().to_string()).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
