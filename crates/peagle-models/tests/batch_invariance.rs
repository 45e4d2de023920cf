//! A row's logits and captured states are bit-identical however it is batched: alone, as one
//! of K+1 rows of a verification window, or next to other sequences. Speculative decoding's
//! exactness rests on this.

mod common;
use common::*;

#[test]
fn window_rows_equal_single_token_steps_bitwise() {
    for name in FIXTURES {
        let f = Fixture::load(name);
        let (singles, windowed, batched) = window_three_ways(&f, 8);
        for (mode, rows) in [("window", &windowed), ("window in a mixed batch", &batched)] {
            assert_eq!(bits(&rows.0), bits(&singles.0), "{name} {mode}: logits");
            assert_eq!(bits(&rows.1), bits(&singles.1), "{name} {mode}: captured states");
            assert_eq!(bits(&rows.2), bits(&singles.2), "{name} {mode}: final states");
        }
    }
}
