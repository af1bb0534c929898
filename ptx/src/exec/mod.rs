//! The executor: runs a decoded kernel over a grid of CTAs. CTAs are independent, so they run in
//! parallel on rayon's pool (each worker reuses its warps' register files); within a CTA the
//! warps run one after another until each blocks at a barrier or exits (`cta`). Results do not
//! depend on scheduling, except for the order of float atomics across CTAs (float addition is
//! not associative) and for kernels with data races, as on a GPU.

mod cmp;
mod convert;
mod cta;
mod dispatch;
mod float;
mod int;
mod lanes;
mod memops;
mod warp;

use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;

use crate::error::ExecError;
use crate::memory::GlobalView;
use crate::module::{Kernel, Module};
use warp::Warp;

pub(crate) use lanes::WARP;

/// What one CTA sees while it runs.
pub(crate) struct CtaEnv<'a> {
    pub module: &'a Module,
    pub kernel: &'a Kernel,
    pub global: &'a GlobalView,
    pub params: &'a [u8],
    pub shared: Vec<u8>,
    pub cta: [u32; 3],
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub nwarps: u32,
    /// Warp-instructions executed so far by this CTA, and the budget.
    pub steps: u64,
    pub step_limit: u64,
    pub lane_instrs: u64,
    /// Index of the last allocation hit (a cache for address resolution).
    pub hint: usize,
    /// The host has an FMA unit (`float::host_has_fma`).
    pub hw_fma: bool,
}

/// Everything a launch needs, validated by the device.
pub(crate) struct Launch<'a> {
    pub module: &'a Module,
    pub kernel: &'a Kernel,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_shared: usize,
    pub params: &'a [u8],
    pub global: &'a GlobalView,
    pub step_limit: u64,
    pub parallel: bool,
}

/// Counters of a finished launch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaunchStats {
    /// CTAs executed.
    pub ctas: u64,
    /// Warp-instructions executed (one per instruction issued for a group of lanes).
    pub warp_instructions: u64,
    /// Lane-instructions executed (active lanes summed over warp-instructions).
    pub lane_instructions: u64,
}

struct Scratch {
    warps: Vec<Warp>,
    shared: Vec<u8>,
}

pub(crate) fn run(l: &Launch) -> Result<LaunchStats, ExecError> {
    let [gx, gy, gz] = l.grid.map(u64::from);
    let ncta = gx * gy * gz;
    let nthreads = l.block[0] * l.block[1] * l.block[2];
    let nwarps = nthreads.div_ceil(WARP as u32) as usize;
    let shared_len = l.kernel.static_shared + l.dynamic_shared;
    let hw_fma = float::host_has_fma();
    let abort = AtomicBool::new(false);
    let new_scratch = || Scratch {
        warps: (0..nwarps).map(|_| Warp::default()).collect(),
        shared: Vec::new(),
    };
    let run_one = |s: &mut Scratch, i: u64| -> Result<(u64, u64), ExecError> {
        if abort.load(Ordering::Relaxed) {
            return Ok((0, 0));
        }
        // Grid dimensions are validated to fit u32 per axis, so each coordinate fits.
        let cta = [
            (i % gx) as u32,
            ((i / gx) % gy) as u32,
            (i / (gx * gy)) as u32,
        ];
        let mut shared = std::mem::take(&mut s.shared);
        shared.clear();
        shared.resize(shared_len, 0);
        let mut env = CtaEnv {
            module: l.module,
            kernel: l.kernel,
            global: l.global,
            params: l.params,
            shared,
            cta,
            grid: l.grid,
            block: l.block,
            nwarps: nwarps as u32,
            steps: 0,
            step_limit: l.step_limit,
            lane_instrs: 0,
            hint: 0,
            hw_fma,
        };
        let result = cta::run_cta(&mut env, &mut s.warps);
        s.shared = std::mem::take(&mut env.shared);
        if result.is_err() {
            abort.store(true, Ordering::Relaxed);
        }
        result.map(|()| (env.steps, env.lane_instrs))
    };
    // Contiguous chunks of CTAs, a few per worker thread for balance; each chunk reuses one
    // scratch (register files, shared memory) for all its CTAs.
    let chunks = if l.parallel {
        (rayon::current_num_threads() as u64 * 8).clamp(1, ncta)
    } else {
        1
    };
    let per_chunk = ncta.div_ceil(chunks);
    let run_chunk = |c: u64| -> Result<(u64, u64), ExecError> {
        let mut s = new_scratch();
        let mut total = (0u64, 0u64);
        for i in c * per_chunk..((c + 1) * per_chunk).min(ncta) {
            let (steps, lanes) = run_one(&mut s, i)?;
            total = (total.0 + steps, total.1 + lanes);
        }
        Ok(total)
    };
    let results: Vec<Result<(u64, u64), ExecError>> = if chunks > 1 {
        (0..chunks).into_par_iter().map(run_chunk).collect()
    } else {
        vec![run_chunk(0)]
    };
    let mut stats = LaunchStats {
        ctas: ncta,
        ..LaunchStats::default()
    };
    for r in results {
        let (steps, lanes) = r?;
        stats.warp_instructions += steps;
        stats.lane_instructions += lanes;
    }
    Ok(stats)
}
