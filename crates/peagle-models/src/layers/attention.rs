use super::{Linear, RmsNorm, RopeTables};
use crate::checkpoint::Checkpoint;
use crate::config::TextConfig;
use crate::error::LoadError;
use crate::kv_cache::LayerKv;
use crate::ops::{masked_softmax, paged_attention, write_kv};
use candle_core::{bail, DType, Result, Tensor};
use peagle_kernels::{AttentionMetadata, AttentionParams, KvScale, Sinks};

/// Architecture switches of one layer's attention block.
#[derive(Debug, Clone, Copy, Default)]
pub struct AttentionOptions {
    /// Per-head RMSNorm of q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Biases on the q, k, v and o projections.
    pub bias: bool,
    /// Attend only to the last `n` positions, the query's own included; `None` is full
    /// attention. Paged attention only: the training layouts of drafters have no window.
    pub sliding_window: Option<usize>,
    /// A learned sink logit per query head (`{prefix}.sinks`, gpt-oss) that joins the
    /// softmax's denominator only. Paged attention only, as the window.
    pub sinks: bool,
}

/// Where attention takes its keys and values from.
pub enum AttentionContext<'a> {
    /// The paged cache (inference): the batch's keys and values are written, then attended.
    /// On a GPU the metadata carries its device copy (`AttentionMetadata::on_device`).
    Paged {
        kv: &'a LayerKv,
        meta: &'a AttentionMetadata,
    },
    /// The batch alone under an explicit additive mask [rows, rows] (0 or -inf): training
    /// layouts such as P-EAGLE's multi-depth sequences.
    Masked { bias: &'a Tensor },
}

/// GQA self-attention, q/k/v fused into one projection.
pub struct Attention {
    qkv: Linear,
    o: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    sinks: Option<Sinks>,
    params: AttentionParams,
    /// The checkpoint's FP8 KV-cache scales (1 where it has none), used by an FP8 cache only.
    fp8_kv_scale: KvScale,
}

impl Attention {
    /// `in_dim` is the width of the q/k/v input: the hidden size, except in an EAGLE drafter's
    /// first layer, which reads [embedding ; hidden].
    pub fn load(
        ckpt: &Checkpoint,
        prefix: &str,
        cfg: &TextConfig,
        in_dim: usize,
        opts: AttentionOptions,
    ) -> std::result::Result<Self, LoadError> {
        let (heads, kv_heads, d, hidden) = (
            cfg.num_attention_heads,
            cfg.num_kv_heads(),
            cfg.head_dim(),
            cfg.hidden_size,
        );
        let q = format!("{prefix}.q_proj");
        let k = format!("{prefix}.k_proj");
        let v = format!("{prefix}.v_proj");
        let norm = |name: &str| RmsNorm::load(ckpt, &format!("{prefix}.{name}"), d, cfg.rms_norm_eps);
        Ok(Self {
            qkv: Linear::load_fused(
                ckpt,
                &[(&q, heads * d), (&k, kv_heads * d), (&v, kv_heads * d)],
                in_dim,
                opts.bias,
            )?,
            o: Linear::load(ckpt, &format!("{prefix}.o_proj"), hidden, heads * d, opts.bias)?,
            q_norm: opts.qk_norm.then(|| norm("q_norm")).transpose()?,
            k_norm: opts.qk_norm.then(|| norm("k_norm")).transpose()?,
            sinks: opts.sinks.then(|| load_sinks(ckpt, prefix, heads)).transpose()?,
            params: AttentionParams {
                num_heads: heads,
                num_kv_heads: kv_heads,
                head_dim: d,
                scale: 1.0 / (d as f32).sqrt(),
                sliding_window: opts.sliding_window,
                kv_scale: KvScale::ONE,
            },
            fp8_kv_scale: KvScale {
                k: load_kv_scale(ckpt, prefix, "k")?,
                v: load_kv_scale(ckpt, prefix, "v")?,
            },
        })
    }

    /// `x` [rows, in_dim] to [rows, hidden].
    pub fn forward(&self, x: &Tensor, rope: &RopeTables, ctx: &AttentionContext) -> Result<Tensor> {
        let p = &self.params;
        let rows = x.dim(0)?;
        let (q_width, kv_width) = (p.num_heads * p.head_dim, p.num_kv_heads * p.head_dim);
        let qkv = self.qkv.forward(x)?;
        let (q, k) = self.queries_and_keys(&qkv, rows)?;
        let v = qkv.narrow(1, q_width + kv_width, kv_width)?;
        let out = match ctx {
            AttentionContext::Paged { kv, meta } => {
                let p = AttentionParams {
                    kv_scale: if kv.k.dtype() == DType::F8E4M3 {
                        self.fp8_kv_scale
                    } else {
                        KvScale::ONE
                    },
                    ..*p
                };
                // The KV write rotates the keys and attention the queries as they read them.
                let rotation = rope.rotation(p.head_dim);
                write_kv(&kv.both, &k, &v, meta, p.kv_scale, rotation)?;
                paged_attention(&q, &kv.k, &kv.v, meta, &p, self.sinks.as_ref(), rotation)?
            }
            AttentionContext::Masked { .. } if p.sliding_window.is_some() || self.sinks.is_some() => {
                bail!("sliding windows and attention sinks are not supported in masked (training) attention")
            }
            AttentionContext::Masked { bias } => {
                let q = rope.apply(&q, p.num_heads, p.head_dim)?;
                let k = rope.apply(&k, p.num_kv_heads, p.head_dim)?;
                masked_attention(&q, &k, &v, bias, p)?
            }
        };
        self.o.forward(&out)
    }

    /// The queries and keys of the fused projection `qkv`, each normed per head where the
    /// architecture norms them, not yet rotated; without norms, column ranges of `qkv` that the
    /// kernels read in place.
    fn queries_and_keys(&self, qkv: &Tensor, rows: usize) -> Result<(Tensor, Tensor)> {
        let p = &self.params;
        let (q_width, kv_width) = (p.num_heads * p.head_dim, p.num_kv_heads * p.head_dim);
        let q = head_norm(self.q_norm.as_ref(), &qkv.narrow(1, 0, q_width)?, rows, p.head_dim)?;
        let k = head_norm(
            self.k_norm.as_ref(),
            &qkv.narrow(1, q_width, kv_width)?,
            rows,
            p.head_dim,
        )?;
        Ok((q, k))
    }
}

/// Dense attention of `rows` queries over the same rows under an additive mask.
fn masked_attention(q: &Tensor, k: &Tensor, v: &Tensor, bias: &Tensor, p: &AttentionParams) -> Result<Tensor> {
    let rows = q.dim(0)?;
    let group = p.num_heads / p.num_kv_heads;
    let heads = |t: &Tensor, n: usize| t.reshape((rows, n, p.head_dim))?.transpose(0, 1)?.contiguous();
    // Each KV head serves `group` consecutive query heads.
    let expand = |t: &Tensor| {
        let (n, r, d) = t.dims3()?;
        t.unsqueeze(1)?.expand((n, group, r, d))?.reshape((n * group, r, d))
    };
    // Scaling q rather than the scores saves a [heads, rows, rows] tensor.
    let q = (heads(q, p.num_heads)? * p.scale as f64)?;
    let k = expand(&heads(k, p.num_kv_heads)?)?;
    let v = expand(&heads(v, p.num_kv_heads)?)?;
    let weights = masked_softmax(&q.matmul(&k.t()?)?, bias)?;
    weights
        .matmul(&v)?
        .transpose(0, 1)?
        .reshape((rows, p.num_heads * p.head_dim))
}

/// `{prefix}.sinks`, one logit per query head, where the model's kernels read them.
fn load_sinks(ckpt: &Checkpoint, prefix: &str, heads: usize) -> std::result::Result<Sinks, LoadError> {
    let name = format!("{prefix}.sinks");
    ckpt.vector(&name, &[heads])?
        .to_dtype(candle_core::DType::F32)
        .and_then(|t| Sinks::new(t.to_vec1()?, ckpt.device()))
        .map_err(|source| LoadError::Candle {
            context: format!("reading {name}"),
            source,
        })
}

/// The scale of an FP8 cache's keys (`which` = "k") or values ("v"), under the names FP8
/// checkpoints give it: `{prefix}.k_scale` (compressed-tensors), `{prefix}.k_proj.k_scale`
/// (ModelOpt) or `{prefix}.k_proj.output_scale` (older compressed-tensors); 1 where there is
/// none, as in vLLM.
fn load_kv_scale(ckpt: &Checkpoint, prefix: &str, which: &str) -> std::result::Result<f32, LoadError> {
    let names = [
        format!("{prefix}.{which}_scale"),
        format!("{prefix}.{which}_proj.{which}_scale"),
        format!("{prefix}.{which}_proj.output_scale"),
    ];
    let Some(name) = names.into_iter().find(|n| ckpt.contains(n)) else {
        return Ok(1.0);
    };
    let shape = ckpt.shape_of(&name)?;
    let invalid = |msg: String| LoadError::InvalidTensor {
        name: name.clone(),
        msg,
    };
    if shape.iter().product::<usize>() != 1 {
        return Err(invalid(format!(
            "a KV-cache scale must hold one value, not shape {shape:?}"
        )));
    }
    let scale = ckpt
        .vector(&name, &shape)?
        .to_dtype(DType::F32)
        .and_then(|t| t.flatten_all()?.to_vec1::<f32>())
        .map_err(|source| LoadError::Candle {
            context: format!("reading {name}"),
            source,
        })?[0];
    if !(scale.is_finite() && scale > 0.0) {
        return Err(invalid(format!(
            "a KV-cache scale must be a positive number, not {scale}"
        )));
    }
    Ok(scale)
}

fn head_norm(norm: Option<&RmsNorm>, x: &Tensor, rows: usize, head_dim: usize) -> Result<Tensor> {
    match norm {
        // The kernels read the projection's columns in place.
        None => Ok(x.clone()),
        Some(n) => {
            let width = x.dim(1)?;
            n.forward(&x.contiguous()?.reshape((rows * width / head_dim, head_dim))?)?
                .reshape((rows, width))
        }
    }
}
