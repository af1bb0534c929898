//! Memory planning: offsets of scratch buffers in each device's arena.
//!
//! A linear scan over the schedule with a best-fit free list: a buffer is allocated when its
//! kernel runs and freed after its last reader. An elementwise kernel may write an output over an
//! input that dies with it (same size, read at the same index), which is legal because each
//! point is read before it is written. The arena size is the planned peak.

use std::collections::BTreeMap;

/// Buffers are placed on this alignment (bytes).
pub const ALIGN: usize = 64;

/// What the planner needs to know about one scratch buffer.
#[derive(Clone, Debug)]
pub struct Interval {
    pub device: u16,
    pub bytes: usize,
    /// Schedule index of the kernel that writes it (`None` for feeds: before the first kernel).
    pub def: Option<usize>,
    /// Last schedule index that reads it (`usize::MAX` when it must survive the step).
    pub last_use: usize,
    /// An input buffer of the defining kernel it may overwrite, if the kernel allows it.
    pub reuse_candidates: Vec<usize>,
}

/// The planned offsets (per buffer) and arena sizes (per device).
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub offsets: Vec<usize>,
    pub arena_bytes: BTreeMap<u16, usize>,
    /// Number of outputs written in place over an input.
    pub in_place: usize,
}

#[derive(Default)]
struct Arena {
    free: Vec<(usize, usize)>, // (offset, size), sorted by offset
    end: usize,
}

impl Arena {
    fn alloc(&mut self, size: usize) -> usize {
        let best = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, (_, s))| *s >= size)
            .min_by_key(|(_, (_, s))| *s)
            .map(|(i, _)| i);
        if let Some(i) = best {
            let (off, s) = self.free[i];
            if s == size {
                self.free.remove(i);
            } else {
                self.free[i] = (off + size, s - size);
            }
            return off;
        }
        // Grow, reusing a free block that ends at the arena's end.
        if let Some(&(off, s)) = self.free.last()
            && off + s == self.end
        {
            self.free.pop();
            self.end = off + size;
            return off;
        }
        let off = self.end;
        self.end += size;
        off
    }

    fn release(&mut self, off: usize, size: usize) {
        let i = self.free.partition_point(|&(o, _)| o < off);
        self.free.insert(i, (off, size));
        // Coalesce with neighbours.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }
}

fn aligned(bytes: usize) -> usize {
    bytes.div_ceil(ALIGN).max(1) * ALIGN
}

/// Plans `buffers` for a schedule of `kernels` kernels.
pub fn plan(buffers: &[Interval], kernels: usize) -> Plan {
    let mut arenas: BTreeMap<u16, Arena> = BTreeMap::new();
    let mut offsets = vec![0; buffers.len()];
    let mut by_def: Vec<Vec<usize>> = vec![Vec::new(); kernels + 1];
    let mut by_death: Vec<Vec<usize>> = vec![Vec::new(); kernels];
    for (i, b) in buffers.iter().enumerate() {
        by_def[b.def.map_or(0, |d| d + 1)].push(i);
        if b.last_use < kernels {
            by_death[b.last_use].push(i);
        }
    }
    let mut handed_over = vec![false; buffers.len()];
    let mut in_place = 0;
    // Feeds first; then, per kernel, its outputs are placed while its inputs are still live,
    // and only afterwards the buffers it read for the last time are freed.
    for (t, defined) in by_def.iter().enumerate() {
        for &i in defined {
            let b = &buffers[i];
            let arena = arenas.entry(b.device).or_default();
            let donor = b.reuse_candidates.iter().copied().find(|&j| {
                let d = &buffers[j];
                !handed_over[j]
                    && d.device == b.device
                    && aligned(d.bytes) == aligned(b.bytes)
                    && Some(d.last_use) == b.def
            });
            offsets[i] = match donor {
                Some(j) => {
                    handed_over[j] = true;
                    in_place += 1;
                    offsets[j]
                }
                None => arena.alloc(aligned(b.bytes)),
            };
        }
        // by_def[t] holds the outputs of kernel t - 1: free what kernel t - 1 read last.
        if let Some(k) = t.checked_sub(1) {
            for &i in &by_death[k] {
                if !handed_over[i] {
                    let b = &buffers[i];
                    if let Some(a) = arenas.get_mut(&b.device) {
                        a.release(offsets[i], aligned(b.bytes));
                    }
                }
            }
        }
    }
    Plan {
        offsets,
        arena_bytes: arenas.into_iter().map(|(d, a)| (d, a.end)).collect(),
        in_place,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(bytes: usize, def: Option<usize>, last_use: usize) -> Interval {
        Interval {
            device: 0,
            bytes,
            def,
            last_use,
            reuse_candidates: Vec::new(),
        }
    }

    #[test]
    fn buffers_that_never_live_together_share_memory() {
        // k0: a -> b; k1: b -> c; k2: c -> d (fetched)
        let bufs = vec![
            iv(640, None, 0),
            iv(640, Some(0), 1),
            iv(640, Some(1), 2),
            iv(640, Some(2), usize::MAX),
        ];
        let p = plan(&bufs, 3);
        assert_eq!(p.arena_bytes[&0], 1280, "two live buffers at a time");
        assert_ne!(p.offsets[1], p.offsets[2]);
        assert_eq!(p.offsets[0], p.offsets[2]);
    }

    #[test]
    fn elementwise_outputs_reuse_a_dying_input() {
        let mut out = iv(640, Some(0), usize::MAX);
        out.reuse_candidates = vec![0];
        let p = plan(&[iv(640, None, 0), out], 1);
        assert_eq!(p.in_place, 1);
        assert_eq!(p.offsets[0], p.offsets[1]);
        assert_eq!(p.arena_bytes[&0], 640);
    }
}

/// [`plan`] with contiguity constraints: the buffers of each group are placed back to back, in
/// order, with no padding between them (a gradient arena). A group lives from its first
/// member's definition to its last member's last use, and its members never share memory
/// with an input in place.
pub fn plan_grouped(buffers: &[Interval], groups: &[Vec<usize>], kernels: usize) -> Plan {
    let mut in_group = vec![None; buffers.len()];
    for (g, members) in groups.iter().enumerate() {
        for &m in members {
            in_group[m] = Some(g);
        }
    }
    // The reduced problem: ungrouped buffers, then one interval per group.
    let mut reduced: Vec<Interval> = Vec::new();
    let mut index_of = vec![usize::MAX; buffers.len()];
    for (i, b) in buffers.iter().enumerate() {
        if in_group[i].is_none() {
            index_of[i] = reduced.len();
            let mut b = b.clone();
            b.reuse_candidates.retain(|&j| in_group[j].is_none());
            reduced.push(b);
        }
    }
    for b in &mut reduced {
        b.reuse_candidates = b
            .reuse_candidates
            .iter()
            .map(|&j| index_of[j])
            .filter(|&j| j != usize::MAX)
            .collect();
    }
    let first_group = reduced.len();
    for members in groups {
        let def = members
            .iter()
            .map(|&m| buffers[m].def)
            .min_by_key(|d| d.map_or(0, |x| x + 1))
            .flatten();
        reduced.push(Interval {
            device: members.first().map_or(0, |&m| buffers[m].device),
            bytes: members.iter().map(|&m| buffers[m].bytes).sum(),
            def,
            last_use: members
                .iter()
                .map(|&m| buffers[m].last_use)
                .max()
                .unwrap_or(0),
            reuse_candidates: Vec::new(),
        });
    }
    let p = plan(&reduced, kernels);
    let mut offsets = vec![0; buffers.len()];
    for (i, &r) in index_of.iter().enumerate() {
        if r != usize::MAX {
            offsets[i] = p.offsets[r];
        }
    }
    for (g, members) in groups.iter().enumerate() {
        let mut at = p.offsets[first_group + g];
        for &m in members {
            offsets[m] = at;
            at += buffers[m].bytes;
        }
    }
    Plan {
        offsets,
        arena_bytes: p.arena_bytes,
        in_place: p.in_place,
    }
}

#[cfg(test)]
mod group_tests {
    use super::*;

    #[test]
    fn grouped_buffers_are_back_to_back_and_live_together() {
        let iv = |bytes, def: Option<usize>, last_use| Interval {
            device: 0,
            bytes,
            def,
            last_use,
            reuse_candidates: Vec::new(),
        };
        // Gradients made by k0 and k1, all read by k2; an unrelated buffer dies at k0.
        let bufs = vec![iv(40, Some(0), 2), iv(12, Some(1), 2), iv(64, None, 0)];
        let p = plan_grouped(&bufs, &[vec![1, 0]], 3);
        assert_eq!(
            p.offsets[0],
            p.offsets[1] + 12,
            "member order is the group's"
        );
        let (lo, hi) = (p.offsets[1], p.offsets[0] + 40);
        assert!(
            p.offsets[2] >= hi || p.offsets[2] + 64 <= lo,
            "the live input does not overlap the group"
        );
    }
}
