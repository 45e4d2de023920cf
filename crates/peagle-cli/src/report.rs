//! Aggregate generation statistics, printed by the binaries and written as JSON.

use anyhow::{bail, Context, Result};
use peagle_engine::{GenerateOutput, SpecStats, StepTimes};
use serde_json::{json, Value};
use std::path::Path;

#[derive(Default)]
pub struct Report {
    prompts: usize,
    prompt_tokens: usize,
    generated_tokens: usize,
    seconds: f64,
    spec: SpecStats,
    times: StepTimes,
}

impl Report {
    pub fn add(&mut self, out: &GenerateOutput) {
        self.prompts += 1;
        self.prompt_tokens += out.prompt_tokens;
        self.generated_tokens += out.token_ids.len();
        self.seconds += out.prefill_seconds + out.decode_seconds;
        self.spec.merge(&out.spec_stats);
    }

    /// The engine's time by phase, cumulative over every prompt so far.
    pub fn set_step_times(&mut self, times: &StepTimes) {
        self.times = times.clone();
    }

    pub fn tokens_per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            self.generated_tokens as f64 / self.seconds
        } else {
            0.0
        }
    }

    /// One prompt's result as a JSON line.
    pub fn line(&self, prompt: &str, text: &str, out: &GenerateOutput) -> Value {
        json!({
            "prompt": prompt,
            "text": text,
            "prompt_tokens": out.prompt_tokens,
            "generated_tokens": out.token_ids.len(),
            "finish_reason": format!("{:?}", out.finish_reason).to_lowercase(),
            "seconds": out.prefill_seconds + out.decode_seconds,
            "mean_acceptance_length": out.spec_stats.mean_acceptance_length(),
        })
    }

    pub fn json(&self) -> Value {
        json!({
            "num_prompts": self.prompts,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "seconds": self.seconds,
            "tokens_per_second": self.tokens_per_second(),
            "mean_acceptance_length": self.spec.mean_acceptance_length(),
            "per_position_acceptance": self.spec.per_position_acceptance(),
            "num_drafts": self.spec.num_drafts,
            "num_draft_tokens": self.spec.num_draft_tokens,
            "num_accepted_tokens": self.spec.num_accepted_tokens,
            "step_times": self.times,
        })
    }

    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} prompt(s), {} prompt tokens, {} generated in {:.2} s: {:.1} tokens/s",
            self.prompts,
            self.prompt_tokens,
            self.generated_tokens,
            self.seconds,
            self.tokens_per_second()
        );
        if self.spec.num_drafts > 0 {
            s += &format!(
                "; mean acceptance length {:.2}, draft acceptance rate {:.3}",
                self.spec.mean_acceptance_length(),
                self.spec.draft_acceptance_rate()
            );
        }
        let t = &self.times;
        if t.steps > 0 {
            let ms = |seconds: f64| 1e3 * seconds / t.steps as f64;
            s += &format!(
                "; per step ({}): target {:.2} ms, drafter {:.2} ms, verify {:.2} ms, other {:.2} ms",
                t.steps,
                ms(t.target_seconds),
                ms(t.drafter_seconds),
                ms(t.verify_seconds),
                ms(t.other_seconds)
            );
        }
        s
    }
}

/// The `prompt` field of every line of a JSONL file.
pub fn read_prompts(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut prompts = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).with_context(|| format!("{}:{}: not JSON", path.display(), i + 1))?;
        match v["prompt"].as_str() {
            Some(p) if !p.is_empty() => prompts.push(p.to_owned()),
            _ => bail!(
                "{}:{}: expected a non-empty string field \"prompt\"",
                path.display(),
                i + 1
            ),
        }
    }
    if prompts.is_empty() {
        bail!("{} has no prompts", path.display());
    }
    Ok(prompts)
}
