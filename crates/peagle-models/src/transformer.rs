//! A decoder-only causal LM (embedding, pre-norm blocks, final norm, LM head) over the paged
//! KV cache, with capture of the hidden states a drafter reads.

use crate::batch::ForwardBatch;
use crate::checkpoint::Checkpoint;
use crate::config::TextConfig;
use crate::error::LoadError;
use crate::kv_cache::KvCache;
use crate::layers::{AttentionContext, AttentionOptions, DecoderLayer, Embedding, Linear, RmsNorm, RotaryEmbedding};
use candle_core::{bail, DType, Device, Result, Tensor};

/// The sizes other components need to know (cache layout, drafter input width).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelDims {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

pub struct CausalLm {
    dims: ModelDims,
    embed: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
    rope: RotaryEmbedding,
    capture_layers: Vec<usize>,
    device: Device,
}

/// What one forward returns.
pub struct ForwardOutput {
    /// [logit rows, vocab], f32.
    pub logits: Tensor,
    /// [capture rows, capture layers * hidden]: the residual stream entering each capture
    /// layer, concatenated in `capture_layers` order. `None` when no row was captured.
    pub aux_hidden: Option<Tensor>,
    /// [capture rows, hidden]: the output of the last layer before the final norm.
    pub final_hidden: Option<Tensor>,
}

impl CausalLm {
    pub(crate) fn load(
        cfg: &TextConfig,
        ckpt: &Checkpoint,
        opts: AttentionOptions,
    ) -> std::result::Result<Self, LoadError> {
        let dims = ModelDims {
            vocab_size: cfg.vocab_size,
            hidden_size: cfg.hidden_size,
            num_layers: cfg.num_hidden_layers,
            num_heads: cfg.num_attention_heads,
            num_kv_heads: cfg.num_kv_heads(),
            head_dim: cfg.head_dim(),
        };
        let table = ckpt.matrix("model.embed_tokens.weight", &[dims.vocab_size, dims.hidden_size])?;
        let lm_head = if cfg.tie_word_embeddings {
            Linear::new(table.clone(), None).map_err(|source| LoadError::Candle {
                context: "packing the tied lm_head".into(),
                source,
            })?
        } else {
            Linear::load(ckpt, "lm_head", dims.vocab_size, dims.hidden_size, false)?
        };
        let layers = (0..dims.num_layers)
            .map(|i| DecoderLayer::load(ckpt, &format!("model.layers.{i}"), cfg, opts))
            .collect::<std::result::Result<_, _>>()?;
        Ok(Self {
            capture_layers: default_capture_layers(dims.num_layers),
            rope: RotaryEmbedding::new(dims.head_dim, &cfg.rope()?),
            embed: Embedding::new(table),
            layers,
            norm: RmsNorm::load(ckpt, "model.norm", dims.hidden_size, cfg.rms_norm_eps)?,
            lm_head,
            device: ckpt.device().clone(),
            dims,
        })
    }

    pub fn dims(&self) -> &ModelDims {
        &self.dims
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn embedding(&self) -> &Embedding {
        &self.embed
    }

    /// The LM head's weight, [vocab, hidden] (the embedding table's values when tied).
    pub fn lm_head_weight(&self) -> Result<Tensor> {
        self.lm_head.weight()
    }

    /// Next-token logits from final pre-norm states [rows, hidden], as `forward` computes them.
    pub fn logits_from_final(&self, final_hidden: &Tensor) -> Result<Tensor> {
        self.lm_head.forward(&self.norm.forward(final_hidden)?)
    }

    pub fn capture_layers(&self) -> &[usize] {
        &self.capture_layers
    }

    /// Chooses which layers' inputs are captured (a drafter's `eagle_aux_hidden_state_layer_ids`).
    pub fn set_capture_layers(&mut self, layers: Vec<usize>) -> Result<()> {
        if let Some(bad) = layers.iter().find(|l| **l >= self.dims.num_layers) {
            bail!(
                "capture layer {bad} does not exist: the model has {} layers",
                self.dims.num_layers
            );
        }
        self.capture_layers = layers;
        Ok(())
    }

    pub fn forward(&self, batch: &ForwardBatch, kv: &KvCache) -> Result<ForwardOutput> {
        let rows = batch.token_ids.len();
        if rows == 0 {
            bail!("empty batch");
        }
        if let Some(bad) = batch.token_ids.iter().find(|t| **t as usize >= self.dims.vocab_size) {
            bail!("token id {bad} is outside the vocabulary of {}", self.dims.vocab_size);
        }
        if kv.num_layers() != self.layers.len() || kv.block_size() != batch.attn.block_size {
            bail!("KV cache does not match the model or the batch's block size");
        }
        let ids = Tensor::from_slice(&batch.token_ids, rows, &self.device)?;
        let rope = self.rope.tables(&batch.positions, &self.device)?;
        let capture = RowSelection::new(&batch.capture_rows, rows, &self.device)?;
        let mut captured: Vec<Option<Tensor>> = vec![None; self.layers.len()];
        let mut x = self.embed.forward(&ids)?;
        for (i, layer) in self.layers.iter().enumerate() {
            if self.capture_layers.contains(&i) {
                captured[i] = capture.apply(&x)?;
            }
            let ctx = AttentionContext::Paged {
                kv: kv.layer(i),
                meta: &batch.attn,
            };
            x = layer.forward(&x, &rope, &ctx)?;
        }
        let (aux_hidden, final_hidden) = match capture.apply(&x)? {
            None => (None, None),
            Some(last) => {
                let aux: Vec<Tensor> = self
                    .capture_layers
                    .iter()
                    .map(|l| captured[*l].clone().expect("captured above"))
                    .collect();
                (Some(Tensor::cat(&aux, 1)?), Some(last))
            }
        };
        let logits = match RowSelection::new(&batch.logit_rows, rows, &self.device)?.apply(&x)? {
            None => Tensor::zeros((0, self.dims.vocab_size), DType::F32, &self.device)?,
            Some(selected) => self.logits_from_final(&selected)?,
        };
        Ok(ForwardOutput {
            logits,
            aux_hidden,
            final_hidden,
        })
    }
}

/// EAGLE-3's choice for our own drafters: an early, a middle and the last layer.
pub fn default_capture_layers(num_layers: usize) -> Vec<usize> {
    let last = num_layers.saturating_sub(1);
    vec![2.min(last), num_layers / 2, last]
}

/// The rows of a batch's activations that an output keeps (their indices ascend).
enum RowSelection {
    Nothing,
    /// Every row: the activation itself serves, with no copy (every decode step's logits, and
    /// the captured states of a batch whose sequences all feed a drafter).
    Everything,
    Rows(Tensor),
}

impl RowSelection {
    fn new(rows: &[u32], total: usize, device: &Device) -> Result<Self> {
        Ok(match rows.len() {
            0 => Self::Nothing,
            n if n == total => Self::Everything,
            n => Self::Rows(Tensor::from_slice(rows, n, device)?),
        })
    }

    fn apply(&self, x: &Tensor) -> Result<Option<Tensor>> {
        match self {
            Self::Nothing => Ok(None),
            Self::Everything => Ok(Some(x.clone())),
            Self::Rows(idx) => x.index_select(idx, 0).map(Some),
        }
    }
}
