//! The distributed trainer with ranks as threads of this process ([`LocalGroup`]): the same
//! trainer code as under MPI, without a launcher. Equivalence with one process at the total
//! batch, identical ranks, one all-reduce per bucket, towers inside ranks, bf16 on the wire,
//! stops and failures that end every rank, out-of-step ranks, different graphs, and resumes
//! from the chief's checkpoint with another number of ranks.

use crate::distributed_common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use distributed_common::*;
use towerpack::backend::collective::{CollectiveEngine, CollectiveError, LocalGroup, WireFormat};
use towerpack::backend::{BackendError, Collective};
use towerpack::ir::ReduceOp;
use towerpack::tensor::HostTensor;
use towerpack::train::callbacks::ModelSaver;
use towerpack::train::distributed::{DistributedOptions, RankLogging};
use towerpack::train::*;

/// What a rank's run left, extracted in its thread.
struct Outcome {
    variables: Vec<(String, HostTensor)>,
    global_step: u64,
    stopped: Option<String>,
    resumed_at: Option<u64>,
}

fn outcome(r: TrainReport) -> Outcome {
    Outcome {
        variables: variables(r.session.as_ref()),
        global_step: r.counters.global_step,
        stopped: r.stopped,
        resumed_at: r.resumed.map(|x| x.global_step),
    }
}

/// Runs `rank_run(rank, engine)` on `size` threads, one [`LocalGroup`] member each.
fn run_ranks<T: Send + 'static>(
    size: usize,
    rank_run: impl Fn(usize, Arc<dyn CollectiveEngine>) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let rank_run = Arc::new(rank_run);
    let threads: Vec<_> = LocalGroup::new(size, Duration::from_secs(60))
        .into_iter()
        .enumerate()
        .map(|(rank, member)| {
            let f = rank_run.clone();
            std::thread::spawn(move || f(rank, member))
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("rank thread"))
        .collect()
}

/// Trains rank `rank` of `size` on its shard of `steps` steps at per-tower batch `B`.
fn train_rank(
    rank: usize,
    size: usize,
    engine: Arc<dyn CollectiveEngine>,
    options: DistributedOptions,
    steps: usize,
) -> Result<Outcome, TrainError> {
    let towers = options.towers_per_rank;
    let data = rank_data(size * towers, rank * towers, towers, B, steps);
    let mut trainer = DistributedTrainer::new(engine, options);
    let report = trainer.launch(config(&data, B, steps as u64 / 2, 2))?;
    Ok(outcome(report))
}

/// One process (SimpleTrainer) at batch `total_batch` over the same examples.
fn single_process(total_batch: usize, steps: usize) -> Vec<(String, HostTensor)> {
    let data = shard(1, 0, total_batch, steps);
    let report = launch_train_with_config(
        config(&data, total_batch, steps as u64 / 2, 2),
        &mut SimpleTrainer::new(),
    )
    .expect("single process");
    variables(report.session.as_ref())
}

#[test]
fn two_ranks_at_batch_b_reach_the_weights_of_one_process_at_batch_2b() {
    let steps = 8;
    let options = DistributedOptions {
        bucket_bytes: 8 << 10,
        ..DistributedOptions::default()
    };
    let outs = run_ranks(2, move |rank, engine| {
        train_rank(rank, 2, engine, options.clone(), steps).expect("rank")
    });
    let reference = single_process(2 * B, steps);
    for o in &outs {
        eprintln!(
            "2 ranks vs 1 process: max relative difference {:.2e}",
            max_relative_difference(&o.variables, &reference)
        );
        assert_eq!(o.global_step, steps as u64);
        let rel = max_relative_difference(&o.variables, &reference);
        assert!(rel <= 1e-5, "relative difference {rel}");
    }
    assert!(identical(&outs[0].variables, &outs[1].variables));
}

/// Counts the gradient all-reduces that reach the engine through the backend.
struct Counting {
    inner: Arc<dyn CollectiveEngine>,
    gradient_calls: AtomicUsize,
}

impl Collective for Counting {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn all_reduce(&self, data: &mut [f32], op: ReduceOp) -> Result<(), BackendError> {
        self.gradient_calls.fetch_add(1, Ordering::Relaxed);
        self.inner.all_reduce(data, op)
    }
}

impl CollectiveEngine for Counting {
    fn local_rank(&self) -> usize {
        self.inner.local_rank()
    }
    fn local_size(&self) -> usize {
        self.inner.local_size()
    }
    fn host(&self) -> String {
        self.inner.host()
    }
    fn all_reduce_as(
        &self,
        d: &mut [f32],
        op: ReduceOp,
        w: WireFormat,
    ) -> Result<(), CollectiveError> {
        self.inner.all_reduce_as(d, op, w)
    }
    fn broadcast(&self, data: &mut [u8], root: usize) -> Result<(), CollectiveError> {
        self.inner.broadcast(data, root)
    }
    fn gradient_wire(&self) -> WireFormat {
        self.inner.gradient_wire()
    }
    fn set_gradient_wire(&self, wire: WireFormat) {
        self.inner.set_gradient_wire(wire)
    }
}

#[test]
fn each_step_makes_one_all_reduce_per_bucket_and_tower_not_per_variable() {
    // 4 variables (2 weights, 2 biases): 1 bucket when unbounded; with 8 KiB buckets fc0/W
    // (98 KiB) alone and the other three (fc1/W 1.3 KiB, biases) together. Each tower of a
    // rank has its own gradient arena per bucket.
    for (bucket_bytes, buckets, towers) in [(usize::MAX, 1, 1), (8 << 10, 2, 1), (8 << 10, 2, 2)] {
        let calls = run_ranks(2, move |rank, engine| {
            let counting = Arc::new(Counting {
                inner: engine,
                gradient_calls: AtomicUsize::new(0),
            });
            let options = DistributedOptions {
                bucket_bytes,
                towers_per_rank: towers,
                ..DistributedOptions::default()
            };
            train_rank(rank, 2, counting.clone(), options, 4).expect("rank");
            counting.gradient_calls.load(Ordering::Relaxed)
        });
        for calls in calls {
            assert_eq!(
                calls,
                4 * buckets * towers,
                "4 steps × {buckets} buckets × {towers} towers"
            );
        }
    }
}

#[test]
fn towers_inside_ranks_match_one_process_at_the_total_batch() {
    let steps = 6;
    let options = DistributedOptions {
        towers_per_rank: 2,
        ..DistributedOptions::default()
    };
    let outs = run_ranks(2, move |rank, engine| {
        train_rank(rank, 2, engine, options.clone(), steps).expect("rank")
    });
    let reference = single_process(4 * B, steps);
    for o in &outs {
        let rel = max_relative_difference(&o.variables, &reference);
        assert!(rel <= 1e-5, "relative difference {rel}");
    }
    assert!(identical(&outs[0].variables, &outs[1].variables));
}

#[test]
fn bf16_on_the_wire_stays_close_and_keeps_ranks_identical() {
    let steps = 8;
    let options = DistributedOptions {
        compression: WireFormat::Bf16,
        ..DistributedOptions::default()
    };
    let outs = run_ranks(2, move |rank, engine| {
        train_rank(rank, 2, engine, options.clone(), steps).expect("rank")
    });
    let reference = single_process(2 * B, steps);
    let rel = max_relative_difference(&outs[0].variables, &reference);
    // bf16 keeps 8 significant bits: the gradients (not the weights) are rounded.
    assert!(rel > 1e-6, "bf16 changed nothing ({rel}): was it used?");
    assert!(rel < 2e-2, "relative difference {rel}");
    assert!(identical(&outs[0].variables, &outs[1].variables));
}

/// Stops (or fails) the run at global step `at`; chief-only unless told otherwise.
struct EndAt {
    at: u64,
    fail: bool,
    chief_only: bool,
}

impl Callback for EndAt {
    fn chief_only(&self) -> bool {
        self.chief_only
    }
    fn trigger_step(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        if ctx.global_step() < self.at {
            Ok(())
        } else if self.fail {
            Err(TrainError::callback("EndAt", "a simulated failure"))
        } else {
            Err(TrainError::stop("EndAt"))
        }
    }
}

fn run_with_end(end_on_rank: usize, fail: bool) -> Vec<Result<Outcome, TrainError>> {
    run_ranks(2, move |rank, engine| {
        let data = shard(2, rank, B, 8);
        let mut c = config(&data, B, 8, 1);
        if rank == end_on_rank {
            c = c.callback(EndAt {
                at: 3,
                fail,
                chief_only: end_on_rank == 0,
            });
        }
        let mut trainer = DistributedTrainer::new(engine, DistributedOptions::default());
        trainer.launch(c).map(outcome)
    })
}

#[test]
fn a_chief_only_stop_ends_every_rank_cleanly() {
    let outs = run_with_end(0, false);
    let chief = outs[0].as_ref().expect("chief");
    let other = outs[1].as_ref().expect("rank 1");
    assert_eq!(chief.stopped.as_deref(), Some("EndAt"));
    let reason = other.stopped.as_deref().expect("rank 1 stopped");
    assert!(reason.contains("rank 0 ended its run"), "{reason}");
    assert_eq!((chief.global_step, other.global_step), (3, 3));
    assert!(identical(&chief.variables, &other.variables));
}

#[test]
fn a_rank_that_fails_ends_the_others_with_an_error_naming_it() {
    let outs = run_with_end(1, true);
    let own = outs[1].as_ref().err().expect("rank 1 fails").to_string();
    assert!(own.contains("simulated failure"), "{own}");
    let chief = outs[0]
        .as_ref()
        .err()
        .expect("the chief fails too")
        .to_string();
    assert!(chief.contains("rank 1 failed"), "{chief}");
}

#[test]
fn ranks_out_of_step_fail_with_where_each_one_is() {
    let outs = run_ranks(2, |rank, engine| {
        let data = shard(2, rank, B, 8);
        // Rank 1's epochs are one step longer: the epoch-end broadcasts cannot line up.
        let c = config(&data, B, 3 + rank as u64, 2);
        let options = DistributedOptions {
            broadcast_every_epoch: true,
            ..DistributedOptions::default()
        };
        let mut trainer = DistributedTrainer::new(engine, options);
        trainer.launch(c).map(outcome)
    });
    for o in outs {
        let e = o.err().expect("out of step").to_string();
        assert!(
            e.contains("out of step")
                && e.contains("rank 0 at the end of an epoch (step 3)")
                && e.contains("rank 1 at step 3"),
            "{e}"
        );
    }
}

#[test]
fn ranks_with_different_graphs_are_refused() {
    let outs = run_ranks(2, |rank, engine| {
        let data = shard(2, rank, B, 4);
        let mut c = config(&data, B, 4, 1);
        c.model = Some(Arc::new(model(if rank == 0 { 32 } else { 16 })));
        let mut trainer = DistributedTrainer::new(engine, DistributedOptions::default());
        trainer.launch(c).map(outcome)
    });
    let own = outs[1].as_ref().err().expect("rank 1").to_string();
    assert!(own.contains("fc0/W") && own.contains("[784,16]"), "{own}");
    let chief = outs[0].as_ref().err().expect("chief").to_string();
    assert!(chief.contains("ranks [1] differ"), "{chief}");
}

/// A 2-rank run checkpointed by the chief after epoch 1, then resumed with `ranks` ranks
/// (the data split for that many ranks at the same total batch) to the end of epoch 2.
fn resume_with(ranks: usize) -> (Vec<Outcome>, Vec<(String, HostTensor)>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let steps = 8;
    let logdir = dir.path().to_path_buf();
    let first = logdir.clone();
    let outs = run_ranks(2, move |rank, engine| {
        let data = shard(2, rank, B, steps);
        let c = config(&data, B, 4, 1)
            .callback(ModelSaver::new())
            .logdir(&first);
        let mut trainer = DistributedTrainer::new(engine, DistributedOptions::default());
        trainer.launch(c).map(outcome).expect("first half")
    });
    assert_eq!(outs[0].global_step, 4);
    let total = 2 * B;
    let resumed = run_ranks(ranks, move |rank, engine| {
        let batch = total / ranks;
        // The same ranks continue their shards where the chief's checkpoint says; another
        // number of ranks restarts its (new) shards, so it gets the job's remaining batches.
        let data = if ranks == 2 {
            shard(2, rank, B, steps)
        } else {
            shard_of_steps(ranks, rank, batch, 4..steps)
        };
        let c = config(&data, batch, 4, 2)
            .callback(ModelSaver::new())
            .logdir(&logdir)
            .auto_resume(true);
        let mut trainer = DistributedTrainer::new(engine, DistributedOptions::default());
        trainer.launch(c).map(outcome).expect("resumed")
    });
    let uninterrupted = run_ranks(2, move |rank, engine| {
        let data = shard(2, rank, B, steps);
        let mut trainer = DistributedTrainer::new(engine, DistributedOptions::default());
        let r = trainer
            .launch(config(&data, B, 4, 2))
            .expect("uninterrupted");
        variables(r.session.as_ref())
    });
    (resumed, uninterrupted.into_iter().next().expect("rank 0"))
}

#[test]
fn the_chiefs_checkpoint_resumes_the_job_with_the_same_or_another_number_of_ranks() {
    for ranks in [2, 1, 4] {
        let (resumed, reference) = resume_with(ranks);
        for o in &resumed {
            assert_eq!(o.resumed_at, Some(4), "{ranks} ranks");
            assert_eq!(o.global_step, 8);
            let rel = max_relative_difference(&o.variables, &reference);
            if ranks == 2 {
                assert!(identical(&o.variables, &reference), "{ranks} ranks: {rel}");
            } else {
                assert!(rel <= 1e-5, "{ranks} ranks: relative difference {rel}");
            }
        }
        for o in &resumed[1..] {
            assert!(identical(&o.variables, &resumed[0].variables));
        }
    }
}

#[test]
fn only_the_chief_logs_unless_ranks_log_to_their_own_directories() {
    for logging in [RankLogging::ChiefOnly, RankLogging::PerRank] {
        let dir = tempfile::tempdir().expect("tempdir");
        let logdir = dir.path().to_path_buf();
        let mode = logging.clone();
        run_ranks(2, move |rank, engine| {
            let data = shard(2, rank, B, 4);
            let mut c = config(&data, B, 4, 1)
                .callback(ModelSaver::new())
                .logdir(&logdir);
            c.monitors = None; // the default monitors: stats.json, events, printer
            let options = DistributedOptions {
                logging: mode.clone(),
                ..DistributedOptions::default()
            };
            let mut trainer = DistributedTrainer::new(engine, options);
            trainer.launch(c).map(outcome).expect("rank")
        });
        let root = dir.path();
        assert!(root.join("stats.json").exists(), "{logging:?}");
        assert!(root.join("model-4.safetensors").exists(), "{logging:?}");
        let rank1 = root.join("rank1");
        match logging {
            RankLogging::ChiefOnly => assert!(!rank1.exists()),
            RankLogging::PerRank => {
                assert!(rank1.join("stats.json").exists());
                // Checkpoints stay with the chief.
                assert!(!rank1.join("model-4.safetensors").exists());
            }
        }
    }
}

#[test]
fn selecting_nccl_without_it_gives_one_clear_error() {
    let options = DistributedOptions {
        gradient_engine: GradientEngine::Nccl,
        ..DistributedOptions::default()
    };
    // Not under mpirun: a job of one process, whose gradient engine would be NCCL.
    let e = match DistributedTrainer::from_environment(options) {
        Ok(_) => panic!("this machine has no GPU: NCCL cannot be used"),
        Err(e) => e.to_string(),
    };
    eprintln!("selecting NCCL here: {e}");
    if cfg!(feature = "nccl") {
        assert!(
            e.contains("collective engine `nccl` is unavailable")
                && (e.contains("libnccl") || e.contains("CUDA driver") || e.contains("GPU 0")),
            "{e}"
        );
    } else {
        assert!(e.contains("built without the `nccl` feature"), "{e}");
    }
}
