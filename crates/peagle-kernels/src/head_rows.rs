//! What one key head of one sequence reads from a paged cache.

/// Rows `slots` of a cache of rows `width` wide, in position order, each cut to the head's
/// `head_dim` columns from `offset`.
#[derive(Clone, Copy)]
pub struct HeadRows<'a, T> {
    pub data: &'a [T],
    pub slots: &'a [usize],
    pub width: usize,
    pub offset: usize,
    pub head_dim: usize,
}

impl<'a, T> HeadRows<'a, T> {
    /// Position `j`'s row. Inlined into the kernels' loops, whatever their target features.
    #[inline(always)]
    pub fn row(&self, j: usize) -> &'a [T] {
        &self.data[self.slots[j] * self.width + self.offset..][..self.head_dim]
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }
}
