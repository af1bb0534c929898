//! One CTA: runs each warp until it blocks or exits, then releases the barrier when every thread
//! of the CTA waits at it — or reports a deadlock when some have exited or wait elsewhere.
//! Turns warp faults into [`ExecError`]s naming the kernel, PTX line, CTA and thread.

use super::CtaEnv;
use super::warp::{Warp, WarpFault};
use crate::error::{ExecError, Fault, describe_lanes};

fn exec_error(env: &CtaEnv, warp: &Warp, f: WarpFault) -> ExecError {
    let line = env.kernel.lines.get(f.pc as usize).copied().unwrap_or(0);
    ExecError {
        kernel: env.kernel.name.clone(),
        line,
        text: env.module.line_text(line),
        cta: env.cta,
        thread: f.lane.map(|l| warp.tid[l]),
        fault: f.fault,
    }
}

pub(super) fn run_cta(env: &mut CtaEnv, warps: &mut [Warp]) -> Result<(), ExecError> {
    let kernel = env.kernel;
    for (i, w) in warps.iter_mut().enumerate() {
        w.reset(kernel, i as u32, env.block);
    }
    let total: u32 = warps.iter().map(|w| w.existing.count_ones()).sum();
    loop {
        for w in warps.iter_mut() {
            if let Err(f) = w.run(env) {
                return Err(exec_error(env, w, f));
            }
        }
        let arrived: u32 = warps.iter().map(|w| w.at_barrier.count_ones()).sum();
        if arrived == 0 {
            return Ok(());
        }
        // The barrier id of the first waiting lane; all waiting lanes must agree.
        let (first_warp, first_lane) = warps
            .iter()
            .enumerate()
            .find(|(_, w)| w.at_barrier != 0)
            .map(|(i, w)| (i, w.at_barrier.trailing_zeros() as usize))
            .unwrap_or((0, 0));
        let id = warps[first_warp].bar_id[first_lane];
        let same_id = warps
            .iter()
            .all(|w| super::lanes::lanes(w.at_barrier).all(|l| w.bar_id[l] == id));
        if arrived == total && same_id {
            warps.iter_mut().for_each(Warp::release_barrier);
            continue;
        }
        let w = &warps[first_warp];
        let pc = w.pc[first_lane];
        let mut detail = format!("{arrived} of {total} threads wait at barrier {id}");
        let exited: u32 = warps.iter().map(|w| w.exited.count_ones()).sum();
        if exited > 0 {
            let (ew, el) = warps
                .iter()
                .find(|w| w.exited != 0)
                .map(|w| (w.index, w.exited))
                .unwrap_or((0, 0));
            detail += &format!(
                "; {exited} threads have exited and can never arrive (first: warp {ew} {})",
                describe_lanes(el)
            );
        }
        if !same_id {
            detail += "; threads wait at different barrier ids";
        }
        let fault = WarpFault {
            pc,
            lane: None,
            fault: Fault::Deadlock { detail },
        };
        return Err(exec_error(env, w, fault));
    }
}
