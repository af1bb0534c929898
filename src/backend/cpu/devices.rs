//! Running a program spread over several logical devices on the CPU: each worker pool gets one
//! thread that runs, in program order, the kernels of every logical device placed on that pool,
//! waiting for other pools' kernels only where the program says so (`Program::waits`).
//!
//! One thread per POOL, not per logical device: two device threads installed into one rayon
//! pool could deadlock, since a worker blocked in a parallel kernel steals the other device's
//! job, which then spins on a kernel below it on the same stack. Within one thread, program
//! order is a valid order (it is a topological order of the whole program), and a wait always
//! names an earlier kernel, so the globally earliest unfinished kernel can always run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::exec::Prepared;
use super::kernels::simd::{SimdLevel, with_level};
use super::memory::Arena;
use crate::backend::{BackendError, Collective};

impl Prepared {
    /// Runs the program's kernels, logical device `d` on `pools[d]` (devices may share a
    /// pool), at SIMD level `level`. The first error stops every pool's thread.
    pub fn run_kernels_on_devices(
        &mut self,
        state: &mut [Arena],
        pools: &[&rayon::ThreadPool],
        collective: Option<&dyn Collective>,
        level: SimdLevel,
    ) -> Result<(), BackendError> {
        let devices = self.program.devices();
        if pools.len() < devices {
            return Err(BackendError::Unavailable {
                backend: "cpu".into(),
                reason: format!(
                    "the program runs on {devices} devices, {} worker pools were given",
                    pools.len()
                ),
            });
        }
        self.bind(state)?;
        // The distinct pools, and which of them runs each logical device.
        let mut distinct: Vec<&rayon::ThreadPool> = Vec::new();
        let pool_of_device: Vec<usize> = pools[..devices]
            .iter()
            .map(
                |&p| match distinct.iter().position(|&q| std::ptr::eq(p, q)) {
                    Some(i) => i,
                    None => {
                        distinct.push(p);
                        distinct.len() - 1
                    }
                },
            )
            .collect();
        let n = self.program.kernels.len();
        let done: Vec<AtomicBool> = (0..n).map(|_| AtomicBool::new(false)).collect();
        let failed = AtomicBool::new(false);
        let this = &*self;
        let results: Vec<Result<Vec<(usize, Duration)>, BackendError>> =
            std::thread::scope(|scope| {
                let handles: Vec<_> = distinct
                    .iter()
                    .enumerate()
                    .map(|(p, &pool)| {
                        let (done, failed, pool_of_device) = (&done, &failed, &pool_of_device);
                        scope.spawn(move || {
                            let mine = (0..n).filter(|&i| {
                                pool_of_device[usize::from(this.program.kernels[i].device)] == p
                            });
                            let kernels: Vec<usize> = mine.collect();
                            pool.install(|| {
                                with_level(level, || {
                                    run_in_order(this, &kernels, pool, done, failed, collective)
                                })
                            })
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(BackendError::Unavailable {
                                backend: "cpu".into(),
                                reason: "a device thread panicked".into(),
                            })
                        })
                    })
                    .collect()
            });
        for r in results {
            for (i, elapsed) in r? {
                self.record_time(i, elapsed);
            }
        }
        Ok(())
    }
}

/// Runs `kernels` (ascending indices) in order on the current pool, each after the kernels of
/// other pools it waits for; returns their times when profiling.
fn run_in_order(
    this: &Prepared,
    kernels: &[usize],
    pool: &rayon::ThreadPool,
    done: &[AtomicBool],
    failed: &AtomicBool,
    collective: Option<&dyn Collective>,
) -> Result<Vec<(usize, Duration)>, BackendError> {
    let mut times = Vec::new();
    let threads = pool.current_num_threads();
    for &i in kernels {
        for &w in this.program.waits.get(i).map_or(&[][..], |w| w.as_slice()) {
            let mut spins = 0u32;
            while !done[w as usize].load(Ordering::Acquire) {
                if failed.load(Ordering::Relaxed) {
                    return Ok(times);
                }
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        let start = this.profiling().then(Instant::now);
        if let Err(e) = this.run_one(i, threads, collective) {
            failed.store(true, Ordering::Relaxed);
            return Err(e);
        }
        if let Some(start) = start {
            times.push((i, start.elapsed()));
        }
        done[i].store(true, Ordering::Release);
    }
    Ok(times)
}
