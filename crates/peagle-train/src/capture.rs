//! `peagle-train capture`: runs the target over training text and stores what a drafter learns
//! from, one [`Sample`] file per example, plus the token frequencies of the learned tokens
//! (the draft vocabulary is chosen from them) and a `data_config.json` naming the target and
//! the captured layers.

use crate::error::TrainError;
use crate::files::{read_json, write_json};
use crate::sample::Sample;
use candle_core::{DType, Tensor};
use peagle_engine::{GenerateParams, Generator, SamplingParams};
use peagle_kernels::on_pool;
use peagle_models::{BatchBuilder, KvCache, Rows, TargetModel};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use tokenizers::Tokenizer;

/// One line of the input JSONL.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Example {
    pub text: Option<String>,
    pub prompt: Option<String>,
    pub response: Option<String>,
}

/// Written next to the samples; `fit` reads it back.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DataConfig {
    #[serde(flatten)]
    pub source: CaptureSource,
    pub num_samples: usize,
    pub num_tokens: usize,
    pub num_loss_tokens: usize,
}

/// Where captured states come from: samples of two sources cannot train one drafter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureSource {
    pub target: PathBuf,
    pub aux_layer_ids: Vec<usize>,
    pub target_hidden_size: usize,
    pub vocab_size: usize,
}

impl CaptureSource {
    /// A 400-style refusal to combine `other`'s samples (at `path`) with these.
    pub fn check_same(&self, other: &Self, path: &Path) -> Result<(), TrainError> {
        if self == other {
            return Ok(());
        }
        Err(TrainError::data(
            path,
            format!(
                "holds states of {} layers {:?} (hidden {}, vocab {}), not of {} layers {:?} (hidden {}, vocab {})",
                other.target.display(),
                other.aux_layer_ids,
                other.target_hidden_size,
                other.vocab_size,
                self.target.display(),
                self.aux_layer_ids,
                self.target_hidden_size,
                self.vocab_size
            ),
        ))
    }
}

pub const DATA_CONFIG: &str = "data_config.json";
pub const TOKEN_FREQ: &str = "token_freq.safetensors";
const PROGRESS: &str = "capture_progress.json";

/// How far an interrupted capture got: `--resume` continues from here, from the same source.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaptureProgress {
    #[serde(flatten)]
    pub source: CaptureSource,
    pub examples_done: usize,
    pub num_samples: usize,
}

/// Totals over the samples written so far.
struct Totals {
    counts: Vec<i64>,
    tokens: usize,
    loss_tokens: usize,
}

impl Totals {
    fn add(&mut self, sample: &Sample) {
        for (t, m) in sample.token_ids.iter().zip(&sample.loss_mask) {
            self.counts[*t as usize] += *m as i64;
        }
        self.tokens += sample.len();
        self.loss_tokens += sample.loss_mask.iter().filter(|m| **m).count();
    }
}

pub fn sample_path(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("sample_{i:07}.safetensors"))
}

/// Reads the input JSONL, one example per non-empty line; errors name the line.
pub fn read_examples(path: &Path) -> Result<Vec<Example>, TrainError> {
    let text = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
    let mut examples = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let example: Example =
            serde_json::from_str(line).map_err(|e| TrainError::data(path, format!("line {}: {e}", i + 1)))?;
        let shape_ok = matches!(
            (&example.text, &example.prompt, &example.response),
            (Some(_), None, None) | (None, Some(_), _)
        );
        if !shape_ok {
            return Err(TrainError::data(
                path,
                format!(
                    "line {}: expected {{\"text\"}}, {{\"prompt\", \"response\"}} or {{\"prompt\"}}",
                    i + 1
                ),
            ));
        }
        examples.push(example);
    }
    if examples.is_empty() {
        return Err(TrainError::data(path, "no examples"));
    }
    Ok(examples)
}

pub struct CaptureOptions {
    /// Let the target write the response to each prompt, this many tokens at most.
    pub generate: Option<usize>,
    pub sampling: SamplingParams,
    /// Longer examples are cut to this many tokens.
    pub max_len: usize,
    pub dtype: DType,
    /// Continue an interrupted capture in the same directory.
    pub resume: bool,
}

/// The token ids of an example and which of them are learned: all of `text`, the response
/// after a prompt. Prompt and response are encoded apart so the boundary is exact.
pub fn tokenize_example(
    example: &Example,
    tokenizer: &Tokenizer,
    generator: &mut Generator,
    opts: &CaptureOptions,
) -> Result<(Vec<u32>, Vec<bool>), TrainError> {
    let encode = |s: &str, special: bool| -> Result<Vec<u32>, TrainError> {
        Ok(tokenizer
            .encode(s, special)
            .map_err(|e| TrainError::Invalid(format!("tokenizer: {e}")))?
            .get_ids()
            .to_vec())
    };
    if let Some(text) = &example.text {
        let ids = encode(text, true)?;
        return Ok((ids.clone(), vec![true; ids.len()]));
    }
    let prompt = encode(example.prompt.as_deref().unwrap_or_default(), true)?;
    let response = match (&example.response, opts.generate) {
        (Some(r), _) => encode(r, false)?,
        (None, Some(_)) if prompt.len() >= opts.max_len => {
            // The cut at --max-len would drop any response: the example teaches nothing.
            tracing::warn!(
                prompt_tokens = prompt.len(),
                max_len = opts.max_len,
                "skipping a prompt that fills the maximum length"
            );
            Vec::new()
        }
        (None, Some(n)) => {
            let params = GenerateParams {
                max_tokens: n.min(opts.max_len.saturating_sub(prompt.len())).max(1),
                sampling: opts.sampling.clone(),
                ..GenerateParams::default()
            };
            let mut out = Vec::new();
            generator
                .generate(&prompt, &params, |id| out.push(id))
                .map_err(|e| TrainError::Invalid(format!("generating a response: {e}")))?;
            out
        }
        (None, None) => {
            return Err(TrainError::Invalid(
                "an example has a prompt but no response: let the target generate the responses".into(),
            ))
        }
    };
    let mut mask = vec![false; prompt.len()];
    mask.resize(prompt.len() + response.len(), true);
    Ok(([prompt, response].concat(), mask))
}

/// The captured states of every position, [n, aux layers + 1, hidden]: the target's capture
/// layers' inputs, then its final pre-norm state.
pub fn capture_states(target: &dyn TargetModel, tokens: &[u32]) -> Result<Tensor, TrainError> {
    const BLOCK: usize = 16;
    let n = tokens.len();
    let blocks = n.div_ceil(BLOCK);
    // Drafters learn from the model's exact states: an f32 cache, whatever serving uses.
    let kv = KvCache::new(target.dims(), blocks, BLOCK, DType::F32, target.device())?;
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut batch = BatchBuilder::new(BLOCK);
    batch.add(tokens, 0, &table, Rows::None, Rows::All)?;
    let out = on_pool(|| target.forward(&batch.build(), &kv))?;
    let h = target.dims().hidden_size;
    let layers = target.capture_layers().len();
    let aux = out.aux_hidden.expect("every row captured").reshape((n, layers, h))?;
    let last = out.final_hidden.expect("every row captured").reshape((n, 1, h))?;
    Ok(Tensor::cat(&[aux, last], 1)?)
}

/// TrainingData every example into `out`, calling `progress` after each; returns the data config.
pub fn capture(
    target_dir: &Path,
    generator: &mut Generator,
    examples: &[Example],
    out: &Path,
    opts: &CaptureOptions,
    mut progress: impl FnMut(usize),
) -> Result<DataConfig, TrainError> {
    // Samples are numbered from 0: a fresh capture over an old one would mix the two.
    if !opts.resume && (out.join(PROGRESS).exists() || out.join(DATA_CONFIG).exists()) {
        return Err(TrainError::data(
            out,
            "already holds a capture: resume it, or choose an empty output directory",
        ));
    }
    std::fs::create_dir_all(out).map_err(|e| TrainError::io(out, e))?;
    let tokenizer = generator
        .tokenizer()
        .cloned()
        .ok_or_else(|| TrainError::Invalid("the target has no tokenizer.json".into()))?;
    let target = generator.engine().target();
    let dims = target.dims().clone();
    let source = CaptureSource {
        target: target_dir.to_owned(),
        aux_layer_ids: target.capture_layers().to_vec(),
        target_hidden_size: dims.hidden_size,
        vocab_size: dims.vocab_size,
    };
    let mut totals = Totals {
        counts: vec![0; dims.vocab_size],
        tokens: 0,
        loss_tokens: 0,
    };
    let mut progress_state = CaptureProgress {
        source: source.clone(),
        examples_done: 0,
        num_samples: 0,
    };
    if opts.resume {
        let progress_path = out.join(PROGRESS);
        progress_state = read_json(&progress_path)?;
        source.check_same(&progress_state.source, &progress_path)?;
        for i in 0..progress_state.num_samples {
            totals.add(&Sample::load(&sample_path(out, i))?);
        }
        progress(progress_state.examples_done);
    }
    for example in examples.iter().skip(progress_state.examples_done) {
        let (mut tokens, mut mask) = tokenize_example(example, &tokenizer, generator, opts)?;
        tokens.truncate(opts.max_len);
        mask.truncate(opts.max_len);
        // A drafter learns from pairs of following tokens; shorter examples teach nothing.
        if tokens.len() >= 3 && mask.iter().any(|m| *m) {
            let hidden_states = capture_states(generator.engine().target(), &tokens)?;
            let sample = Sample {
                token_ids: tokens,
                hidden_states,
                loss_mask: mask,
            };
            totals.add(&sample);
            sample.save(&sample_path(out, progress_state.num_samples), opts.dtype)?;
            progress_state.num_samples += 1;
        }
        progress_state.examples_done += 1;
        write_json(&out.join(PROGRESS), &progress_state)?;
        progress(1);
    }
    let target = generator.engine().target();
    let config = DataConfig {
        source,
        num_samples: progress_state.num_samples,
        num_tokens: totals.tokens,
        num_loss_tokens: totals.loss_tokens,
    };
    let freq_path = out.join(TOKEN_FREQ);
    let freq = Tensor::from_vec(totals.counts, dims.vocab_size, target.device())?;
    candle_core::safetensors::save(&std::collections::HashMap::from([("counts", freq)]), &freq_path)
        .map_err(|e| TrainError::io(&freq_path, e))?;
    write_json(&out.join(DATA_CONFIG), &config)?;
    Ok(config)
}
