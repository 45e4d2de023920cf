//! Fixtures shared by the training tests: the tiny Llama target and a drafter on variables.
// Each test binary compiles this module and uses only some of it.
#![allow(dead_code)]

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use peagle_models::{load_target, LoadOptions, TargetModel};
use peagle_train::DraftVocab;
use safetensors::Dtype;
use std::collections::BTreeMap;
use std::path::PathBuf;

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

pub fn tiny_target() -> Box<dyn TargetModel> {
    load_target(&fixture("tiny-llama"), LoadOptions::default())
        .unwrap()
        .model
}

/// The float weights of a committed drafter fixture, in f32.
pub fn drafter_weights(name: &str) -> BTreeMap<String, Tensor> {
    let path = fixture(name).join("model.safetensors");
    // SAFETY: a read-only map of a committed fixture.
    let st = unsafe { MmapedSafetensors::new(path) }.unwrap();
    st.tensors()
        .into_iter()
        .filter(|(_, view)| matches!(view.dtype(), Dtype::F32 | Dtype::BF16 | Dtype::F16))
        .map(|(n, _)| {
            let t = st.load(&n, &Device::Cpu).unwrap().to_dtype(DType::F32).unwrap();
            (n, t)
        })
        .collect()
}

/// The identity draft vocabulary of `size` over the tiny target's 384 tokens.
pub fn identity_vocab(size: u32) -> DraftVocab {
    DraftVocab {
        selected: (0..size).collect(),
        target_vocab_size: 384,
    }
}
