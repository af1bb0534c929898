//! Graceful interruption with real signals: a child process (this test binary, re-run with an
//! environment variable) trains with checkpoints every 4 steps; SIGINT or SIGTERM stops it at
//! the next step boundary with a checkpoint of that step, the exit status of a death by that
//! signal (128 + N) and one line saying where it stopped; the run resumed from that checkpoint
//! ends with variables bit-identical to an uninterrupted run. A second signal exits at once.

use crate::train_common;

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use towerpack::train::*;
use train_common::*;

const DIR_VAR: &str = "TOWERPACK_INTERRUPT_TEST_DIR";

#[test]
#[ignore = "the child process of the signal tests; runs only when spawned by them"]
fn child_training_run() {
    let Some(dir) = std::env::var_os(DIR_VAR) else {
        return;
    };
    let c = full_config(Path::new(&dir))
        .auto_resume(true)
        .callback(SlowSteps);
    if let Err(e) = launch_train_with_config(c, &mut SimpleTrainer::new()) {
        eprintln!("{e}");
        std::process::exit(e.interrupted_exit_code().unwrap_or(1));
    }
}

/// Starts the child run in `dir`; returns once it wrote a checkpoint of step `at_least` or later.
fn start_child(dir: &Path, at_least: u64) -> Child {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--ignored",
            "--exact",
            &test_name("child_training_run"),
            "--test-threads",
            "1",
            "--nocapture",
        ])
        .env(DIR_VAR, dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the child run");
    wait_for_checkpoint(&mut child, dir, at_least);
    child
}

fn send(child: &Child, signal: i32) {
    let pid = i32::try_from(child.id()).expect("pid fits i32");
    // SAFETY: signals our own child, not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "kill");
}

/// Waits for the child; its exit code and stderr.
fn finish(mut child: Child) -> (Option<i32>, String) {
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("piped")
        .read_to_string(&mut stderr)
        .expect("stderr");
    let status = child.wait().expect("reap");
    (status.code(), stderr)
}

fn interrupted_run_resumes_bit_identically(signal: i32, name: &str) {
    let reference_dir = tempfile::tempdir().expect("tempdir");
    let reference =
        launch_train_with_config(full_config(reference_dir.path()), &mut SimpleTrainer::new())
            .expect("uninterrupted run");
    let reference_vars = variable_bytes(reference.session.as_ref());

    let dir = tempfile::tempdir().expect("tempdir");
    let child = start_child(dir.path(), 8);
    jitter(60);
    send(&child, signal);
    let (code, stderr) = finish(child);
    assert_eq!(code, Some(128 + signal), "{stderr}");
    let stopped_at = latest_step(dir.path()).expect("a checkpoint");
    assert!(stopped_at < 24, "the child finished its run ({stopped_at})");
    let said = format!("interrupted by {name} at global_step {stopped_at}");
    assert!(
        stderr.contains(&said),
        "the checkpoint is not of the step where it stopped: no `{said}` in\n{stderr}"
    );
    assert!(stderr.contains("run again to resume"), "{stderr}");

    assert_resumes_bit_identically(
        dir.path(),
        reference_dir.path(),
        &reference_vars,
        stopped_at,
        name,
    );
}

#[cfg(unix)]
#[test]
fn sigint_saves_the_step_exits_130_and_resumes_bit_identically() {
    interrupted_run_resumes_bit_identically(libc::SIGINT, "SIGINT");
}

#[cfg(unix)]
#[test]
fn sigterm_saves_the_step_exits_143_and_resumes_bit_identically() {
    interrupted_run_resumes_bit_identically(libc::SIGTERM, "SIGTERM");
}

#[cfg(unix)]
#[test]
fn a_second_sigint_exits_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The checkpoint of step 4 appears at a step boundary; the next boundary is one slow step
    // (40 ms) later. Two signals a few milliseconds apart (closer ones could merge into one
    // pending signal) both arrive within that step.
    let child = start_child(dir.path(), 4);
    std::thread::sleep(Duration::from_millis(10));
    send(&child, libc::SIGINT);
    std::thread::sleep(Duration::from_millis(5));
    send(&child, libc::SIGINT);
    let (code, stderr) = finish(child);
    assert_eq!(code, Some(130), "{stderr}");
    assert!(stderr.contains("second interrupt"), "{stderr}");
    assert!(
        !stderr.contains("run again to resume"),
        "the run wound down instead of exiting at once:\n{stderr}"
    );
}

/// The libtest name of this module's test `name`: in a stage's test binary a test's name is
/// its module path without the crate (`stage::module::test`, listed as `module::test`).
fn test_name(name: &str) -> String {
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    format!("{module}::{name}")
}
