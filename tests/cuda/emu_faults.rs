//! Deliberately broken kernels run through the CUDA backend's own launch path on the emulated
//! device: an out-of-bounds write, a shuffle in divergent code and a barrier only some threads
//! reach are each reported as an error naming the program kernel and the PTX line of the
//! faulting instruction — never a crash or a hang.

use crate::cuda_common;

use towerpack::backend::cuda::bodies::COMMON;
use towerpack::backend::cuda::nvrtc::{Arch, Compiler};
use towerpack::backend::cuda::render::{self, KernelPlan};
use towerpack::backend::cuda::{CudaOptions, CudaSession};
use towerpack::backend::{BackendError, Session};
use towerpack::lower::KernelKind;

const OOB_WRITE: &str = r#"
extern "C" __global__ void tp_broken(const tp_params p) {
    // Far past the end of the output buffer and of its arena.
    p.out0[(1u << 24) + threadIdx.x] = 1.0f;
}
"#;

const DIVERGENT_SHUFFLE: &str = r#"
extern "C" __global__ void tp_broken(const tp_params p) {
    const int lane = threadIdx.x & 31;
    float v = (float)lane;
    for (int i = 0; i < lane; ++i) v = __shfl_down_sync(0xffffffffu, v, 1);  // lanes diverge
    if (threadIdx.x == 0) p.out0[0] = v;
}
"#;

const MISSING_BARRIER: &str = r#"
extern "C" __global__ void tp_broken(const tp_params p) {
    __shared__ float s[256];
    s[threadIdx.x] = (float)threadIdx.x;
    if (threadIdx.x < 32) {
        __syncthreads();  // only the first warp arrives: the others have exited
        p.out0[0] = s[255 - threadIdx.x];
    }
}
"#;

/// The line number after "PTX line " in `message`.
fn reported_line(message: &str) -> usize {
    let at = message.find("PTX line ").expect("a PTX line") + "PTX line ".len();
    let digits: String = message[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().expect("a line number")
}

fn run_broken(body: &str, faulting: &str, what: &str) {
    cuda_common::require_nvrtc();
    let tg = cuda_common::mlp();
    let options = CudaOptions {
        cache_dir: None,
        ..CudaOptions::default()
    };
    let mut emu = CudaSession::emulated(tg.graph.clone(), 1, options).expect("emu");
    emu.initialize_variables(1).expect("init");
    let program = emu.program(&tg.step, 4).expect("program").clone();
    // The first elementwise kernel: the broken body takes its parameter struct.
    let index = program
        .kernels
        .iter()
        .position(|k| matches!(k.kind, KernelKind::Elementwise { .. }))
        .expect("an elementwise kernel");
    let KernelPlan::Launch(rendered) = render::render_kernel(&program, index).expect("render")
    else {
        panic!("kernel {index} launches nothing")
    };
    let source = format!("{COMMON}\n{}\n{body}", rendered.generated);
    emu.replace_kernel(&tg.step, 4, index, &source, "tp_broken")
        .expect("replace");
    let ptx = Compiler::new(None)
        .expect("nvrtc")
        .compile("broken", &source, Arch::EMULATED)
        .expect("compile");
    let feeds = cuda_common::feeds(&tg, 4, 1);
    match emu.run(&tg.step, &feeds) {
        Err(BackendError::Kernel { node, message, .. }) => {
            assert_eq!(node, program.kernels[index].name, "{message}");
            // The reported line of the PTX NVRTC produced is the faulting instruction.
            let line = reported_line(&message);
            let text = ptx.lines().nth(line - 1).unwrap_or_default();
            assert!(
                text.contains(faulting),
                "PTX line {line} is `{text}`, expected `{faulting}`: {message}"
            );
            assert!(message.contains(what), "expected `{what}`: {message}");
        }
        other => panic!("expected a fault report, got {other:?}"),
    }
}

#[test]
fn an_out_of_bounds_write_names_the_kernel_and_the_ptx_line() {
    run_broken(OOB_WRITE, "st.global", "out-of-bounds global access");
}

#[test]
fn a_shuffle_in_divergent_code_names_the_kernel_and_the_ptx_line() {
    run_broken(DIVERGENT_SHUFFLE, "shfl.sync.down", "converge");
}

#[test]
fn a_barrier_some_threads_never_reach_is_a_deadlock_not_a_hang() {
    run_broken(MISSING_BARRIER, "bar.sync", "deadlock");
}
