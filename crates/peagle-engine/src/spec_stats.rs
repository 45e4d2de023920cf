//! Speculative decoding counters, defined as vLLM defines them so dashboards carry over.
//! A "draft" is one verification of one sequence's proposed tokens.

use serde::Serialize;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SpecStats {
    pub num_drafts: u64,
    pub num_draft_tokens: u64,
    pub num_accepted_tokens: u64,
    /// Drafts whose position i was accepted (so all before it were too).
    pub accepted_per_position: Vec<u64>,
    /// Drafts that had a position i: with k adapting, not every draft is K long.
    pub offered_per_position: Vec<u64>,
}

impl SpecStats {
    pub fn record(&mut self, num_draft_tokens: usize, accepted: usize) {
        if num_draft_tokens == 0 {
            return;
        }
        self.num_drafts += 1;
        self.num_draft_tokens += num_draft_tokens as u64;
        self.num_accepted_tokens += accepted as u64;
        if self.accepted_per_position.len() < num_draft_tokens {
            self.accepted_per_position.resize(num_draft_tokens, 0);
            self.offered_per_position.resize(num_draft_tokens, 0);
        }
        for slot in &mut self.accepted_per_position[..accepted] {
            *slot += 1;
        }
        for slot in &mut self.offered_per_position[..num_draft_tokens] {
            *slot += 1;
        }
    }

    pub fn merge(&mut self, other: &SpecStats) {
        self.num_drafts += other.num_drafts;
        self.num_draft_tokens += other.num_draft_tokens;
        self.num_accepted_tokens += other.num_accepted_tokens;
        if self.accepted_per_position.len() < other.accepted_per_position.len() {
            self.accepted_per_position.resize(other.accepted_per_position.len(), 0);
            self.offered_per_position.resize(other.offered_per_position.len(), 0);
        }
        for (a, b) in self.accepted_per_position.iter_mut().zip(&other.accepted_per_position) {
            *a += b;
        }
        for (a, b) in self.offered_per_position.iter_mut().zip(&other.offered_per_position) {
            *a += b;
        }
    }

    /// Expected tokens a verification with k drafts commits: 1 plus, for each position, the
    /// share of drafts that reached it and had it accepted. Positions never drafted count as
    /// accepted, so untried window lengths look promising and get measured.
    pub fn expected_tokens(&self, k: usize) -> f64 {
        1.0 + (0..k)
            .map(|i| match self.offered_per_position.get(i) {
                Some(&offered) if offered > 0 => self.accepted_per_position[i] as f64 / offered as f64,
                _ => 1.0,
            })
            .sum::<f64>()
    }

    /// 1 + accepted / drafts: tokens committed per verification.
    pub fn mean_acceptance_length(&self) -> f64 {
        if self.num_drafts == 0 {
            return 1.0;
        }
        1.0 + self.num_accepted_tokens as f64 / self.num_drafts as f64
    }

    /// Share of drafts that got at least i + 1 tokens accepted.
    pub fn per_position_acceptance(&self) -> Vec<f64> {
        let drafts = self.num_drafts.max(1) as f64;
        self.accepted_per_position.iter().map(|a| *a as f64 / drafts).collect()
    }

    pub fn draft_acceptance_rate(&self) -> f64 {
        if self.num_draft_tokens == 0 {
            return 0.0;
        }
        self.num_accepted_tokens as f64 / self.num_draft_tokens as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_match_vllm() {
        let mut s = SpecStats::default();
        s.record(3, 3);
        s.record(3, 1);
        s.record(3, 0);
        s.record(0, 0);
        s.record(1, 1);
        assert_eq!((s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens), (4, 10, 5));
        assert!((s.mean_acceptance_length() - (1.0 + 5.0 / 4.0)).abs() < 1e-12);
        assert_eq!(s.per_position_acceptance(), vec![3.0 / 4.0, 1.0 / 4.0, 1.0 / 4.0]);
        assert!((s.draft_acceptance_rate() - 5.0 / 10.0).abs() < 1e-12);
        assert_eq!(s.offered_per_position, vec![4, 3, 3]);
        assert!((s.expected_tokens(2) - (1.0 + 3.0 / 4.0 + 1.0 / 3.0)).abs() < 1e-12);
        assert!((s.expected_tokens(5) - (s.expected_tokens(3) + 2.0)).abs() < 1e-12);
        let mut t = SpecStats::default();
        t.merge(&s);
        t.merge(&s);
        assert_eq!(t.num_accepted_tokens, 10);
        assert_eq!(t.accepted_per_position, vec![6, 2, 2]);
        assert_eq!(t.offered_per_position, vec![8, 6, 6]);
    }
}
