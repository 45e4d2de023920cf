//! Sequence partitioning (P-EAGLE, Algorithm 1): a long multi-depth sequence is trained in S
//! contiguous segments, each forward and backward on its own, so memory is bounded by a
//! segment rather than the whole sequence.
//!
//! Anchors are cut into S equal ranges. The depth-0 element of anchor a belongs to the segment
//! of a; deeper elements to the segment of a + 1 (they read depth-0 elements up to a, which
//! then sit in their segment or an earlier one). Each segment also re-reads every depth-0
//! element of earlier segments as context, without loss: a query sees exactly the keys it sees
//! in the whole sequence, so the segments' summed gradient equals the whole one's.

use crate::cod::CodLayout;

pub struct Segment {
    /// Layout indices: the context (earlier depth-0 elements) first, then the segment's own.
    pub indices: Vec<usize>,
    /// How many leading entries of `indices` are context.
    pub context: usize,
}

impl Segment {
    /// Which rows carry loss: the segment's own elements.
    pub fn own(&self) -> impl Iterator<Item = bool> + '_ {
        (0..self.indices.len()).map(|i| i >= self.context)
    }
}

/// Splits `layout` over `positions` anchors into `parts` segments (empty ones are dropped).
pub fn partition(layout: &CodLayout, positions: usize, parts: usize) -> Vec<Segment> {
    let parts = parts.clamp(1, positions.max(1));
    let bucket = |anchor: usize| (anchor * parts / positions).min(parts - 1);
    let owner = |i: usize| {
        let e = layout.elements[i];
        if e.depth == 0 {
            bucket(e.anchor)
        } else {
            bucket(e.anchor + 1)
        }
    };
    (0..parts)
        .map(|s| {
            let mut indices: Vec<usize> = (0..layout.len())
                .filter(|&i| layout.elements[i].depth == 0 && owner(i) < s)
                .collect();
            let context = indices.len();
            indices.extend((0..layout.len()).filter(|&i| owner(i) == s));
            Segment { indices, context }
        })
        .filter(|seg| seg.indices.len() > seg.context)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cod::CodConfig;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn every_element_is_owned_once_and_sees_its_keys() {
        let n = 97;
        let cfg = CodConfig {
            depths: 5,
            ratio: 0.8,
            ratio_min: 0.2,
        };
        let layout = CodLayout::sample(&vec![true; n], &vec![0; n], &cfg, &mut StdRng::seed_from_u64(2));
        let segments = partition(&layout, n, 4);
        assert_eq!(segments.len(), 4);
        let mut owned = vec![0; layout.len()];
        for seg in &segments {
            for (i, own) in seg.indices.iter().zip(seg.own()) {
                owned[*i] += own as usize;
            }
            // Every key an owned query sees in the whole layout is in the segment.
            for q in seg.indices[seg.context..].iter() {
                for k in 0..layout.len() {
                    if layout.visible(*q, k) {
                        assert!(seg.indices.contains(&k), "query {q} misses key {k}");
                    }
                }
            }
        }
        assert!(
            owned.iter().all(|c| *c == 1),
            "each element trained in exactly one segment"
        );
    }
}
