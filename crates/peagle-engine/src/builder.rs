//! Assembling an engine from model directories: the one place that loads the target and the
//! drafter, settles the defaults (drafts per step, maximum length, parallel drafting for
//! P-EAGLE checkpoints, sampling defaults), sizes the KV caches and checks that the parts fit.
//! The server, peagle-generate, the trainer's capture and the benches all build through it.

use crate::block_manager::BlockManager;
use crate::drafting::Drafting;
use crate::engine::Engine;
use crate::error::GenerateError;
use crate::kv_budget::{self, step_activations, DEFAULT_GPU_MEMORY_UTILIZATION};
use crate::model_runner::ModelRunner;
use crate::prefix_cache::PrefixCache;
use crate::proposer::{DrafterPasses, Eagle3Proposer, NoProposer, PEagleProposer, Proposer};
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::speculation_policy::draft_counts;
use candle_core::DType;
use peagle_kernels::on_pool;
use peagle_models::{
    ops, CudaGraphs, Drafter, DrafterGraphs, GenerationConfig, GraphLimits, KvCache, KvCacheDtype, LoadOptions,
    ModelDims, PassRows, SamplingDefaults, TargetModel, TextConfig, DEFAULT_GRAPH_MAX_ROWS,
};
use std::path::PathBuf;

/// Drafts per step when neither the request nor the drafter's config says.
pub const DEFAULT_K: usize = 3;

/// The maximum length when neither the options nor the model's config give one.
pub const FALLBACK_MAX_MODEL_LEN: usize = 4096;

/// KV cache sizing on the CPU when no block count is given: room for every sequence the
/// scheduler may run at full length, but at most this many bytes (target and drafter caches
/// together). A GPU's budget is what its memory leaves (`kv_budget`).
const DEFAULT_KV_BUDGET_BYTES: usize = 4 << 30;

/// A draft model and how to use it.
#[derive(Debug, Clone)]
pub struct DraftModel {
    pub dir: PathBuf,
    /// Drafts per step; default: the checkpoint's published value, else `DEFAULT_K`.
    pub k: Option<usize>,
    /// Draft all K tokens in one P-EAGLE pass. P-EAGLE checkpoints always do.
    pub parallel: bool,
}

/// Where requests' sampling defaults come from (vLLM's generation config choice).
#[derive(Debug, Clone, Default, PartialEq)]
pub enum GenerationDefaults {
    /// The model's generation_config.json, as its authors recommend.
    #[default]
    Auto,
    /// OpenAI's neutral defaults.
    Neutral,
    /// The generation_config.json of another directory.
    Dir(PathBuf),
}

#[derive(Debug, Clone)]
pub struct EngineBuilder {
    pub model_dir: PathBuf,
    pub draft: Option<DraftModel>,
    /// The device and dtype, chosen once.
    pub load: LoadOptions,
    /// Default: the model's max_position_embeddings, else `FALLBACK_MAX_MODEL_LEN`.
    pub max_model_len: Option<usize>,
    /// Default: room for every sequence the scheduler may run at full length, within
    /// `DEFAULT_KV_BUDGET_BYTES` on the CPU or what `gpu_memory_utilization` leaves on a GPU.
    pub kv_cache_blocks: Option<usize>,
    /// The share of a GPU's memory the engine may fill, the KV cache included (vLLM's).
    pub gpu_memory_utilization: f64,
    pub block_size: usize,
    pub kv_cache_dtype: KvCacheDtype,
    pub scheduler: SchedulerConfig,
    pub generation_defaults: GenerationDefaults,
    /// Run decode and verification steps, and the drafter's passes, by CUDA graphs (a GPU only).
    pub cuda_graphs: bool,
}

/// A built engine and the sampling defaults it is served with.
pub struct BuiltEngine {
    pub engine: Engine,
    /// What requests that leave sampling fields out get.
    pub sampling_defaults: SamplingDefaults,
}

impl EngineBuilder {
    pub fn new(model_dir: PathBuf) -> Self {
        Self {
            model_dir,
            draft: None,
            load: LoadOptions::default(),
            max_model_len: None,
            kv_cache_blocks: None,
            gpu_memory_utilization: DEFAULT_GPU_MEMORY_UTILIZATION,
            block_size: 16,
            kv_cache_dtype: KvCacheDtype::Auto,
            scheduler: SchedulerConfig::default(),
            generation_defaults: GenerationDefaults::Auto,
            cuda_graphs: false,
        }
    }

    pub fn build(&self) -> Result<BuiltEngine, GenerateError> {
        self.check_sizes()?;
        ops::check_inference_device(&self.load.device).map_err(|e| GenerateError::Config(e.to_string()))?;
        if self.cuda_graphs && !self.load.device.is_cuda() {
            return Err(GenerateError::Config(
                "CUDA graphs need a GPU, and this engine runs on the CPU".into(),
            ));
        }
        let chosen_defaults = self.chosen_sampling_defaults()?;
        tracing::info!(model = %self.model_dir.display(), device = ?self.load.device, "loading the model");
        let mut loaded = peagle_models::load_target(&self.model_dir, self.load.clone())?;
        let max_model_len = self.max_model_len(&loaded.config)?;
        let mut drafter = match &self.draft {
            None => None,
            Some(d) => Some(self.load_drafter(d, loaded.model.as_ref())?),
        };
        let k = drafter.as_ref().map_or(0, |(_, k, _)| *k);
        let needed = blocks_per_sequence(max_model_len, k, self.block_size);
        if !self.load.device.is_cpu() {
            // Every position a sequence's rows can take has a slot of its own: on a GPU the
            // rotary tables of them all are made once and read by position, not uploaded every
            // forward. Made before the KV cache's budget is measured, which they then come out of.
            let positions = needed * self.block_size;
            loaded.model.place_rotary_table(positions)?;
            if let Some((d, ..)) = drafter.as_mut() {
                d.place_rotary_table(positions)?;
            }
        }
        let dtype = self.kv_cache_dtype.resolve(&loaded.config);
        let gpu_budget = match self.kv_cache_blocks {
            Some(_) => None,
            None => self.gpu_kv_bytes(loaded.model.as_ref(), max_model_len, dtype, k)?,
        };
        let num_blocks = self.num_blocks(loaded.model.dims(), drafter.as_ref(), max_model_len, dtype, gpu_budget);
        if num_blocks < needed {
            // vLLM refuses to start here too: a sequence that outgrows the whole cache could
            // only preempt itself and start over, forever.
            let raise = match gpu_budget {
                Some(_) => "the GPU memory utilization",
                None => "the block count",
            };
            return Err(GenerateError::Config(format!(
                "a KV cache of {num_blocks} blocks of {} tokens cannot hold one sequence of the maximum \
                 length ({max_model_len} tokens, {k} drafts): that takes {needed} blocks; raise {raise} \
                 or lower the maximum length",
                self.block_size
            )));
        }
        let device = loaded.model.device().clone();
        let cuda_graphs = self.cuda_graphs && !loaded.model.reads_back();
        if self.cuda_graphs && !cuda_graphs {
            tracing::warn!("running without CUDA graphs: this model routes its experts on the host");
        }
        let draft_counts = draft_counts(k, self.scheduler.adaptive_k);
        let limits = GraphLimits {
            table_width: needed,
            max_sequences: self.scheduler.max_num_seqs,
            max_rows_each: k + 1,
            max_rows: DEFAULT_GRAPH_MAX_ROWS,
        };
        let mut proposer: Box<dyn Proposer> = match drafter {
            None => Box::new(NoProposer),
            Some((d, k, parallel)) => {
                let kv = KvCache::new(d.dims(), num_blocks, self.block_size, dtype, &device)?;
                // A sequence's rows in a pass: its slots, up to a verified window's k + 1, and
                // P-EAGLE's k - 1 mask slots; its logit rows: P-EAGLE's k drafts, EAGLE-3's 1.
                let pass_limits = GraphLimits {
                    max_rows_each: if parallel { 2 * k } else { k + 1 },
                    ..limits
                };
                let kinds = drafter_passes(parallel, k, &draft_counts);
                let graphs = cuda_graphs
                    .then(|| DrafterGraphs::new(&d, pass_limits, kinds))
                    .transpose()
                    .map_err(|e| GenerateError::Config(e.to_string()))?;
                let passes = DrafterPasses::new(d, kv, graphs);
                if parallel {
                    Box::new(PEagleProposer::new(passes, k)?)
                } else {
                    Box::new(Eagle3Proposer::new(passes, k))
                }
            }
        };
        let mut target = loaded.model;
        if k > 0 {
            target.set_capture_layers(proposer.aux_layer_ids().to_vec())?;
        }
        let kv = KvCache::new(target.dims(), num_blocks, self.block_size, dtype, &device)?;
        let mut graphs = cuda_graphs
            .then(|| CudaGraphs::new(&device, limits))
            .transpose()
            .map_err(|e| GenerateError::Config(e.to_string()))?;
        if let Some(graphs) = &mut graphs {
            let started = std::time::Instant::now();
            let before = peagle_kernels::device_memory(&device)?;
            let budget = self.scheduler.step_rows(k + 1);
            // On rayon's pool, whose threads the steps run on and which outlives the graphs:
            // candle keeps what a capture uploads per thread.
            let captured = on_pool(|| -> Result<usize, GenerateError> {
                let windows: Vec<usize> = draft_counts.iter().map(|c| c + 1).collect();
                let target_graphs = graphs.capture_at_startup(target.as_ref(), &kv, budget, k > 0, &windows)?;
                Ok(target_graphs + proposer.capture_graphs()?)
            })?;
            let after = peagle_kernels::device_memory(&device)?;
            let (held, warning) = match before.zip(after) {
                Some((before, after)) => kv_budget::graph_memory(before, after, self.gpu_memory_utilization),
                None => (0, None),
            };
            tracing::info!(
                captured,
                seconds = started.elapsed().as_secs_f64(),
                bytes = held,
                "captured CUDA graphs"
            );
            if let Some(warning) = warning {
                tracing::warn!("{warning}");
            }
        }
        tracing::info!(
            model = %self.model_dir.display(),
            drafter = ?self.draft.as_ref().map(|d| d.dir.display().to_string()),
            k,
            max_model_len,
            num_blocks,
            kv_cache_dtype = ?dtype,
            cuda_graphs,
            "built the engine"
        );
        // Cached blocks hold this target's KV and this drafter's, in this dtype.
        let identity = format!(
            "{} {:?} {dtype:?}",
            self.model_dir.display(),
            self.draft.as_ref().map(|d| &d.dir)
        );
        let cache = PrefixCache::new(num_blocks, self.scheduler.prefix_caching, &identity);
        let scheduler = Scheduler::new(
            self.scheduler.clone(),
            BlockManager::with_cache(num_blocks, self.block_size, cache),
            k,
            proposer.lookahead(),
        );
        let engine = Engine::new(
            scheduler,
            ModelRunner::new(target, kv, graphs),
            Drafting::new(proposer, self.scheduler.prefix_caching),
            loaded.generation.eos_token_ids,
            max_model_len,
        );
        Ok(BuiltEngine {
            engine,
            sampling_defaults: chosen_defaults.unwrap_or(loaded.generation.sampling),
        })
    }

    fn check_sizes(&self) -> Result<(), GenerateError> {
        let sizes = [
            ("the KV cache block size", self.block_size),
            ("the most sequences per step", self.scheduler.max_num_seqs),
            ("the most tokens per step", self.scheduler.max_num_batched_tokens),
            // Every request waits for admission, if only for a step: a limit of 0 refuses all.
            ("the waiting-request limit", self.scheduler.max_waiting),
        ];
        if let Some((what, _)) = sizes.iter().find(|(_, n)| *n == 0) {
            return Err(GenerateError::Config(format!("{what} must be at least 1")));
        }
        // Before the model loads; a drafter's own count is checked as it loads.
        if let Some(k) = self.draft.as_ref().and_then(|d| d.k) {
            check_drafts(k)?;
        }
        kv_budget::check_utilization(self.gpu_memory_utilization)
    }

    /// The sampling defaults chosen instead of the model's own (None: the model's, read as it
    /// loads), checked before the model loads.
    fn chosen_sampling_defaults(&self) -> Result<Option<SamplingDefaults>, GenerateError> {
        match &self.generation_defaults {
            GenerationDefaults::Auto => Ok(None),
            GenerationDefaults::Neutral => Ok(Some(SamplingDefaults::default())),
            GenerationDefaults::Dir(dir) if !dir.join("generation_config.json").is_file() => Err(
                GenerateError::Config(format!("{}: no generation_config.json there", dir.display())),
            ),
            GenerationDefaults::Dir(dir) => Ok(Some(GenerationConfig::load(dir)?.sampling)),
        }
    }

    fn max_model_len(&self, config: &TextConfig) -> Result<usize, GenerateError> {
        let native = config.max_position_embeddings;
        let len = match (self.max_model_len, native) {
            (Some(asked), Some(native)) if asked > native => {
                return Err(GenerateError::Config(format!(
                    "a maximum length of {asked} is more than the model's max_position_embeddings ({native})"
                )))
            }
            (Some(asked), _) => asked,
            (None, native) => native.unwrap_or(FALLBACK_MAX_MODEL_LEN),
        };
        if len < 2 {
            return Err(GenerateError::Config(format!(
                "the maximum length must be at least 2, got {len}"
            )));
        }
        Ok(len)
    }

    /// The drafter with its drafts per step and whether it drafts in parallel.
    fn load_drafter(&self, d: &DraftModel, target: &dyn TargetModel) -> Result<(Drafter, usize, bool), GenerateError> {
        let drafter = Drafter::load(&d.dir, target, self.load.clone())?;
        let k = d.k.or(drafter.config().num_speculative_tokens).unwrap_or(DEFAULT_K);
        check_drafts(k)?;
        let parallel = d.parallel || drafter.is_parallel();
        Ok((drafter, k, parallel))
    }

    /// The bytes a GPU leaves the KV caches once the weights are loaded, drafts being `k` a
    /// step; None on the CPU.
    fn gpu_kv_bytes(
        &self,
        target: &dyn TargetModel,
        max_model_len: usize,
        dtype: DType,
        k: usize,
    ) -> Result<Option<usize>, GenerateError> {
        if target.device().is_cpu() {
            return Ok(None);
        }
        let max_tokens = self.scheduler.step_rows(k + 1);
        let logit_rows = self.scheduler.max_num_seqs * (k + 1);
        tracing::info!(
            rows = max_tokens,
            logit_rows,
            "running the largest step once to measure its activations"
        );
        let activations = step_activations(
            target,
            max_tokens,
            logit_rows,
            max_model_len,
            self.block_size,
            dtype,
            k > 0,
        )?;
        // Read after the step, so that what the driver took for it (its modules, say) counts
        // as in use; its own allocations are back in the driver's hands by then.
        let Some(memory) = peagle_kernels::device_memory(target.device())? else {
            return Ok(None);
        };
        let bytes = kv_budget::gpu_kv_bytes(memory, activations.unwrap_or(0), self.gpu_memory_utilization)?;
        tracing::info!(
            total_gib = memory.total as f64 / (1u64 << 30) as f64,
            free_gib = memory.free as f64 / (1u64 << 30) as f64,
            activations_gib = activations.unwrap_or(0) as f64 / (1u64 << 30) as f64,
            kv_gib = bytes as f64 / (1u64 << 30) as f64,
            "sized the KV cache from the GPU's memory"
        );
        Ok(Some(bytes))
    }

    fn num_blocks(
        &self,
        target: &ModelDims,
        drafter: Option<&(Drafter, usize, bool)>,
        max_model_len: usize,
        dtype: DType,
        gpu_budget: Option<usize>,
    ) -> usize {
        if let Some(n) = self.kv_cache_blocks {
            return n;
        }
        let k = drafter.map_or(0, |(_, k, _)| *k);
        let per_sequence = blocks_per_sequence(max_model_len, k, self.block_size);
        let block_bytes = |d: &ModelDims| KvCache::bytes_per_block(d, self.block_size, dtype);
        let bytes_per_block = (block_bytes(target) + drafter.map_or(0, |(d, _, _)| block_bytes(d.dims()))).max(1);
        let wanted = per_sequence * self.scheduler.max_num_seqs;
        match gpu_budget {
            // What the GPU leaves is all there is: fewer blocks than a sequence needs are
            // refused by the caller.
            Some(bytes) => wanted.min(bytes / bytes_per_block),
            None => wanted.min(DEFAULT_KV_BUDGET_BYTES / bytes_per_block).max(per_sequence),
        }
    }
}

/// The drafter passes a proposer of at most `max_k` drafts runs between decode steps when a
/// step drafts any of `draft_counts`. A sequence's slots are the tokens its last window
/// committed, 1 to `max_k + 1`. P-EAGLE adds k - 1 mask slots and keeps k logit rows, and a
/// sequence that finishes feeds its slots alone, keeping none (a pass of finishing sequences
/// only keeps a bucket of one); EAGLE-3's first pass keeps one logit row of the slots and each
/// later pass has one row. Catching the drafter up on a backlog is left to a capture on first
/// use: its rows are as many as the steps it was suspended for.
fn drafter_passes(parallel: bool, max_k: usize, draft_counts: &[usize]) -> Vec<PassRows> {
    let slots = PassRows {
        rows_each: 1..=max_k + 1,
        logits_each: 1,
    };
    match parallel {
        true => draft_counts
            .iter()
            .filter(|&&k| k > 0)
            .map(|&k| PassRows {
                rows_each: k..=max_k + k,
                logits_each: k,
            })
            .chain([slots])
            .collect(),
        false => vec![slots],
    }
}

/// The most drafts a step: well past what drafters are trained to fill (P-EAGLE's K up to
/// about 16), and far below what would overflow a sequence's sizes.
pub const MAX_DRAFTS: usize = 64;

/// Refuses a count of drafts per step outside 1 ..= MAX_DRAFTS.
fn check_drafts(k: usize) -> Result<(), GenerateError> {
    if !(1..=MAX_DRAFTS).contains(&k) {
        return Err(GenerateError::Config(format!(
            "a draft model drafts 1 to {MAX_DRAFTS} tokens a step, not {k}"
        )));
    }
    Ok(())
}

/// Blocks one sequence can come to need: `max_model_len` tokens, then a verification window
/// of `k` drafts and the drafter's look-ahead past it.
fn blocks_per_sequence(max_model_len: usize, k: usize, block_size: usize) -> usize {
    (max_model_len + 2 * k).div_ceil(block_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every pass a proposer runs between decode steps is of a kind captured at start-up: a
    /// sequence whose last window verified k' drafts and accepted a of them has a + 1 slots,
    /// P-EAGLE drafting k adds k - 1 mask slots and keeps k logit rows, and a finishing one
    /// feeds its slots alone (a pass of only those keeps a bucket of one logit row).
    #[test]
    fn drafter_passes_cover_every_window_the_policy_can_follow() {
        for (max_k, adaptive) in [(7, true), (7, false), (3, true), (1, true)] {
            let counts = draft_counts(max_k, adaptive);
            let peagle = drafter_passes(true, max_k, &counts);
            let eagle3 = drafter_passes(false, max_k, &counts);
            let covered = |kinds: &[PassRows], rows: usize, logits: usize| {
                kinds
                    .iter()
                    .any(|p| p.rows_each.contains(&rows) && p.logits_each == logits)
            };
            for &verified in counts.iter().filter(|&&k| k > 0) {
                for slots in 1..=verified + 1 {
                    assert!(covered(&eagle3, slots, 1), "EAGLE-3, {slots} slots");
                    assert!(covered(&peagle, slots, 1), "P-EAGLE K = {max_k}, finishing");
                    for &k in counts.iter().filter(|&&k| k > 0) {
                        assert!(covered(&peagle, slots + k - 1, k), "P-EAGLE K = {max_k}, k = {k}");
                    }
                }
            }
        }
        let kinds = drafter_passes(true, 7, &draft_counts(7, true));
        let rows: Vec<_> = kinds.iter().map(|p| (p.rows_each.clone(), p.logits_each)).collect();
        assert_eq!(rows, [(1..=8, 1), (4..=11, 4), (7..=14, 7), (1..=8, 1)]);
    }
}
