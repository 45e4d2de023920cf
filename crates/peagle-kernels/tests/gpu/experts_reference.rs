//! What the mixture-of-experts tests share, whatever the experts' weights: the block in f64 as
//! their reference, router logits that test the routing's order, and the check that a row
//! gives the same bits in every tile form.
use super::{bits, values};
use candle_core::{Device, Tensor};
use peagle_kernels::{MmaTiles, Routing};

/// An expert's weights as the reference takes them, [2I, H] and [H, I] row-major, in f32, and its
/// biases.
pub(super) struct ReferenceExpert {
    pub gate_up: Vec<f32>,
    pub gate_up_bias: Vec<f32>,
    pub down: Vec<f32>,
    pub down_bias: Vec<f32>,
}

/// Where a kernel rounds to bf16 what the f64 reference keeps: nowhere (f32 rows), the
/// activations (the MXFP4 tensor-core kernels, which read them as bf16 operands), or every
/// projection's output as a bf16 linear layer does, and the activations (the dense kernels).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Rounding {
    None,
    Activations,
    Projections,
}

fn rounded(v: f64, to_bf16: bool) -> f64 {
    match to_bf16 {
        true => half::bf16::from_f32(v as f32).to_f64(),
        false => v,
    }
}

/// The mixture-of-experts block in f64 over the experts' weights: each row's `top_k` best
/// experts (ties to the lower index), weighted by a softmax over them (or their shares of one
/// over all), each a SwiGLU MLP with biases; what `rounding` names rounded to f32, then bf16.
pub(super) fn moe_reference(
    x: &[f32],
    logits: &[f32],
    experts: &[ReferenceExpert],
    hidden: usize,
    routing: &Routing,
    rounding: Rounding,
) -> Vec<f32> {
    let projections = rounding == Rounding::Projections;
    let (num_experts, inter) = (experts.len(), experts[0].gate_up_bias.len() / 2);
    let dot = |w: &[f32], x: &[f64]| w.iter().zip(x).map(|(a, b)| *a as f64 * b).sum::<f64>();
    x.chunks_exact(hidden)
        .zip(logits.chunks_exact(num_experts))
        .flat_map(|(x, scores)| {
            let x: Vec<f64> = x.iter().map(|v| *v as f64).collect();
            let mut order: Vec<usize> = (0..num_experts).collect();
            order.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]).then(a.cmp(b)));
            let max = scores[order[0]] as f64;
            let exps: Vec<f64> = order.iter().map(|e| (scores[*e] as f64 - max).exp()).collect();
            let sum: f64 = if routing.normalize {
                exps[..routing.top_k].iter().sum()
            } else {
                exps.iter().sum()
            };
            let mut out = vec![0f64; hidden];
            for (rank, e) in order.iter().take(routing.top_k).enumerate() {
                let ReferenceExpert {
                    gate_up,
                    gate_up_bias,
                    down,
                    down_bias,
                } = &experts[*e];
                let act: Vec<f64> = (0..inter)
                    .map(|c| {
                        let g = dot(&gate_up[c * hidden..][..hidden], &x) + gate_up_bias[c] as f64;
                        let u = dot(&gate_up[(inter + c) * hidden..][..hidden], &x) + gate_up_bias[inter + c] as f64;
                        let (g, u) = (rounded(g, projections), rounded(u, projections));
                        match routing.clamp {
                            Some((alpha, limit)) => {
                                let (g, u) = (g.min(limit as f64), u.clamp(-limit as f64, limit as f64));
                                (u + 1.0) * g / (1.0 + (-g * alpha as f64).exp())
                            }
                            None => g / (1.0 + (-g).exp()) * u,
                        }
                    })
                    .map(|a| rounded(a, rounding != Rounding::None))
                    .collect();
                for (h, o) in out.iter_mut().enumerate() {
                    let y = dot(&down[h * inter..][..inter], &act) + down_bias[h] as f64;
                    *o += exps[rank] / sum * rounded(y, projections);
                }
            }
            out.into_iter().map(|v| v as f32)
        })
        .collect()
}

/// Random router logits but for rows that only an order as total as the CPU's sort ranks
/// alike: row 1 of signed zeros (+0 ranks above -0), row 2 of one value throughout (ties go
/// to the lower index).
pub(super) fn router_logits(rows: usize, experts: usize) -> Tensor {
    let mut v = values(rows * experts, 8, 3.0);
    for (e, z) in v[experts..2 * experts].iter_mut().enumerate() {
        *z = if e % 3 == 0 { -0.0 } else { 0.0 };
    }
    v[2 * experts..3 * experts].fill(1.5);
    Tensor::from_vec(v, (rows, experts), &Device::Cpu).unwrap()
}

/// The rows `favouring_two` routes.
pub(super) const TILE_FORM_ROWS: usize = 40;

/// Router logits of TILE_FORM_ROWS rows that all favour experts 0 and 1 (of `experts`), so that
/// at top 4 they fill a wide tile of each and part of another.
pub(super) fn favouring_two(experts: usize) -> Tensor {
    let mut scores = values(TILE_FORM_ROWS * experts, 8, 1.0);
    for row in scores.chunks_exact_mut(experts) {
        row[0] += 4.0;
        row[1] += 3.0;
    }
    Tensor::from_vec(scores, (TILE_FORM_ROWS, experts), &Device::Cpu).unwrap()
}

/// A block's output for the `favouring_two` rows from `first` on, `n` of them, in `tiles`
/// (`forward`): the rows in narrow tiles, in wide ones and as the batch chooses (wide) agree bit
/// for bit, and with each row alone (narrow) and the first 16 together (64 pairs: narrow).
/// Returns the rows' output in wide tiles.
pub(super) fn assert_every_tile_form_gives_the_same_bits(forward: impl Fn(usize, usize, MmaTiles) -> Tensor) -> Tensor {
    let rows = TILE_FORM_ROWS;
    let wide = forward(0, rows, MmaTiles::Wide);
    for tiles in [MmaTiles::Narrow, MmaTiles::ByBatch] {
        assert_eq!(bits(&forward(0, rows, tiles)), bits(&wide), "{tiles:?}");
    }
    let first = forward(0, 16, MmaTiles::ByBatch);
    assert_eq!(bits(&first), bits(&wide.narrow(0, 0, 16).unwrap()), "the first 16 rows");
    for r in 0..rows {
        let alone = forward(r, 1, MmaTiles::ByBatch);
        assert_eq!(bits(&alone), bits(&wide.narrow(0, r, 1).unwrap()), "row {r} alone");
    }
    wide
}
