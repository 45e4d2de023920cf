//! A row's logits and captured states are bit-identical however it is batched: alone, as one
//! of K+1 rows of a verification window, or next to other sequences. Speculative decoding's
//! exactness rests on this.

mod common;
use common::*;

#[test]
fn window_rows_equal_single_token_steps_bitwise() {
    for name in FIXTURES {
        let f = Fixture::load(name);
        let prompt = f.prompt(2);
        let n = prompt.len();
        let window = 8;

        let kv = f.cache();
        let singles: Vec<Rowset> = (0..n)
            .map(|i| run(f.model.as_ref(), &kv, &[(0, &prompt[i..i + 1], i)]).remove(0))
            .collect();
        let singles = cat_rows(&singles[n - window..]);

        let kv = f.cache();
        run(f.model.as_ref(), &kv, &[(0, &prompt[..n - window], 0)]);
        let windowed = run(f.model.as_ref(), &kv, &[(0, &prompt[n - window..], n - window)]).remove(0);

        // The same window again, now batched with a decode of p0 and a prefill of p1.
        let kv = f.cache();
        let (p0, p1) = (f.prompt(0), f.prompt(1));
        run(
            f.model.as_ref(),
            &kv,
            &[(0, &prompt[..n - window], 0), (1, &p0[..p0.len() - 1], 0)],
        );
        let batched = run(
            f.model.as_ref(),
            &kv,
            &[
                (1, &p0[p0.len() - 1..], p0.len() - 1),
                (0, &prompt[n - window..], n - window),
                (2, &p1, 0),
            ],
        )
        .remove(1);

        for (mode, rows) in [("window", &windowed), ("window in a mixed batch", &batched)] {
            assert_eq!(bits(&rows.0), bits(&singles.0), "{name} {mode}: logits");
            assert_eq!(bits(&rows.1), bits(&singles.1), "{name} {mode}: captured states");
            assert_eq!(bits(&rows.2), bits(&singles.2), "{name} {mode}: final states");
        }
    }
}
