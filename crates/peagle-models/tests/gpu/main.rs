//! The fixture models on a GPU: logits against HF transformers (f32) and against the CPU
//! (bf16), a row's bits independent of its batch, and steps by CUDA graphs equal to steps
//! without (`graphs`). Built with the `cuda` feature only and run by scripts/gpu_check.sh;
//! without a GPU each test says so and passes.
#![cfg(feature = "cuda")]

#[path = "../common/mod.rs"]
mod common;
mod graphs;

use candle_core::{DType, Tensor};
use common::*;
use peagle_kernels::CudaMatmul;
use peagle_models::{DTypeSpec, DeviceSpec, LoadOptions};

/// The fixtures whose architectures have CUDA kernels in every dtype: gpt-oss's from its
/// MXFP4 checkpoint.
const GPU_FIXTURES: [&str; 3] = ["tiny-llama", "tiny-qwen3", "tiny-gpt-oss-mxfp4"];

/// Mixtures of dense experts, which run on the tensor cores in bf16 (`DenseExperts`) where the
/// process's matmul is theirs; elsewhere (f32, `PEAGLE_CUDA_MATMUL=fma`) Qwen3-MoE's run one
/// at a time, routed on the host, and dense gpt-oss refuses the GPU.
const DENSE_EXPERT_FIXTURES: [&str; 2] = ["tiny-qwen3-moe", "tiny-gpt-oss"];

/// The fixtures that run on a GPU in bf16, their experts on the device.
fn bf16_fixtures() -> Vec<&'static str> {
    let tensor_cores = CudaMatmul::chosen() == Ok(CudaMatmul::Mma);
    let dense = DENSE_EXPERT_FIXTURES.into_iter().filter(|_| tensor_cores);
    GPU_FIXTURES.into_iter().chain(dense).collect()
}

fn on_gpu(dtype: DTypeSpec) -> Option<LoadOptions> {
    match LoadOptions::place(DeviceSpec::Cuda(0), dtype) {
        Ok(options) => Some(options),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

#[test]
fn f32_logits_equal_transformers_prefilled_and_token_by_token() {
    let Some(options) = on_gpu(DTypeSpec::F32) else { return };
    for name in GPU_FIXTURES {
        let f = Fixture::load_with(name, options.clone());
        for p in 0..3 {
            let prompt = f.prompt(p);
            let whole = run(f.model.as_ref(), &f.cache(), &[(0, &prompt, 0)]).remove(0);
            let kv = f.cache();
            let steps: Vec<Rowset> = (0..prompt.len())
                .map(|i| run(f.model.as_ref(), &kv, &[(0, &prompt[i..i + 1], i)]).remove(0))
                .collect();
            for (mode, got) in [("prefill", whole), ("token by token", cat_rows(&steps))] {
                let diff = max_abs_diff(&got.0, &f.reference(p, "logits"));
                assert!(diff < 1e-4, "{name} prompt {p} {mode}: logits off by {diff}");
            }
        }
    }
}

/// bf16 keeps 8 bits of each weight and activation, so logits of the fixtures' size (up to
/// about 4) drift from f32's by a few hundredths; a wrong kernel errs by whole units. A mixture
/// of experts routes each row on bf16 router scores, and where two experts nearly tie, bf16 may
/// choose the other one, as any bf16 engine may: that row's logits, and those of the rows that
/// attend to it, move by whole units. Most of its rows must stay within the bound.
#[test]
fn bf16_logits_are_within_0_1_of_the_cpu() {
    let Some(options) = on_gpu(DTypeSpec::Bf16) else { return };
    for name in bf16_fixtures() {
        let gpu = Fixture::load_with(name, options.clone());
        let cpu = Fixture::load(name);
        for p in 0..3 {
            let prompt = gpu.prompt(p);
            let got = run(gpu.model.as_ref(), &gpu.cache(), &[(0, &prompt, 0)]).remove(0);
            let want = run(cpu.model.as_ref(), &cpu.cache(), &[(0, &prompt, 0)]).remove(0);
            let (mut rows, mean) = abs_diffs(&got.0, &want.0);
            rows.sort_by(f32::total_cmp);
            let (median, max) = (rows[rows.len() / 2], rows[rows.len() - 1]);
            let over = rows.iter().filter(|d| **d >= 0.1).count();
            eprintln!(
                "{name} prompt {p}: bf16 GPU logits within {max} of the f32 CPU (mean {mean}, median row {median}, \
                 {over} of {} rows over 0.1)",
                rows.len()
            );
            match name.contains("gpt-oss") || name.contains("moe") {
                true => assert!(
                    median < 0.1,
                    "{name} prompt {p}: bf16 logits' median row off by {median}"
                ),
                false => assert!(max < 0.1, "{name} prompt {p}: bf16 logits off by {max}"),
            }
        }
    }
}

/// The largest difference between `a` and `b` [rows, cols] in each row, and the mean one.
fn abs_diffs(a: &candle_core::Tensor, b: &candle_core::Tensor) -> (Vec<f32>, f32) {
    let host = |t: &candle_core::Tensor| {
        t.to_dtype(DType::F32)
            .unwrap()
            .to_device(&candle_core::Device::Cpu)
            .unwrap()
    };
    let diffs = (host(a) - host(b)).unwrap().abs().unwrap();
    let mean = diffs.mean_all().unwrap().to_scalar().unwrap();
    (diffs.max(1).unwrap().to_vec1().unwrap(), mean)
}

/// An FP8 cache on the GPU errs from transformers' f32 logits as it does on the CPU (see
/// fp8_kv_cache.rs): a relative error under 0.2, and at most twice the CPU's.
#[test]
fn fp8_cache_logits_err_as_on_the_cpu() {
    let Some(options) = on_gpu(DTypeSpec::F32) else { return };
    let relative_error = |f: &Fixture, p: usize| {
        let got = run(f.model.as_ref(), &f.cache(), &[(0, &f.prompt(p), 0)]).remove(0).0;
        let want = f.reference(p, "logits");
        let norm = |t: &candle_core::Tensor| {
            t.to_device(&candle_core::Device::Cpu)
                .unwrap()
                .sqr()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
                .sqrt()
        };
        norm(&(got.to_device(&candle_core::Device::Cpu).unwrap() - &want).unwrap()) / norm(&want)
    };
    for name in GPU_FIXTURES {
        let gpu = Fixture::load_with(name, options.clone()).with_cache_dtype(DType::F8E4M3);
        let cpu = Fixture::load(name).with_cache_dtype(DType::F8E4M3);
        for p in 0..3 {
            let (on_gpu, on_cpu) = (relative_error(&gpu, p), relative_error(&cpu, p));
            eprintln!("{name} prompt {p}: fp8 cache, relative error {on_gpu} on the GPU, {on_cpu} on the CPU");
            assert!(
                on_gpu < 0.2 && on_gpu < 2.0 * on_cpu + 1e-3,
                "{name} prompt {p}: {on_gpu} against {on_cpu}"
            );
        }
    }
}

#[test]
fn window_rows_equal_single_token_steps_bitwise_on_the_gpu() {
    for dtype in [DTypeSpec::Bf16, DTypeSpec::F32] {
        let Some(options) = on_gpu(dtype) else { return };
        let names = match dtype {
            DTypeSpec::Bf16 => bf16_fixtures(),
            _ => GPU_FIXTURES.to_vec(),
        };
        for name in names {
            for fp8 in [false, true] {
                let mut f = Fixture::load_with(name, options.clone());
                if fp8 {
                    f = f.with_cache_dtype(DType::F8E4M3);
                }
                let what = format!("{name} {dtype}, fp8 cache {fp8}");
                let (singles, windowed, batched) = window_three_ways(&f, 8);
                assert_eq!(bits(&windowed.0), bits(&singles.0), "{what}: window logits");
                assert_eq!(bits(&batched.0), bits(&singles.0), "{what}: logits");
                assert_eq!(bits(&batched.1), bits(&singles.1), "{what}: captured states");
            }
        }
    }
}

/// Rows past 1024 positions, whose keys the attention kernel cuts into parts, give the same
/// bits in a verification window as one token a forward, where several blocks share a row's
/// parts, and beside another sequence's 300-row prefill chunk, whose rows make the launch give
/// each row one block.
#[test]
fn rows_past_1024_positions_equal_single_token_steps_bitwise_on_the_gpu() {
    const LEN: usize = 1100;
    const WINDOW: usize = 8;
    let long_table: Vec<u32> = (0..70).collect();
    let other_table: Vec<u32> = (70..90).collect();
    // f32 too: bf16 outputs round away most of a fold's last bits.
    for (dtype, name) in [DTypeSpec::Bf16, DTypeSpec::F32]
        .into_iter()
        .flat_map(|d| ["tiny-llama", "tiny-gpt-oss-mxfp4"].map(|n| (d, n)))
    {
        let Some(options) = on_gpu(dtype) else { return };
        let f = Fixture::load_with(name, options);
        let model = f.model.as_ref();
        let tokens: Vec<u32> = (0..3).flat_map(|p| f.prompt(p)).cycle().take(LEN).collect();
        // A cache with the long sequence's context but for its last WINDOW tokens. The three
        // ways of running the window share it: each writes the window's keys and values in a
        // layer before its attention reads them, so what an earlier way left there is never
        // read (and prefilling once spares the emulator two thirds of the test's work).
        let kv = f.cache_of(90);
        for start in (0..LEN - WINDOW).step_by(512) {
            let chunk = &tokens[start..(start + 512).min(LEN - WINDOW)];
            run_tables(model, &kv, &[(&long_table, chunk, start)]);
        }
        let window = &tokens[LEN - WINDOW..];
        let singles: Vec<Rowset> = (LEN - WINDOW..LEN)
            .map(|i| run_tables(model, &kv, &[(&long_table, &tokens[i..i + 1], i)]).remove(0))
            .collect();
        let singles = cat_rows(&singles);
        let windowed = run_tables(model, &kv, &[(&long_table, window, LEN - WINDOW)]).remove(0);
        let batched = run_tables(
            model,
            &kv,
            &[(&other_table, &tokens[..300], 0), (&long_table, window, LEN - WINDOW)],
        )
        .remove(1);
        let what = format!("{name} {dtype}");
        assert_eq!(bits(&windowed.0), bits(&singles.0), "{what}: window logits");
        assert_eq!(
            bits(&batched.0),
            bits(&singles.0),
            "{what}: logits beside a prefill chunk"
        );
        assert_eq!(bits(&batched.1), bits(&singles.1), "{what}: captured states");
    }
}

/// An FP8 checkpoint's weights stay FP8 on the GPU, and its logits are bit for bit those of
/// the dense checkpoint of its dequantized weights: the FP8 kernel scales each weight as it
/// reads it, then follows the f32 matmul's chain.
#[test]
fn an_fp8_checkpoint_equals_its_dequantized_weights_bitwise_on_the_gpu() {
    let Some(options) = on_gpu(DTypeSpec::F32) else { return };
    for block in [(16, 32), (48, 32)] {
        let (fp8, dense) = fp8_and_dense(block);
        let fp8 = Fixture::load_from(fp8.path(), options.clone());
        let dense = Fixture::load_from(dense.path(), options.clone());
        for p in 0..3 {
            let logits = |f: &Fixture| run(f.model.as_ref(), &f.cache(), &[(0, &f.prompt(p), 0)]).remove(0).0;
            assert_eq!(
                bits(&logits(&fp8)),
                bits(&logits(&dense)),
                "blocks {block:?}, prompt {p}"
            );
        }
    }
}

/// bf16 rows on an FP8 checkpoint take the tensor cores where its blocks are a multiple of 32
/// wide (the CUDA cores otherwise): logits within 0.1 of the CPU's f32 ones, as a bf16
/// model's are, and a prompt's logits have the same bits beside another prompt's prefill.
#[test]
fn an_fp8_checkpoint_in_bf16_is_near_the_cpu_and_batch_invariant_on_the_gpu() {
    let Some(options) = on_gpu(DTypeSpec::Bf16) else { return };
    for block in [(16, 32), (48, 40)] {
        let (fp8, _dense) = fp8_and_dense(block);
        let gpu = Fixture::load_from(fp8.path(), options.clone());
        let cpu = Fixture::load_from(fp8.path(), LoadOptions::default());
        assert_near_the_cpu_and_batch_invariant(&gpu, &cpu, false, &format!("blocks {block:?}"));
    }
}

/// `gpu`'s bf16 logits over the fixture's prompts against `cpu`'s, the same checkpoint's in
/// f32 on the CPU: within 0.1 on every row, or, where `routed` (a mixture of experts, where two
/// nearly tied experts may route a row otherwise in bf16), on the median row; and a prompt's
/// logits have the same bits beside another prompt's prefill.
fn assert_near_the_cpu_and_batch_invariant(gpu: &Fixture, cpu: &Fixture, routed: bool, what: &str) {
    for p in 0..3 {
        let prompt = gpu.prompt(p);
        let got = run(gpu.model.as_ref(), &gpu.cache(), &[(0, &prompt, 0)]).remove(0);
        let want = run(cpu.model.as_ref(), &cpu.cache(), &[(0, &prompt, 0)]).remove(0);
        let (mut rows, _) = abs_diffs(&got.0, &want.0);
        rows.sort_by(f32::total_cmp);
        let off = if routed {
            rows[rows.len() / 2]
        } else {
            rows[rows.len() - 1]
        };
        assert!(
            off < 0.1,
            "{what}, prompt {p}: bf16 logits off by {off} (routed {routed})"
        );
        let other = gpu.prompt((p + 1) % 3);
        let spans = [(1, other.as_slice(), 0), (0, prompt.as_slice(), 0)];
        let beside = run(gpu.model.as_ref(), &gpu.cache(), &spans).remove(1);
        assert_eq!(bits(&beside.0), bits(&got.0), "{what}, prompt {p}: beside another");
    }
}

#[test]
fn dense_gpt_oss_in_f32_refuses_the_gpu_in_one_line() {
    let Some(options) = on_gpu(DTypeSpec::F32) else { return };
    let err = match peagle_models::load_target(&fixture_dir("tiny-gpt-oss"), options) {
        Ok(_) => panic!("dense gpt-oss loaded on a GPU in f32, which its experts' kernels do not take"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("in bf16 on the tensor cores only") && !err.contains('\n'),
        "{err}"
    );
}

/// Qwen3-MoE in FP8 blocks, in bf16: its experts stay FP8 and run on the device where the
/// tensor cores take their blocks (a multiple of 32 wide), so a forward reads nothing back,
/// and one at a time otherwise; its logits within 0.1 of the CPU's f32 ones on most rows (a
/// near tie of two experts may route a row otherwise in bf16), and a prompt's logits have
/// the same bits beside another prompt's prefill.
#[test]
fn an_fp8_mixture_of_experts_in_bf16_is_near_the_cpu_and_batch_invariant_on_the_gpu() {
    let Some(options) = on_gpu(DTypeSpec::Bf16) else { return };
    let tensor_cores = CudaMatmul::chosen() == Ok(CudaMatmul::Mma);
    for (block, on_device) in [((32, 32), tensor_cores), ((16, 16), false)] {
        let (fp8, _dense) = fixture_fp8_and_dense("tiny-qwen3-moe", block);
        let gpu = Fixture::load_from(fp8.path(), options.clone());
        assert_eq!(gpu.model.reads_back(), !on_device, "blocks {block:?}");
        let cpu = Fixture::load_from(fp8.path(), LoadOptions::default());
        assert_near_the_cpu_and_batch_invariant(&gpu, &cpu, true, &format!("blocks {block:?}"));
    }
}

/// A trained weight projecting data that tracks no gradient (EAGLE-3's fc over captured
/// target states) gets its gradient on the GPU, as on the CPU: the ops take the kernels,
/// which have no backward, only when nothing is trained.
#[test]
fn a_trained_weight_over_untracked_input_gets_its_gradient() {
    let Some(options) = on_gpu(DTypeSpec::F32) else { return };
    let gradients = |device: &candle_core::Device| {
        let values =
            |n: usize, scale: f32| -> Vec<f32> { (0..n).map(|i| ((i * 37 % 23) as f32 - 11.0) * scale).collect() };
        let x = Tensor::from_vec(values(3 * 64, 0.05), (3, 64), device).unwrap();
        let w = candle_core::Var::from_vec(values(32 * 64, 0.01), (32, 64), device).unwrap();
        let b = candle_core::Var::from_vec(values(32, 0.1), 32, device).unwrap();
        let weight = peagle_models::ops::Weight::new(w.as_tensor().clone()).unwrap();
        let y = peagle_models::ops::linear(&x, &weight, Some(b.as_tensor())).unwrap();
        let gated = peagle_models::ops::linear_swiglu(&x, &weight, Some(b.as_tensor())).unwrap();
        let loss = (y.sqr().unwrap().sum_all().unwrap() + gated.sum_all().unwrap()).unwrap();
        let grads = loss.backward().unwrap();
        let host = |v: &candle_core::Var| {
            grads
                .get(v.as_tensor())
                .map(|g| g.to_device(&candle_core::Device::Cpu).unwrap())
        };
        (host(&w), host(&b))
    };
    let (gpu_w, gpu_b) = gradients(&options.device);
    let (cpu_w, cpu_b) = gradients(&candle_core::Device::Cpu);
    for (name, gpu, cpu) in [("weight", gpu_w, cpu_w), ("bias", gpu_b, cpu_b)] {
        let gpu = gpu.unwrap_or_else(|| panic!("no gradient for the {name} on the GPU"));
        let diff = max_abs_diff(&gpu, &cpu.unwrap());
        assert!(diff < 1e-4, "the {name}'s gradient is off by {diff}");
    }
}
