//! The first tokens of a row in order of logit, by partial selection instead of a sort.
//!
//! The order is sampling's (`SamplingParams::probabilities`): largest logit first by
//! `f32::total_cmp`, ties to the lower index.

use std::cmp::Ordering;

/// Where token `a` stands against token `b` in the order.
fn by_logit(row: &[f32], a: u32, b: u32) -> Ordering {
    row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b))
}

/// `f32::total_cmp`'s order as an integer's (the same bit twiddle).
fn order_key(x: f32) -> i32 {
    let bits = x.to_bits() as i32;
    bits ^ (((bits >> 31) as u32) >> 1) as i32
}

/// Tokens tested together: once a floor is set, a block without a key above it (and at most
/// the ceiling) is passed over after one test the compiler vectorises.
const BLOCK: usize = 16;
/// Every this many tokens one goes into the sample that guesses a floor.
const SAMPLE: usize = 64;

/// Indices of the `count` tokens of `row` that come first in the order after token `after`
/// (from the start without it), in that order.
///
/// One pass collects candidates above a floor, up to `2 * count` at a time; when they fill
/// up, selection cuts them back to the first `count`, and the last of those raises the floor.
/// A token at or below the floor cannot be among the first `count` once `count` candidates
/// above it are found (a tie neither, as the earlier index wins). The first floor is guessed
/// from a sample of the row, so that about `2 * count` tokens pass it: one vector comparison
/// per token, about one selection, then one sort of `count`. A guess that passes too few
/// tokens is dropped and the pass repeated from no floor.
pub fn top_tokens(row: &[f32], count: usize, after: Option<u32>) -> Vec<u32> {
    if count == 0 {
        return Vec::new();
    }
    // The tokens up to `after` in the order: keys above the ceiling, and the ceiling's own up
    // to `after`'s index.
    let ceiling = after.map_or(i32::MAX, |a| order_key(row[a as usize]));
    let precedes = |key: i32, i: usize| after.is_some_and(|a| key > ceiling || (key == ceiling && i <= a as usize));
    let guess = guess_floor(row, count, ceiling);
    let mut kept = candidates(row, count, guess, ceiling, precedes);
    if kept.len() < count && guess.is_some() {
        kept = candidates(row, count, None, ceiling, precedes);
    }
    cut(row, &mut kept, count);
    kept.sort_unstable_by(|a, b| by_logit(row, *a, *b));
    kept
}

/// The tokens above `floor` that do not precede the ceiling, less those that selection shows
/// cannot be among the first `count`.
fn candidates(
    row: &[f32],
    count: usize,
    mut floor: Option<i32>,
    ceiling: i32,
    precedes: impl Fn(i32, usize) -> bool,
) -> Vec<u32> {
    let mut kept: Vec<u32> = Vec::with_capacity(2 * count);
    for (b, block) in row.chunks(BLOCK).enumerate() {
        if let Some(floor) = floor {
            let open = block.iter().fold(false, |open, &logit| {
                let key = order_key(logit);
                open | ((key > floor) & (key <= ceiling))
            });
            if !open {
                continue;
            }
        }
        for (k, &logit) in block.iter().enumerate() {
            let (i, key) = (b * BLOCK + k, order_key(logit));
            if floor.is_some_and(|f| key <= f) || precedes(key, i) {
                continue;
            }
            kept.push(i as u32);
            if kept.len() == 2 * count {
                cut(row, &mut kept, count);
                floor = Some(order_key(row[kept[count - 1] as usize]));
            }
        }
    }
    kept
}

/// A key about `2 * count` tokens below the ceiling exceed, from every `SAMPLE`-th token;
/// none where the sample is too small to tell.
fn guess_floor(row: &[f32], count: usize, ceiling: i32) -> Option<i32> {
    let rank = 2 * count / SAMPLE;
    let mut keys: Vec<i32> = row
        .iter()
        .step_by(SAMPLE)
        .map(|&logit| order_key(logit))
        .filter(|&key| key < ceiling)
        .collect();
    if rank == 0 || keys.len() <= rank {
        return None;
    }
    Some(*keys.select_nth_unstable_by(rank, |a, b| b.cmp(a)).1)
}

/// Keeps the first `count` (at least one) of `kept` in the order, the last of them at the end.
fn cut(row: &[f32], kept: &mut Vec<u32>, count: usize) {
    if kept.len() > count {
        kept.select_nth_unstable_by(count - 1, |a, b| by_logit(row, *a, *b));
        kept.truncate(count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    #[test]
    fn the_first_tokens_are_those_of_a_full_sort() {
        let mut rng = StdRng::seed_from_u64(1);
        for n in [1, 2, 7, 100, 1000, 5000] {
            // Few distinct values, both zeros and infinities: ties everywhere.
            let values = [0.0, -0.0, 1.5, -2.0, 3.0, f32::NEG_INFINITY, f32::INFINITY];
            let row: Vec<f32> = (0..n).map(|_| values[rng.random_range(0..values.len())]).collect();
            let mut sorted: Vec<u32> = (0..n as u32).collect();
            sorted.sort_by(|a, b| by_logit(&row, *a, *b));
            for count in [0, 1, 2, 3, 10, 333, 2000, n, n + 5] {
                assert_eq!(
                    top_tokens(&row, count, None),
                    sorted[..count.min(n)],
                    "n {n}, count {count}"
                );
                for from in [0, n / 2, n - 1] {
                    let after = &sorted[from + 1..];
                    let expected = &after[..count.min(after.len())];
                    assert_eq!(
                        top_tokens(&row, count, Some(sorted[from])),
                        expected,
                        "n {n}, {count} after {from}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_integer_key_orders_as_total_cmp() {
        let xs = [f32::NEG_INFINITY, -3.5, -0.0, 0.0, 1e-40, 2.0, f32::MAX, f32::INFINITY];
        for a in xs {
            for b in xs {
                assert_eq!(order_key(a).cmp(&order_key(b)), a.total_cmp(&b), "{a} against {b}");
            }
        }
    }
}
