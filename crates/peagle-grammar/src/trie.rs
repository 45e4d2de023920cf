//! A vocabulary's tokens as a trie over their bytes, laid out flat in preorder, so that a walk
//! from a parse state is one pass over a few arrays, skipping each subtree whose first byte no
//! text takes, rather than a chase of pointers from node to node.
//!
//! Node i (the root is not stored) has a byte, a depth (1 for a token's first byte), the end
//! of its subtree (the first node after i not under it: i + 1 for a leaf), and the tokens whose
//! bytes end at it. In preorder a node's parent is the nearest node before it one level up.

pub(crate) struct Trie {
    bytes: Vec<u8>,
    depths: Vec<u32>,
    ends: Vec<u32>,
    /// Node i's tokens are `tokens[first_token[i]..first_token[i + 1]]`.
    first_token: Vec<u32>,
    tokens: Vec<u32>,
    max_depth: usize,
}

impl Trie {
    /// The trie of `tokens` (each an id and its bytes, none empty).
    ///
    /// In lexicographic order of their bytes, a trie's nodes are met in preorder: each token
    /// shares a prefix with the one before it (the nodes already made) and adds the rest of
    /// its bytes as new nodes, the last of which it ends at; a token equal to the one before
    /// it ends at the last node made. The nodes deeper than the shared prefix are closed then,
    /// as nothing later goes under them.
    pub(crate) fn new(mut tokens: Vec<(u32, &[u8])>) -> Self {
        debug_assert!(tokens.iter().all(|(_, bytes)| !bytes.is_empty()), "an empty token");
        tokens.sort_by(|a, b| a.1.cmp(b.1).then(a.0.cmp(&b.0)));
        let mut trie = Self {
            bytes: Vec::new(),
            depths: Vec::new(),
            ends: Vec::new(),
            first_token: Vec::new(),
            tokens: Vec::with_capacity(tokens.len()),
            max_depth: 0,
        };
        // The nodes on the way to the last token, by depth - 1.
        let mut open: Vec<u32> = Vec::new();
        let mut last: &[u8] = &[];
        for (id, bytes) in tokens {
            let shared = last.iter().zip(bytes).take_while(|(a, b)| a == b).count();
            trie.close(&mut open, shared);
            for (depth, &byte) in bytes.iter().enumerate().skip(shared) {
                open.push(trie.bytes.len() as u32);
                trie.bytes.push(byte);
                trie.depths.push(depth as u32 + 1);
                trie.ends.push(0);
                trie.first_token.push(trie.tokens.len() as u32);
            }
            trie.tokens.push(id);
            trie.max_depth = trie.max_depth.max(bytes.len());
            last = bytes;
        }
        trie.close(&mut open, 0);
        trie.first_token.push(trie.tokens.len() as u32);
        trie
    }

    /// Closes the open nodes deeper than `depth`: their subtrees end at the next node.
    fn close(&mut self, open: &mut Vec<u32>, depth: usize) {
        let next = self.bytes.len() as u32;
        for node in open.drain(depth..) {
            self.ends[node as usize] = next;
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    /// The longest token's length: the deepest node's depth.
    pub(crate) fn max_depth(&self) -> usize {
        self.max_depth
    }

    pub(crate) fn byte(&self, node: usize) -> u8 {
        self.bytes[node]
    }

    pub(crate) fn depth(&self, node: usize) -> usize {
        self.depths[node] as usize
    }

    /// The first node after `node`'s subtree.
    pub(crate) fn end(&self, node: usize) -> usize {
        self.ends[node] as usize
    }

    /// The tokens whose bytes end at `node`.
    pub(crate) fn tokens(&self, node: usize) -> &[u32] {
        &self.tokens[self.first_token[node] as usize..self.first_token[node + 1] as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every token is found under its bytes, each node's subtree holds exactly the nodes whose
    /// path it prefixes, and depths and bytes spell the paths.
    #[test]
    fn the_flat_trie_holds_every_token_under_its_bytes() {
        let words: [&[u8]; 7] = [b"ab", b"a", b"b", b"ab", b"abc", b"ba", b"\xff"];
        let trie = Trie::new(words.iter().enumerate().map(|(i, w)| (i as u32, *w)).collect());
        // Each node's path, from the nearest node one level up before it.
        let mut paths: Vec<Vec<u8>> = Vec::new();
        for node in 0..trie.len() {
            let depth = trie.depth(node);
            let mut path = match depth {
                1 => Vec::new(),
                _ => paths[(0..node).rev().find(|&p| trie.depth(p) == depth - 1).unwrap()].clone(),
            };
            path.push(trie.byte(node));
            assert_eq!(path.len(), depth);
            paths.push(path);
        }
        let spelled: Vec<&[u8]> = paths.iter().map(Vec::as_slice).collect();
        assert_eq!(spelled, [&b"a"[..], b"ab", b"abc", b"b", b"ba", b"\xff"]);
        for node in 0..trie.len() {
            let under: Vec<usize> = (node..trie.len())
                .filter(|&n| paths[n].starts_with(&paths[node]))
                .collect();
            assert_eq!(under, (node..trie.end(node)).collect::<Vec<_>>(), "node {node}");
            let ending: Vec<u32> = (0..words.len() as u32)
                .filter(|&t| words[t as usize] == paths[node])
                .collect();
            assert_eq!(trie.tokens(node), ending, "node {node}");
        }
        assert_eq!(trie.max_depth(), 3);
    }
}
