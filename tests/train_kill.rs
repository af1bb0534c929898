//! Exact resume across a real crash: a child process (this test binary, re-run with an
//! environment variable) trains with checkpoints every 4 steps and is killed with SIGKILL
//! after a checkpoint appears; the run resumed from its latest checkpoint ends with variables
//! bit-identical to an uninterrupted run, and the same stats.json.

mod train_common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use towerpack::train::checkpoint::latest_checkpoint;
use towerpack::train::*;
use train_common::*;

const DIR_VAR: &str = "TOWERPACK_KILL_TEST_DIR";

/// Sleeps after every step (no fetches: the steps the backend runs are unchanged), so the
/// parent has time to kill the run in the middle.
struct Slow;

impl Callback for Slow {
    fn chief_only(&self) -> bool {
        false
    }
    fn trigger_step(&mut self, _: &mut TrainContext) -> Result<(), TrainError> {
        std::thread::sleep(Duration::from_millis(40));
        Ok(())
    }
}

#[test]
#[ignore = "the child process of the SIGKILL test; runs only when spawned by it"]
fn child_training_run() {
    let Some(dir) = std::env::var_os(DIR_VAR) else {
        return;
    };
    let c = full_config(Path::new(&dir))
        .auto_resume(true)
        .callback(Slow);
    launch_train_with_config(c, &mut SimpleTrainer::new()).expect("child training");
}

fn latest_step(dir: &Path) -> Option<u64> {
    let path = latest_checkpoint(dir).ok()??;
    towerpack::train::checkpoint::step_of_file_name(path.file_name()?.to_str()?)
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
            "child_training_run",
            "--test-threads",
            "1",
        ])
        .env(DIR_VAR, dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the child run");
    // Kill after the checkpoint of step 8, at a time-dependent moment within the next steps.
    let started = Instant::now();
    while latest_step(dir.path()).is_none_or(|s| s < 8) {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no checkpoint appeared"
        );
        if let Some(status) = child.try_wait().expect("poll") {
            panic!("the child ended before it was killed: {status}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let jitter = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() % 120);
    std::thread::sleep(Duration::from_millis(u64::from(jitter)));
    child.kill().expect("SIGKILL");
    let status = child.wait().expect("reap");
    assert_eq!(
        status.signal(),
        Some(9),
        "the child was killed, not finished: {status}"
    );
    let killed_at = latest_step(dir.path()).expect("a checkpoint");
    assert!(killed_at < 24, "the child finished its run ({killed_at})");

    let c = full_config(dir.path()).auto_resume(true);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("resumed run");
    assert_eq!(
        report.resumed.as_ref().expect("resumed").global_step,
        killed_at
    );
    assert_eq!(report.counters.global_step, 24);
    let vars = variable_bytes(report.session.as_ref());
    assert_eq!(vars.len(), reference_vars.len());
    for ((name, a), (_, b)) in reference_vars.iter().zip(&vars) {
        assert!(
            a == b,
            "variable {name} differs after the kill at step {killed_at}"
        );
    }
    assert_eq!(
        deterministic_stats(dir.path()),
        deterministic_stats(reference_dir.path())
    );
}
