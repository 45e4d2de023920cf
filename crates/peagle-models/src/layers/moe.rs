use super::{Delta, Linear};
use crate::checkpoint::Checkpoint;
use crate::error::LoadError;
use crate::ops::{self, Weight};
use candle_core::{DType, Result, Tensor};
use peagle_kernels::Mxfp4Weight;

/// How a mixture-of-experts block is shaped and stored.
#[derive(Debug, Clone, Copy)]
pub struct MoeConfig {
    pub num_experts: usize,
    /// Experts per token.
    pub top_k: usize,
    pub hidden: usize,
    /// Each expert's intermediate width.
    pub intermediate: usize,
    /// Routing weights are a softmax over the `top_k` chosen scores (gpt-oss; Qwen3-MoE's
    /// `norm_topk_prob`, softmax over all then renormalised, is the same function), else the
    /// chosen experts' shares of a softmax over all of them.
    pub normalize_top_k: bool,
    pub activation: Activation,
    /// Expert weights stored as MXFP4 blocks and scales rather than dense matrices.
    pub mxfp4: bool,
}

/// An expert's nonlinearity over its fused gate and up projections.
#[derive(Debug, Clone, Copy)]
pub enum Activation {
    /// `silu(gate) * up` (Qwen3-MoE).
    Swiglu,
    /// gpt-oss's clamped SwiGLU, with its `alpha` and `limit` (1.702 and 7).
    ClampedSwiglu { alpha: f32, limit: f32 },
}

/// A mixture-of-experts feed-forward block: a router (a linear layer) scores the experts,
/// each token goes to its `top_k` best, and its output is theirs weighted by the routing
/// weights. An expert is a SwiGLU MLP (gpt-oss's clamped, with biases).
///
/// Each expert runs once per call over the rows routed to it (through the batch-invariant
/// linear kernels), and each row sums its experts' outputs in the order of its own ranking, so
/// a row's result does not depend on the other rows.
pub struct Moe {
    router: Linear,
    experts: Experts,
    cfg: MoeConfig,
}

enum Experts {
    /// One at a time through the linear kernels, routed on the host: the CPU, and a GPU's
    /// experts that the device kernels do not take (f32, FP8 in other blocks, the CUDA-core
    /// matmul).
    Each(Vec<Expert>),
    /// All of them routed by `kernels/moe.cu` on the device: MXFP4 experts on a GPU.
    #[cfg(feature = "cuda")]
    Mxfp4OnDevice(Box<peagle_kernels::Mxfp4Experts>),
    /// All of them routed by `kernels/moe.cu` and run by `kernels/moe_dense.cu` on the device: bf16 or
    /// FP8 experts on a GPU's tensor cores (`placed`).
    #[cfg(feature = "cuda")]
    DenseOnDevice(Box<peagle_kernels::DenseExperts>),
}

struct Expert {
    /// Gate rows first, then up rows (the checkpoint interleaves them).
    gate_up: Linear,
    down: Linear,
}

impl Moe {
    /// gpt-oss's `{prefix}.router` and `{prefix}.experts`, dense (`gate_up_proj` [E, H, 2I],
    /// `down_proj` [E, I, H]) or MXFP4 (`*_blocks` [E, out, in / 32, 16] and `*_scales`).
    pub fn load_gpt_oss(ckpt: &Checkpoint, prefix: &str, cfg: MoeConfig) -> std::result::Result<Self, LoadError> {
        let (e, h, i) = (cfg.num_experts, cfg.hidden, cfg.intermediate);
        let experts = format!("{prefix}.experts");
        let candle = |context: String| move |source| LoadError::Candle { context, source };
        // Checkpoint rows alternate gate, up; ours take the gate rows, then the up rows.
        let gate_up_rows: Vec<usize> = (0..i).map(|r| 2 * r).chain((0..i).map(|r| 2 * r + 1)).collect();
        let order = Tensor::from_vec(
            gate_up_rows.iter().map(|r| *r as u32).collect::<Vec<_>>(),
            2 * i,
            ckpt.device(),
        )
        .map_err(candle("the gate/up order".into()))?;
        let gate_up_bias = ckpt.vector(&format!("{experts}.gate_up_proj_bias"), &[e, 2 * i])?;
        let down_bias = ckpt.vector(&format!("{experts}.down_proj_bias"), &[e, h])?;
        let (gate_up, down) = if cfg.mxfp4 {
            let load = |name: &str, out: usize, inner: usize| -> std::result::Result<_, LoadError> {
                let groups = inner / peagle_kernels::MXFP4_BLOCK;
                Ok((
                    ckpt.bytes(&format!("{experts}.{name}_blocks"), &[e, out, groups, 16])?,
                    ckpt.bytes(&format!("{experts}.{name}_scales"), &[e, out, groups])?,
                ))
            };
            (
                Stored::Mxfp4(load("gate_up_proj", 2 * i, h)?),
                Stored::Mxfp4(load("down_proj", h, i)?),
            )
        } else {
            (
                Stored::Dense(ckpt.matrix(&format!("{experts}.gate_up_proj"), &[e, h, 2 * i])?),
                Stored::Dense(ckpt.matrix(&format!("{experts}.down_proj"), &[e, i, h])?),
            )
        };
        let router = Linear::load(ckpt, &format!("{prefix}.router"), e, h, true)?;
        #[cfg(feature = "cuda")]
        if let (Stored::Mxfp4(gate_up), Stored::Mxfp4(down), false) = (&gate_up, &down, ckpt.device().is_cpu()) {
            let experts = mxfp4_on_device(ckpt.device(), gate_up, &gate_up_bias, &gate_up_rows, down, &down_bias)
                .map_err(candle(format!("moving the experts of {prefix} to the GPU")))?;
            return Ok(Self {
                router,
                experts: Experts::Mxfp4OnDevice(Box::new(experts)),
                cfg,
            });
        }
        let experts = (0..e)
            .map(|x| -> Result<Expert> {
                let gate_up_weight = match &gate_up {
                    Stored::Dense(w) => Weight::new(w.get(x)?.t()?.contiguous()?.index_select(&order, 0)?)?,
                    Stored::Mxfp4((b, s)) => {
                        Weight::Mxfp4(Mxfp4Weight::new(&b.get(x)?, &s.get(x)?)?.select_rows(&gate_up_rows))
                    }
                };
                let down_weight = match &down {
                    Stored::Dense(w) => Weight::new(w.get(x)?.t()?.contiguous()?)?,
                    Stored::Mxfp4((b, s)) => Weight::Mxfp4(Mxfp4Weight::new(&b.get(x)?, &s.get(x)?)?),
                };
                Ok(Expert {
                    gate_up: Linear::from_weight(gate_up_weight, Some(gate_up_bias.get(x)?.index_select(&order, 0)?)),
                    down: Linear::from_weight(down_weight, Some(down_bias.get(x)?)),
                })
            })
            .collect::<Result<_>>()
            .map_err(candle(format!("unpacking the experts of {prefix}")))?;
        Ok(Self {
            router,
            experts: placed(experts, ckpt, &cfg)
                .map_err(candle(format!("moving the experts of {prefix} to the GPU")))?,
            cfg,
        })
    }

    /// Qwen3-MoE's `{prefix}.gate` (the router, no bias) and `{prefix}.experts.{e}.{gate,up,down}_proj`.
    pub fn load_qwen3_moe(ckpt: &Checkpoint, prefix: &str, cfg: MoeConfig) -> std::result::Result<Self, LoadError> {
        let (h, i) = (cfg.hidden, cfg.intermediate);
        let experts = (0..cfg.num_experts)
            .map(|x| {
                let expert = format!("{prefix}.experts.{x}");
                let (gate, up) = (format!("{expert}.gate_proj"), format!("{expert}.up_proj"));
                Ok(Expert {
                    gate_up: Linear::load_fused(ckpt, &[(&gate, i), (&up, i)], h, false)?,
                    down: Linear::load(ckpt, &format!("{expert}.down_proj"), h, i, false)?,
                })
            })
            .collect::<std::result::Result<_, LoadError>>()?;
        let experts = placed(experts, ckpt, &cfg).map_err(|source| LoadError::Candle {
            context: format!("moving the experts of {prefix} to the GPU"),
            source,
        })?;
        Ok(Self {
            router: Linear::load(ckpt, &format!("{prefix}.gate"), cfg.num_experts, h, false)?,
            experts,
            cfg,
        })
    }

    /// Whether the forward routes on the host, reading the router's logits back.
    pub fn routes_on_host(&self) -> bool {
        matches!(self.experts, Experts::Each(_))
    }

    /// `x` [rows, hidden] to [rows, hidden]; on a GPU, the experts' outputs before their
    /// weighted sum, which the residual stream's next norm computes.
    pub fn forward(&self, x: &Tensor) -> Result<Delta> {
        match &self.experts {
            Experts::Each(experts) => Ok(Delta::Rows(self.forward_each(x, experts)?)),
            #[cfg(feature = "cuda")]
            Experts::Mxfp4OnDevice(experts) => {
                let outputs = experts.outputs(x, &self.router.forward(x)?, &self.routing())?;
                Ok(Delta::Experts(Box::new(outputs)))
            }
            #[cfg(feature = "cuda")]
            Experts::DenseOnDevice(experts) => {
                let outputs = experts.outputs(x, &self.router.forward(x)?, &self.routing())?;
                Ok(Delta::Experts(Box::new(outputs)))
            }
        }
    }

    /// How the device kernels route and gate.
    #[cfg(feature = "cuda")]
    fn routing(&self) -> peagle_kernels::Routing {
        peagle_kernels::Routing {
            top_k: self.cfg.top_k,
            normalize: self.cfg.normalize_top_k,
            clamp: match self.cfg.activation {
                Activation::Swiglu => None,
                Activation::ClampedSwiglu { alpha, limit } => Some((alpha, limit)),
            },
        }
    }

    /// Routes on the host, then runs each expert once over the rows routed to it.
    fn forward_each(&self, x: &Tensor, experts: &[Expert]) -> Result<Tensor> {
        let (rows, hidden) = x.dims2()?;
        let (num_experts, k) = (self.cfg.num_experts, self.cfg.top_k);
        let scores: Vec<f32> = self.router.forward(x)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        // Per expert, the (row, rank) pairs routed to it; per (row, rank), the routing weight.
        let mut routed: Vec<Vec<(usize, usize)>> = vec![Vec::new(); num_experts];
        let mut weights = vec![0f32; rows * k];
        for (r, row) in scores.chunks_exact(num_experts).enumerate() {
            for (rank, (expert, w)) in route(row, k, self.cfg.normalize_top_k).into_iter().enumerate() {
                routed[expert].push((r, rank));
                weights[r * k + rank] = w;
            }
        }
        let mut outputs = vec![0f32; rows * k * hidden];
        for (expert, pairs) in experts.iter().zip(&routed).filter(|(_, p)| !p.is_empty()) {
            let ids: Vec<u32> = pairs.iter().map(|(r, _)| *r as u32).collect();
            let xs = x.index_select(&Tensor::from_vec(ids, pairs.len(), x.device())?, 0)?;
            let gated = match self.cfg.activation {
                Activation::Swiglu => expert.gate_up.forward_swiglu(&xs)?,
                Activation::ClampedSwiglu { alpha, limit } => {
                    ops::clamped_swiglu(&expert.gate_up.forward(&xs)?, alpha, limit)?
                }
            };
            let ys: Vec<f32> = expert
                .down
                .forward(&gated)?
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1()?;
            for ((r, rank), y) in pairs.iter().zip(ys.chunks_exact(hidden)) {
                outputs[(r * k + rank) * hidden..][..hidden].copy_from_slice(y);
            }
        }
        let mut out = vec![0f32; rows * hidden];
        for (r, out) in out.chunks_exact_mut(hidden).enumerate() {
            for rank in 0..k {
                let w = weights[r * k + rank];
                for (o, y) in out.iter_mut().zip(&outputs[(r * k + rank) * hidden..][..hidden]) {
                    *o += w * y;
                }
            }
        }
        Tensor::from_vec(out, (rows, hidden), x.device())?.to_dtype(x.dtype())
    }
}

/// Whether dense experts of `cfg`'s widths may run on `ckpt`'s device, routed there: bf16 rows
/// on a GPU's tensor cores (`peagle_kernels::DenseExperts`), where `placed` then finds their
/// weights of a kind those kernels take. Elsewhere they run one at a time.
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
pub fn dense_on_device(ckpt: &Checkpoint, cfg: &MoeConfig) -> bool {
    #[cfg(feature = "cuda")]
    if ckpt.device().is_cuda() {
        return ckpt.dtype() == DType::BF16
            && peagle_kernels::CudaMatmul::chosen() == Ok(peagle_kernels::CudaMatmul::Mma)
            && peagle_kernels::DenseExperts::takes_widths(cfg.hidden, cfg.intermediate);
    }
    false
}

/// `experts` where they run: on the device where `dense_on_device` says so and the device
/// kernels take their weights (bf16, or FP8 in blocks the tensor cores take), else one at a
/// time.
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn placed(experts: Vec<Expert>, ckpt: &Checkpoint, cfg: &MoeConfig) -> Result<Experts> {
    #[cfg(feature = "cuda")]
    if dense_on_device(ckpt, cfg) {
        use peagle_kernels::{DenseExpert, DenseExperts};
        let parts = experts
            .iter()
            .map(|e| {
                Some(DenseExpert {
                    gate_up: device_matrix(&e.gate_up)?,
                    gate_up_bias: e.gate_up.bias(),
                    down: device_matrix(&e.down)?,
                    down_bias: e.down.bias(),
                })
            })
            .collect::<Option<Vec<_>>>();
        if let Some(parts) = parts.filter(|parts| DenseExperts::takes(parts)) {
            let on_device = DenseExperts::new(ckpt.device(), &parts)?;
            return Ok(Experts::DenseOnDevice(Box::new(on_device)));
        }
    }
    Ok(Experts::Each(experts))
}

/// A GPU expert's weight as `DenseExperts` takes it, where it is of a kind it takes.
#[cfg(feature = "cuda")]
fn device_matrix(linear: &Linear) -> Option<peagle_kernels::ExpertMatrix<'_>> {
    match linear.stored_weight() {
        Weight::Plain(w) => Some(peagle_kernels::ExpertMatrix::Bf16(w)),
        Weight::Fp8(w) => Some(peagle_kernels::ExpertMatrix::Fp8(w)),
        _ => None,
    }
}

/// gpt-oss's MXFP4 experts, as `load_gpt_oss` reads them, copied to a GPU: gate_up's rows
/// taken in `gate_up_rows` order (gate, then up) with its bias, and down with its own.
#[cfg(feature = "cuda")]
fn mxfp4_on_device(
    device: &candle_core::Device,
    (gate_up_blocks, gate_up_scales): &(Tensor, Tensor),
    gate_up_bias: &Tensor,
    gate_up_rows: &[usize],
    (down_blocks, down_scales): &(Tensor, Tensor),
    down_bias: &Tensor,
) -> Result<peagle_kernels::Mxfp4Experts> {
    // The blocks and scales are on the host already (`Checkpoint::bytes`); the biases join
    // them there, so that each expert's part is a slice of a host tensor.
    let host = &candle_core::Device::Cpu;
    let (gate_up_bias, down_bias) = (gate_up_bias.to_device(host)?, down_bias.to_device(host)?);
    let order: Vec<u32> = gate_up_rows.iter().map(|r| *r as u32).collect();
    let order = Tensor::from_vec(order, gate_up_rows.len(), host)?;
    let floats = |t: Tensor| t.to_dtype(DType::F32)?.to_vec1::<f32>();
    let weights = (0..gate_up_blocks.dim(0)?)
        .map(|x| {
            Ok((
                Mxfp4Weight::new(&gate_up_blocks.get(x)?, &gate_up_scales.get(x)?)?.select_rows(gate_up_rows),
                floats(gate_up_bias.get(x)?.index_select(&order, 0)?)?,
                Mxfp4Weight::new(&down_blocks.get(x)?, &down_scales.get(x)?)?,
                floats(down_bias.get(x)?)?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let experts: Vec<peagle_kernels::Mxfp4Expert> = weights
        .iter()
        .map(|(gate_up, gate_up_bias, down, down_bias)| peagle_kernels::Mxfp4Expert {
            gate_up,
            gate_up_bias,
            down,
            down_bias,
        })
        .collect();
    peagle_kernels::Mxfp4Experts::new(device, &experts)
}

enum Stored {
    Dense(Tensor),
    Mxfp4((Tensor, Tensor)),
}

/// The `k` best experts of one row, best first (ties to the lower index), each with its
/// weight: its softmax share among the `k` chosen, or among all experts when not `normalize`.
fn route(scores: &[f32], k: usize, normalize: bool) -> Vec<(usize, f32)> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]).then(a.cmp(b)));
    let max = scores[order[0]];
    let exps: Vec<f32> = order.iter().map(|e| (scores[*e] - max).exp()).collect();
    let sum: f32 = match normalize {
        true => exps[..k].iter().sum(),
        false => exps.iter().sum(),
    };
    order.into_iter().zip(exps).take(k).map(|(e, x)| (e, x / sum)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_takes_the_best_k_and_normalises_over_them_only() {
        let scores = [0.5, 2.0, -1.0, 2.0, 1.0];
        let picked = route(&scores, 3, true);
        let experts: Vec<usize> = picked.iter().map(|(e, _)| *e).collect();
        assert_eq!(experts, [1, 3, 4]);
        let z = 2.0 * 1f32.exp() + 1.0;
        assert!((picked[0].1 - 1f32.exp() / z).abs() < 1e-6);
        assert!((picked[2].1 - 1.0 / z).abs() < 1e-6);
    }

    #[test]
    fn without_normalizing_the_weights_are_shares_of_all_experts() {
        let scores = [0.5, 2.0, -1.0, 2.0, 1.0];
        let picked = route(&scores, 2, false);
        let z: f32 = scores.iter().map(|s| (s - 2.0f32).exp()).sum();
        assert_eq!(picked.iter().map(|(e, _)| *e).collect::<Vec<_>>(), [1, 3]);
        assert!(picked.iter().all(|(_, w)| (w - 1.0 / z).abs() < 1e-6));
    }
}
