//! Numbers between bounds as a regex (a JSON schema's `minimum`, `maximum` and their
//! exclusive forms on a number): the decimal texts (no exponent, at most 16 digits either
//! side of the point) whose values are in range. The integer part is a range of integers
//! (`int_range`); where it equals a bound's, the fraction's digits are held to that bound's,
//! digit by digit. Zero is written unsigned.

use crate::int_range::{int_range_pattern, MAX_MAGNITUDE};
use std::cmp::Ordering;

/// Most digits after the point.
const MAX_FRACTION: usize = 16;

/// One end of a range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    pub value: f64,
    pub inclusive: bool,
}

/// A bound's magnitude as its integer part and its fraction's digits (no trailing zeros).
#[derive(Debug, Clone, PartialEq)]
struct Decimal {
    int: i128,
    fraction: Vec<u8>,
    inclusive: bool,
}

impl Decimal {
    /// `value` (not negative) written out; None past the largest 16-digit integer.
    fn of(value: f64, inclusive: bool) -> Option<Self> {
        if value > MAX_MAGNITUDE as f64 {
            return None;
        }
        // Rust writes a float's shortest round-trip digits, never with an exponent.
        let text = format!("{value}");
        let (int, fraction) = text.split_once('.').unwrap_or((&text, ""));
        let fraction = fraction.trim_end_matches('0').bytes().map(|b| b - b'0').collect();
        Some(Self {
            int: int.parse().ok()?,
            fraction,
            inclusive,
        })
    }
}

/// A regex for the numbers in range (either end open when None); None when no number is.
pub fn number_range_pattern(lo: Option<Bound>, hi: Option<Bound>) -> Option<String> {
    let mut alternatives = Vec::new();
    let zero = Bound {
        value: 0.0,
        inclusive: true,
    };
    // The numbers at least 0: from lo (or 0, where lo is below it) to hi.
    if hi.is_none_or(|h| h.value > 0.0 || (h.value == 0.0 && h.inclusive)) {
        let from = match lo {
            Some(l) if l.value >= 0.0 => l,
            _ => zero,
        };
        let to = hi.and_then(|h| Decimal::of(h.value, h.inclusive));
        if let Some(from) = Decimal::of(from.value, from.inclusive) {
            alternatives.extend(magnitudes(&from, to.as_ref()));
        }
    }
    // The negative numbers: magnitudes above -hi (or 0) up to -lo.
    if lo.is_none_or(|l| l.value < 0.0) {
        let from = match hi {
            Some(h) if h.value < 0.0 => Decimal::of(-h.value, h.inclusive),
            _ => Decimal::of(0.0, false),
        };
        let to = lo.and_then(|l| Decimal::of(-l.value, l.inclusive));
        if let Some(p) = from.and_then(|from| magnitudes(&from, to.as_ref())) {
            alternatives.push(format!("-({p})"));
        }
    }
    (!alternatives.is_empty()).then(|| alternatives.join("|"))
}

/// A regex for the magnitude texts from `from` up to `to` (no limit when None).
fn magnitudes(from: &Decimal, to: Option<&Decimal>) -> Option<String> {
    let mut alternatives = Vec::new();
    let mut with_fraction = |int: String, fraction: Option<String>| {
        if let Some(fraction) = fraction {
            alternatives.push(format!("({int}){fraction}"));
        }
    };
    match to {
        Some(to) if to.int == from.int => {
            with_fraction(
                from.int.to_string(),
                fraction(
                    Some((&from.fraction, from.inclusive)),
                    Some((&to.fraction, to.inclusive)),
                ),
            );
        }
        Some(to) if to.int < from.int => return None,
        _ => {
            with_fraction(
                from.int.to_string(),
                fraction(Some((&from.fraction, from.inclusive)), None),
            );
            let top = to.map(|t| t.int - 1);
            if top.is_none_or(|t| t > from.int) {
                with_fraction(int_range_pattern(Some(from.int + 1), top)?, fraction(None, None));
            }
            if let Some(to) = to {
                with_fraction(to.int.to_string(), fraction(None, Some((&to.fraction, to.inclusive))));
            }
        }
    }
    (!alternatives.is_empty()).then(|| alternatives.join("|"))
}

/// A regex for what follows an integer part: nothing or `.` and 1 to 16 digits, such that
/// the fraction is above `lo` and below `hi` (each a bound's digits and whether it is
/// inclusive; None where the integer part already decides). None where no fraction fits.
fn fraction(lo: Option<(&[u8], bool)>, hi: Option<(&[u8], bool)>) -> Option<String> {
    let (empty, digits) = fraction_digits(lo, hi, MAX_FRACTION);
    let dotted = digits.map(|d| format!("\\.{d}"));
    match (empty, dotted) {
        (true, Some(d)) => Some(format!("({d})?")),
        (true, None) => Some(String::new()),
        (false, Some(d)) => Some(d),
        (false, None) => None,
    }
}

/// Digit strings D of at most `room` digits with lo <(=) 0.D <(=) hi: whether the empty one
/// is, and a regex for the others (None if there are none).
fn fraction_digits(lo: Option<(&[u8], bool)>, hi: Option<(&[u8], bool)>, room: usize) -> (bool, Option<String>) {
    // Where the bounds have run out of digits, the rest is zeros.
    let empty_fits =
        lo.is_none_or(|(l, incl)| incl && l.is_empty()) && hi.is_none_or(|(h, incl)| incl || !h.is_empty());
    if room == 0 {
        return (empty_fits, None);
    }
    if lo.is_none() && hi.is_none() {
        return (true, Some(format!("[0-9]{{1,{room}}}")));
    }
    // Each next digit's bounds on the rest; digits with the same outcome share a class.
    let mut groups: Vec<(u8, u8, Option<String>, bool)> = Vec::new();
    for d in 0..=9u8 {
        let next_lo = after_digit(lo, d, Ordering::Greater);
        let next_hi = after_digit(hi, d, Ordering::Less);
        let (Some(next_lo), Some(next_hi)) = (next_lo, next_hi) else {
            continue;
        };
        // Past a bound's digits with the rest of it zeros, an exclusive low end still needs
        // a digit above zero, and an inclusive high end takes zeros only.
        let (rest_empty, rest) = fraction_digits(next_lo, next_hi, room - 1);
        if !rest_empty && rest.is_none() {
            continue;
        }
        match groups.last_mut() {
            Some(g) if g.1 + 1 == d && g.2 == rest && g.3 == rest_empty => g.1 = d,
            _ => groups.push((d, d, rest, rest_empty)),
        }
    }
    let alternatives: Vec<String> = groups
        .into_iter()
        .map(|(from, to, rest, rest_empty)| {
            let class = if from == to {
                from.to_string()
            } else {
                format!("[{from}-{to}]")
            };
            match (rest, rest_empty) {
                (Some(r), true) => format!("{class}({r})?"),
                (Some(r), false) => format!("{class}{r}"),
                (None, _) => class,
            }
        })
        .collect();
    let digits = (!alternatives.is_empty()).then(|| format!("({})", alternatives.join("|")));
    (empty_fits, digits)
}

/// A fraction bound on the digits after `d`: Some(None) where `d` is on the bound's `inside`
/// (the rest is free), the bound's remaining digits where `d` is its digit (past its digits,
/// zeros), None where `d` crosses it.
fn after_digit(bound: Option<(&[u8], bool)>, d: u8, inside: Ordering) -> Option<Option<(&[u8], bool)>> {
    let Some((digits, inclusive)) = bound else {
        return Some(None);
    };
    match d.cmp(&digits.first().copied().unwrap_or(0)) {
        Ordering::Equal => Some(Some((digits.get(1..).unwrap_or_default(), inclusive))),
        side if side == inside => Some(None),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A text's value in hundredths, where it has at most two decimals.
    fn hundredths(text: &str) -> i64 {
        let (sign, magnitude) = match text.strip_prefix('-') {
            Some(m) => (-1, m),
            None => (1, text),
        };
        let (int, fraction) = magnitude.split_once('.').unwrap_or((magnitude, ""));
        let fraction = format!("{fraction:0<2}");
        sign * (int.parse::<i64>().unwrap() * 100 + fraction.parse::<i64>().unwrap())
    }

    /// Every text from -30 to 30 with no, one or two decimals matches a range's pattern
    /// exactly when its value is in range, for ends inclusive and exclusive, on both sides of
    /// zero, at zero, on and off whole numbers, and open.
    #[test]
    fn a_range_pattern_matches_exactly_the_numbers_in_it() {
        let mut texts = Vec::new();
        for int in 0..=30 {
            texts.push(int.to_string());
            for f in 0..10 {
                texts.push(format!("{int}.{f}"));
            }
            for f in 0..100 {
                texts.push(format!("{int}.{f:02}"));
            }
        }
        // Negative zero ("-0", "-0.00") is not written: the texts of 0 are unsigned.
        let negatives: Vec<String> = texts
            .iter()
            .filter(|t| hundredths(t) != 0)
            .map(|t| format!("-{t}"))
            .collect();
        texts.extend(negatives);
        let values = [
            None,
            Some(-12.5),
            Some(-1.0),
            Some(-0.25),
            Some(0.0),
            Some(0.05),
            Some(1.0),
            Some(3.75),
            Some(10.0),
            Some(29.99),
        ];
        for lo in values {
            for hi in values {
                for (lo_incl, hi_incl) in [(true, true), (false, false), (true, false)] {
                    let bound = |v: Option<f64>, inclusive| v.map(|value| Bound { value, inclusive });
                    let (lo, hi) = (bound(lo, lo_incl), bound(hi, hi_incl));
                    let inside = |n: i64| {
                        let above = lo.is_none_or(|l| {
                            let l = (l.value * 100.0).round() as i64;
                            if lo_incl {
                                n >= l
                            } else {
                                n > l
                            }
                        });
                        let below = hi.is_none_or(|h| {
                            let h = (h.value * 100.0).round() as i64;
                            if hi_incl {
                                n <= h
                            } else {
                                n < h
                            }
                        });
                        above && below
                    };
                    let Some(pattern) = number_range_pattern(lo, hi) else {
                        assert!(
                            texts.iter().all(|t| !inside(hundredths(t))),
                            "{lo:?}..{hi:?} is not empty"
                        );
                        continue;
                    };
                    let re = regex::Regex::new(&format!("^(?:{pattern})$")).unwrap();
                    for t in &texts {
                        assert_eq!(
                            re.is_match(t),
                            inside(hundredths(t)),
                            "{t} in {lo:?}..{hi:?}: {pattern}"
                        );
                    }
                    for spelling in ["01", "1.", ".5", "+1", "1e2", "-0", ""] {
                        assert!(!re.is_match(spelling), "{spelling:?} in {lo:?}..{hi:?}: {pattern}");
                    }
                }
            }
        }
    }
}
