//! Token ids that stay on the device between the step that makes them and the forward that
//! reads them: a proposer's drafts. The next verification window takes them where they lie
//! (`BatchBuilder::add_then`), so the host does not wait for the drafter before it issues the
//! target's forward; it reads them while that forward runs, to verify them after it.

use candle_core::{Result, Tensor};
use std::collections::hash_map::Entry;
use std::collections::HashMap;

/// Ids that lie in a device tensor: elements `picks` of `ids` (u32 [n], contiguous), in order.
#[derive(Debug, Clone)]
pub struct DeviceIds {
    pub ids: Tensor,
    pub picks: Vec<u32>,
}

impl DeviceIds {
    pub fn len(&self) -> usize {
        self.picks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.picks.is_empty()
    }

    /// The ids of every set, copied to the host: one copy per tensor they lie in, each a wait
    /// for the work issued before it.
    pub fn to_host(sets: &[&DeviceIds]) -> Result<Vec<Vec<u32>>> {
        let mut copied: HashMap<_, Vec<u32>> = HashMap::new();
        let mut out = Vec::with_capacity(sets.len());
        for set in sets {
            let key = set.ids.id();
            if let Entry::Vacant(entry) = copied.entry(key) {
                entry.insert(set.ids.to_vec1()?);
            }
            let values = &copied[&key];
            let picked = set.picks.iter().map(|&p| values.get(p as usize).copied());
            let picked: Option<Vec<u32>> = picked.collect();
            out.push(
                picked
                    .ok_or_else(|| candle_core::Error::Msg(format!("picks {:?} of {} ids", set.picks, values.len())))?,
            );
        }
        Ok(out)
    }
}

/// Rows of a batch whose tokens lie on the device: row `rows[j]` takes `ids[picks[j]]`.
#[derive(Debug, Clone)]
pub struct DeviceTokens {
    pub rows: Vec<u32>,
    pub ids: Tensor,
    pub picks: Vec<u32>,
}
