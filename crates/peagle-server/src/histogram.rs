//! A Prometheus histogram: cumulative bucket counts, sum and count.

use std::fmt::Write;

#[derive(Debug, Clone)]
pub struct Histogram {
    /// Upper bounds, ascending; +Inf is implicit.
    bounds: Vec<f64>,
    /// Observations per bucket (not cumulative); the last one is +Inf.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    pub fn new(bounds: &[f64]) -> Self {
        Self {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, value: f64) {
        let bucket = self
            .bounds
            .iter()
            .position(|b| value <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[bucket] += 1;
        self.sum += value;
        self.count += 1;
    }

    /// vLLM's buckets for token counts: 1, 2, 5, 10, 20, 50, ... up to `max`.
    pub fn one_two_five(max: usize) -> Self {
        let bounds: Vec<f64> = std::iter::successors(Some(1usize), |b| b.checked_mul(10))
            .flat_map(|b| [b, 2 * b, 5 * b])
            .take_while(|b| *b <= max)
            .map(|b| b as f64)
            .collect();
        Self::new(&bounds)
    }

    /// The `_bucket`, `_sum` and `_count` samples; `labels` is `key="value",...` or empty.
    pub fn write_samples(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (i, n) in self.counts.iter().enumerate() {
            cumulative += n;
            let le = self.bounds.get(i).map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_with_inf_last() {
        let mut h = Histogram::new(&[0.25, 1.0]);
        for v in [0.125, 0.25, 0.5, 3.0] {
            h.observe(v);
        }
        let mut out = String::new();
        h.write_samples(&mut out, "x", "m=\"a\"");
        assert_eq!(
            out,
            "x_bucket{m=\"a\",le=\"0.25\"} 2\nx_bucket{m=\"a\",le=\"1\"} 3\nx_bucket{m=\"a\",le=\"+Inf\"} 4\n\
             x_sum{m=\"a\"} 3.875\nx_count{m=\"a\"} 4\n"
        );
    }

    #[test]
    fn token_count_buckets_go_one_two_five() {
        assert_eq!(
            Histogram::one_two_five(1024).bounds,
            [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0]
        );
        assert_eq!(Histogram::one_two_five(1).bounds, [1.0]);
    }
}
