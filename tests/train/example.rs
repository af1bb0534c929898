//! An example-style run in a child process (the logger dir is process-wide): it writes a logdir
//! a tensorpack user recognizes — log.log, stats.json, an events file, checkpoints — and running
//! it again resumes where it stopped. With no action for an existing logdir and no terminal,
//! it refuses instead of prompting.

use crate::train_common;

use std::path::Path;
use std::process::{Command, Stdio};

use towerpack::train::callbacks::{
    ClassificationError, InferenceRunner, Inferencer, MinSaver, ModelSaver, ScalarStats,
    ScheduledHyperParamSetter,
};
use towerpack::train::checkpoint::latest_checkpoint;
use towerpack::train::logdir::{LogDirAction, set_logger_dir};
use towerpack::train::summary::load_existing_json;
use towerpack::train::*;
use train_common::*;

const DIR_VAR: &str = "TOWERPACK_EXAMPLE_DIR";
const EPOCHS_VAR: &str = "TOWERPACK_EXAMPLE_EPOCHS";
const ACTION_VAR: &str = "TOWERPACK_EXAMPLE_ACTION";
const CONFIG_DIR_VAR: &str = "TOWERPACK_EXAMPLE_CONFIG_DIR";

/// A run that names its logdir in the config alone (no `set_logger_dir`, no logger installed
/// by the application), backing an existing one up when asked.
#[test]
#[ignore = "the child process of the config-logdir test; runs only when spawned by it"]
fn child_config_logdir_run() {
    let Some(dir) = std::env::var_os(CONFIG_DIR_VAR) else {
        return;
    };
    let action = match std::env::var(ACTION_VAR).as_deref() {
        Ok("backup") => LogDirAction::Backup,
        _ => LogDirAction::Keep,
    };
    let infs: Vec<Box<dyn Inferencer>> = vec![Box::new(ClassificationError::from_logits(
        "linear/output",
        "label",
    ))];
    let c = config(mlp_model(0.1), train_flow(128, 32, 1), None)
        .callback(ModelSaver::new())
        .callback(InferenceRunner::new(val_flow(100, 50), infs))
        .logdir(Path::new(&dir))
        .logdir_action(action)
        .max_epoch(1);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("run");
    println!("LOGDIR {}", report.logdir.expect("a logdir").display());
}

/// What `examples/mnist.rs` does, on fewer digits.
#[test]
#[ignore = "the child process of the example test; runs only when spawned by it"]
fn child_example_run() {
    let Some(dir) = std::env::var_os(DIR_VAR) else {
        return;
    };
    let epochs: u64 = std::env::var(EPOCHS_VAR)
        .expect("epochs")
        .parse()
        .expect("number");
    let action = match std::env::var(ACTION_VAR).as_deref() {
        Ok("ask") => LogDirAction::Ask,
        _ => LogDirAction::Keep,
    };
    let logdir = match set_logger_dir(Path::new(&dir), action) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("logdir refused: {e}");
            std::process::exit(3);
        }
    };
    let infs: Vec<Box<dyn Inferencer>> = vec![
        Box::new(ScalarStats::new(&["cross_entropy_loss"])),
        Box::new(ClassificationError::default()),
    ];
    let c = config(mlp_model(0.1), train_flow(256, 32, 1), Some(&logdir))
        .callback(ModelSaver::new())
        .callback(InferenceRunner::new(val_flow(100, 50), infs))
        .callback(MinSaver::new("validation_error"))
        .callback(ScheduledHyperParamSetter::new(
            "learning_rate",
            &[(0, 0.1), (2, 0.01)],
        ))
        .max_epoch(epochs)
        .auto_resume(true);
    launch_train_with_config(c, &mut SimpleTrainer::new()).expect("example run");
}

fn run_child(dir: &Path, epochs: u64, action: &str) -> std::process::Output {
    Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--ignored",
            "--exact",
            &test_name("child_example_run"),
            "--nocapture",
        ])
        .env(DIR_VAR, dir)
        .env(EPOCHS_VAR, epochs.to_string())
        .env(ACTION_VAR, action)
        .stdin(Stdio::null())
        .output()
        .expect("spawn the example run")
}

fn files(dir: &Path, prefix: &str) -> usize {
    std::fs::read_dir(dir)
        .expect("dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .count()
}

#[test]
fn the_logdir_looks_like_tensorpacks_and_a_second_run_resumes() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("mnist_mlp");
    let out = run_child(&dir, 2, "keep");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = std::fs::read_to_string(dir.join("log.log")).expect("log.log");
    assert!(log.contains("Epoch 2 (global_step 16) finished"), "{log}");
    assert!(log.contains("validation_error: "), "{log}");
    let epochs: Vec<u64> = load_existing_json(&dir)
        .expect("stats")
        .expect("stats.json")
        .iter()
        .map(|r| r.epoch_num)
        .collect();
    assert_eq!(epochs, [1, 2]);
    assert_eq!(files(&dir, "events.out.tfevents."), 1);
    assert!(dir.join("checkpoint").is_file());
    assert!(
        dir.join("model-8.safetensors").is_file() && dir.join("model-16.safetensors").is_file()
    );
    assert!(dir.join("min-validation_error.safetensors").is_file());

    // Run again with one more epoch: it resumes at epoch 3, step 16.
    let out = run_child(&dir, 3, "keep");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = std::fs::read_to_string(dir.join("log.log")).expect("log.log");
    assert!(log.contains("Resuming from"), "{log}");
    assert!(log.contains("Start training with global_step=16"), "{log}");
    assert!(log.contains("Epoch 3 (global_step 24) finished"), "{log}");
    assert!(!log.contains("Epoch 1 (global_step 24)"));
    let epochs: Vec<u64> = load_existing_json(&dir)
        .expect("stats")
        .expect("stats.json")
        .iter()
        .map(|r| r.epoch_num)
        .collect();
    assert_eq!(epochs, [1, 2, 3]);
    assert_eq!(files(&dir, "events.out.tfevents."), 2);
    assert_eq!(
        latest_checkpoint(&dir).expect("index"),
        Some(dir.join("model-24.safetensors"))
    );

    // No action for an existing logdir, and stdin is not a terminal: refuse, never prompt.
    let out = run_child(&dir, 4, "ask");
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("stdin is not a terminal"), "{stderr}");
    assert_eq!(
        latest_checkpoint(&dir).expect("index"),
        Some(dir.join("model-24.safetensors"))
    );
}

/// One way to set the logdir: `TrainConfig::logdir` alone gives `log.log` (and the lines also
/// reach stderr with no logger installed by the application), and `logdir_action` backs an
/// existing one up.
#[test]
fn the_config_alone_sets_the_logdir_and_the_log_goes_to_stderr_and_log_log() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("run");
    let run = |action: &str| {
        let out = Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--ignored",
                "--exact",
                &test_name("child_config_logdir_run"),
                "--nocapture",
            ])
            .env(CONFIG_DIR_VAR, &dir)
            .env(ACTION_VAR, action)
            .stdin(Stdio::null())
            .output()
            .expect("spawn");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
    };
    let (stdout, stderr) = run("keep");
    assert!(
        stdout.contains(&format!("LOGDIR {}", dir.display())),
        "{stdout}"
    );
    for text in [
        stderr.as_str(),
        &std::fs::read_to_string(dir.join("log.log")).expect("log.log"),
    ] {
        assert!(text.contains("Epoch 1 (global_step 4) finished"), "{text}");
        assert!(text.contains("validation_error: "), "{text}");
        assert!(text.contains("learning_rate: 0.1"), "{text}");
    }
    assert!(dir.join("model-4.safetensors").is_file());

    let (_, stderr) = run("backup");
    let backups: Vec<_> = std::fs::read_dir(root.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("run."))
        .collect();
    assert_eq!(backups.len(), 1, "{backups:?}");
    assert!(
        root.path()
            .join(&backups[0])
            .join("model-4.safetensors")
            .is_file()
    );
    // The fresh dir started at step 0 (no resume) and has its own log.
    assert!(!stderr.contains("Resuming from"), "{stderr}");
    let log = std::fs::read_to_string(dir.join("log.log")).expect("log.log");
    assert_eq!(
        log.matches("Epoch 1 (global_step 4) finished").count(),
        1,
        "{log}"
    );
}

/// The libtest name of this module's test `name`: in a stage's test binary a test's name is
/// its module path without the crate (`stage::module::test`, listed as `module::test`).
fn test_name(name: &str) -> String {
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    format!("{module}::{name}")
}
