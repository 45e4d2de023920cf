//! A verification window's drafts taken where they lie on the device (`BatchBuilder::add_then`,
//! `DeviceTokens`) give the forward the bits it has with the same tokens uploaded from the host,
//! padded to a CUDA graph's shape or not. The GPU tests run the same batches by graphs.

mod common;
use candle_core::{Device, Tensor};
use common::*;
use peagle_models::{BatchBuilder, DeviceIds, Rows};

#[test]
fn a_window_whose_drafts_lie_on_the_device_gives_the_bits_of_one_uploaded() {
    for name in FIXTURES {
        let f = Fixture::load(name);
        let model = f.model.as_ref();
        let (kv, device_kv) = (f.cache(), f.cache());
        prefill_but(&f, 6, &kv);
        prefill_but(&f, 6, &device_kv);
        for ((step, batch), sequences) in graph_steps(&f).into_iter().zip([4, 2, 2, 4]) {
            let want = model.forward(&batch, &kv).unwrap();
            let on_device = tokens_on_device(&batch, &Device::Cpu);
            let moved: usize = on_device.device_tokens.iter().map(|d| d.rows.len()).sum();
            assert_eq!(moved, batch.token_ids.len() - batch.attn.num_sequences(), "{step}");
            let got = model.forward(&on_device, &device_kv).unwrap();
            assert_same_step(&format!("{name}, {step}"), got, &device_kv, want, &kv);

            // Padded as a graph pads it, the inputs made as a graph's first run makes them.
            let want = model.forward(&batch, &kv).unwrap();
            let padded = on_device.padded(sequences, 8).unwrap();
            let states = model.forward_states(&model.inputs(&padded, &device_kv).unwrap(), &device_kv);
            let got = states.unwrap().first_rows(batch.token_ids.len()).unwrap();
            let got = got.logits(model).unwrap();
            assert_same_step(&format!("{name}, {step}, padded"), got, &device_kv, want, &kv);
        }
    }
}

/// `add_then` holds placeholders for the device's tokens and names their rows: one entry per
/// tensor, whichever sequences share it; rows grown to a drafter pass's shape move with them.
/// (Padding keeps them as they are: its rows follow the batch's.)
#[test]
fn add_then_names_the_rows_of_each_tensor() {
    let dev = Device::Cpu;
    let (a, b) = (
        Tensor::new(&[7u32, 8, 9], &dev).unwrap(),
        Tensor::new(&[5u32], &dev).unwrap(),
    );
    let ids = |t: &Tensor, picks: &[u32]| DeviceIds {
        ids: t.clone(),
        picks: picks.to_vec(),
    };
    let mut batch = BatchBuilder::new(BLOCK);
    batch.add(&[1, 2], 0, &[0], Rows::None, Rows::None).unwrap();
    let first = batch
        .add_then(&[3], &ids(&a, &[2, 0]), 4, &[1], Rows::All, Rows::None)
        .unwrap();
    batch
        .add_then(&[4], &ids(&b, &[0]), 6, &[2], Rows::All, Rows::None)
        .unwrap();
    batch
        .add_then(&[6], &ids(&a, &[1]), 2, &[3], Rows::All, Rows::None)
        .unwrap();
    let batch = batch.build();
    assert_eq!(first.logits, 0..3);
    assert_eq!(batch.token_ids, [1, 2, 3, 0, 0, 4, 0, 6, 0]);
    assert_eq!(batch.positions, [0, 1, 4, 5, 6, 6, 7, 2, 3]);
    let entries: Vec<_> = batch
        .device_tokens
        .iter()
        .map(|d| (d.ids.id(), d.rows.clone(), d.picks.clone()))
        .collect();
    assert_eq!(
        entries,
        [(a.id(), vec![3, 4, 8], vec![2, 0, 1]), (b.id(), vec![6], vec![0])]
    );

    let (grown, _) = batch.with_rows_each(3).unwrap();
    let rows: Vec<Vec<u32>> = grown.device_tokens.iter().map(|d| d.rows.clone()).collect();
    assert_eq!(rows, [vec![4, 5, 10], vec![7]]);
}
