//! towerpack-ptx: an emulated CUDA device that executes the PTX NVRTC emits, on the CPU.
//!
//! The pipeline: `lexer` (logos) → `parser` (syntax tree) → `decode` (typed instructions with
//! resolved registers, labels and symbols, once per module) → `exec` (grids of CTAs, warps of 32
//! lanes with per-lane PCs, barriers, shuffles, bounds-checked memory, exact rounding). The
//! [`Device`] API mirrors the CUDA driver API the CUDA backend calls: [`Device::load_module`],
//! [`Device::alloc`], copies, [`Device::launch`] with packed parameters.
//!
//! Semantics worth knowing: every memory access is bounds- and alignment-checked (a fault names
//! the kernel, PTX line, CTA, thread and address); round-to-nearest arithmetic is IEEE-exact and
//! directed rounding (`fma.rm` ...) is exactly rounded; `.approx` functions are more accurate
//! than the hardware's; tensor-core `mma` rounds each exact dot product once (the hardware's
//! accumulation order is unspecified); `cp.async` copies land at the wait that completes them.
//! CTAs run in parallel, so only the order of float atomics across CTAs (and racy kernels) can
//! change results between runs; everything else is deterministic.
//!
//! ```
//! use towerpack_ptx::{Device, KernelArgs, LaunchConfig};
//! let ptx = r#"
//! .version 8.8
//! .target sm_80
//! .address_size 64
//! .visible .entry twice(.param .u64 p)
//! {
//!     .reg .b32 %r<3>; .reg .f32 %f<3>; .reg .b64 %rd<4>;
//!     ld.param.u64 %rd1, [p];
//!     mov.u32 %r1, %tid.x;
//!     mul.wide.u32 %rd2, %r1, 4;
//!     add.s64 %rd3, %rd1, %rd2;
//!     ld.global.f32 %f1, [%rd3];
//!     add.f32 %f2, %f1, %f1;
//!     st.global.f32 [%rd3], %f2;
//!     ret;
//! }"#;
//! let dev = Device::new(0);
//! let module = dev.load_module(ptx)?;
//! let buf = dev.alloc(4 * 32)?;
//! let host: Vec<u8> = (0..32).flat_map(|i| (i as f32).to_le_bytes()).collect();
//! dev.copy_htod(buf, &host)?;
//! let cfg = LaunchConfig { grid: [1, 1, 1], block: [32, 1, 1], shared_bytes: 0 };
//! dev.launch(&module, "twice", cfg, KernelArgs::PerParam(&[&buf.0.to_le_bytes()]))?;
//! let mut out = vec![0u8; 4 * 32];
//! dev.copy_dtoh(&mut out, buf)?;
//! assert_eq!(f32::from_le_bytes(out[12..16].try_into().unwrap()), 6.0);
//! # Ok::<(), towerpack_ptx::EmuError>(())
//! ```

mod decode;
mod device;
mod error;
mod exec;
mod inst;
mod kernel;
mod lexer;
mod memory;
mod module;
mod parser;
mod softfloat;

pub use device::{
    DEFAULT_MULTIPROCESSORS, DEFAULT_STEP_LIMIT, Device, DevicePtr, Event, KernelArgs,
    LaunchConfig, MAX_SHARED_PER_CTA, copy_peer, create_devices,
};
pub use error::{EmuError, ExecError, Fault, LoadError, Space};
pub use exec::LaunchStats;
pub use kernel::{Kernel, ParamInfo};
pub use module::Module;
