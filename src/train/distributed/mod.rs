//! Distributed data parallelism across processes and machines: [`DistributedTrainer`]
//! (tensorpack's `HorovodTrainer`, alias [`HorovodTrainer`]). One process per rank, each with
//! its own copy of the variables and its own data; every step, the gradients are averaged across
//! the ranks by all-reduces ([`all_reduce`]: lowered to one in-place all-reduce per bucket of
//! the fused gradient arena, not one per variable), and every rank applies the same update.
//!
//! - rank 0 is the chief: it alone runs chief-only callbacks (checkpoints, validation) and the
//!   session init; its variables are broadcast to the others once callbacks have created
//!   theirs, and at every epoch end when asked;
//! - the batch is per rank: with `N` ranks of `K` towers at batch `B`, a step consumes
//!   `N·K·B` examples and averages (not sums) the gradients — the same update as one process
//!   at batch `N·K·B` on a model without batch statistics;
//! - a resume follows the chief's checkpoint, whatever the number of ranks;
//! - the ranks agree before every step (`sync`): one rank that ends its loop (a stop, an
//!   error, shorter data) ends everyone's, and ranks out of step fail with an error naming
//!   where each is. A rank that dies is the engine's business: see
//!   [`crate::backend::collective`].

pub mod all_reduce;
mod sync;

use std::path::PathBuf;
use std::sync::Arc;

use crate::backend::Session;
use crate::backend::collective::{CollectiveEngine, SingleProcess, WireFormat, launched_by_mpi};
use crate::data::DataFlow;
use crate::dsl::Strategy;
use crate::ir::{NodeId, Value, VarId};
use crate::lower::DEFAULT_BUCKET_BYTES;

pub use all_reduce::all_reduce_gradients;

use self::sync::{Agreement, EpochBroadcast, Point};
use super::config::{BackendChoice, Resume, TrainConfig};
use super::engine::{TrainReport, launch_train_with_config};
use super::error::{DistributedError, SetupError, TrainError};
use super::input::InputSource;
use super::resume::FoundResume;
use super::tower_trainer::{
    TowerGraph, apply_optimizer, build_training_towers_on, tower_gradients,
};
use super::trainer::{BuiltGraph, GraphSetup, StepRunner, Trainer};

/// Where the ranks other than the chief write their logs, event files and `stats.json`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum RankLogging {
    /// Only the chief writes files and prints statistics (tensorpack's Horovod examples).
    #[default]
    ChiefOnly,
    /// Rank `r > 0` writes to `<logdir>/rank<r>` (its own monitors; no checkpoints).
    PerRank,
}

/// Which engine carries the gradient all-reduces of a [`DistributedTrainer`] made by
/// [`DistributedTrainer::from_environment`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GradientEngine {
    /// The job's engine (MPI for a launched job): gradients travel through host memory.
    #[default]
    Job,
    /// NCCL on this rank's GPU (feature `nccl`; CUDA device 0 of the process: give each rank
    /// its own GPU with `CUDA_VISIBLE_DEVICES`), bootstrapped over the job's engine, which
    /// keeps carrying control messages and watching the ranks.
    Nccl,
}

/// Options of a [`DistributedTrainer`].
#[derive(Clone, Debug, PartialEq)]
pub struct DistributedOptions {
    /// Training towers inside each rank (sharing one set of variables, tower `i` on logical
    /// device `i`): each tower's gradient arena is all-reduced across the ranks, then the
    /// fused update kernel averages the towers' arenas.
    pub towers_per_rank: usize,
    /// Largest bucket of gradients one all-reduce carries (bytes of f32 gradients): the
    /// `lower::LowerOptions::bucket_bytes` of the fused update kernels, whose gradient arenas
    /// are the buckets (Horovod's tensor-fusion threshold by default).
    pub bucket_bytes: usize,
    /// How gradients travel: exact f32, or bf16 (half the bytes).
    pub compression: WireFormat,
    /// Also broadcast the chief's variables at the end of every epoch.
    pub broadcast_every_epoch: bool,
    /// Where non-chief ranks log.
    pub logging: RankLogging,
    /// The engine of gradient all-reduces (for [`DistributedTrainer::from_environment`]).
    pub gradient_engine: GradientEngine,
}

impl Default for DistributedOptions {
    fn default() -> DistributedOptions {
        DistributedOptions {
            towers_per_rank: 1,
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            compression: WireFormat::F32,
            broadcast_every_epoch: false,
            logging: RankLogging::ChiefOnly,
            gradient_engine: GradientEngine::Job,
        }
    }
}

/// A data-parallel trainer over the ranks of a collective engine (Horovod-style).
///
/// ```
/// use std::sync::Arc;
/// use towerpack::backend::collective::SingleProcess;
/// use towerpack::train::distributed::{DistributedOptions, DistributedTrainer};
/// use towerpack::train::Trainer;
///
/// // Under `mpirun`: DistributedTrainer::from_environment(options) (feature `mpi`).
/// let trainer = DistributedTrainer::new(Arc::new(SingleProcess::default()), DistributedOptions::default());
/// assert!(trainer.is_chief());
/// assert_eq!((trainer.rank(), trainer.size()), (0, 1));
/// ```
pub struct DistributedTrainer {
    engine: Arc<dyn CollectiveEngine>,
    options: DistributedOptions,
    agreement: Arc<Agreement>,
    train_op: Option<NodeId>,
    global_step: u64,
}

/// tensorpack's name for [`DistributedTrainer`].
pub type HorovodTrainer = DistributedTrainer;

impl DistributedTrainer {
    /// A trainer over `engine`'s ranks.
    pub fn new(
        engine: Arc<dyn CollectiveEngine>,
        options: DistributedOptions,
    ) -> DistributedTrainer {
        DistributedTrainer {
            agreement: Arc::new(Agreement::new(engine.clone())),
            engine,
            options,
            train_op: None,
            global_step: 0,
        }
    }

    /// The trainer of this process's place in its job: an MPI rank when started by an MPI
    /// launcher (feature `mpi`; timeouts from `MpiOptions::from_env`), else a job of one
    /// process; with [`GradientEngine::Nccl`], gradients then go through NCCL on the rank's
    /// GPU. Errors when started by a launcher in a build without the `mpi` feature, when NCCL
    /// is asked for in a build without the `nccl` feature, and (on every rank alike) when
    /// libnccl, the CUDA driver or the GPU is missing on any rank.
    pub fn from_environment(options: DistributedOptions) -> Result<DistributedTrainer, TrainError> {
        let job = job_engine()?;
        let engine = match options.gradient_engine {
            GradientEngine::Job => job,
            GradientEngine::Nccl => nccl_engine(job)?,
        };
        Ok(DistributedTrainer::new(engine, options))
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.engine.rank()
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.engine.size()
    }

    /// This process's rank among those of its host.
    pub fn local_rank(&self) -> usize {
        self.engine.local_rank()
    }

    /// This rank's share of `len` examples: equal contiguous shards (the last `len % size`
    /// examples are left out, so every rank has as many steps per epoch).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use towerpack::backend::collective::LocalGroup;
    /// # use towerpack::train::{DistributedOptions, DistributedTrainer};
    /// let ranks = LocalGroup::new(3, std::time::Duration::from_secs(1));
    /// let second = DistributedTrainer::new(ranks[1].clone(), DistributedOptions::default());
    /// assert_eq!(second.shard(10), 3..6);
    /// ```
    pub fn shard(&self, len: usize) -> std::ops::Range<usize> {
        let per_rank = len / self.size();
        self.rank() * per_rank..(self.rank() + 1) * per_rank
    }

    /// The collective engine.
    pub fn engine(&self) -> &Arc<dyn CollectiveEngine> {
        &self.engine
    }

    /// The options.
    pub fn options(&self) -> &DistributedOptions {
        &self.options
    }

    /// `config` adapted to this rank: a CPU backend left at "one thread per core" gets the
    /// host's cores shared among the ranks on it (as tensorpack's Horovod trainer sets
    /// `inter_op_parallelism_threads`); then the chief's config is kept, and other ranks drop
    /// their resume setting (they follow the chief's) and follow [`RankLogging`]: no monitors
    /// and no logdir (`ChiefOnly`) or the logdir's `rank<r>` subdirectory (`PerRank`, falling
    /// back to the logger dir).
    pub fn configure(&self, mut config: TrainConfig) -> TrainConfig {
        if config.backend == (BackendChoice::Cpu { threads: 0 }) && self.engine.local_size() > 1 {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            config.backend = BackendChoice::Cpu {
                threads: (cores / self.engine.local_size()).max(1),
            };
        }
        if self.is_chief() {
            return config;
        }
        // The chief alone decides where the job resumes (and sends it): the others need
        // neither its logdir nor its checkpoint files.
        config.resume = Resume::No;
        // The chief alone backs up or deletes the shared logdir.
        config.logdir_action = super::logdir::LogDirAction::Keep;
        match self.options.logging {
            RankLogging::ChiefOnly => {
                config.logdir = None;
                config.monitors = Some(Vec::new());
            }
            RankLogging::PerRank => {
                let base: Option<PathBuf> =
                    config.logdir.clone().or_else(super::logdir::logger_dir);
                config.logdir = base.map(|d| d.join(format!("rank{}", self.rank())));
            }
        }
        config
    }

    /// Trains this rank with `config` adapted by [`DistributedTrainer::configure`].
    pub fn launch(&mut self, config: TrainConfig) -> Result<TrainReport, TrainError> {
        let config = self.configure(config);
        launch_train_with_config(config, self)
    }

    fn build(&mut self, setup: &mut GraphSetup<'_>) -> Result<TowerGraph, TrainError> {
        let model = setup.model()?;
        let k = self.options.towers_per_rank;
        let strategy = if k == 1 {
            Strategy::Single
        } else {
            Strategy::Shared
        };
        let towers = build_training_towers_on(setup, k, strategy)?;
        let mut per_tower = Vec::with_capacity(k);
        for (i, t) in towers.iter().enumerate() {
            let scope = if k == 1 {
                String::new()
            } else {
                format!("tower{i}/")
            };
            let grads = tower_gradients(
                setup.graph,
                t,
                &format!("{scope}gradients"),
                setup.loss_scale.as_ref(),
            )?;
            let reduced = all_reduce_gradients(setup.graph, &grads, &format!("{scope}allreduce"))?;
            per_tower.push(reduced);
        }
        let averaged = average_towers(setup.graph, &per_tower)?;
        let (train, processed) = apply_optimizer(
            setup.graph,
            model.as_ref(),
            &averaged,
            "train_op",
            setup.loss_scale.as_ref(),
        )?;
        let cost = towers[0].cost.ok_or_else(|| SetupError::NoCost {
            tower: String::new(),
        })?;
        let mut callbacks: Vec<Box<dyn super::Callback>> =
            vec![Box::new(sync::JobRecord { ranks: self.size() })];
        if self.options.broadcast_every_epoch {
            callbacks.push(Box::new(EpochBroadcast {
                engine: self.engine.clone(),
                agreement: self.agreement.clone(),
            }));
        }
        Ok(TowerGraph {
            train_op: train.train_op,
            built: BuiltGraph {
                losses: vec![(setup.graph.value_name(cost), cost)],
                gradients: processed.grads,
                numeric_checks: processed.checks,
                towers,
                callbacks,
                bucket_bytes: Some(self.options.bucket_bytes),
                ..BuiltGraph::default()
            },
        })
    }
}

/// The engine of this process's job: MPI under a launcher, else a job of one process.
fn job_engine() -> Result<Arc<dyn CollectiveEngine>, TrainError> {
    if !launched_by_mpi() {
        return Ok(Arc::new(SingleProcess::default()));
    }
    #[cfg(feature = "mpi")]
    {
        let engine = crate::backend::collective::mpi::MpiEngine::init_from_env()
            .map_err(sync::collective)?;
        Ok(engine)
    }
    #[cfg(not(feature = "mpi"))]
    Err(DistributedError::NoMpiFeature.into())
}

/// NCCL on CUDA device 0 of this process, bootstrapped over `job`.
fn nccl_engine(job: Arc<dyn CollectiveEngine>) -> Result<Arc<dyn CollectiveEngine>, TrainError> {
    #[cfg(feature = "nccl")]
    {
        let engine =
            crate::backend::collective::nccl::NcclEngine::init(job, 0).map_err(sync::collective)?;
        Ok(engine)
    }
    #[cfg(not(feature = "nccl"))]
    {
        drop(job);
        Err(DistributedError::NoNcclFeature.into())
    }
}

/// The mean of each variable's (all-reduced) gradients over the towers of one rank (the towers
/// share their variables, so each list has the same variables). One tower: its gradients
/// unchanged. Lowering fuses the mean into the update kernel that reads the towers' arenas.
fn average_towers(
    graph: &mut crate::ir::Graph,
    per_tower: &[Vec<(VarId, Value)>],
) -> Result<Vec<(VarId, Value)>, TrainError> {
    use crate::ir::{BinaryOp, Op};
    let Some((first, rest)) = per_tower.split_first() else {
        return Ok(Vec::new());
    };
    if rest.is_empty() {
        return Ok(first.clone());
    }
    let scale = crate::tensor::HostTensor::scalar_f32(1.0 / per_tower.len() as f32);
    let name = graph.unique_name("tower_average/scale");
    let scale = Value::first(graph.add_node(&name, Op::Constant { value: scale }, &[])?);
    let mut out = Vec::with_capacity(first.len());
    for &(var, g0) in first {
        let mut sum = g0;
        for (t, grads) in rest.iter().enumerate() {
            let g = grads
                .iter()
                .find(|(v, _)| *v == var)
                .map(|(_, g)| *g)
                .ok_or_else(|| {
                    TrainError::from(SetupError::MissingGradient {
                        tower: t + 1,
                        variable: graph.variable(var).name.clone(),
                    })
                })?;
            let name = graph.unique_name("tower_average/add");
            sum = Value::first(graph.add_node(&name, Op::Binary(BinaryOp::Add), &[sum, g])?);
        }
        let name = graph.unique_name("tower_average/mean");
        let mean = graph.add_node(&name, Op::Binary(BinaryOp::Mul), &[sum, scale])?;
        out.push((var, Value::first(mean)));
    }
    Ok(out)
}

impl Trainer for DistributedTrainer {
    fn name(&self) -> String {
        format!(
            "DistributedTrainer(rank {} of {})",
            self.rank(),
            self.size()
        )
    }

    fn setup_graph(&mut self, setup: &mut GraphSetup<'_>) -> Result<BuiltGraph, TrainError> {
        if self.train_op.is_some() {
            return Err(SetupError::AlreadyBuilt {
                trainer: "DistributedTrainer".into(),
            }
            .into());
        }
        if self.options.towers_per_rank == 0 {
            return Err(DistributedError::NoTowersPerRank.into());
        }
        let built = self.build(setup)?;
        self.train_op = Some(built.train_op);
        if self.size() > 1 {
            log::info!(
                target: "towerpack",
                "Rank {} of {}: gradients averaged by one in-place all-reduce per gradient \
                 arena (buckets of at most {} bytes{})",
                self.rank(),
                self.size(),
                self.options.bucket_bytes,
                if self.options.compression == WireFormat::Bf16 { ", sent as bf16" } else { "" }
            );
        }
        Ok(built.built)
    }

    fn run_step(&mut self, runner: &mut StepRunner<'_>) -> Result<(), TrainError> {
        let op = self.train_op.ok_or_else(|| {
            TrainError::from(SetupError::NotBuilt {
                trainer: "DistributedTrainer".into(),
            })
        })?;
        self.global_step = runner.global_step();
        self.agreement.round(Point::Step, self.global_step)?;
        runner.hooked_run(&[], &[op])?;
        self.global_step = runner.global_step();
        Ok(())
    }

    fn is_chief(&self) -> bool {
        self.rank() == sync::CHIEF
    }

    fn default_input(&self, flow: Box<dyn DataFlow>) -> Box<dyn InputSource> {
        Box::new(super::input::QueueInput::from_boxed(flow))
    }

    fn agree_on_resume(
        &mut self,
        found: Option<FoundResume>,
    ) -> Result<Option<FoundResume>, TrainError> {
        sync::agree_on_resume(self.engine.as_ref(), found)
    }

    fn initialize_session(&mut self, session: &mut dyn Session) -> Result<(), TrainError> {
        self.engine.set_gradient_wire(self.options.compression);
        if self.size() == 1 {
            return Ok(());
        }
        let collective: Arc<dyn crate::backend::Collective> = self.engine.clone();
        session.join_collective(collective)?;
        sync::check_same_variables(self.engine.as_ref(), session)?;
        if self.is_chief() {
            log::info!(target: "towerpack", "Broadcasting initialized variables ...");
        }
        sync::broadcast_variables(self.engine.as_ref(), session)
    }

    fn loop_ended(&mut self, outcome: &Result<(), TrainError>) {
        self.agreement.leave(outcome, self.global_step);
    }
}
