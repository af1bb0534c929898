//! Exact resume across a real crash: a child process (this test binary, re-run with an
//! environment variable) trains with checkpoints every 4 steps and is killed with SIGKILL
//! after a checkpoint appears; the run resumed from its latest checkpoint ends with variables
//! bit-identical to an uninterrupted run, and the same stats.json.

use crate::train_common;

use std::path::Path;
use std::process::{Command, Stdio};

use towerpack::train::*;
use train_common::*;

const DIR_VAR: &str = "TOWERPACK_KILL_TEST_DIR";

#[test]
#[ignore = "the child process of the SIGKILL test; runs only when spawned by it"]
fn child_training_run() {
    let Some(dir) = std::env::var_os(DIR_VAR) else {
        return;
    };
    let c = full_config(Path::new(&dir))
        .auto_resume(true)
        .callback(SlowSteps);
    launch_train_with_config(c, &mut SimpleTrainer::new()).expect("child training");
}

#[cfg(unix)]
#[test]
fn a_run_killed_with_sigkill_resumes_to_bit_identical_weights() {
    use std::os::unix::process::ExitStatusExt;

    let reference_dir = tempfile::tempdir().expect("tempdir");
    let reference =
        launch_train_with_config(full_config(reference_dir.path()), &mut SimpleTrainer::new())
            .expect("uninterrupted run");
    let reference_vars = variable_bytes(reference.session.as_ref());

    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--ignored",
            "--exact",
            &test_name("child_training_run"),
            "--test-threads",
            "1",
        ])
        .env(DIR_VAR, dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the child run");
    // Kill after the checkpoint of step 8, at a time-dependent moment within the next steps.
    wait_for_checkpoint(&mut child, dir.path(), 8);
    jitter(120);
    child.kill().expect("SIGKILL");
    let status = child.wait().expect("reap");
    assert_eq!(
        status.signal(),
        Some(9),
        "the child was killed, not finished: {status}"
    );
    let killed_at = latest_step(dir.path()).expect("a checkpoint");
    assert!(killed_at < 24, "the child finished its run ({killed_at})");

    assert_resumes_bit_identically(
        dir.path(),
        reference_dir.path(),
        &reference_vars,
        killed_at,
        "SIGKILL",
    );
}

/// The libtest name of this module's test `name`: in a stage's test binary a test's name is
/// its module path without the crate (`stage::module::test`, listed as `module::test`).
fn test_name(name: &str) -> String {
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    format!("{module}::{name}")
}
