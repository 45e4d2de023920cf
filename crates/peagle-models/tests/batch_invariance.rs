//! A row's logits and captured states are bit-identical however it is batched: alone, as one
//! of K+1 rows of a verification window, or next to other sequences. Speculative decoding's
//! exactness rests on this.

mod common;
use candle_core::DType;
use common::*;

#[test]
fn window_rows_equal_single_token_steps_bitwise_with_every_cache_dtype() {
    for name in FIXTURES {
        let mut f = Fixture::load(name);
        for cache in [DType::F32, DType::BF16, DType::F8E4M3] {
            f = f.with_cache_dtype(cache);
            let (singles, windowed, batched) = window_three_ways(&f, 8);
            for (mode, rows) in [("window", &windowed), ("window in a mixed batch", &batched)] {
                let what = format!("{name}, {cache:?} cache, {mode}");
                assert_eq!(bits(&rows.0), bits(&singles.0), "{what}: logits");
                assert_eq!(bits(&rows.1), bits(&singles.1), "{what}: captured states");
                assert_eq!(bits(&rows.2), bits(&singles.2), "{what}: final states");
            }
        }
    }
}
