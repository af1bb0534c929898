//! The distributed trainer over real MPI ranks (feature `mpi`; needs Open MPI's `mpirun`).
//! Each test starts `mpirun -np N` on this test binary, whose ignored test `mpi_rank` plays
//! one rank (chosen by environment variables) and writes what its run left to a directory:
//! equivalence with one process at the total batch and identical ranks (f32 and bf16 wire),
//! a rank killed or stopped mid-run ending the job within 60 s with its rank named, and the
//! chief's checkpoint resuming the job with another number of ranks.
#![cfg(feature = "mpi")]

use crate::distributed_common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use distributed_common::*;
use serde_json::{Value as Json, json};
use towerpack::backend::Collective;
use towerpack::backend::collective::WireFormat;
use towerpack::backend::collective::mpi::MpiEngine;
use towerpack::tensor::HostTensor;
use towerpack::train::callbacks::ModelSaver;
use towerpack::train::distributed::DistributedOptions;
use towerpack::train::*;

const MODE: &str = "TOWERPACK_MPI_TEST_MODE";
const DIR: &str = "TOWERPACK_MPI_TEST_DIR";
const STEPS: usize = 8;

/// Sleeps after every step and records the step reached, so a test can act mid-run.
struct Slow {
    file: PathBuf,
}

impl Callback for Slow {
    fn chief_only(&self) -> bool {
        false
    }
    fn trigger_step(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        std::fs::write(&self.file, ctx.global_step().to_string())
            .map_err(|e| TrainError::callback("Slow", e.to_string()))?;
        std::thread::sleep(Duration::from_millis(30));
        Ok(())
    }
}

/// One rank's run in `mode`, returning what the parent checks.
fn rank_run(mode: &str, engine: std::sync::Arc<MpiEngine>, dir: &Path) -> Result<Json, TrainError> {
    let (rank, size) = (engine.rank(), engine.size());
    let mut options = DistributedOptions::default();
    let total = 2 * B;
    let c = match mode {
        "train" | "train-bf16" => {
            if mode == "train-bf16" {
                options.compression = WireFormat::Bf16;
            }
            options.bucket_bytes = 8 << 10;
            let data = shard(size, rank, B, STEPS);
            config(&data, B, STEPS as u64 / 2, 2)
        }
        "slow" => {
            let data = shard(size, rank, B, 60);
            config(&data, B, 60, 3).callback(Slow {
                file: dir.join(format!("rank{rank}.step")),
            })
        }
        "first-half" | "resume" => {
            // Same total batch whatever the number of ranks; a resumed job with another
            // number of ranks restarts its shards, so it is given the remaining batches.
            let batch = total / size;
            let data = if mode == "first-half" {
                shard(size, rank, batch, STEPS)
            } else {
                shard_of_steps(size, rank, batch, STEPS / 2..STEPS)
            };
            let epochs = if mode == "first-half" { 1 } else { 2 };
            config(&data, batch, STEPS as u64 / 2, epochs)
                .callback(ModelSaver::new())
                .logdir(dir.join("logdir"))
                .auto_resume(true)
        }
        other => panic!("unknown mode {other}"),
    };
    let mut trainer = DistributedTrainer::new(engine, options);
    let report = trainer.launch(c)?;
    let vars: Vec<Json> = variables(report.session.as_ref())
        .into_iter()
        .map(|(name, v)| json!([name, v.to_f32_vec()]))
        .collect();
    Ok(json!({
        "global_step": report.counters.global_step,
        "resumed_at": report.resumed.map(|r| r.global_step),
        "variables": vars,
    }))
}

#[test]
#[ignore = "one rank of the MPI tests: runs only under mpirun, started by them"]
fn mpi_rank() {
    let (Ok(mode), Some(dir)) = (std::env::var(MODE), std::env::var_os(DIR)) else {
        return;
    };
    let dir = PathBuf::from(dir);
    #[cfg(feature = "nccl")]
    if mode == "nccl" {
        return nccl_rank(&dir);
    }
    let engine = MpiEngine::init_from_env().expect("MPI");
    let rank = engine.rank();
    std::fs::write(
        dir.join(format!("rank{rank}.pid")),
        std::process::id().to_string(),
    )
    .expect("pid file");
    match rank_run(&mode, engine, &dir) {
        Ok(out) => std::fs::write(dir.join(format!("rank{rank}.json")), out.to_string())
            .expect("result file"),
        Err(e) => {
            std::fs::write(dir.join(format!("rank{rank}.error")), e.to_string())
                .expect("error file");
            panic!("rank {rank}: {e}");
        }
    }
}

/// A rank asking for NCCL gradients: records the trainer's error (or its absence) and fails.
#[cfg(feature = "nccl")]
fn nccl_rank(dir: &Path) {
    let rank = std::env::var("OMPI_COMM_WORLD_RANK").expect("an Open MPI rank");
    let options = DistributedOptions {
        gradient_engine: GradientEngine::Nccl,
        ..DistributedOptions::default()
    };
    match DistributedTrainer::from_environment(options) {
        Ok(_) => std::fs::write(dir.join(format!("rank{rank}.json")), "{}").expect("file"),
        Err(e) => {
            std::fs::write(dir.join(format!("rank{rank}.error")), e.to_string()).expect("file");
            panic!("rank {rank}: {e}");
        }
    }
}

/// `mpirun -np <ranks> [extra] <this binary> mpi_rank` in `mode`, output captured.
fn mpirun(ranks: usize, extra: &[&str], mode: &str, dir: &Path) -> Child {
    let exe = std::env::current_exe().expect("test binary");
    let mut cmd = Command::new("mpirun");
    cmd.args(["--bind-to", "none", "-np", &ranks.to_string()]);
    if ranks > 2 {
        cmd.arg("--oversubscribe");
    }
    cmd.args(extra)
        .arg(exe)
        .args([
            "--ignored",
            "--exact",
            &test_name("mpi_rank"),
            "--test-threads",
            "1",
            "--nocapture",
        ])
        .env(MODE, mode)
        .env(DIR, dir)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("TOWERPACK_MPI_HEARTBEAT_SECS", "0.25")
        .env("TOWERPACK_MPI_PEER_TIMEOUT_SECS", "10")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun (apt-get install openmpi-bin libopenmpi-dev)")
}

/// Waits for `child` at most `limit` (then ends it: SIGTERM, which mpirun forwards to the
/// ranks, then SIGKILL); returns its success, its whole output and how long it ran.
fn finish(mut child: Child, limit: Duration) -> (bool, String, Duration) {
    use std::io::Read;
    let began = Instant::now();
    let mut readers = Vec::new();
    for mut pipe in [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        readers.push(std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        }));
    }
    let status = loop {
        if let Some(status) = child.try_wait().expect("poll mpirun") {
            break status;
        }
        if began.elapsed() > limit {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            std::thread::sleep(Duration::from_secs(3));
            let _ = child.kill();
            break child.wait().expect("reap mpirun");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = began.elapsed();
    let text: String = readers
        .into_iter()
        .map(|r| r.join().unwrap_or_default())
        .collect();
    (status.success(), text, took)
}

fn read_json(path: &Path) -> Json {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("json")
}

fn rank_variables(out: &Json) -> Vec<(String, HostTensor)> {
    out["variables"]
        .as_array()
        .expect("variables")
        .iter()
        .map(|v| {
            let name = v[0].as_str().expect("name").to_string();
            let values: Vec<f32> = v[1]
                .as_array()
                .expect("values")
                .iter()
                .map(|x| x.as_f64().expect("number") as f32)
                .collect();
            let n = values.len();
            (name, HostTensor::from_f32(&[n], values).expect("tensor"))
        })
        .collect()
}

/// The single-process reference at batch 2B, as flat tensors.
fn reference() -> Vec<(String, HostTensor)> {
    let data = shard(1, 0, 2 * B, STEPS);
    let report = launch_train_with_config(
        config(&data, 2 * B, STEPS as u64 / 2, 2),
        &mut SimpleTrainer::new(),
    )
    .expect("single process");
    variables(report.session.as_ref())
        .into_iter()
        .map(|(name, v)| {
            let n = v.len();
            (name, v.reshape(&[n]).expect("flat"))
        })
        .collect()
}

#[test]
fn two_mpi_ranks_at_batch_b_match_one_process_at_batch_2b_and_each_other() {
    let reference = reference();
    for mode in ["train", "train-bf16"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ok, output, _) = finish(mpirun(2, &[], mode, dir.path()), Duration::from_secs(120));
        assert!(ok, "{mode}: mpirun failed:\n{output}");
        let ranks: Vec<Json> = (0..2)
            .map(|r| read_json(&dir.path().join(format!("rank{r}.json"))))
            .collect();
        let vars: Vec<_> = ranks.iter().map(rank_variables).collect();
        assert!(identical(&vars[0], &vars[1]), "{mode}: the ranks differ");
        assert_eq!(ranks[0]["global_step"], STEPS as u64);
        let rel = max_relative_difference(&vars[0], &reference);
        eprintln!("{mode}: 2 MPI ranks vs 1 process, max relative difference {rel:.2e}");
        if mode == "train" {
            assert!(rel <= 1e-5, "relative difference {rel}");
        } else {
            assert!(rel > 1e-6 && rel < 2e-2, "bf16: relative difference {rel}");
        }
    }
}

fn wait_for_step(dir: &Path, rank: usize, at_least: u64, child: &mut Child) -> u32 {
    let began = Instant::now();
    loop {
        let step = std::fs::read_to_string(dir.join(format!("rank{rank}.step")))
            .ok()
            .and_then(|s| s.parse::<u64>().ok());
        if step.is_some_and(|s| s >= at_least) {
            break;
        }
        assert!(
            child.try_wait().expect("poll").is_none(),
            "mpirun ended before the ranks trained"
        );
        assert!(began.elapsed() < Duration::from_secs(60), "no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::read_to_string(dir.join(format!("rank{rank}.pid")))
        .expect("pid")
        .parse()
        .expect("pid number")
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(ok.success(), "kill {sig} {pid}");
}

#[test]
fn killing_a_rank_mid_run_ends_the_job_within_60_s_naming_the_lost_rank() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = mpirun(2, &[], "slow", dir.path());
    let pid = wait_for_step(dir.path(), 1, 5, &mut child);
    signal(pid, "-KILL");
    let (ok, output, took) = finish(child, Duration::from_secs(60));
    assert!(!ok, "the job succeeded:\n{output}");
    assert!(took < Duration::from_secs(60), "took {took:?}");
    // Open MPI's launcher ends the job at once and names the rank.
    assert!(
        output.contains("process rank 1") && output.contains("signal 9"),
        "{output}"
    );
}

#[test]
fn a_rank_killed_under_enable_recovery_is_named_by_the_survivors_watchdog() {
    // With --enable-recovery the launcher lets the job live on: only towerpack's heartbeat
    // watchdog can end the survivor.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = mpirun(2, &["--enable-recovery"], "slow", dir.path());
    let pid = wait_for_step(dir.path(), 1, 5, &mut child);
    let killed = Instant::now();
    signal(pid, "-KILL");
    let (_, output, _) = finish(child, Duration::from_secs(60));
    let took = killed.elapsed();
    let error = std::fs::read_to_string(dir.path().join("rank0.error"))
        .unwrap_or_else(|_| panic!("rank 0 left no error:\n{output}"));
    assert!(took < Duration::from_secs(60), "took {took:?}");
    assert!(
        error.contains("rank 1 (on ") && error.contains("was lost: no heartbeat"),
        "{error}"
    );
    assert!(
        output.contains("rank 0: "),
        "rank 0 did not fail:\n{output}"
    );
}

#[test]
fn a_stopped_rank_is_named_by_the_watchdog_instead_of_hanging() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = mpirun(2, &[], "slow", dir.path());
    let pid = wait_for_step(dir.path(), 1, 5, &mut child);
    let stopped = Instant::now();
    signal(pid, "-STOP");
    let (ok, output, _) = finish(child, Duration::from_secs(60));
    let took = stopped.elapsed();
    // A stopped process does not die: make sure it cannot outlive the test.
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
    assert!(!ok, "the job succeeded:\n{output}");
    assert!(took < Duration::from_secs(60), "took {took:?}");
    let error = std::fs::read_to_string(dir.path().join("rank0.error"))
        .unwrap_or_else(|_| panic!("rank 0 left no error:\n{output}"));
    assert!(
        error.contains("rank 1 (on ") && error.contains("was lost"),
        "{error}"
    );
}

#[test]
fn the_chiefs_checkpoint_resumes_the_job_with_another_number_of_ranks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ok, output, _) = finish(
        mpirun(2, &[], "first-half", dir.path()),
        Duration::from_secs(120),
    );
    assert!(ok, "first half:\n{output}");
    assert_eq!(read_json(&dir.path().join("rank0.json"))["global_step"], 4);
    let (ok, output, _) = finish(
        mpirun(4, &[], "resume", dir.path()),
        Duration::from_secs(120),
    );
    assert!(ok, "resume with 4 ranks:\n{output}");
    let ranks: Vec<Json> = (0..4)
        .map(|r| read_json(&dir.path().join(format!("rank{r}.json"))))
        .collect();
    let reference = reference();
    for (r, out) in ranks.iter().enumerate() {
        assert_eq!(out["resumed_at"], 4, "rank {r}");
        assert_eq!(out["global_step"], STEPS as u64, "rank {r}");
        let vars = rank_variables(out);
        let rel = max_relative_difference(&vars, &reference);
        assert!(rel <= 1e-5, "rank {r}: relative difference {rel}");
    }
}

#[cfg(feature = "nccl")]
#[test]
fn selecting_nccl_without_libnccl_fails_every_rank_with_one_clear_error() {
    if towerpack::backend::collective::nccl::missing_libraries().is_none() {
        eprintln!("NCCL and a CUDA driver are present: the guard has nothing to refuse here");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (ok, output, took) = finish(mpirun(2, &[], "nccl", dir.path()), Duration::from_secs(60));
    assert!(!ok, "the ranks started without NCCL:\n{output}");
    assert!(took < Duration::from_secs(60), "took {took:?}");
    for r in 0..2 {
        let error = std::fs::read_to_string(dir.path().join(format!("rank{r}.error")))
            .unwrap_or_else(|_| panic!("rank {r} left no error:\n{output}"));
        eprintln!("rank {r}: {error}");
        assert!(
            error.contains("collective engine `nccl` is unavailable: ")
                && error.contains("(ranks [0, 1] cannot load NCCL)"),
            "rank {r}: {error}"
        );
    }
}

/// The libtest name of this module's test `name`: in a stage's test binary a test's name is
/// its module path without the crate (`stage::module::test`, listed as `module::test`).
fn test_name(name: &str) -> String {
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    format!("{module}::{name}")
}
