//! On a machine without a GPU (every machine of this project), selecting the CUDA backend is
//! one clear error and a non-zero exit — never a panic — and the error points at `cuda-emu`.

use crate::cuda_common;

use std::path::PathBuf;
use std::process::Command;
use towerpack::backend::BackendError;
use towerpack::backend::cuda::{CudaOptions, CudaSession};
use towerpack::train::BackendChoice;

#[test]
fn device_names_parse_with_optional_counts() {
    assert_eq!("cuda".parse(), Ok(BackendChoice::Cuda { devices: 0 }));
    assert_eq!(
        "cuda-emu:2".parse(),
        Ok(BackendChoice::CudaEmu { devices: 2 })
    );
    assert_eq!("cpu:4".parse(), Ok(BackendChoice::Cpu { threads: 4 }));
    assert_eq!("reference".parse(), Ok(BackendChoice::Reference));
    let err = "tpu".parse::<BackendChoice>().expect_err("unknown");
    assert!(err.contains("unknown device `tpu`"), "{err}");
    assert!("cuda:x".parse::<BackendChoice>().is_err());
}

#[test]
fn a_cuda_session_without_a_gpu_is_a_typed_error() {
    let tg = cuda_common::mlp();
    match CudaSession::gpu(tg.graph, 0, CudaOptions::default()) {
        Err(BackendError::Unavailable { backend, reason }) => {
            assert_eq!(backend, "cuda");
            assert!(reason.contains("cuda-emu"), "{reason}");
        }
        Err(other) => panic!("expected an unavailable backend, got {other}"),
        Ok(_) => panic!("this machine has no GPU, yet a CUDA session opened"),
    }
}

/// The example binary, built by `cargo test` next to the test binaries.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let path = dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: `cargo test` (without --test) builds the examples, or run \
         `cargo build --release --example {name}`",
        path.display()
    );
    path
}

/// Runs the mnist example for one epoch on `device` (with `env` set, the PTX cache in a fresh
/// directory) and returns its one error line, after checking that it exits 1 without a panic.
/// Log lines (`[date @towerpack] ...`) may precede it; exactly one line is the error.
fn the_one_error(device: &str, env: &[(&str, &std::ffi::OsStr)]) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(example("mnist"))
        .envs(env.iter().copied())
        .env("TOWERPACK_CUDA_CACHE", dir.path().join("ptx"))
        .args(["--device", device, "--max-epoch", "1", "--logdir"])
        .arg(dir.path().join("log"))
        .output()
        .expect("run the example");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 1, "one error line: {stderr}");
    errors[0].to_string()
}

#[test]
fn the_example_with_device_cuda_prints_one_error_and_exits_non_zero() {
    let error = the_one_error("cuda", &[]);
    assert!(
        error.contains("backend `cuda` is unavailable") && error.contains("cuda-emu"),
        "{error}"
    );
}

/// The emulated device's run with `TOWERPACK_NVRTC` set to `nvrtc`: its one error line.
fn error_with_nvrtc(nvrtc: &std::ffi::OsStr) -> String {
    the_one_error("cuda-emu", &[("TOWERPACK_NVRTC", nvrtc)])
}

#[test]
fn an_nvrtc_path_that_does_not_load_is_one_error_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("libnvrtc.so.13");
    let error = error_with_nvrtc(missing.as_os_str());
    assert!(
        error.contains("TOWERPACK_NVRTC is set")
            && error.contains(&missing.display().to_string())
            && error.contains("cannot open shared object file"),
        "{error}"
    );
}

#[test]
fn a_library_without_nvrtc_s_functions_is_one_error_naming_the_function() {
    // libm loads everywhere and has no NVRTC symbols.
    let error = error_with_nvrtc("libm.so.6".as_ref());
    assert!(
        error.contains("libm.so.6 has no nvrtcVersion") && error.contains("dlsym failed"),
        "{error}"
    );
}
