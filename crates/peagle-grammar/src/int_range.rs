//! Integers between bounds as a regex (a JSON schema's `minimum` and `maximum` on an
//! integer): the decimal strings, without leading zeros, of exactly the integers in range. A
//! range splits into runs of equal digit count, and each run into a few digit patterns (the
//! classic construction: the low end's tail up to all nines, whole digits between, the high
//! end's tail from all zeros).

/// The largest magnitude an integer's text may have (16 digits, as the JSON grammar allows).
pub const MAX_MAGNITUDE: i128 = 9_999_999_999_999_999;

/// A regex matching exactly the integers in `lo..=hi` (either end open when None); None when
/// no integer of at most 16 digits is in range.
pub fn int_range_pattern(lo: Option<i128>, hi: Option<i128>) -> Option<String> {
    let lo = lo.unwrap_or(-MAX_MAGNITUDE).max(-MAX_MAGNITUDE);
    let hi = hi.unwrap_or(MAX_MAGNITUDE).min(MAX_MAGNITUDE);
    if lo > hi {
        return None;
    }
    let mut alternatives = Vec::new();
    if hi >= 0 {
        alternatives.extend(natural_range(lo.max(0) as u64, hi as u64));
    }
    if lo < 0 {
        // The negatives' magnitudes, -min(hi, -1) up to -lo; "-0" is not written.
        let magnitudes = natural_range((-hi.min(-1)) as u64, (-lo) as u64);
        alternatives.push(format!("-({})", magnitudes.join("|")));
    }
    Some(alternatives.join("|"))
}

/// Patterns for the naturals `lo..=hi` (lo <= hi), one or more per digit count.
fn natural_range(lo: u64, hi: u64) -> Vec<String> {
    let digits = |n: u64| n.to_string().len() as u32;
    let mut out = Vec::new();
    for d in digits(lo)..=digits(hi) {
        let first = if d == 1 { 0 } else { 10u64.pow(d - 1) };
        let last = 10u64.pow(d) - 1;
        out.extend(same_length(&lo.max(first).to_string(), &hi.min(last).to_string()));
    }
    out
}

/// Patterns for the digit strings of one length from `lo` to `hi` (lo <= hi as numbers).
fn same_length(lo: &str, hi: &str) -> Vec<String> {
    if lo == hi {
        return vec![lo.to_string()];
    }
    let (lo, hi) = (lo.as_bytes(), hi.as_bytes());
    let i = (0..lo.len()).find(|&i| lo[i] != hi[i]).expect("the strings differ");
    let prefix = std::str::from_utf8(&lo[..i]).expect("digits");
    let rest = lo.len() - i - 1;
    let any = |n: usize| if n == 0 { String::new() } else { format!("[0-9]{{{n}}}") };
    let lo_tail_zeros = lo[i + 1..].iter().all(|&b| b == b'0');
    let hi_tail_nines = hi[i + 1..].iter().all(|&b| b == b'9');
    let mut out = Vec::new();
    if !lo_tail_zeros {
        let tail = std::str::from_utf8(&lo[i + 1..]).expect("digits");
        for p in same_length(tail, &"9".repeat(rest)) {
            out.push(format!("{prefix}{}{p}", lo[i] as char));
        }
    }
    let from = if lo_tail_zeros { lo[i] } else { lo[i] + 1 };
    let to = if hi_tail_nines { hi[i] } else { hi[i] - 1 };
    if from <= to {
        out.push(format!("{prefix}[{}-{}]{}", from as char, to as char, any(rest)));
    }
    if !hi_tail_nines {
        let tail = std::str::from_utf8(&hi[i + 1..]).expect("digits");
        for p in same_length(&"0".repeat(rest), tail) {
            out.push(format!("{prefix}{}{p}", hi[i] as char));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every integer from -1200 to 1200 matches the pattern of a range exactly when it is in
    /// the range, and no other spelling (a leading zero, "-0", "+1") matches, for ranges with
    /// ends on both sides of zero, on digit boundaries and open.
    #[test]
    fn a_range_pattern_matches_exactly_the_integers_in_it() {
        let ends = [
            None,
            Some(-1000),
            Some(-101),
            Some(-99),
            Some(-10),
            Some(-1),
            Some(0),
            Some(1),
            Some(9),
            Some(10),
            Some(99),
            Some(100),
            Some(347),
            Some(1000),
        ];
        for lo in ends {
            for hi in ends {
                let Some(pattern) = int_range_pattern(lo, hi) else {
                    assert!(lo.zip(hi).is_some_and(|(l, h)| l > h), "{lo:?}..={hi:?} is not empty");
                    continue;
                };
                let re = regex::Regex::new(&format!("^(?:{pattern})$")).unwrap();
                for n in -1200i128..=1200 {
                    let inside = lo.is_none_or(|l| n >= l) && hi.is_none_or(|h| n <= h);
                    assert_eq!(re.is_match(&n.to_string()), inside, "{n} in {lo:?}..={hi:?}: {pattern}");
                }
                for spelling in ["01", "-0", "+1", "00", ""] {
                    assert!(!re.is_match(spelling), "{spelling:?} in {lo:?}..={hi:?}: {pattern}");
                }
            }
        }
        let big = regex::Regex::new(&format!("^(?:{})$", int_range_pattern(Some(5), None).unwrap())).unwrap();
        assert!(big.is_match("9999999999999999") && !big.is_match("10000000000000000"));
    }
}
