//! The memory a GPU leaves the KV caches, as vLLM's `--gpu-memory-utilization` sizes them:
//! that share of the device's total, less what the loaded weights and the driver hold, less
//! the peak of the largest step's activations, measured by running one.

use crate::error::GenerateError;
use candle_core::DType;
use peagle_kernels::{peak_allocated, DeviceMemory};
use peagle_models::{BatchBuilder, KvCache, Rows, TargetModel};

const GIB: f64 = (1u64 << 30) as f64;

/// vLLM's default: a tenth of the GPU is left to what the engine does not count (CUDA graphs,
/// the allocator's fragments, other processes).
pub const DEFAULT_GPU_MEMORY_UTILIZATION: f64 = 0.9;

/// The bytes the KV caches may take on a GPU with `memory` (its free bytes read once the
/// weights are loaded), whose steps' activations peak at `activations` bytes.
pub fn gpu_kv_bytes(memory: DeviceMemory, activations: usize, utilization: f64) -> Result<usize, GenerateError> {
    check_utilization(utilization)?;
    let allowed = utilization * memory.total as f64;
    let in_use = memory.total.saturating_sub(memory.free) as f64;
    let left = allowed - in_use - activations as f64;
    if left < 1.0 {
        return Err(GenerateError::Config(format!(
            "no GPU memory is left for the KV cache: {utilization} of {:.1} GiB allows {:.1} GiB, the weights \
             and the driver hold {:.1} GiB and a step's activations {:.1} GiB; raise the GPU memory \
             utilization or lower the most tokens per step",
            memory.total as f64 / GIB,
            allowed / GIB,
            in_use / GIB,
            activations as f64 / GIB
        )));
    }
    Ok(left as usize)
}

/// The bytes CUDA graphs hold, from the device's memory `before` and `after` their capture,
/// and a warning where that is more than the share `utilization` leaves. The KV cache is sized
/// before the graphs, which live in that share, as vLLM's do: past it they hold memory the
/// steps' activations were counted on.
pub fn graph_memory(before: DeviceMemory, after: DeviceMemory, utilization: f64) -> (usize, Option<String>) {
    let held = before.free.saturating_sub(after.free);
    let left = (1.0 - utilization) * after.total as f64;
    let warning = (held as f64 > left).then(|| {
        format!(
            "CUDA graphs hold {:.2} GiB, more than the {:.2} GiB the GPU memory utilization leaves: lower it, \
             or run without CUDA graphs",
            held as f64 / GIB,
            left / GIB
        )
    });
    (held, warning)
}

/// Checks a share of a GPU's memory: above 0 and at most 1.
pub fn check_utilization(utilization: f64) -> Result<(), GenerateError> {
    if utilization > 0.0 && utilization <= 1.0 {
        return Ok(());
    }
    Err(GenerateError::Config(format!(
        "the GPU memory utilization must be above 0 and at most 1, not {utilization}"
    )))
}

/// The largest step the scheduler makes, run once over a cache of its own: its most tokens
/// (`max_tokens`) as prefill chunks from position 0 (sequences of at most `max_model_len`),
/// keeping the logits of `logit_rows` of them (a full step of verification windows keeps
/// every row's) and, for a drafter, every row's captured states. The logits count once more
/// for what choosing from them on the device copies, and the activations' peak twice with a
/// drafter, whose pass then runs over as many rows while the target's states are held. None
/// where the device keeps no such count (the CPU).
pub fn step_activations(
    target: &dyn TargetModel,
    max_tokens: usize,
    logit_rows: usize,
    max_model_len: usize,
    block_size: usize,
    cache_dtype: DType,
    drafter: bool,
) -> Result<Option<usize>, GenerateError> {
    let capture = if drafter { Rows::All } else { Rows::None };
    let mut batch = BatchBuilder::new(block_size);
    let mut blocks = 0;
    let (mut left, mut logits_left) = (max_tokens, logit_rows.min(max_tokens));
    while left > 0 {
        let len = left.min(max_model_len.max(1));
        let table: Vec<u32> = (blocks..blocks + len.div_ceil(block_size)).map(|b| b as u32).collect();
        blocks += table.len();
        let kept = logits_left.min(len);
        batch.add(&vec![0; len], 0, &table, Rows::Tail(kept), capture)?;
        (left, logits_left) = (left - len, logits_left - kept);
    }
    let batch = batch.build();
    let device = target.device();
    let kv = KvCache::new(target.dims(), blocks, block_size, cache_dtype, device)?;
    let (_, peak) = peak_allocated(device, || target.forward(&batch, &kv).map(drop))?;
    if peak == Some(0) {
        // A forward allocates its activations: none counted means they came from elsewhere
        // than the pool (a GPU without stream-ordered allocation).
        return Err(GenerateError::Config(
            "this GPU's allocations bypass its memory pool, so a step's activations cannot be measured to \
             size the KV cache: give its block count"
                .into(),
        ));
    }
    let choosing = logit_rows.min(max_tokens) * target.dims().vocab_size * std::mem::size_of::<f32>();
    Ok(peak.map(|peak| if drafter { 2 * peak } else { peak } + choosing))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: usize = 1 << 30;

    #[test]
    fn the_kv_cache_gets_the_share_left_after_weights_and_activations() {
        let memory = DeviceMemory {
            free: 60 * GB,
            total: 80 * GB,
        };
        // 0.9 of 80 is 72; 20 in use and 4 of activations leave 48.
        assert_eq!(gpu_kv_bytes(memory, 4 * GB, 0.9).unwrap(), 48 * GB);
        assert_eq!(gpu_kv_bytes(memory, 0, 1.0).unwrap(), 60 * GB);
    }

    #[test]
    fn a_gpu_with_nothing_left_or_a_share_out_of_range_is_refused() {
        let memory = DeviceMemory {
            free: 10 * GB,
            total: 80 * GB,
        };
        let err = gpu_kv_bytes(memory, 2 * GB, 0.9).unwrap_err().to_string();
        assert!(err.contains("no GPU memory is left for the KV cache"), "{err}");
        assert!(
            err.contains("hold 70.0 GiB") && err.contains("activations 2.0 GiB"),
            "{err}"
        );
        for bad in [0.0, -0.5, 1.5, f64::NAN] {
            let err = gpu_kv_bytes(memory, 0, bad).unwrap_err().to_string();
            assert!(err.contains("above 0 and at most 1"), "{bad}: {err}");
        }
    }

    #[test]
    fn graphs_past_the_share_the_utilization_leaves_are_warned_of() {
        let memory = |free| DeviceMemory { free, total: 80 * GB };
        // 0.9 of 80 leaves 8.
        assert_eq!(graph_memory(memory(20 * GB), memory(17 * GB), 0.9), (3 * GB, None));
        let (held, warning) = graph_memory(memory(20 * GB), memory(10 * GB), 0.9);
        assert_eq!(held, 10 * GB);
        let warning = warning.expect("a warning");
        assert!(warning.contains("hold 10.00 GiB, more than the 8.00 GiB"), "{warning}");
        // Memory freed meanwhile counts as none held.
        assert_eq!(graph_memory(memory(20 * GB), memory(21 * GB), 1.0), (0, None));
    }

    /// On the CPU the step runs (its batch is well formed: chunks of at most the maximum
    /// length, each on blocks of its own) and there is no count to read.
    #[test]
    fn the_profiled_step_runs_on_the_cpu_and_counts_nothing() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-llama");
        let loaded = peagle_models::load_target(&dir, Default::default()).unwrap();
        let peak = step_activations(loaded.model.as_ref(), 40, 20, 16, 16, DType::F32, true).unwrap();
        assert_eq!(peak, None);
    }
}
