//! The first tokens of a row in order of logit, by partial selection instead of a sort.
//!
//! The order is sampling's (`SamplingParams::probabilities`): largest logit first by
//! `f32::total_cmp`, ties to the lower index.

use std::cmp::Ordering;

/// Where token `a` stands against token `b` in the order.
fn by_logit(row: &[f32], a: u32, b: u32) -> Ordering {
    row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b))
}

/// `f32::total_cmp`'s order as an integer's (the same bit twiddle), widened so that
/// `i64::MIN` and `i64::MAX` lie outside it.
fn order_key(x: f32) -> i64 {
    let bits = x.to_bits() as i32;
    i64::from(bits ^ (((bits >> 31) as u32) >> 1) as i32)
}

/// Indices of the `count` tokens of `row` that come first in the order after token `after`
/// (from the start without it), in that order.
///
/// One pass collects candidates, up to `2 * count` at a time; when they fill up, selection
/// cuts them back to the first `count`, and the last of those sets a floor. A later token at
/// or below the floor cannot be among the first `count`: `count` tokens precede it already (a
/// tie too, as every later token has a higher index). About two comparisons per token, a
/// selection per `count` admitted tokens, then one sort of `count`.
pub fn top_tokens(row: &[f32], count: usize, after: Option<u32>) -> Vec<u32> {
    if count == 0 {
        return Vec::new();
    }
    let (ceiling, ceiling_index) = after.map_or((i64::MAX, 0), |a| (order_key(row[a as usize]), a as usize));
    let mut kept: Vec<u32> = Vec::with_capacity(2 * count);
    let mut floor = i64::MIN;
    for (i, &logit) in row.iter().enumerate() {
        let key = order_key(logit);
        if key <= floor || key > ceiling || (key == ceiling && i <= ceiling_index) {
            continue;
        }
        kept.push(i as u32);
        if kept.len() == 2 * count {
            cut(row, &mut kept, count);
            floor = order_key(row[kept[count - 1] as usize]);
        }
    }
    cut(row, &mut kept, count);
    kept.sort_unstable_by(|a, b| by_logit(row, *a, *b));
    kept
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
        for n in [1, 2, 7, 100, 1000] {
            // Few distinct values, both zeros and infinities: ties everywhere.
            let values = [0.0, -0.0, 1.5, -2.0, 3.0, f32::NEG_INFINITY, f32::INFINITY];
            let row: Vec<f32> = (0..n).map(|_| values[rng.random_range(0..values.len())]).collect();
            let mut sorted: Vec<u32> = (0..n as u32).collect();
            sorted.sort_by(|a, b| by_logit(&row, *a, *b));
            for count in [0, 1, 2, 3, 10, 333, n, n + 5] {
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
