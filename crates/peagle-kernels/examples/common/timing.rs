//! What the GPU examples share: the mean time of a launch.

use candle_core::{Device, Tensor};
use std::time::Instant;

/// Seconds one call of `f` takes on `device`, the mean of `reps` after one to warm up.
pub fn time(device: &Device, reps: usize, f: impl Fn() -> candle_core::Result<Tensor>) -> candle_core::Result<f64> {
    f()?;
    device.synchronize()?;
    let start = Instant::now();
    for _ in 0..reps {
        f()?;
    }
    device.synchronize()?;
    Ok(start.elapsed().as_secs_f64() / reps as f64)
}
