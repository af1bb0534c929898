//! Shared by the CUDA backend tests: the device they run on (emulated by default; the real GPU
//! with `TOWERPACK_TEST_CUDA=gpu`), the example training programs ([`model_steps`], lowered
//! as the CUDA session does), NVRTC and ptxas discovery with a clear failure when
//! missing, and comparison helpers.
#![allow(dead_code)]

pub mod ops;

#[path = "../model_steps/mod.rs"]
mod model_steps;
pub use model_steps::*;

use std::sync::Arc;
use towerpack::backend::Step;
use towerpack::backend::cuda::driver::emulated::EmulatedDriver;
use towerpack::backend::cuda::nvrtc::Arch;
use towerpack::backend::cuda::{CudaOptions, CudaSession};
use towerpack::ir::Graph;
use towerpack::lower::{LowerOptions, Program, lower};
use towerpack::train::BackendChoice;

/// Where the CUDA tests run their comparisons.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestDevice {
    /// towerpack-ptx's emulated devices (the default: every machine).
    Emulated,
    /// The machine's GPUs (`TOWERPACK_TEST_CUDA=gpu`).
    Gpu,
}

/// The device of `TOWERPACK_TEST_CUDA` (`gpu` or `emu`, default `emu`); any other value fails
/// the test rather than silently testing the emulator.
pub fn test_device() -> TestDevice {
    match std::env::var("TOWERPACK_TEST_CUDA").as_deref() {
        Err(_) | Ok("") | Ok("emu") | Ok("cuda-emu") => TestDevice::Emulated,
        Ok("gpu") | Ok("cuda") => TestDevice::Gpu,
        Ok(other) => panic!("TOWERPACK_TEST_CUDA={other}: expected `gpu` or `emu`"),
    }
}

/// The trainer's backend choice for `devices` devices of the test device.
pub fn backend(devices: usize) -> BackendChoice {
    match test_device() {
        TestDevice::Emulated => BackendChoice::CudaEmu { devices },
        TestDevice::Gpu => BackendChoice::Cuda { devices },
    }
}

/// A CUDA session over `graph` on `devices` devices (0: one per logical device) of the test
/// device; fails the test with the backend's message when the device cannot be opened.
pub fn session(graph: Graph, devices: usize, options: CudaOptions) -> CudaSession {
    let s = match test_device() {
        TestDevice::Emulated => CudaSession::emulated(graph, devices, options),
        TestDevice::Gpu => CudaSession::gpu(graph, devices, options),
    };
    s.unwrap_or_else(|e| panic!("cannot open a CUDA session on {:?}: {e}", test_device()))
}

/// A CUDA session over `graph` on one emulated device that reports `multiprocessors` SMs (what
/// launch shapes are chosen for: GEMM tiles, splits of K and of long reductions).
pub fn emulated_session(graph: Graph, multiprocessors: u32, options: CudaOptions) -> CudaSession {
    let driver = EmulatedDriver::new(1);
    driver
        .device(0)
        .expect("device 0")
        .set_multiprocessors(multiprocessors);
    CudaSession::with_driver(graph, Arc::new(driver), options).expect("emulated session")
}

/// Whether the test device has `n` devices: always on emulated devices; on a GPU machine, the
/// driver's count. A test needing more GPUs than the machine has says so and passes (its
/// emulated run covers the logic).
pub fn has_devices(n: usize, test: &str) -> bool {
    if test_device() == TestDevice::Emulated {
        return true;
    }
    match CudaSession::gpu(Graph::new(), n, CudaOptions::default()) {
        Ok(_) => true,
        Err(e) => {
            eprintln!("{test}: skipped on this GPU machine ({e})");
            false
        }
    }
}

/// The lowering options of the CUDA tests' example programs: the session's without epilogue
/// reductions, so every batch-norm reduction is a kernel of its own the tests compare
/// (`cuda_emu_split` and `cuda_emu_kernels`' ResNet-20 case cover the epilogue reductions).
pub fn cuda_lowering() -> LowerOptions {
    LowerOptions {
        epilogue_reductions: false,
        ..towerpack::backend::cuda::CudaOptions::default().lowering()
    }
}

/// The op-coverage graph of [`ops`] as a step fetching every result.
pub fn ops_program() -> (Graph, Program) {
    let c = ops::build();
    let step = Step::new(c.fetches.iter().map(|f| f.1).collect(), Vec::new());
    let p = lower(&c.graph, &step, ops::N, &cuda_lowering()).expect("lower ops");
    (c.graph, p)
}

/// The lowered training programs the CUDA tests cover: (name, graph, program).
pub fn example_programs() -> Vec<(&'static str, TrainGraph, Program)> {
    let opts = cuda_lowering();
    [
        ("mlp", mlp(), 4),
        ("resnet20", resnet20(), 2),
        ("convnet", convnet(), 3),
    ]
    .into_iter()
    .map(|(name, tg, batch)| {
        let p = lower(&tg.graph, &tg.step, batch, &opts).expect("lower");
        (name, tg, p)
    })
    .collect()
}

/// Fails the test with a clear message when NVRTC is missing (CI installs it).
pub fn require_nvrtc() {
    if let Err(e) = towerpack::backend::cuda::nvrtc::ensure_nvrtc() {
        panic!(
            "this test needs NVRTC and it is missing: {e}\n\
             (CI installs it: pip install nvidia-cuda-nvrtc-cu12==12.9.86)"
        );
    }
}

/// `ptxas` of the `nvidia-cuda-nvcc-cu12` wheel (or `TOWERPACK_PTXAS`); fails clearly if missing.
pub fn ptxas() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("TOWERPACK_PTXAS") {
        return p.into();
    }
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import nvidia.cuda_nvcc as m; print(list(m.__path__)[0])",
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let dir = String::from_utf8_lossy(&o.stdout).trim().to_string();
            let p = std::path::Path::new(&dir).join("bin").join("ptxas");
            assert!(p.exists(), "{} does not exist", p.display());
            p
        }
        _ => panic!(
            "this test needs ptxas and it is missing: set TOWERPACK_PTXAS or \
             pip install nvidia-cuda-nvcc-cu12==12.9.86 (CI installs it)"
        ),
    }
}

/// ptxas's report of one kernel (`ptxas -v`).
#[derive(Debug, Default)]
pub struct Report {
    pub registers: u32,
    pub shared: u32,
    pub stack: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    /// ptxas's whole `-v` output.
    pub log: String,
}

impl Report {
    /// Bytes of local memory the kernel uses: stack frame and spills.
    pub fn spilled(&self) -> u32 {
        self.stack + self.spill_stores + self.spill_loads
    }
}

fn number_before(line: &str, unit: &str) -> Option<u32> {
    let at = line.find(unit)?;
    line[..at].split_whitespace().last()?.parse().ok()
}

/// Assembles `ptx` for `arch` with `ptxas -v` (which must accept it) and reads its report.
pub fn assemble(ptx: &str, arch: Arch) -> Report {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("k.ptx");
    std::fs::write(&file, ptx).expect("write ptx");
    let out = std::process::Command::new(ptxas())
        .arg(format!("-arch={}", arch.sm()))
        .arg("-v")
        .arg(&file)
        .arg("-o")
        .arg(dir.path().join("k.cubin"))
        .output()
        .expect("run ptxas");
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "ptxas {} rejected:\n{log}\n{ptx}",
        arch.sm()
    );
    let mut r = Report {
        log: log.clone(),
        ..Report::default()
    };
    for line in log.lines() {
        if line.contains("bytes stack frame") {
            r.stack = number_before(line, "bytes stack frame").unwrap_or(0);
            r.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
            r.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
        }
        if line.contains("Used") && line.contains("registers") {
            r.registers = number_before(line, "registers").unwrap_or(0);
            r.shared = number_before(line, "bytes smem").unwrap_or(0);
        }
    }
    r
}
