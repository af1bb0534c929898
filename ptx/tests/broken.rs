//! Deliberately broken kernels (NVRTC output of `kernels/broken.cu`): each failure is reported as
//! an error naming the kernel, the PTX line and what went wrong — never a crash or a hang.

mod common;

use common::*;
use towerpack_ptx::{Device, Fault};

#[test]
fn out_of_bounds_write_names_kernel_line_thread_and_address() {
    let dev = Device::new(0);
    let m = fixture("broken");
    let n = 40usize;
    let buf = zeros::<f32>(&dev, n);
    let err = Args::default()
        .ptr(buf)
        .val(n as i32)
        .launch(&dev, &m, "oob_write", [2, 1, 1], [32, 1, 1], 0)
        .unwrap_err();
    let msg = err.to_string();
    let e = exec_error(err);
    assert_eq!(e.kernel, "oob_write");
    assert_eq!(
        e.line,
        line_of("broken", "st.global.u32", ".entry oob_write")
    );
    let Fault::OutOfBounds { addr, bytes: 4, .. } = e.fault else {
        panic!("{msg}")
    };
    // Thread i writes element i + n; the first thread past the end is thread 0 of CTA 0.
    assert_eq!(addr, buf.0 + 4 * n as u64, "{msg}");
    assert_eq!((e.cta, e.thread), ([0, 0, 0], Some([0, 0, 0])), "{msg}");
    assert!(
        msg.contains("oob_write") && msg.contains(&format!("{addr:#x}")),
        "{msg}"
    );
}

#[test]
fn shuffle_in_divergent_code_is_not_converged() {
    let dev = Device::new(0);
    let m = fixture("broken");
    let out = zeros::<f32>(&dev, 32);
    let err = Args::default()
        .ptr(out)
        .launch(&dev, &m, "divergent_shuffle", [1, 1, 1], [32, 1, 1], 0)
        .unwrap_err();
    let msg = err.to_string();
    let e = exec_error(err);
    assert_eq!(e.kernel, "divergent_shuffle");
    assert!(e.text.starts_with("shfl.sync.down.b32"), "{msg}");
    let Fault::NotConverged {
        missing, detail, ..
    } = &e.fault
    else {
        panic!("{msg}")
    };
    assert_ne!(*missing, 0, "{msg}");
    assert!(detail.contains("lane 0 exited"), "{msg}");
}

#[test]
fn barrier_that_exited_threads_never_reach_is_a_deadlock() {
    let dev = Device::new(0);
    let m = fixture("broken");
    let out = zeros::<f32>(&dev, 64);
    let err = Args::default()
        .ptr(out)
        .launch(&dev, &m, "missing_barrier", [1, 1, 1], [64, 1, 1], 0)
        .unwrap_err();
    let msg = err.to_string();
    let e = exec_error(err);
    assert_eq!(e.kernel, "missing_barrier");
    assert_eq!(
        e.line,
        line_of("broken", "bar.sync", ".entry missing_barrier")
    );
    let Fault::Deadlock { detail } = &e.fault else {
        panic!("{msg}")
    };
    assert!(
        detail.contains("32 of 64 threads") && detail.contains("exited"),
        "{msg}"
    );
}

#[test]
fn infinite_loop_exhausts_the_step_budget() {
    let dev = Device::new(0);
    dev.set_step_limit(100_000);
    let m = fixture("broken");
    let flag = zeros::<i32>(&dev, 1);
    let out = zeros::<i32>(&dev, 32);
    let err = Args::default()
        .ptr(flag)
        .ptr(out)
        .launch(&dev, &m, "spin_forever", [4, 1, 1], [32, 1, 1], 0)
        .unwrap_err();
    let msg = err.to_string();
    let e = exec_error(err);
    assert_eq!(e.kernel, "spin_forever");
    assert_eq!(e.fault, Fault::StepBudget { limit: 100_000 });
    let loop_start = line_of("broken", "ld.volatile.global.u32", ".entry spin_forever");
    assert!((loop_start..=loop_start + 2).contains(&e.line), "{msg}");
    // The same kernel finishes once the flag is set.
    dev.copy_htod(flag, &1i32.to_le_bytes()).unwrap();
    Args::default()
        .ptr(flag)
        .ptr(out)
        .launch(&dev, &m, "spin_forever", [4, 1, 1], [32, 1, 1], 0)
        .unwrap();
    assert_eq!(download::<i32>(&dev, out, 32), vec![1; 32]);
}
