//! The front door, run as a user runs it: the `resnet` example binary (built by `cargo test`
//! next to the test binaries) trains, resumes, benchmarks and predicts, and every mistake a
//! user can make is one clear error line and a non-zero exit, never a panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use towerpack::train::checkpoint::load_checkpoint;

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

fn run(args: &[&str]) -> Output {
    Command::new(example("resnet"))
        .args(args)
        .output()
        .expect("the resnet example starts")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A depth-8 ResNet (n = 1) at batch 16: small enough for a test.
const SMALL: &[&str] = &["--depth", "8", "--batch", "16", "--threads", "2"];

fn small(extra: &[&str]) -> Vec<String> {
    SMALL.iter().chain(extra).map(|s| s.to_string()).collect()
}

/// `--logdir DIR --max-epoch 1 --steps-per-epoch 1`: a run of one step logging into `logdir`.
fn one_step_into(logdir: &Path) -> [&str; 6] {
    [
        "--logdir",
        logdir.to_str().expect("utf-8 path"),
        "--max-epoch",
        "1",
        "--steps-per-epoch",
        "1",
    ]
}

fn run_small(extra: &[&str]) -> Output {
    let args = small(extra);
    run(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
fn resnet_trains_resumes_and_predicts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let logdir = dir.path().join("log");
    let logdir_str = logdir.to_str().expect("utf-8 path");

    let first = run_small(&[
        "--logdir",
        logdir_str,
        "--max-epoch",
        "1",
        "--steps-per-epoch",
        "3",
    ]);
    assert!(first.status.success(), "{}", text(&first));
    assert!(
        text(&first).contains("validation accuracy"),
        "{}",
        text(&first)
    );
    for file in ["log.log", "stats.json", "checkpoint", "model-3.safetensors"] {
        assert!(logdir.join(file).exists(), "{file} missing");
    }
    let events = std::fs::read_dir(&logdir)
        .expect("logdir")
        .filter_map(Result::ok)
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("events.out.tfevents.")
        });
    assert!(events, "no TensorBoard events file");

    // The same command with a later max epoch resumes where the first stopped.
    let second = run_small(&[
        "--logdir",
        logdir_str,
        "--max-epoch",
        "2",
        "--steps-per-epoch",
        "3",
    ]);
    assert!(second.status.success(), "{}", text(&second));
    assert!(
        text(&second).contains("Resuming from") && text(&second).contains("model-3.safetensors"),
        "{}",
        text(&second)
    );
    assert!(logdir.join("model-6.safetensors").exists());

    // --predict writes the logits of every held-out image with the labels.
    let output = dir.path().join("predictions.safetensors");
    let predict = run_small(&[
        "--predict",
        "--load",
        logdir_str,
        "--output",
        output.to_str().expect("utf-8"),
    ]);
    assert!(predict.status.success(), "{}", text(&predict));
    let written = load_checkpoint(&output).expect("a safetensors file");
    let shape_of = |name: &str| {
        written
            .tensors
            .iter()
            .find(|(n, _)| n.as_str() == name)
            .map(|(_, t)| t.shape().to_vec())
            .unwrap_or_else(|| panic!("{name} missing"))
    };
    assert_eq!(shape_of("logits"), vec![2000, 10]);
    assert_eq!(shape_of("labels"), vec![2000]);

    // A different network on the same logdir is refused, and nothing saved is touched.
    let saved = std::fs::read(logdir.join("model-6.safetensors")).expect("checkpoint");
    let other = run(&["--depth", "14", "--logdir", logdir_str, "--max-epoch", "3"]);
    assert_eq!(other.status.code(), Some(1), "{}", text(&other));
    assert!(
        text(&other).contains("written by a different model"),
        "{}",
        text(&other)
    );
    assert_eq!(
        std::fs::read(logdir.join("model-6.safetensors")).expect("kept"),
        saved
    );
}

#[test]
fn resnet_bench_prints_one_json_line() {
    let out = run_small(&["--bench", "--bench-steps", "2"]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().expect("a line");
    let json: serde_json::Value = serde_json::from_str(line).expect("JSON");
    assert_eq!(json["model"], "resnet8");
    assert_eq!(json["batch"], 16);
    assert_eq!(json["towers"], 1);
    assert_eq!(json["steps"], 2);
    assert!(json["images_per_sec"].as_f64().expect("number") > 0.0);
    assert!(json["step_ms_median"].as_f64().expect("number") > 0.0);
}

#[test]
fn resnet_switches_to_data_parallel_trainers_with_one_flag() {
    for trainer in ["ps", "replicated", "async"] {
        let out = run_small(&[
            "--bench",
            "--bench-steps",
            "1",
            "--towers",
            "2",
            "--trainer",
            trainer,
        ]);
        assert!(out.status.success(), "{trainer}: {}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let json: serde_json::Value =
            serde_json::from_str(stdout.lines().last().expect("a line")).expect("JSON");
        assert_eq!(json["trainer"], trainer);
        assert_eq!(json["towers"], 2);
    }
}

#[test]
fn user_mistakes_are_one_clear_error_not_a_panic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("no-such-dir");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--data", missing.to_str().expect("utf-8")],
            "CIFAR-10 directory not found",
        ),
        (vec!["--depth", "21"], "--depth must be 6n + 2"),
        (vec!["--bogus-flag"], "unexpected argument '--bogus-flag'"),
        (vec!["--predict"], "--load"),
        (vec!["--towers", "2"], "--trainer simple trains one tower"),
        (vec!["--device", "tpu"], "unknown device `tpu`"),
    ];
    for (args, expected) in cases {
        let out = run(&args);
        let all = text(&out);
        assert!(!out.status.success(), "{args:?} succeeded:\n{all}");
        assert!(
            all.contains(expected),
            "{args:?}: expected `{expected}` in:\n{all}"
        );
        assert!(!all.contains("panicked"), "{args:?} panicked:\n{all}");
    }

    // A truncated CIFAR file names the file and the offset.
    let cifar = dir.path().join("cifar");
    std::fs::create_dir(&cifar).expect("mkdir");
    for name in [
        "data_batch_1.bin",
        "data_batch_2.bin",
        "data_batch_3.bin",
        "data_batch_4.bin",
    ] {
        std::fs::write(cifar.join(name), vec![0u8; 3073]).expect("write");
    }
    std::fs::write(cifar.join("data_batch_5.bin"), vec![0u8; 3073 + 100]).expect("write");
    std::fs::write(cifar.join("test_batch.bin"), vec![0u8; 3073]).expect("write");
    let out = run(&["--data", cifar.to_str().expect("utf-8")]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("data_batch_5.bin"), "{all}");
    assert!(all.contains("3073"), "{all}");
    assert!(!all.contains("panicked"), "{all}");
}

#[test]
fn the_readme_shows_the_own_model_example_as_it_is() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let example =
        std::fs::read_to_string(root.join("examples/own_model.rs")).expect("own_model.rs");
    let start = example
        .find("use std::sync::Arc;")
        .expect("the example's first `use`");
    assert!(
        readme.contains(&example[start..]),
        "README's \"Your own model\" differs from examples/own_model.rs: copy the file's code \
         from its first `use` into the README"
    );
}

#[test]
fn the_own_model_example_trains_and_predicts_with_the_prelude_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(example("own_model"))
        .current_dir(dir.path())
        .output()
        .expect("the own_model example starts");
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    let accuracy: f64 = all
        .lines()
        .find_map(|l| l.strip_prefix("validation accuracy "))
        .and_then(|rest| rest.trim_end_matches('%').parse().ok())
        .unwrap_or_else(|| panic!("no validation accuracy line:\n{all}"));
    // Measured on this project's machines: 98.00% (AVX-512, 2 threads), 97.75% (AVX2; and one
    // thread), 97.90% (scalar); the bar is issue 18's 97%, 0.75 points below the lowest.
    assert!(accuracy >= 97.0, "accuracy {accuracy}%:\n{all}");
    // The predictor restored from the last checkpoint agrees with the last validation.
    let right: usize = all
        .lines()
        .find_map(|l| {
            l.split(": ")
                .nth(1)?
                .strip_suffix(" of 2000 held-out digits right")
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no predictor line:\n{all}"));
    assert!(
        ((right as f64 / 20.0) - accuracy).abs() < 1e-9,
        "predictor {right}/2000 vs validation {accuracy}%:\n{all}"
    );
    assert!(
        dir.path().join("train_log/own_model/checkpoint").exists(),
        "no checkpoint in the working directory's train_log/own_model"
    );
}

#[test]
fn a_finished_logdir_says_so_instead_of_doing_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let logdir = dir.path().join("log");
    let logdir_str = logdir.to_str().expect("utf-8 path");
    let args = [
        "--logdir",
        logdir_str,
        "--max-epoch",
        "1",
        "--steps-per-epoch",
        "2",
    ];
    let first = run_small(&args);
    assert!(first.status.success(), "{}", text(&first));
    assert!(
        !text(&first).contains("already at max_epoch"),
        "{}",
        text(&first)
    );
    // The same command again: nothing is left to train, and the run says why.
    let again = run_small(&args);
    assert!(again.status.success(), "{}", text(&again));
    assert!(
        text(&again).contains("already at max_epoch 1 (global_step 2)")
            && text(&again).contains("use --fresh or raise --max-epoch"),
        "{}",
        text(&again)
    );
}

#[test]
fn threads_beyond_the_cores_are_a_warning_naming_both_numbers() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let message =
        towerpack::backend::cpu::oversubscription_warning(cores + 1, cores).expect("a warning");
    assert!(
        message.contains(&format!("{} CPU worker threads", cores + 1))
            && message.contains(&format!("has {cores} cores")),
        "{message}"
    );
    assert_eq!(
        towerpack::backend::cpu::oversubscription_warning(cores, cores),
        None
    );

    // One thread more than the cores: enough for the warning, and the run stays quick (the
    // issue's `--threads 1000` takes minutes here).
    let threads = (cores + 1).to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let logdir = dir.path().join("log");
    let mut args = vec!["--depth", "8", "--batch", "16", "--threads", &threads];
    args.extend(one_step_into(&logdir));
    let out = run(&args);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!(
            "{threads} CPU worker threads asked for, but this machine has {cores} cores"
        )),
        "{}",
        text(&out)
    );
}

/// A precision slower than fp32 on this CPU is said once: fp16 always, bf16 without AMX tiles;
/// fp32, TF32 and bf16 on tiles say nothing. The example run trains fp16 one step.
#[test]
fn a_precision_slower_than_fp32_on_the_cpu_is_a_warning() {
    use towerpack::backend::cpu::precision_warning;
    use towerpack::lower::Precision;
    for tiles in [false, true] {
        assert!(precision_warning(Precision::Fp16, tiles).is_some_and(|m| m.contains("fp16")));
        assert_eq!(precision_warning(Precision::Fp32, tiles), None);
        assert_eq!(precision_warning(Precision::Tf32, tiles), None);
    }
    assert!(precision_warning(Precision::Bf16, false).is_some_and(|m| m.contains("AMX")));
    assert_eq!(precision_warning(Precision::Bf16, true), None);

    let dir = tempfile::tempdir().expect("tempdir");
    let logdir = dir.path().join("log");
    let mut args = vec!["--precision", "fp16"];
    args.extend(one_step_into(&logdir));
    let out = run_small(&args);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        text(&out).matches("fp16 on the CPU rounds").count(),
        1,
        "{}",
        text(&out)
    );
}

/// Every example takes the same common flags (`examples/common/cli.rs`), and its help says so.
#[test]
fn the_examples_share_their_common_flags() {
    let common = [
        "--logdir",
        "--fresh",
        "--max-epoch",
        "--steps-per-epoch",
        "--seed",
        "--load",
        "--device",
        "--threads",
        "--precision",
    ];
    for name in ["resnet", "mnist", "gan", "train_mnist_distributed"] {
        let out = Command::new(example(name))
            .arg("--help")
            .output()
            .expect("the example starts");
        let help = text(&out);
        assert!(out.status.success(), "{name}: {help}");
        for flag in common {
            assert!(help.contains(flag), "{name} --help lacks {flag}:\n{help}");
        }
        assert!(help.contains("[default: train_log/"), "{name}: {help}");
    }
}

/// `--load` without `--predict` starts training from the checkpoint's weights (tensorpack's
/// `SessionInit`), and says so; a logdir with a checkpoint of its own resumes from that
/// instead, and says that too. The MPI example runs as a job of one without a launcher.
#[test]
fn load_initialises_training_and_a_resumed_logdir_wins() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mnist = |args: &[&str]| {
        let out = Command::new(example("mnist"))
            .current_dir(dir.path())
            .args(args)
            .output()
            .expect("mnist starts");
        let all = text(&out);
        assert!(out.status.success(), "{args:?}: {all}");
        all
    };
    let first = mnist(&[
        "--logdir",
        "a",
        "--max-epoch",
        "1",
        "--steps-per-epoch",
        "20",
    ]);
    assert!(!first.contains("Restored"), "{first}");
    let loaded = mnist(&[
        "--logdir",
        "b",
        "--load",
        "a",
        "--max-epoch",
        "1",
        "--steps-per-epoch",
        "20",
    ]);
    assert!(
        loaded.contains("Restored") && loaded.contains("from a/model-20.safetensors"),
        "{loaded}"
    );
    assert!(
        loaded.contains("Start training with global_step=20"),
        "{loaded}"
    );
    let resumed = mnist(&[
        "--logdir",
        "b",
        "--load",
        "a",
        "--max-epoch",
        "2",
        "--steps-per-epoch",
        "20",
    ]);
    assert!(
        resumed.contains("Resuming from b/model-40.safetensors"),
        "{resumed}"
    );
    assert!(
        resumed.contains("session_init (e.g. --load) is not used"),
        "{resumed}"
    );

    let out = Command::new(example("train_mnist_distributed"))
        .current_dir(dir.path())
        .args([
            "--logdir",
            "d",
            "--max-epoch",
            "1",
            "--steps-per-epoch",
            "10",
        ])
        .args(["--load", "a"])
        .output()
        .expect("the distributed example starts");
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(
        all.contains("Restored") && all.contains("1 ranks × batch 64"),
        "{all}"
    );
    assert!(dir.path().join("d/model-30.safetensors").is_file(), "{all}");
}
