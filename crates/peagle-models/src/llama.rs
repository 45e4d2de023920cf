//! `LlamaForCausalLM`: Llama 2 and 3 (llama3 rope scaling included), and the many models that
//! share its layout: token embedding, pre-norm blocks of GQA attention and a dense SwiGLU MLP,
//! a final RMSNorm and an LM head, tied to the embedding or not.

use crate::batch::ForwardBatch;
use crate::checkpoint::Checkpoint;
use crate::config::{ModelDims, TextConfig};
use crate::error::LoadError;
use crate::forward_inputs::ForwardInputs;
use crate::kv_cache::KvCache;
use crate::layers::{
    AttentionContext, AttentionOptions, DecoderLayer, Embedding, Linear, Residual, RmsNorm, RotaryEmbedding,
};
use crate::target_model::{
    check_batch, check_capture_layers, default_capture_layers, Capture, ForwardStates, TargetModel,
};
use candle_core::{Device, Result, Tensor};

pub struct Llama {
    dims: ModelDims,
    embed: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
    rope: RotaryEmbedding,
    capture_layers: Vec<usize>,
    device: Device,
}

pub(crate) fn load(cfg: &TextConfig, ckpt: &Checkpoint) -> std::result::Result<Box<dyn TargetModel>, LoadError> {
    let opts = AttentionOptions {
        bias: cfg.attention_bias,
        ..AttentionOptions::default()
    };
    Ok(Box::new(Llama::load(cfg, ckpt, opts)?))
}

impl Llama {
    /// Loads the Llama layout with `opts` in every layer's attention (variants such as Qwen3
    /// differ only there).
    pub(crate) fn load(
        cfg: &TextConfig,
        ckpt: &Checkpoint,
        opts: AttentionOptions,
    ) -> std::result::Result<Self, LoadError> {
        Self::load_with_layers(cfg, ckpt, |_, prefix| DecoderLayer::load_dense(ckpt, prefix, cfg, opts))
    }

    /// Loads the shell every decoder-only architecture here shares (embedding, final norm, LM
    /// head, rotary tables) around layers that `layer(index, prefix)` loads: an architecture
    /// whose blocks differ (gpt-oss) brings its own.
    pub(crate) fn load_with_layers(
        cfg: &TextConfig,
        ckpt: &Checkpoint,
        layer: impl Fn(usize, &str) -> std::result::Result<DecoderLayer, LoadError>,
    ) -> std::result::Result<Self, LoadError> {
        let dims = ModelDims::of(cfg);
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
            .map(|i| layer(i, &format!("model.layers.{i}")))
            .collect::<std::result::Result<_, _>>()?;
        Ok(Self {
            capture_layers: default_capture_layers(dims.num_layers),
            rope: RotaryEmbedding::new(dims.head_dim, &cfg.rope()?),
            embed: Embedding::new(table, ckpt.dtype()),
            layers,
            norm: RmsNorm::load(ckpt, "model.norm", dims.hidden_size, cfg.rms_norm_eps)?,
            lm_head,
            device: ckpt.device().clone(),
            dims,
        })
    }
}

impl TargetModel for Llama {
    fn dims(&self) -> &ModelDims {
        &self.dims
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn embedding(&self) -> &Embedding {
        &self.embed
    }

    fn lm_head_weight(&self) -> Result<Tensor> {
        self.lm_head.weight()
    }

    fn logits_from_final(&self, final_hidden: &Tensor) -> Result<Tensor> {
        self.logits_from_normed(&self.norm.forward(final_hidden)?)
    }

    fn logits_from_normed(&self, normed: &Tensor) -> Result<Tensor> {
        self.lm_head.forward(normed)
    }

    fn capture_layers(&self) -> &[usize] {
        &self.capture_layers
    }

    fn set_capture_layers(&mut self, layers: Vec<usize>) -> Result<()> {
        check_capture_layers(&layers, self.dims.num_layers)?;
        self.capture_layers = layers;
        Ok(())
    }

    fn place_rotary_table(&mut self, positions: usize) -> Result<()> {
        self.rope.place_table(positions, &self.device)
    }

    fn inputs(&self, batch: &ForwardBatch, kv: &KvCache) -> Result<ForwardInputs> {
        check_batch(batch, kv, &self.dims)?;
        ForwardInputs::new(batch, &self.rope, &self.device, &[])
    }

    fn upload_inputs(&self, batch: &ForwardBatch, kv: &KvCache, target: &ForwardInputs) -> Result<()> {
        check_batch(batch, kv, &self.dims)?;
        ForwardInputs::upload_into(batch, &self.rope, target, &[])
    }

    fn reads_back(&self) -> bool {
        self.layers.iter().any(DecoderLayer::reads_back)
    }

    fn forward_states(&self, inputs: &ForwardInputs, kv: &KvCache) -> Result<ForwardStates> {
        let mut capture = Capture::new(inputs, &self.capture_layers);
        let mut x = Residual::new(self.embed.forward(&inputs.ids)?);
        for (i, layer) in self.layers.iter().enumerate() {
            let ctx = AttentionContext::Paged {
                kv: kv.layer(i),
                meta: &inputs.attn,
            };
            let (input, output) = layer.forward(x, &inputs.rope, &ctx)?;
            capture.layer_input(i, &input)?;
            x = output;
        }
        // The final norm over every row, fused with the last block's add (and, for MXFP4
        // experts on a GPU, their sum), as each block's input norm is: the head then selects.
        let (last, normed) = x.normed(&self.norm)?;
        capture.finish(&last, &normed)
    }
}
