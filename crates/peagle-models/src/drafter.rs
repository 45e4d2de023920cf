//! The EAGLE-3 / P-EAGLE drafter head (docs/ARCHITECTURE.md, "The drafter input layout").
//!
//! `fc` projects the concatenated captured target states to the drafter width; the first layer
//! fuses token embedding and that hidden input; plain decoder layers follow; `norm` and an
//! `lm_head` over the draft vocabulary give logits, mapped to target ids through `d2t`. The
//! drafter keeps its own KV layers on its sequence's block table.

use crate::batch::ForwardBatch;
use crate::checkpoint::{Checkpoint, LoadOptions};
use crate::config::ModelDims;
use crate::drafter_config::{DraftAlgorithm, DrafterConfig, TensorLayout};
use crate::drafter_graphs::PassHidden;
use crate::error::LoadError;
use crate::forward_inputs::ForwardInputs;
use crate::kv_cache::KvCache;
use crate::layers::{
    AttentionContext, AttentionOptions, DecoderLayer, EagleInputLayer, Embedding, Linear, RmsNorm, RopeTables,
    RotaryEmbedding,
};
use crate::target_model::TargetModel;
use candle_core::{bail, Device, Result, Tensor};
use peagle_kernels::Indices;
use std::path::Path;

/// The hidden input of a drafter pass.
pub enum DraftHidden {
    /// Captured target states, [rows, aux layers * target hidden]; goes through `fc`.
    Target(Tensor),
    /// Already at the drafter's width, [rows, drafter hidden]: `fc`'s output, or the drafter's
    /// own previous output (EAGLE-3 steps 2..K).
    Projected(Tensor),
}

pub struct DraftOutput {
    /// [logit rows, draft vocab].
    pub logits: Tensor,
    /// [logit rows, drafter hidden]: what autoregressive drafting feeds back.
    pub hidden: Tensor,
}

/// A pass's greedy drafts: the argmax of each logit row, found where the logits are and left
/// there: the next pass or the next verification window reads them on the device.
pub struct GreedyDrafts {
    /// u32 [kept rows], on the drafter's device: each kept row's draft id, in the drafter's
    /// vocabulary.
    kept_ids: Tensor,
    /// [kept rows, drafter hidden]: the kept rows' hidden outputs (`DraftOutput::hidden`).
    /// A pass by a CUDA graph leaves them and the ids in the graph's outputs, which its
    /// shape's next replay overwrites: read them before the drafter's next pass runs.
    hidden: Tensor,
    /// The kept row of each logit row, in order; None: logit row i is kept row i.
    rows: Option<Vec<u32>>,
    /// `rows` on the device, where the pass's inputs carried them (a graph's, which its
    /// shape's next replay overwrites, as it does the outputs).
    rows_uploaded: Option<Tensor>,
}

impl GreedyDrafts {
    /// Drafts whose logit row i is kept row `rows[i]` of `kept_ids` and `hidden`, or kept row i
    /// where `rows` is None.
    pub(crate) fn new(kept_ids: Tensor, hidden: Tensor, rows: Option<Vec<u32>>) -> Self {
        Self {
            kept_ids,
            hidden,
            rows,
            rows_uploaded: None,
        }
    }

    /// `new`'s drafts, with `rows` also on the device: `uploaded` holds them.
    pub(crate) fn with_rows_uploaded(kept_ids: Tensor, hidden: Tensor, rows: Vec<u32>, uploaded: Tensor) -> Self {
        Self {
            rows_uploaded: Some(uploaded),
            ..Self::new(kept_ids, hidden, Some(rows))
        }
    }

    /// The draft id (in the drafter's vocabulary) of each logit row, in order, copied to the
    /// host (to look at them; the engine reads drafts as target ids, `target_ids`): a wait for
    /// the pass to finish, where it has logit rows.
    pub fn ids(&self) -> Result<Vec<u32>> {
        match &self.rows {
            _ if self.kept_ids.elem_count() == 0 => Ok(Vec::new()),
            Some(rows) if rows.is_empty() => Ok(Vec::new()),
            Some(rows) => {
                let kept: Vec<u32> = self.kept_ids.to_vec1()?;
                Ok(rows.iter().map(|&at| kept[at as usize]).collect())
            }
            None => self.kept_ids.to_vec1(),
        }
    }

    /// The draft of each logit row, in order, as a target id mapped by `drafter`, on the
    /// device: written into `into` (u32 [logit rows], contiguous), or a new tensor. The host
    /// does not wait: a later forward takes them where they lie (`DeviceIds`). A copy, so a
    /// graph's next replay does not overwrite them.
    pub fn target_ids(&self, drafter: &Drafter, into: Option<&Tensor>) -> Result<Tensor> {
        let identity: Vec<u32>;
        let picks = match (&self.rows, &self.rows_uploaded) {
            (Some(rows), Some(uploaded)) => Indices::uploaded(rows, uploaded.clone())?,
            (Some(rows), None) => Indices::new(rows),
            (None, _) => {
                identity = (0..self.kept_ids.dim(0)? as u32).collect();
                Indices::new(&identity)
            }
        };
        peagle_kernels::pick_ids(&self.kept_ids, &picks, Some(&drafter.to_target), into)
    }

    /// The logit rows' hidden outputs as the next pass's hidden input.
    pub fn hidden(&self) -> PassHidden<'_> {
        match &self.rows {
            Some(rows) => PassHidden::picked(&self.hidden, None, rows),
            None => PassHidden::rows(&self.hidden),
        }
    }

    /// The input of the next pass of autoregressive drafting, fed on the device: row i reads
    /// logit row i's hidden output and, as its token, its draft mapped to a target id by
    /// `drafter`, which feeding the next pass also writes into `drafts` (u32 [logit rows]).
    pub fn chained<'a>(&'a self, drafter: &'a Drafter, drafts: &'a Tensor) -> PassHidden<'a> {
        self.hidden().chained(&self.kept_ids, &drafter.to_target, drafts)
    }
}

pub struct Drafter {
    config: DrafterConfig,
    dims: ModelDims,
    aux_layer_ids: Vec<usize>,
    embed: Embedding,
    fc: Linear,
    first: EagleInputLayer,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
    /// Target id of each draft id (`i + d2t[i]`), u32 [draft vocab] on the drafter's device,
    /// where drafts are mapped.
    to_target: Tensor,
    /// `mask_hidden` as stored, [1, aux layers * target hidden]; P-EAGLE only.
    mask_hidden: Option<Tensor>,
    rope: RotaryEmbedding,
    device: Device,
}

impl Drafter {
    /// Loads a drafter for `target` from a directory in either published layout.
    pub fn load(dir: &Path, target: &dyn TargetModel, options: LoadOptions) -> std::result::Result<Self, LoadError> {
        let config = DrafterConfig::from_file(&dir.join("config.json"))?;
        Self::from_checkpoint(config, &Checkpoint::open(dir, options)?, target)
    }

    /// Builds a drafter from weights already opened: a directory, or the variables of a
    /// drafter in training, which the drafter then shares so gradients reach them.
    pub fn from_checkpoint(
        config: DrafterConfig,
        ckpt: &Checkpoint,
        target: &dyn TargetModel,
    ) -> std::result::Result<Self, LoadError> {
        let cfg = &config.layers;
        let invalid = |msg: String| cfg.invalid(msg);
        let t = target.dims();
        if cfg.vocab_size != t.vocab_size {
            return Err(invalid(format!(
                "drafter vocab_size {} differs from the target's {}",
                cfg.vocab_size, t.vocab_size
            )));
        }
        if config.target_hidden_size != t.hidden_size {
            return Err(invalid(format!(
                "drafter expects target hidden size {}, the target has {}",
                config.target_hidden_size, t.hidden_size
            )));
        }
        let aux_layer_ids = config
            .aux_layer_ids
            .clone()
            .unwrap_or_else(|| vllm_default_aux_layers(t.num_layers));
        if let Some(bad) = aux_layer_ids.iter().find(|l| **l >= t.num_layers) {
            return Err(invalid(format!(
                "aux hidden state layer {bad} but the target has {} layers",
                t.num_layers
            )));
        }
        let h = cfg.hidden_size;
        let embed = if ckpt.contains("embed_tokens.weight") {
            Embedding::new(ckpt.matrix("embed_tokens.weight", &[t.vocab_size, h])?, ckpt.dtype())
        } else if h == t.hidden_size {
            Embedding::new(target.embedding().table().clone(), ckpt.dtype())
        } else {
            return Err(invalid(format!(
                "no embed_tokens.weight and the drafter width {h} differs from the target's {}",
                t.hidden_size
            )));
        };
        let layout = if ckpt.contains("midlayer.self_attn.q_proj.weight") {
            TensorLayout::Eagle3Midlayer
        } else {
            TensorLayout::Speculators
        };
        let first_prefix = match layout {
            TensorLayout::Eagle3Midlayer => "midlayer",
            TensorLayout::Speculators => "layers.0",
        };
        let opts = AttentionOptions {
            qk_norm: cfg.model_type.as_deref() == Some("qwen3"),
            bias: cfg.attention_bias,
            ..AttentionOptions::default()
        };
        let n_aux = aux_layer_ids.len();
        let draft_to_target = load_d2t(ckpt, config.draft_vocab_size, t.vocab_size)?;
        let to_target = Tensor::new(draft_to_target.as_slice(), ckpt.device()).map_err(|source| LoadError::Candle {
            context: "placing d2t on the device".into(),
            source,
        })?;
        let mask_hidden = match ckpt.contains("mask_hidden") {
            true => Some(load_mask_hidden(ckpt, n_aux * t.hidden_size)?),
            false => None,
        };
        let dims = ModelDims {
            vocab_size: config.draft_vocab_size,
            hidden_size: h,
            num_layers: cfg.num_hidden_layers,
            num_heads: cfg.num_attention_heads,
            num_kv_heads: cfg.num_kv_heads(),
            head_dim: cfg.head_dim(),
        };
        Ok(Self {
            fc: Linear::load(ckpt, "fc", h, n_aux * t.hidden_size, false)?,
            first: EagleInputLayer::load(ckpt, first_prefix, cfg, opts, config.norm_before_residual)?,
            layers: (1..cfg.num_hidden_layers)
                .map(|i| DecoderLayer::load_dense(ckpt, &format!("layers.{i}"), cfg, opts))
                .collect::<std::result::Result<_, _>>()?,
            norm: RmsNorm::load(ckpt, "norm", h, cfg.rms_norm_eps)?,
            lm_head: Linear::load(ckpt, "lm_head", config.draft_vocab_size, h, false)?,
            rope: RotaryEmbedding::new(cfg.head_dim(), &cfg.rope()?),
            device: ckpt.device().clone(),
            embed,
            to_target,
            mask_hidden,
            aux_layer_ids,
            dims,
            config,
        })
    }

    /// `TargetModel::place_rotary_table` for the drafter's own rotary embedding.
    pub fn place_rotary_table(&mut self, positions: usize) -> Result<()> {
        self.rope.place_table(positions, &self.device)
    }

    pub fn config(&self) -> &DrafterConfig {
        &self.config
    }

    /// Shape of the drafter's KV cache.
    pub fn dims(&self) -> &ModelDims {
        &self.dims
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The dtype of its activations, its hidden input's included.
    pub fn dtype(&self) -> candle_core::DType {
        self.embed.dtype()
    }

    /// Target layers whose inputs the drafter reads, in concatenation order.
    pub fn aux_layer_ids(&self) -> &[usize] {
        &self.aux_layer_ids
    }

    /// The mask token and the hidden input of every future slot in parallel drafting. A
    /// P-EAGLE checkpoint without them cannot draft in parallel.
    pub fn parallel_inputs(&self) -> std::result::Result<(u32, &Tensor), LoadError> {
        let missing = |what: &str| {
            self.config.layers.invalid(format!(
                "parallel drafting needs {what}, which this {:?} drafter does not have",
                self.config.algorithm
            ))
        };
        let token = self.config.mask_token_id.ok_or_else(|| missing("a mask_token_id"))?;
        let hidden = self
            .mask_hidden
            .as_ref()
            .ok_or_else(|| missing("a mask_hidden tensor"))?;
        if token as usize >= self.dims.vocab_size.max(self.config.layers.vocab_size) {
            return Err(missing("a mask_token_id inside the vocabulary"));
        }
        Ok((token, hidden))
    }

    pub fn is_parallel(&self) -> bool {
        self.config.algorithm == DraftAlgorithm::PEagle
    }

    /// `fc` over captured target states [rows, aux width]: the hidden input of fresh slots.
    pub fn project_target(&self, aux: &Tensor) -> Result<Tensor> {
        self.fc.forward(aux)
    }

    /// Target id of each draft id (`i + d2t[i]`), u32 [draft vocab] on the drafter's device.
    pub fn draft_to_target(&self) -> &Tensor {
        &self.to_target
    }

    /// A pass over the paged cache (inference); logits for the batch's logit rows.
    pub fn forward(&self, batch: &ForwardBatch, hidden: &DraftHidden, kv: &KvCache) -> Result<DraftOutput> {
        self.forward_inputs(&self.inputs(batch, &[])?, hidden, kv)
    }

    /// `forward` over a batch's inputs already on the device.
    pub fn forward_inputs(&self, inputs: &ForwardInputs, hidden: &DraftHidden, kv: &KvCache) -> Result<DraftOutput> {
        let x = self.forward_states(inputs, hidden, kv)?;
        match inputs.logit_rows.apply(&x)? {
            Some(rows) => self.head(rows),
            // A pass that only fills the drafter's cache (a prefill chunk) wants no logits.
            None => self.no_logits(x.dtype()),
        }
    }

    /// A batch's inputs on the drafter's device, with the kernel indices `indices`
    /// (`ForwardInputs::new`).
    pub fn inputs(&self, batch: &ForwardBatch, indices: &[u32]) -> Result<ForwardInputs> {
        ForwardInputs::new(batch, &self.rope, &self.device, indices)
    }

    /// Writes a batch's inputs and the kernel indices `indices` into `target`'s, laid out
    /// alike (a CUDA graph's).
    pub fn upload_inputs(&self, batch: &ForwardBatch, target: &ForwardInputs, indices: &[u32]) -> Result<()> {
        ForwardInputs::upload_into(batch, &self.rope, target, indices)
    }

    /// A pass over the paged cache up to the final norm: the last layer's output for every
    /// row, [rows, drafter hidden]. Copies nothing from the host, so that a CUDA graph can
    /// capture it.
    pub fn forward_states(&self, inputs: &ForwardInputs, hidden: &DraftHidden, kv: &KvCache) -> Result<Tensor> {
        if kv.num_layers() != self.dims.num_layers {
            bail!(
                "drafter KV cache has {} layers, the drafter {}",
                kv.num_layers(),
                self.dims.num_layers
            );
        }
        self.layers_forward(&inputs.ids, &inputs.rope, hidden, |i| AttentionContext::Paged {
            kv: kv.layer(i),
            meta: &inputs.attn,
        })
    }

    /// The output of a pass that wants no logits. It is made without a kernel: CUDA refuses a
    /// launch over no elements.
    pub fn no_logits(&self, dtype: candle_core::DType) -> Result<DraftOutput> {
        Ok(DraftOutput {
            logits: peagle_kernels::no_rows(self.dims.vocab_size, dtype, &self.device)?,
            hidden: peagle_kernels::no_rows(self.dims.hidden_size, dtype, &self.device)?,
        })
    }

    /// A pass over rows that attend to each other under `bias` [rows, rows] (0 where visible,
    /// -inf elsewhere), as in P-EAGLE's multi-depth training layout; logits for every row.
    pub fn forward_masked(
        &self,
        tokens: &[u32],
        positions: &[u32],
        hidden: &DraftHidden,
        bias: &Tensor,
    ) -> Result<DraftOutput> {
        if positions.len() != tokens.len() {
            bail!(
                "a drafter pass needs one position a token ({} tokens, {} positions)",
                tokens.len(),
                positions.len()
            );
        }
        let ids = Tensor::from_slice(tokens, tokens.len(), &self.device)?;
        let rope = self.rope.tables(positions, &self.device)?;
        let x = self.layers_forward(&ids, &rope, hidden, |_| AttentionContext::Masked { bias })?;
        self.head(x)
    }

    /// Embedding, hidden input and every layer; `ctx(i)` is layer i's attention context.
    fn layers_forward<'a>(
        &self,
        ids: &Tensor,
        rope: &RopeTables,
        hidden: &DraftHidden,
        ctx: impl Fn(usize) -> AttentionContext<'a>,
    ) -> Result<Tensor> {
        let rows = ids.dim(0)?;
        if rows == 0 {
            bail!("a drafter pass needs rows");
        }
        let h = match hidden {
            DraftHidden::Target(t) => self.fc.forward(t)?,
            DraftHidden::Projected(t) => t.clone(),
        };
        if h.dims() != [rows, self.dims.hidden_size] {
            bail!(
                "drafter hidden input is {:?}, expected [{rows}, {}]",
                h.dims(),
                self.dims.hidden_size
            );
        }
        let mut x = self.first.forward(&self.embed.forward(ids)?, &h, rope, &ctx(0))?;
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(x, rope, &ctx(i + 1))?.1;
        }
        x.sum()
    }

    /// The greedy drafts of a pass's output: each logit row's argmax, found where the rows are.
    pub fn greedy(&self, out: DraftOutput) -> Result<GreedyDrafts> {
        let ids = match out.logits.dim(0)? {
            0 => peagle_kernels::no_rows(1, candle_core::DType::U32, &self.device)?.flatten_all()?,
            _ => peagle_kernels::argmax_each_row(&out.logits)?,
        };
        Ok(GreedyDrafts::new(ids, out.hidden, None))
    }

    /// Final norm and draft-vocabulary logits of the selected rows of `forward_states`.
    pub fn head(&self, out: Tensor) -> Result<DraftOutput> {
        let normed = self.norm.forward(&out)?;
        Ok(DraftOutput {
            logits: self.lm_head.forward(&normed)?,
            hidden: if self.config.norm_output { normed } else { out },
        })
    }
}

/// vLLM's default for published EAGLE-3 heads that do not list their layers.
pub fn vllm_default_aux_layers(num_layers: usize) -> Vec<usize> {
    vec![2.min(num_layers - 1), num_layers / 2, num_layers.saturating_sub(3)]
}

/// The target id of each draft id, `i + d2t[i]`, each checked to lie in the target's
/// vocabulary: a draft becomes a token of the target's and of the drafter's next pass.
fn load_d2t(ckpt: &Checkpoint, draft_vocab: usize, target_vocab: usize) -> std::result::Result<Vec<u32>, LoadError> {
    if !ckpt.contains("d2t") {
        if draft_vocab > target_vocab {
            return Err(LoadError::InvalidTensor {
                name: "d2t".into(),
                msg: format!("missing, and {draft_vocab} draft ids are more than the target's {target_vocab} tokens"),
            });
        }
        return Ok((0..draft_vocab as u32).collect());
    }
    let offsets: Vec<i64> = ckpt
        .int64("d2t", &[draft_vocab])?
        .to_vec1()
        .map_err(|source| LoadError::Candle {
            context: "reading d2t".into(),
            source,
        })?;
    let mapped = |(i, o): (usize, &i64)| {
        let id = i as i64 + o;
        u32::try_from(id)
            .ok()
            .filter(|id| (*id as usize) < target_vocab)
            .ok_or_else(|| LoadError::InvalidTensor {
                name: "d2t".into(),
                msg: format!("maps draft id {i} to {id}, outside the target's {target_vocab} tokens"),
            })
    };
    offsets.iter().enumerate().map(mapped).collect()
}

fn load_mask_hidden(ckpt: &Checkpoint, width: usize) -> std::result::Result<Tensor, LoadError> {
    // Published as [1, 1, width] (speculators) or [1, width].
    let shape: &[usize] = if ckpt.shape_of("mask_hidden")?.len() == 3 {
        &[1, 1, width]
    } else {
        &[1, width]
    };
    ckpt.vector("mask_hidden", shape)?
        .reshape((1, width))
        .map_err(|source| LoadError::Candle {
            context: "reshaping mask_hidden".into(),
            source,
        })
}
