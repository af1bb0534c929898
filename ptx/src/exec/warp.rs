//! One warp: 32 lanes with a PC each. The lanes at the lowest PC run together as the active group;
//! a divergent branch splits the group and lanes re-merge when the group's PC reaches theirs
//! (NVRTC's structured control flow reconverges at the join point that way). Lanes park at
//! `bar.sync` (released by the CTA) and at warp-synchronous instructions (`shfl.sync`, `vote.sync`,
//! `bar.warp.sync`), which execute once every live member lane has arrived at the same one.

use super::CtaEnv;
use super::async_copy::AsyncCopies;
use super::lanes::{FULL, Regs, WARP, lanes};
use crate::error::{Fault, describe_lanes};
use crate::inst::{Op, R};
use crate::kernel::Kernel;

/// A fault of a warp, at instruction `pc`, in one lane or the warp as a whole.
#[derive(Debug)]
pub struct WarpFault {
    pub pc: u32,
    pub lane: Option<usize>,
    pub fault: Fault,
}

/// The execution state of one warp.
#[derive(Debug, Default)]
pub struct Warp {
    pub regs: Regs,
    /// Local memory: `local_bytes` per lane, lane-major.
    pub local: Vec<u8>,
    /// Warp index in the CTA.
    pub index: u32,
    /// Lanes that exist (the last warp of a CTA may be partial).
    pub existing: u32,
    pub exited: u32,
    /// The active group and its PC.
    pub group: u32,
    pub group_pc: u32,
    /// Runnable lanes outside the group, each at `pc[lane]` > `group_pc`.
    pub waiting: u32,
    min_wait: u32,
    /// Lanes parked at a CTA barrier (at `pc[lane]`, barrier `bar_id[lane]`).
    pub at_barrier: u32,
    pub bar_id: [u32; WARP],
    /// Lanes parked at a warp-synchronous instruction (at `pc[lane]`).
    pub at_sync: u32,
    pub pc: [u32; WARP],
    /// Thread index (x, y, z) of each lane.
    pub tid: [[u32; 3]; WARP],
    /// The (warp index, block shape) `tid` and `existing` were computed for.
    layout: Option<(u32, [u32; 3])>,
    /// A branch or barrier ran since this warp's last global load: the next one starts a new
    /// load epoch (see [`super::MemCounts::load_epochs`]).
    pub branched: bool,
    /// The threads' `cp.async` copies in flight.
    pub copies: AsyncCopies,
}

impl Warp {
    /// Prepares the warp to run warp `index` of a CTA of `block` threads.
    pub fn reset(&mut self, kernel: &Kernel, index: u32, block: [u32; 3]) {
        self.regs.reset(kernel);
        self.local.clear();
        self.local.resize(kernel.local_bytes * WARP, 0);
        // Thread indices depend only on the warp index and block shape: reuse them across CTAs.
        if self.layout != Some((index, block)) {
            self.layout = Some((index, block));
            self.index = index;
            let nthreads = block[0] * block[1] * block[2];
            let first = index * WARP as u32;
            let count = nthreads.saturating_sub(first).min(WARP as u32);
            self.existing = if count == 32 {
                FULL
            } else {
                (1u32 << count) - 1
            };
            for l in 0..WARP {
                let lin = first + l as u32;
                self.tid[l] = [
                    lin % block[0],
                    (lin / block[0]) % block[1],
                    lin / (block[0] * block[1]),
                ];
            }
        }
        self.exited = 0;
        self.group = self.existing;
        self.group_pc = 0;
        self.waiting = 0;
        self.min_wait = u32::MAX;
        self.at_barrier = 0;
        self.at_sync = 0;
        self.pc = [0; WARP];
        self.bar_id = [0; WARP];
        self.branched = true;
        self.copies.reset();
    }

    /// Runs until no lane can make progress (all exited, or parked at a barrier).
    pub fn run(&mut self, env: &mut CtaEnv) -> Result<(), WarpFault> {
        let kernel = env.kernel;
        let code = &kernel.code;
        loop {
            if self.group == 0 && !self.schedule() {
                if self.at_sync != 0 {
                    return Err(self.not_converged(kernel));
                }
                return Ok(());
            }
            let pc = self.group_pc;
            let inst = &code[pc as usize];
            let mut mask = self.group;
            if let Some((p, neg)) = inst.guard {
                let bits = self.regs.pred[p as usize];
                mask &= if neg { !bits } else { bits };
            }
            env.steps += 1;
            if env.steps > env.step_limit {
                return Err(WarpFault {
                    pc,
                    lane: None,
                    fault: Fault::StepBudget {
                        limit: env.step_limit,
                    },
                });
            }
            env.lane_instrs += u64::from(mask.count_ones());
            if mask != 0 && matches!(inst.op, Op::Bra { .. } | Op::Bar { .. }) {
                self.branched = true;
                if matches!(inst.op, Op::Bar { .. }) {
                    env.mem.barriers += 1;
                }
            }
            match &inst.op {
                Op::Bra { target } => self.branch(mask, *target),
                Op::Exit => self.exit(mask, kernel),
                Op::Bar { id } => self.barrier(pc, mask, *id),
                Op::Shfl { mask: member, .. }
                | Op::Vote { mask: member, .. }
                | Op::WarpSync { mask: member } => self.sync_op(pc, mask, *member, kernel)?,
                Op::Trap if mask != 0 => {
                    return Err(WarpFault {
                        pc,
                        lane: Some(mask.trailing_zeros() as usize),
                        fault: Fault::Trap,
                    });
                }
                op => {
                    if mask != 0 {
                        self.execute(op, mask, env)
                            .map_err(|(lane, fault)| WarpFault {
                                pc,
                                lane: Some(lane),
                                fault,
                            })?;
                    }
                    self.advance();
                }
            }
        }
    }

    fn recompute_min(&mut self) {
        self.min_wait = lanes(self.waiting)
            .map(|l| self.pc[l])
            .min()
            .unwrap_or(u32::MAX);
    }

    /// Lanes of `set` whose PC is `pc`.
    fn lanes_at(&self, set: u32, pc: u32) -> u32 {
        lanes(set)
            .filter(|&l| self.pc[l] == pc)
            .fold(0, |m, l| m | (1 << l))
    }

    /// Makes the lowest-PC waiting lanes the group. False when nothing is runnable.
    fn schedule(&mut self) -> bool {
        if self.waiting == 0 {
            return false;
        }
        let pc = self.min_wait;
        let g = self.lanes_at(self.waiting, pc);
        self.group = g;
        self.group_pc = pc;
        self.waiting &= !g;
        self.recompute_min();
        true
    }

    /// Moves the group to the next instruction, merging lanes that wait there.
    #[inline]
    fn advance(&mut self) {
        self.group_pc += 1;
        if self.waiting != 0 && self.group_pc == self.min_wait {
            let g = self.lanes_at(self.waiting, self.group_pc);
            self.group |= g;
            self.waiting &= !g;
            self.recompute_min();
        }
    }

    /// Turns the group into waiting lanes at `group_pc`.
    fn park_group(&mut self) {
        for l in lanes(self.group) {
            self.pc[l] = self.group_pc;
        }
        self.waiting |= self.group;
        self.group = 0;
        self.recompute_min();
    }

    fn branch(&mut self, taken: u32, target: u32) {
        let not_taken = self.group & !taken;
        if taken == 0 {
            self.advance();
        } else if not_taken == 0 {
            self.group_pc = target;
            if self.waiting != 0 && target >= self.min_wait {
                self.park_group();
                self.schedule();
            }
        } else {
            let next = self.group_pc + 1;
            for l in lanes(taken) {
                self.pc[l] = target;
            }
            for l in lanes(not_taken) {
                self.pc[l] = next;
            }
            self.waiting |= self.group;
            self.group = 0;
            self.recompute_min();
            self.schedule();
        }
    }

    fn exit(&mut self, mask: u32, kernel: &Kernel) {
        self.exited |= mask;
        self.group &= !mask;
        if self.group != 0 {
            self.advance();
        }
        if mask != 0 && self.at_sync != 0 {
            self.release_sync(kernel);
        }
    }

    fn barrier(&mut self, pc: u32, mask: u32, id: R) {
        for l in lanes(mask) {
            self.pc[l] = pc;
            self.bar_id[l] = self.regs.r32[id as usize][l];
        }
        self.at_barrier |= mask;
        self.group &= !mask;
        if self.group != 0 {
            self.advance();
        }
    }

    /// Releases the lanes parked at the CTA barrier (called by the CTA when all have arrived).
    pub fn release_barrier(&mut self) {
        for l in lanes(self.at_barrier) {
            self.pc[l] += 1;
        }
        self.waiting |= self.at_barrier;
        self.at_barrier = 0;
        if self.group != 0 {
            self.park_group();
        }
        self.recompute_min();
    }

    /// The member lanes still required by the sync instruction `member` for lanes `set`.
    fn required(&self, set: u32, member: R) -> Result<u32, (usize, Fault)> {
        let mut required = 0;
        for l in lanes(set) {
            let mm = self.regs.r32[member as usize][l];
            if (mm >> l) & 1 == 0 {
                return Err((
                    l,
                    Fault::NotInMemberMask {
                        lane: l as u32,
                        mask: mm,
                    },
                ));
            }
            required |= mm;
        }
        Ok(required & self.existing & !self.exited)
    }

    fn sync_op(&mut self, pc: u32, mask: u32, member: R, kernel: &Kernel) -> Result<(), WarpFault> {
        if mask == 0 {
            self.advance();
            return Ok(());
        }
        let required = self
            .required(mask, member)
            .map_err(|(l, fault)| WarpFault {
                pc,
                lane: Some(l),
                fault,
            })?;
        if required & !mask == 0 {
            self.sync_execute(&kernel.code[pc as usize].op, mask);
            self.advance();
            return Ok(());
        }
        for l in lanes(mask) {
            self.pc[l] = pc;
        }
        self.at_sync |= mask;
        self.group &= !mask;
        if self.group != 0 {
            self.advance();
        }
        self.release_sync(kernel);
        Ok(())
    }

    /// Executes every parked sync group whose live member lanes have all arrived.
    fn release_sync(&mut self, kernel: &Kernel) {
        let mut pending = self.at_sync;
        let mut released = false;
        while pending != 0 {
            let pc = self.pc[pending.trailing_zeros() as usize];
            let here = self.lanes_at(pending, pc);
            pending &= !here;
            let op = &kernel.code[pc as usize].op;
            let member = match op {
                Op::Shfl { mask, .. } | Op::Vote { mask, .. } | Op::WarpSync { mask } => *mask,
                _ => continue,
            };
            // Parked lanes passed the member-mask check when they arrived.
            let Ok(required) = self.required(here, member) else {
                continue;
            };
            if required & !here == 0 {
                self.sync_execute(op, here);
                self.at_sync &= !here;
                for l in lanes(here) {
                    self.pc[l] = pc + 1;
                }
                self.waiting |= here;
                released = true;
            }
        }
        if released {
            if self.group != 0 {
                self.park_group();
            }
            self.recompute_min();
        }
    }

    /// Where the lanes of `mask` are, for error messages.
    pub(super) fn whereabouts(&self, mask: u32, kernel: &Kernel) -> String {
        let line = |pc: u32| kernel.lines.get(pc as usize).copied().unwrap_or(0);
        let mut parts = Vec::new();
        let exited = mask & self.exited;
        if exited != 0 {
            parts.push(format!("{} exited", describe_lanes(exited)));
        }
        let skipped = mask & self.group;
        if skipped != 0 {
            parts.push(format!("{} have a false guard", describe_lanes(skipped)));
        }
        for (set, what) in [
            (self.at_barrier, "wait at the barrier on line"),
            (self.at_sync, "wait at line"),
            (self.waiting, "took another path, to line"),
        ] {
            let mut rest = mask & set;
            while rest != 0 {
                let pc = self.pc[rest.trailing_zeros() as usize];
                let here = self.lanes_at(rest, pc);
                rest &= !here;
                parts.push(format!("{} {what} {}", describe_lanes(here), line(pc)));
            }
        }
        parts.join("; ")
    }

    fn not_converged(&self, kernel: &Kernel) -> WarpFault {
        let pc = self.pc[self.at_sync.trailing_zeros() as usize];
        let here = self.lanes_at(self.at_sync, pc);
        let member = match &kernel.code[pc as usize].op {
            Op::Shfl { mask, .. } | Op::Vote { mask, .. } | Op::WarpSync { mask } => *mask,
            _ => 0,
        };
        let wanted =
            lanes(here).fold(0, |m, l| m | self.regs.r32[member as usize][l]) & self.existing;
        let missing = wanted & !here;
        WarpFault {
            pc,
            lane: Some(here.trailing_zeros() as usize),
            fault: Fault::NotConverged {
                waiting: here,
                missing,
                detail: self.whereabouts(missing, kernel),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::error::describe_lanes;

    #[test]
    fn lane_sets_read_as_ranges() {
        assert_eq!(describe_lanes(0b1111), "lanes 0-3");
        assert_eq!(describe_lanes(1 << 31), "lane 31");
        assert_eq!(describe_lanes(0b1011_0001), "lanes 0, 4-5, 7");
    }
}
