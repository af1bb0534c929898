//! Cross-device synchronisation of a program: each logical device runs its kernels in order,
//! so a kernel waits only for the kernels of other devices it conflicts with — true data
//! dependencies, and reuse of memory another device still reads — computed from the buffers'
//! extents once the memory plan is known.

use super::program::{BufferId, KernelKind, Program, Storage};
use std::collections::BTreeMap;

/// Which arena a buffer's bytes are in, and where: `(space, device, start, end)` with space 0
/// for scratch, 1 for state, 2 for constants (never written).
fn extent(p: &Program, b: BufferId) -> (u8, u16, usize, usize) {
    let buf = &p.buffers[b.0 as usize];
    let bytes = buf.bytes();
    match buf.storage {
        Storage::Scratch { device, offset } => (0, device, offset, offset + bytes),
        Storage::State { device, offset } => (1, device, offset, offset + bytes),
        Storage::Constant(i) => (2, 0, i as usize, i as usize + 1),
    }
}

fn overlaps(a: (u8, u16, usize, usize), b: (u8, u16, usize, usize)) -> bool {
    a.0 == b.0 && a.1 == b.1 && a.2 < b.3 && b.2 < a.3
}

/// For each kernel, the latest kernel of every other device it must wait for: one that writes
/// what it reads or writes, or reads what it writes (memory the planner reused in schedule
/// order). Waiting for the latest such kernel of a device covers the earlier ones, since each
/// device runs its kernels in order. `AllReduce` kernels also wait for the previous one
/// (whatever its device): collectives must reach the engine in program order on every
/// participant of a distributed job, or different buffers would be paired across processes.
pub fn cross_device_waits(p: &Program) -> Vec<Vec<u32>> {
    if p.devices() <= 1 {
        return Vec::new();
    }
    let access: Vec<(Vec<_>, Vec<_>)> = p
        .kernels
        .iter()
        .map(|k| {
            let reads = k.inputs.iter().map(|v| extent(p, v.buffer)).collect();
            let writes = k.outputs.iter().map(|&b| extent(p, b)).collect();
            (reads, writes)
        })
        .collect();
    let collective = |k: usize| matches!(p.kernels[k].kind, KernelKind::AllReduce { .. });
    let mut waits = vec![Vec::new(); p.kernels.len()];
    for t in 0..p.kernels.len() {
        let (reads_t, writes_t) = &access[t];
        let previous_collective = if collective(t) {
            (0..t).rev().find(|&j| collective(j))
        } else {
            None
        };
        let mut latest: BTreeMap<u16, u32> = BTreeMap::new();
        for j in (0..t).rev() {
            let d = p.kernels[j].device;
            if d == p.kernels[t].device || latest.contains_key(&d) {
                continue;
            }
            let (reads_j, writes_j) = &access[j];
            let hazard = writes_j
                .iter()
                .any(|w| reads_t.iter().chain(writes_t).any(|x| overlaps(*w, *x)))
                || reads_j
                    .iter()
                    .any(|r| writes_t.iter().any(|w| overlaps(*r, *w)));
            if hazard || Some(j) == previous_collective {
                latest.insert(d, j as u32);
            }
        }
        waits[t] = latest.into_values().collect();
    }
    waits
}
