//! Per-block work measured on the emulated device: a program is prepared on emulated devices
//! at its real size and, of every launch, only block 0 runs (the first block does at least as
//! much as any other in every body: grid-stride loops give it the most points, tiles are full
//! at the origin). Its counters — warp-instructions and load epochs — are the block's serial
//! work, which the model turns into time. Launches of the same module with the same shape are
//! measured once (the counts do not depend on the buffer addresses). Memory holds zeros: no
//! body's control flow depends on its data except at its edges.

use super::model::BlockCounts;
use crate::backend::BackendError;
use crate::backend::cuda::driver::emulated::EmulatedDriver;
use crate::backend::cuda::driver::{Driver, ModuleId};
use crate::backend::cuda::nvrtc::Compiler;
use crate::backend::cuda::prepared::{ModuleCache, Prepared, SessionMemory};
use crate::backend::cuda::render::LaunchDims;
use crate::lower::{Program, Storage};
use std::collections::HashMap;

/// One launch of a program with its block's measured counts.
#[derive(Clone, Debug, PartialEq)]
pub struct MeasuredLaunch {
    /// Index of the kernel in the program.
    pub kernel: usize,
    pub dims: LaunchDims,
    /// Static shared memory of the entry point (from its PTX).
    pub static_shared: u32,
    pub counts: BlockCounts,
}

/// Warp-instructions a sampled block may execute before the measurement gives up on it.
const SAMPLE_STEP_LIMIT: u64 = 1 << 34;

/// Prepares `program` on emulated devices and measures block 0 of every launch.
pub fn measure(
    program: &Program,
    compiler: &Compiler,
) -> Result<Vec<MeasuredLaunch>, BackendError> {
    let devices = program
        .devices()
        .max(program.arena_bytes.len())
        .max(program.state.arena_bytes.len())
        .max(1);
    let driver = EmulatedDriver::new(devices);
    for d in 0..devices {
        if let Some(dev) = driver.device(d) {
            dev.set_step_limit(SAMPLE_STEP_LIMIT);
        }
    }
    // The session's memory: state arenas as large as the program's variables need.
    let mut state_bytes = program.state.arena_bytes.clone();
    state_bytes.resize(devices, 0);
    for b in &program.buffers {
        if let Storage::State { device, offset } = b.storage {
            let d = usize::from(device);
            state_bytes[d] = state_bytes[d].max(offset + b.bytes());
        }
    }
    let mut state = Vec::with_capacity(devices);
    let mut status = Vec::with_capacity(devices);
    for (d, &bytes) in state_bytes.iter().enumerate() {
        state.push(driver.alloc(d, bytes)?);
        status.push(driver.alloc(d, 8)?);
    }
    let memory = SessionMemory {
        state: &state,
        status: &status,
    };
    let prepared = Prepared::new(
        program.clone(),
        &driver,
        compiler,
        &mut ModuleCache::new(),
        &memory,
        crate::backend::cuda::render::launch::windows_from_environment(),
    )?;
    let mut seen: HashMap<(ModuleId, LaunchDims), (BlockCounts, u32)> = HashMap::new();
    let mut out = Vec::new();
    for l in prepared.launches() {
        let key = (l.module, l.dims);
        let (counts, static_shared) = match seen.get(&key) {
            Some(&c) => c,
            None => {
                let stats =
                    driver.sample_launch(l.device, l.module, l.entry, l.dims, l.params, &[0])?;
                let c = BlockCounts {
                    warp_instructions: stats.warp_instructions as f64,
                    load_epochs: stats.load_epochs as f64,
                    shared_wavefronts: stats.shared_wavefronts as f64,
                    global_sectors: stats.global_sectors as f64,
                };
                let shared = driver
                    .static_shared_bytes(l.device, l.module, l.entry)
                    .and_then(|b| u32::try_from(b).ok())
                    .unwrap_or(0);
                seen.insert(key, (c, shared));
                (c, shared)
            }
        };
        out.push(MeasuredLaunch {
            kernel: l.kernel,
            dims: l.dims,
            static_shared,
            counts,
        });
    }
    Ok(out)
}
