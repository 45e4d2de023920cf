//! The draft vocabulary: the target tokens a drafter can propose.
//!
//! The most frequent learned tokens (ties by lower id), sorted ascending, so draft id i maps to
//! target id `i + d2t[i]` and `t2d` marks the selected target ids (docs/ARCHITECTURE.md, "File formats").

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftVocab {
    /// Target id of each draft id, ascending.
    pub selected: Vec<u32>,
    pub target_vocab_size: usize,
}

impl DraftVocab {
    pub fn from_counts(counts: &[i64], size: usize) -> Self {
        let mut ids: Vec<u32> = (0..counts.len() as u32).collect();
        ids.sort_by_key(|&t| (std::cmp::Reverse(counts[t as usize]), t));
        ids.truncate(size.min(counts.len()));
        ids.sort_unstable();
        Self {
            selected: ids,
            target_vocab_size: counts.len(),
        }
    }

    pub fn len(&self) -> usize {
        self.selected.len()
    }

    pub fn is_empty(&self) -> bool {
        self.selected.is_empty()
    }

    /// Offsets `selected[i] - i`.
    pub fn d2t(&self) -> Vec<i64> {
        self.selected
            .iter()
            .enumerate()
            .map(|(i, t)| *t as i64 - i as i64)
            .collect()
    }

    /// Whether each target id is in the draft vocabulary.
    pub fn t2d(&self) -> Vec<bool> {
        let mut mask = vec![false; self.target_vocab_size];
        for t in &self.selected {
            mask[*t as usize] = true;
        }
        mask
    }
}

/// A token for the mask slots that the data never asks a drafter to predict or read: the
/// least frequent one (ties by the highest id, usually an unused tail entry).
pub fn pick_mask_token(counts: &[i64]) -> u32 {
    (0..counts.len() as u32)
        .min_by_key(|&t| (counts[t as usize], std::cmp::Reverse(t)))
        .expect("a non-empty vocabulary")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn most_frequent_tokens_sorted_with_offsets() {
        let counts = [5, 0, 9, 9, 1, 7];
        let v = DraftVocab::from_counts(&counts, 3);
        // 9, 9 (ids 2, 3) then 7 (id 5).
        assert_eq!(v.selected, vec![2, 3, 5]);
        assert_eq!(v.d2t(), vec![2, 2, 3]);
        assert_eq!(v.t2d(), vec![false, false, true, true, false, true]);
        assert_eq!(DraftVocab::from_counts(&counts, 10).len(), 6);
    }

    #[test]
    fn mask_token_is_the_rarest() {
        assert_eq!(pick_mask_token(&[3, 0, 2, 0, 5]), 3);
    }
}
