//! What the engine, the trainer and the benches know of a target model: one forward over a
//! flattened batch on the paged KV cache, with capture of the hidden states a drafter reads.
//! Each architecture implements it in its own file.

use crate::batch::ForwardBatch;
use crate::config::ModelDims;
use crate::forward_inputs::{ForwardInputs, RowSelection};
use crate::kv_cache::KvCache;
use crate::layers::Embedding;
use candle_core::{bail, DType, Device, Result, Tensor};

pub trait TargetModel: Send + Sync {
    fn dims(&self) -> &ModelDims;

    /// Where the weights are, and so where every input of `forward` must be.
    fn device(&self) -> &Device;

    /// The token embedding, which EAGLE drafters without their own share.
    fn embedding(&self) -> &Embedding;

    /// The LM head's weight, [vocab, hidden] (the embedding table's values when tied).
    fn lm_head_weight(&self) -> Result<Tensor>;

    /// Next-token logits [rows, vocab] from final pre-norm states [rows, hidden], as `forward`
    /// computes them: the final norm, then `logits_from_normed`.
    fn logits_from_final(&self, final_hidden: &Tensor) -> Result<Tensor>;

    /// Next-token logits [rows, vocab] from final states already normed [rows, hidden]: the LM
    /// head alone.
    fn logits_from_normed(&self, normed: &Tensor) -> Result<Tensor>;

    /// Layers whose inputs `forward` captures, in concatenation order.
    fn capture_layers(&self) -> &[usize];

    /// Chooses the captured layers (a drafter's `eagle_aux_hidden_state_layer_ids`).
    fn set_capture_layers(&mut self, layers: Vec<usize>) -> Result<()>;

    /// Makes the rotary table of positions 0 to `positions - 1` on the model's device, which
    /// forwards on a GPU then read by their rows' positions instead of uploading their own
    /// (`RotaryEmbedding::place_table`); a row past it is an error.
    fn place_rotary_table(&mut self, positions: usize) -> Result<()>;

    /// The batch's inputs on the model's device, once the batch is checked against the model
    /// and `kv`.
    fn inputs(&self, batch: &ForwardBatch, kv: &KvCache) -> Result<ForwardInputs>;

    /// Writes the batch's inputs into `target`'s, laid out alike (a CUDA graph's), once the
    /// batch is checked against the model and `kv`.
    fn upload_inputs(&self, batch: &ForwardBatch, kv: &KvCache, target: &ForwardInputs) -> Result<()>;

    /// Runs a batch's inputs, writing its keys and values to `kv`: the last layer's output
    /// after the final norm at its logit rows, and the captured states of its capture rows.
    /// Copies nothing from the host, and reads nothing back unless `reads_back` says so. A CUDA
    /// graph captures this much; the logits, by far the largest output, are made after it
    /// (`ForwardStates::logits`).
    fn forward_states(&self, inputs: &ForwardInputs, kv: &KvCache) -> Result<ForwardStates>;

    /// Runs a batch's inputs (`forward_states`), with the logits of its logit rows.
    fn forward_inputs(&self, inputs: &ForwardInputs, kv: &KvCache) -> Result<ForwardOutput> {
        self.forward_states(inputs, kv)?.logits(self)
    }

    /// Whether `forward_states` reads values back to the host part-way (experts routed on the
    /// host), which a CUDA graph cannot capture.
    fn reads_back(&self) -> bool;

    /// Runs the batch (`inputs`, then `forward_inputs`).
    fn forward(&self, batch: &ForwardBatch, kv: &KvCache) -> Result<ForwardOutput> {
        self.forward_inputs(&self.inputs(batch, kv)?, kv)
    }
}

/// What one forward returns.
pub struct ForwardOutput {
    /// [logit rows, vocab], f32.
    pub logits: Tensor,
    /// [capture rows, capture layers * hidden]: the residual stream entering each capture
    /// layer, concatenated in `capture_layers` order. `None` when no row was captured. From
    /// a forward by a CUDA graph, in the graph's outputs: read it before the shape's next replay.
    pub aux_hidden: Option<Tensor>,
    /// [capture rows, hidden]: the output of the last layer before the final norm, which
    /// training reads. `None` also from a forward by a CUDA graph (`CudaGraphs`).
    pub final_hidden: Option<Tensor>,
}

/// What one forward computes before the LM head.
pub struct ForwardStates {
    /// [logit rows, hidden]: the output of the last layer after the final norm, at the rows
    /// whose logits are wanted.
    pub logit_states: Tensor,
    /// As `ForwardOutput`'s.
    pub aux_hidden: Option<Tensor>,
    /// As `ForwardOutput`'s.
    pub final_hidden: Option<Tensor>,
}

impl ForwardStates {
    /// The output, with the logits `target`'s head makes of `logit_states`.
    pub fn logits(self, target: &(impl TargetModel + ?Sized)) -> Result<ForwardOutput> {
        let logits = match self.logit_states.dim(0)? {
            0 => peagle_kernels::no_rows(target.dims().vocab_size, DType::F32, self.logit_states.device())?,
            _ => target.logits_from_normed(&self.logit_states)?,
        };
        Ok(ForwardOutput {
            logits,
            aux_hidden: self.aux_hidden,
            final_hidden: self.final_hidden,
        })
    }

    /// The states of the batch's first `rows` rows, of a forward that kept all its rows'
    /// (a padded batch's own rows): views, not copies.
    pub fn first_rows(&self, rows: usize) -> Result<ForwardStates> {
        let first = |t: &Tensor| t.narrow(0, 0, rows);
        Ok(ForwardStates {
            logit_states: first(&self.logit_states)?,
            aux_hidden: self.aux_hidden.as_ref().map(first).transpose()?,
            final_hidden: self.final_hidden.as_ref().map(first).transpose()?,
        })
    }
}

/// EAGLE-3's choice for our own drafters: an early, a middle and the last layer.
pub fn default_capture_layers(num_layers: usize) -> Vec<usize> {
    let last = num_layers.saturating_sub(1);
    vec![2.min(last), num_layers / 2, last]
}

/// Checks a choice of capture layers against the model's depth.
pub fn check_capture_layers(layers: &[usize], num_layers: usize) -> Result<()> {
    if let Some(bad) = layers.iter().find(|l| **l >= num_layers) {
        bail!("capture layer {bad} does not exist: the model has {num_layers} layers");
    }
    Ok(())
}

/// Checks a batch against the model before any work: rows, token ids and the cache's shape.
pub fn check_batch(batch: &ForwardBatch, kv: &KvCache, dims: &ModelDims) -> Result<()> {
    if batch.token_ids.is_empty() {
        bail!("empty batch");
    }
    if let Some(bad) = batch.token_ids.iter().find(|t| **t as usize >= dims.vocab_size) {
        bail!("token id {bad} is outside the vocabulary of {}", dims.vocab_size);
    }
    if kv.num_layers() != dims.num_layers || kv.block_size() != batch.attn.block_size {
        bail!("KV cache does not match the model or the batch's block size");
    }
    Ok(())
}

/// Collects a forward's outputs: the capture rows of each capture layer's input as the layers
/// run, then the logits and final states from the last layer's output.
pub struct Capture<'a> {
    layers: &'a [usize],
    rows: &'a RowSelection,
    logit_rows: &'a RowSelection,
    captured: Vec<(usize, Tensor)>,
}

impl<'a> Capture<'a> {
    pub fn new(inputs: &'a ForwardInputs, layers: &'a [usize]) -> Self {
        Self {
            layers,
            rows: &inputs.capture_rows,
            logit_rows: &inputs.logit_rows,
            captured: Vec::with_capacity(layers.len()),
        }
    }

    /// Call with the residual stream `x` entering layer `layer`.
    pub fn layer_input(&mut self, layer: usize, x: &Tensor) -> Result<()> {
        if self.layers.contains(&layer) {
            if let Some(rows) = self.rows.apply(x)? {
                self.captured.push((layer, rows));
            }
        }
        Ok(())
    }

    /// The states, from the last layer's output `x` and its final norm `normed`.
    pub fn finish(self, x: &Tensor, normed: &Tensor) -> Result<ForwardStates> {
        let (aux_hidden, final_hidden) = match self.rows.apply(x)? {
            None => (None, None),
            Some(last) => {
                let aux = self
                    .layers
                    .iter()
                    .map(|l| {
                        let (_, t) = self.captured.iter().find(|(c, _)| c == l).expect("captured as run");
                        t.clone()
                    })
                    .collect::<Vec<_>>();
                (Some(Tensor::cat(&aux, 1)?), Some(last))
            }
        };
        Ok(ForwardStates {
            logit_states: match self.logit_rows.apply(normed)? {
                None => normed.narrow(0, 0, 0)?,
                Some(selected) => selected,
            },
            aux_hidden,
            final_hidden,
        })
    }
}
