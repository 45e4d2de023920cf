//! COD sampling: which (anchor, depth) pairs one packed sequence trains on.
//!
//! Training every depth at every position costs K times the sequence; COD keeps all n
//! positions at depth 0 and a geometrically shrinking, nested subset at deeper depths:
//! depth d keeps floor((|seed| - d) * max(r^d, r_min)) positions, drawn from the positions
//! that continue a chain of depth d-1, so an anchor reaches depth d only through d-1.
//!
//! The layout is one flat sequence `[depth 0 | depth 1 | ...]`. Element (anchor a, depth d)
//! sits at position a + d; depth 0 reads (token, target state), deeper elements read the
//! mask token and the shared hidden state. A query sees a key in the same document iff the key
//! is at depth 0 with an anchor no later than the query's, or on the query's own chain at no
//! greater depth: exactly what causal attention over the inference layout of that anchor
//! (its prefix at depth 0, then its mask slots) sees.

use rand::seq::index::sample;
use rand::Rng;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CodConfig {
    /// Depths trained, K: depth 0 plus K-1 mask depths.
    pub depths: usize,
    /// Down-sampling ratio r per depth.
    pub ratio: f64,
    /// Floor on the kept share at deep depths.
    pub ratio_min: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Element {
    pub anchor: usize,
    pub depth: usize,
}

impl Element {
    /// Position id (RoPE and target alignment) of the element.
    pub fn position(&self) -> usize {
        self.anchor + self.depth
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodLayout {
    /// All elements, depth by depth, positions ascending within a depth.
    pub elements: Vec<Element>,
    /// Document of every position of the packed sequence.
    docs: Vec<u32>,
}

impl CodLayout {
    /// Samples the layout of a packed sequence. `valid[p]` marks positions whose prediction is
    /// trained (loss mask); `docs[p]` is the document of position p.
    pub fn sample(valid: &[bool], docs: &[u32], cfg: &CodConfig, rng: &mut impl Rng) -> Self {
        assert_eq!(valid.len(), docs.len(), "one document id per position");
        let n = valid.len();
        let mut elements: Vec<Element> = (0..n).map(|p| Element { anchor: p, depth: 0 }).collect();
        let seed = valid.iter().filter(|v| **v).count();
        // Positions that may hold depth 1: valid, with an anchor one step back in their document.
        let mut pool: Vec<usize> = (1..n).filter(|&p| valid[p] && docs[p] == docs[p - 1]).collect();
        for d in 1..cfg.depths {
            let share = cfg.ratio.powi(d as i32).max(cfg.ratio_min);
            let count = (seed.saturating_sub(d) as f64 * share).floor() as usize;
            // A share of 1 down-samples nothing: every chain goes on, where the count would
            // drop one when position 0 is not trained (it anchors no depth-1 element).
            let mut chosen: Vec<usize> = if count >= pool.len() || share >= 1.0 {
                pool.clone()
            } else {
                sample(rng, pool.len(), count).into_iter().map(|i| pool[i]).collect()
            };
            chosen.sort_unstable();
            elements.extend(chosen.iter().map(|&s| Element {
                anchor: s - d,
                depth: d,
            }));
            pool = chosen
                .iter()
                .map(|s| s + 1)
                .filter(|&p| p < n && valid[p] && docs[p] == docs[p - 1])
                .collect();
        }
        Self {
            elements,
            docs: docs.to_vec(),
        }
    }

    pub fn len(&self) -> usize {
        self.elements.len()
    }

    pub fn is_empty(&self) -> bool {
        self.elements.is_empty()
    }

    /// Elements kept at each depth.
    pub fn depth_counts(&self) -> Vec<usize> {
        let mut counts = Vec::new();
        for e in &self.elements {
            if counts.len() <= e.depth {
                counts.resize(e.depth + 1, 0);
            }
            counts[e.depth] += 1;
        }
        counts
    }

    /// The layout of some of the elements, in the given order; visibility between them is
    /// unchanged, since it depends on the pair alone.
    pub fn subset(&self, indices: &[usize]) -> CodLayout {
        CodLayout {
            elements: indices.iter().map(|i| self.elements[*i]).collect(),
            docs: self.docs.clone(),
        }
    }

    /// Whether element `q` attends to element `k`.
    pub fn visible(&self, q: usize, k: usize) -> bool {
        let (q, k) = (self.elements[q], self.elements[k]);
        self.docs[q.anchor] == self.docs[k.anchor]
            && ((k.depth == 0 && k.anchor <= q.anchor) || (k.anchor == q.anchor && k.depth <= q.depth))
    }

    /// The full attention mask, row-major [query][key].
    pub fn mask(&self) -> Vec<bool> {
        let n = self.len();
        (0..n * n).map(|i| self.visible(i / n, i % n)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;
    use std::collections::HashSet;

    const CFG: CodConfig = CodConfig {
        depths: 4,
        ratio: 0.7,
        ratio_min: 0.2,
    };

    fn layout(valid: &[bool], docs: &[u32], cfg: &CodConfig, seed: u64) -> CodLayout {
        CodLayout::sample(valid, docs, cfg, &mut StdRng::seed_from_u64(seed))
    }

    /// A ratio of 1 (EAGLE-3's training-time test) keeps every chain, also where the first
    /// position is not trained (a prompt before the response).
    #[test]
    fn a_ratio_of_one_keeps_every_chain() {
        let all = CodConfig {
            depths: 3,
            ratio: 1.0,
            ratio_min: 1.0,
        };
        let valid = [false, true, true, true, true];
        for seed in 0..8 {
            assert_eq!(layout(&valid, &[0; 5], &all, seed).depth_counts(), [5, 4, 3]);
        }
    }

    #[test]
    fn counts_follow_the_formula_relative_to_the_seed() {
        let valid = vec![true; 100];
        let l = layout(&valid, &[0; 100], &CFG, 1);
        // floor(99 * .7) = 69, floor(98 * .49) = 48, floor(97 * .343) = 33.
        assert_eq!(l.depth_counts(), vec![100, 69, 48, 33]);
        // With r = 0.3 the floor r_min = 0.2 takes over from depth 2: floor(98 * .2) = 19.
        let cfg = CodConfig { ratio: 0.3, ..CFG };
        assert_eq!(layout(&valid, &[0; 100], &cfg, 1).depth_counts(), vec![100, 29, 19, 19]);
    }

    #[test]
    fn chains_are_nested_and_stay_in_valid_positions_of_one_document() {
        let valid: Vec<bool> = (0..200).map(|p| p % 7 != 3 && p < 190).collect();
        let docs: Vec<u32> = (0..200).map(|p| (p / 64) as u32).collect();
        let cfg = CodConfig {
            depths: 6,
            ratio: 0.8,
            ratio_min: 0.2,
        };
        for seed in 0..20 {
            let l = layout(&valid, &docs, &cfg, seed);
            let set: HashSet<Element> = l.elements.iter().copied().collect();
            assert_eq!(set.len(), l.len(), "no duplicates");
            for e in l.elements.iter().filter(|e| e.depth > 0) {
                assert!(
                    set.contains(&Element {
                        anchor: e.anchor,
                        depth: e.depth - 1
                    }),
                    "{e:?} has no parent"
                );
                assert!(valid[e.position()], "{e:?} sits on a position without loss");
                assert_eq!(docs[e.anchor], docs[e.position()], "{e:?} crosses a document boundary");
            }
        }
    }

    #[test]
    fn sampling_is_deterministic_for_a_seed() {
        let valid = vec![true; 300];
        let docs = vec![0; 300];
        assert_eq!(layout(&valid, &docs, &CFG, 7), layout(&valid, &docs, &CFG, 7));
        assert_ne!(layout(&valid, &docs, &CFG, 7), layout(&valid, &docs, &CFG, 8));
    }

    /// Visibility rebuilt from inference: for the query's anchor a, the drafter sees the
    /// depth-0 slots of a's document up to a, then a's mask slots; causal by position.
    fn inference_visible(l: &CodLayout, docs: &[u32], q: Element, k: Element) -> bool {
        let a = q.anchor;
        let mut query_sequence: Vec<Element> = (0..=a)
            .filter(|&p| docs[p] == docs[a])
            .map(|p| Element { anchor: p, depth: 0 })
            .collect();
        query_sequence.extend(l.elements.iter().filter(|e| e.anchor == a && e.depth > 0).copied());
        query_sequence.contains(&k) && k.position() <= q.position()
    }

    #[test]
    fn mask_equals_causal_attention_over_the_inference_layout() {
        let valid: Vec<bool> = (0..60).map(|p| p % 5 != 0).collect();
        let docs: Vec<u32> = (0..60).map(|p| (p / 25) as u32).collect();
        let l = layout(
            &valid,
            &docs,
            &CodConfig {
                depths: 5,
                ratio: 0.8,
                ratio_min: 0.3,
            },
            3,
        );
        let mask = l.mask();
        let n = l.len();
        for qi in 0..n {
            for ki in 0..n {
                let want = inference_visible(&l, &docs, l.elements[qi], l.elements[ki]);
                assert_eq!(
                    mask[qi * n + ki],
                    want,
                    "query {:?} key {:?}",
                    l.elements[qi],
                    l.elements[ki]
                );
            }
        }
    }
}
