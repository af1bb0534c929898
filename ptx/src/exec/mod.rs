//! The executor: runs a decoded kernel over a grid of CTAs. CTAs are independent, so they run in
//! parallel on rayon's pool (each worker reuses its warps' register files); within a CTA the
//! warps run one after another until each blocks at a barrier or exits (`cta`). Results do not
//! depend on scheduling, except for the order of float atomics across CTAs (float addition is
//! not associative) and for kernels with data races, as on a GPU.

mod async_copy;
mod cmp;
mod convert;
mod cta;
mod dispatch;
mod float;
mod int;
mod lanes;
mod memops;
mod tensor;
mod warp;

use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;

use crate::error::ExecError;
use crate::kernel::Kernel;
use crate::memory::GlobalView;
use crate::module::Module;
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
    /// Global memory instructions and bytes of this CTA.
    pub mem: MemCounts,
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
    /// Run only these CTAs (linear indices, x fastest), not the whole grid: a sample whose
    /// counters stand for the launch.
    pub only: Option<&'a [u64]>,
}

/// Global memory traffic of a CTA: warp-level instructions and the bytes their lanes move.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct MemCounts {
    pub global_loads: u64,
    pub global_stores: u64,
    pub global_bytes: u64,
    /// Runs of global loads a warp issues with no branch or barrier between them, summed over
    /// warps: loads of one run can be in flight together, each run waits for memory once. A
    /// `cp.async.wait_group` that lands copies from global memory counts as one run.
    pub load_epochs: u64,
    /// Warp-level `bar.sync` executions.
    pub barriers: u64,
    /// Shared-memory wavefronts of the warps' shared loads and stores (one per access without
    /// bank conflicts, more with them).
    pub shared_wavefronts: u64,
    /// Distinct 32-byte sectors of the warps' global accesses (their lanes inside one
    /// allocation).
    pub global_sectors: u64,
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
    /// Warp-level global (and generic) memory instructions: loads, then stores.
    pub global_loads: u64,
    pub global_stores: u64,
    /// Bytes moved by those instructions' active lanes (before any caching).
    pub global_bytes: u64,
    /// Runs of global loads issued by a warp with no branch or barrier in between (and
    /// `cp.async.wait_group`s landing copies from global memory), summed over
    /// warps (the loads of a run can be in flight together: a latency-bound warp waits for
    /// memory about once per run).
    pub load_epochs: u64,
    /// Warp-level barrier (`bar.sync`) executions.
    pub barriers: u64,
    /// Shared-memory wavefronts of the shared loads and stores: one per access, more when lanes
    /// hit distinct words of one bank (bank conflicts).
    pub shared_wavefronts: u64,
    /// Distinct 32-byte sectors of the global loads and stores (coalescing: 4 per 128
    /// contiguous bytes, up to one per lane when the lanes scatter).
    pub global_sectors: u64,
    /// Warp-instructions of the busiest CTA (the serial work of one block).
    pub max_cta_warp_instructions: u64,
}

/// What one CTA executed.
#[derive(Clone, Copy, Default)]
struct CtaCount {
    steps: u64,
    lanes: u64,
    mem: MemCounts,
}

impl CtaCount {
    fn add(self, o: CtaCount) -> CtaCount {
        CtaCount {
            steps: self.steps + o.steps,
            lanes: self.lanes + o.lanes,
            mem: MemCounts {
                global_loads: self.mem.global_loads + o.mem.global_loads,
                global_stores: self.mem.global_stores + o.mem.global_stores,
                global_bytes: self.mem.global_bytes + o.mem.global_bytes,
                load_epochs: self.mem.load_epochs + o.mem.load_epochs,
                barriers: self.mem.barriers + o.mem.barriers,
                shared_wavefronts: self.mem.shared_wavefronts + o.mem.shared_wavefronts,
                global_sectors: self.mem.global_sectors + o.mem.global_sectors,
            },
        }
    }
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
    let run_one = |s: &mut Scratch, i: u64| -> Result<CtaCount, ExecError> {
        if abort.load(Ordering::Relaxed) {
            return Ok(CtaCount::default());
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
            mem: MemCounts::default(),
            hint: 0,
            hw_fma,
        };
        let result = cta::run_cta(&mut env, &mut s.warps);
        s.shared = std::mem::take(&mut env.shared);
        if result.is_err() {
            abort.store(true, Ordering::Relaxed);
        }
        result.map(|()| CtaCount {
            steps: env.steps,
            lanes: env.lane_instrs,
            mem: env.mem,
        })
    };
    // The CTAs to run: the whole grid, or the given sample (indices beyond the grid skipped).
    let sample: Vec<u64> = l
        .only
        .map(|o| o.iter().copied().filter(|&i| i < ncta).collect())
        .unwrap_or_default();
    let count = if l.only.is_some() {
        sample.len() as u64
    } else {
        ncta
    };
    let index = |k: u64| {
        if l.only.is_some() {
            sample[k as usize]
        } else {
            k
        }
    };
    // Contiguous chunks of CTAs, a few per worker thread for balance; each chunk reuses one
    // scratch (register files, shared memory) for all its CTAs.
    let chunks = if l.parallel {
        (rayon::current_num_threads() as u64 * 8).clamp(1, count.max(1))
    } else {
        1
    };
    let per_chunk = count.div_ceil(chunks);
    let run_chunk = |c: u64| -> Result<(CtaCount, u64), ExecError> {
        let mut s = new_scratch();
        let (mut total, mut max_steps) = (CtaCount::default(), 0u64);
        for k in c * per_chunk..((c + 1) * per_chunk).min(count) {
            let one = run_one(&mut s, index(k))?;
            max_steps = max_steps.max(one.steps);
            total = total.add(one);
        }
        Ok((total, max_steps))
    };
    let results: Vec<Result<(CtaCount, u64), ExecError>> = if chunks > 1 {
        (0..chunks).into_par_iter().map(run_chunk).collect()
    } else {
        vec![run_chunk(0)]
    };
    let mut stats = LaunchStats {
        ctas: count,
        ..LaunchStats::default()
    };
    for r in results {
        let (c, max_steps) = r?;
        stats.warp_instructions += c.steps;
        stats.lane_instructions += c.lanes;
        stats.global_loads += c.mem.global_loads;
        stats.global_stores += c.mem.global_stores;
        stats.global_bytes += c.mem.global_bytes;
        stats.load_epochs += c.mem.load_epochs;
        stats.barriers += c.mem.barriers;
        stats.shared_wavefronts += c.mem.shared_wavefronts;
        stats.global_sectors += c.mem.global_sectors;
        stats.max_cta_warp_instructions = stats.max_cta_warp_instructions.max(max_steps);
    }
    Ok(stats)
}
