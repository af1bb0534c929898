//! Ctrl-C as a user presses it: the `mnist` example binary gets a real SIGINT after its first
//! epoch's log line; it stops at the next step boundary, saves a checkpoint of the partial
//! epoch, says so on stderr, exits with status 130, and a rerun with the same logdir continues
//! from that checkpoint. (Build the example first: `cargo build --release --example mnist`;
//! `cargo test` builds it with the tests.)

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use towerpack::train::checkpoint::{latest_checkpoint, load_checkpoint};

/// `target/<profile>/examples/<name>`: this test binary lives in `target/<profile>/deps/`.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    let path = profile_dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: `cargo test` builds the examples before the tests",
        path.display()
    );
    path
}

const STEPS_PER_EPOCH: u64 = 20;

/// The mnist example's flags for a small run in `logdir` up to `max_epoch`.
fn mnist_args(logdir: &Path, max_epoch: u64) -> Vec<String> {
    let steps = STEPS_PER_EPOCH.to_string();
    let max_epoch = max_epoch.to_string();
    let logdir = logdir.to_str().expect("utf-8 path");
    [
        "--logdir",
        logdir,
        "--max-epoch",
        &max_epoch,
        "--steps-per-epoch",
        &steps,
        "--val-images",
        "200",
        "--batch",
        "32",
        "--threads",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The global step of the latest checkpoint in `dir`, read from its metadata.
fn latest_global_step(dir: &Path) -> u64 {
    let path = latest_checkpoint(dir)
        .expect("readable logdir")
        .expect("a checkpoint");
    let loaded = load_checkpoint(&path).expect("loadable checkpoint");
    loaded.metadata["global_step"]
        .parse()
        .expect("global_step metadata is a number")
}

#[cfg(unix)]
#[test]
fn mnist_interrupted_by_sigint_saves_the_partial_epoch_exits_130_and_resumes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let logdir = dir.path().join("log");
    let mut child = Command::new(example("mnist"))
        .args(mnist_args(&logdir, 1000))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the mnist example starts");
    let stderr = child.stderr.take().expect("piped stderr");
    let (lines_tx, lines) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no epoch-1 log line in 60 s:\n{}", seen.join("\n")));
        let done = line.contains("Epoch 1 (global_step");
        seen.push(line);
        if done {
            break;
        }
    }
    let pid = i32::try_from(child.id()).expect("pid fits i32");
    // SAFETY: sends a signal to our own child process, which has not been reaped yet.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0, "kill -INT");
    let status = child.wait().expect("reap the child");
    reader.join().expect("stderr reader");
    seen.extend(lines.try_iter());
    let stderr = seen.join("\n");
    assert_eq!(status.code(), Some(130), "{status}\n{stderr}");

    let step = latest_global_step(&logdir);
    assert!(
        step > STEPS_PER_EPOCH && step < 1000 * STEPS_PER_EPOCH,
        "the checkpoint is of epoch 1's end ({step}), not of the interrupted run\n{stderr}"
    );
    let said = format!("interrupted by SIGINT at global_step {step}");
    assert_eq!(
        stderr.matches(&said).count(),
        1,
        "not one line `{said}` on stderr:\n{stderr}"
    );
    assert!(stderr.contains("run again to resume"), "{stderr}");
    assert!(
        !stderr.contains("panicked"),
        "an interrupt is not a panic:\n{stderr}"
    );

    // A rerun with the same logdir continues from the interrupted step.
    let last_epoch = step / STEPS_PER_EPOCH + 2;
    let rerun = Command::new(example("mnist"))
        .args(mnist_args(&logdir, last_epoch))
        .output()
        .expect("the mnist example starts again");
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&rerun.stdout),
        String::from_utf8_lossy(&rerun.stderr)
    );
    assert!(rerun.status.success(), "{out}");
    assert!(
        out.contains(&format!("model-{step}.safetensors")) && out.contains("Resuming from"),
        "the rerun did not resume from step {step}:\n{out}"
    );
    assert!(
        out.contains(&format!("epoch {last_epoch}: validation accuracy")),
        "{out}"
    );
    assert_eq!(latest_global_step(&logdir), last_epoch * STEPS_PER_EPOCH);
}
