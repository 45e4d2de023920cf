//! A JSON schema's bounds on a number (`minimum`, `maximum` and their exclusive forms), read
//! from the schema, and the integers they let in.

use crate::error::GrammarError;
use crate::number_range::Bound;
use serde_json::{Map, Value};

/// The keywords that bound a number.
pub const BOUNDS: &[&str] = &["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];

/// A number's bounds, low and high, None for an open end.
pub type Bounds = (Option<Bound>, Option<Bound>);

/// A number schema's bounds; None when it has none. `exclusiveMinimum` and
/// `exclusiveMaximum` are numbers (JSON Schema since draft 6) or draft 4's booleans, which
/// make `minimum` and `maximum` exclusive; of two bounds on one side, the tighter holds.
pub fn numeric_bounds(object: &Map<String, Value>, path: &str) -> Result<Option<Bounds>, GrammarError> {
    if !BOUNDS.iter().any(|k| object.contains_key(*k)) {
        return Ok(None);
    }
    let number = |key: &str| -> Result<Option<f64>, GrammarError> {
        match object.get(key) {
            None | Some(Value::Bool(_)) => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| GrammarError::Schema {
                path: path.to_string(),
                why: format!("{key} must be a number"),
            }),
        }
    };
    let draft4 = |key: &str| object.get(key) == Some(&Value::Bool(true));
    let bound = |value, inclusive| Bound { value, inclusive };
    let mut lo = number("minimum")?.map(|m| bound(m, !draft4("exclusiveMinimum")));
    let mut hi = number("maximum")?.map(|m| bound(m, !draft4("exclusiveMaximum")));
    if let Some(x) = number("exclusiveMinimum")? {
        lo = Some(match lo {
            Some(l) if l.value > x => l,
            _ => bound(x, false),
        });
    }
    if let Some(x) = number("exclusiveMaximum")? {
        hi = Some(match hi {
            Some(h) if h.value < x => h,
            _ => bound(x, false),
        });
    }
    Ok(Some((lo, hi)))
}

/// The least integer a low bound lets in (beyond the largest 16-digit integer, a bound leaves
/// all or none of them).
pub fn lowest_integer(lo: Bound) -> i128 {
    let v = lo.value.clamp(-1e17, 1e17);
    match lo.inclusive {
        true => v.ceil() as i128,
        false => v.floor() as i128 + 1,
    }
}

/// The greatest integer a high bound lets in.
pub fn highest_integer(hi: Bound) -> i128 {
    let v = hi.value.clamp(-1e17, 1e17);
    match hi.inclusive {
        true => v.floor() as i128,
        false => v.ceil() as i128 - 1,
    }
}
