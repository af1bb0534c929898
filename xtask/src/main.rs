//! `cargo xtask`: the project's commands that need more than cargo (the xtask pattern: a plain
//! Rust binary of the workspace, run through the alias in `.cargo/config.toml`).
//!
//! - `cargo xtask test [ARGS]` — the README's test command: brings the Python packages some
//!   tests use when `python3` cannot import them ([`setup`]), then runs
//!   `cargo test --release --workspace [ARGS]` with those packages on `PYTHONPATH`.
//! - `cargo xtask setup` — the first half alone.
//!
//! Missing packages are installed with `pip install --target target/pydeps`, inside this
//! checkout: nothing is written to the system's or the user's Python (no root, no virtual
//! environment, and PEP 668's "externally managed" interpreters accept it), and `cargo clean`
//! removes them. Packages already importable (e.g. installed by `.ci/setup`) are used as they
//! are.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// A Python package some tests use: the module they import, the pip requirement that provides
/// it, and which tests need it.
struct PythonPackage {
    module: &'static str,
    requirement: &'static str,
    used_by: &'static str,
}

/// Everything the default test suite (`cargo test --release --workspace`) needs besides Rust.
const PACKAGES: &[PythonPackage] = &[
    PythonPackage {
        module: "nvidia.cuda_nvrtc",
        requirement: "nvidia-cuda-nvrtc-cu12==12.9.86",
        used_by: "the CUDA tests (NVRTC compiles the kernels the emulated device runs)",
    },
    PythonPackage {
        module: "nvidia.cuda_nvcc",
        requirement: "nvidia-cuda-nvcc-cu12==12.9.86",
        used_by: "the register-spill check of every kernel (ptxas)",
    },
    PythonPackage {
        module: "tensorboard",
        requirement: "tensorboard",
        used_by: "the event-file tests (TensorBoard's own reader)",
    },
    PythonPackage {
        module: "onnx",
        requirement: "onnx",
        used_by: "the ONNX export tests (onnx.checker)",
    },
    PythonPackage {
        module: "onnxruntime",
        requirement: "onnxruntime",
        used_by: "the ONNX export tests (onnxruntime's outputs against the predictor's)",
    },
];

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let command = args.next();
    let rest: Vec<OsString> = args.collect();
    let result = match command.as_ref().and_then(|c| c.to_str()) {
        Some("test") => setup().and_then(|pythonpath| test(&pythonpath, &rest)),
        Some("setup") => setup().map(|_| ExitCode::SUCCESS),
        _ => {
            eprintln!(
                "usage: cargo xtask test [ARGS]   bring the tests' Python packages, then \
                 `cargo test --release --workspace [ARGS]`\n       cargo xtask setup        \
                 only bring the Python packages (into target/pydeps)"
            );
            return ExitCode::from(2);
        }
    };
    result.unwrap_or_else(|message| {
        eprintln!("xtask: {message}");
        ExitCode::FAILURE
    })
}

/// The workspace root: xtask's manifest lives in `<root>/xtask`.
fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// `target/pydeps` prepended to the caller's `PYTHONPATH`.
fn python_path(pydeps: &Path) -> Result<OsString, String> {
    let mut paths = vec![pydeps.to_path_buf()];
    if let Some(existing) = std::env::var_os("PYTHONPATH") {
        paths.extend(std::env::split_paths(&existing));
    }
    std::env::join_paths(paths).map_err(|e| format!("PYTHONPATH: {e}"))
}

/// The packages `python3` cannot import with `pythonpath`.
fn missing(pythonpath: &OsString) -> Result<Vec<&'static PythonPackage>, String> {
    let mut absent = Vec::new();
    for package in PACKAGES {
        let status = Command::new("python3")
            .args(["-c", &format!("import {}", package.module)])
            .env("PYTHONPATH", pythonpath)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .map_err(|e| {
                format!(
                    "cannot run python3 ({e}); the tests need it for {}",
                    package.used_by
                )
            })?;
        if !status.success() {
            absent.push(package);
        }
    }
    Ok(absent)
}

/// Installs the missing packages into `target/pydeps` and returns the `PYTHONPATH` under which
/// every package imports.
fn setup() -> Result<OsString, String> {
    let pydeps = workspace_root().join("target").join("pydeps");
    let pythonpath = python_path(&pydeps)?;
    let absent = missing(&pythonpath)?;
    if absent.is_empty() {
        return Ok(pythonpath);
    }
    eprintln!(
        "xtask: installing into {} the Python packages python3 cannot import:",
        pydeps.display()
    );
    for package in &absent {
        eprintln!("  {} — for {}", package.requirement, package.used_by);
    }
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .arg("--target")
        .arg(&pydeps)
        .args(absent.iter().map(|p| p.requirement))
        .status()
        .map_err(|e| format!("cannot run `python3 -m pip` ({e})"))?;
    if !status.success() {
        return Err(format!(
            "`pip install --target {}` failed ({status}); install {} yourself, or run \
             `bash .ci/setup`",
            pydeps.display(),
            absent
                .iter()
                .map(|p| p.requirement)
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    let still = missing(&pythonpath)?;
    if let Some(package) = still.first() {
        return Err(format!(
            "{} was installed into {} but `import {}` still fails",
            package.requirement,
            pydeps.display(),
            package.module
        ));
    }
    Ok(pythonpath)
}

/// `cargo test --release --workspace ARGS` with the packages on `PYTHONPATH`; its exit status.
fn test(pythonpath: &OsString, args: &[OsString]) -> Result<ExitCode, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(workspace_root())
        .args(["test", "--release", "--workspace"])
        .args(args)
        .env("PYTHONPATH", pythonpath)
        .status()
        .map_err(|e| format!("cannot run cargo ({e})"))?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}
