//! The trainer system: tensorpack's loop, callbacks, monitors, checkpoints, input sources and
//! predictors.
//!
//! The loop is tiny — `for epoch in starting_epoch..=max_epoch { for local_step in
//! 0..steps_per_epoch { run_step } }` ([`launch_train_with_config`]) — and everything else is a
//! [`Callback`]: the step counter, summaries, checkpoints, schedules, validation, progress.
//! A [`Trainer`] builds the graph and defines `run_step`; [`TowerTrainer`] builds it from a
//! [`TowerStrategy`] ([`SimpleTrainer`] = one tower); the data-parallel trainers of
//! [`data_parallel`] ([`ParameterServerTrainer`], [`ReplicatedTrainer`], [`AsyncTrainer`]) are
//! strategies too, so going from one tower to two is one line. [`distributed`] trains one
//! process per rank over a collective engine (Horovod-style).
//!
//! Beyond tensorpack, a run resumes EXACTLY: checkpoints carry the loop position, the consumed
//! data position and the callbacks' state ([`resume`]), so a run killed at any point and resumed
//! from its latest checkpoint reaches bit-identical weights on a deterministic backend.
//!
//! File formats live in [`checkpoint`], [`summary`] and [`logdir`]; the monitor callbacks that
//! drive them in [`monitors`].
//!
//! ```
//! use towerpack::data::{BatchData, mnist10k_split};
//! use towerpack::models::Mlp;
//! use towerpack::optim::Optimizer;
//! use towerpack::train::callbacks::{ClassificationError, InferenceRunner, Inferencer, ModelSaver};
//! use towerpack::train::*;
//!
//! let digits = mnist10k_split()?;
//! let train = digits.train.slice(0, 128)?.to_f32(1.0 / 255.0);
//! let validation = digits.validation.slice(0, 64)?.to_f32(1.0 / 255.0);
//! let mlp = Mlp { input_shape: vec![28, 28, 1], hidden: vec![16], ..Mlp::default() };
//! let model = ModelFn::new(mlp.inputs(), move |x| mlp.build(x), Optimizer::momentum(0.1, 0.9));
//! let logdir = tempfile::tempdir()?;
//!
//! let validate: Vec<Box<dyn Inferencer>> = vec![Box::new(ClassificationError::default())];
//! let config = TrainConfig::new(model)
//!     .dataflow(BatchData::new(train.to_flow(Some(1))?, 32, false)?)
//!     .callback(ModelSaver::new())
//!     .callback(InferenceRunner::new(BatchData::new(validation.to_flow(None)?, 32, true)?, validate))
//!     .logdir(logdir.path())
//!     .max_epoch(2)
//!     .auto_resume(true);
//! let report = launch_train_with_config(config, &mut SimpleTrainer::new())?;
//! assert_eq!(report.counters.global_step, 8);
//! assert_eq!(report.history("validation_error").len(), 2);
//! assert!(logdir.path().join("model-8.safetensors").exists());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod any;
pub mod callback;
pub mod callbacks;
pub mod checkpoint;
pub mod config;
pub mod context;
pub mod counters;
pub mod data_parallel;
mod dispatch;
pub mod distributed;
mod engine;
pub mod error;
mod feed_check;
pub mod input;
pub mod interrupt;
pub mod logdir;
pub mod model;
pub mod monitors;
pub mod predict;
pub mod resume;
pub mod session_init;
mod suggest;
pub mod summary;
pub mod tower_trainer;
pub mod trainer;

pub use callback::{
    AsAny, Callback, CallbackExt, CallbackFactory, ChiefOnly, RunArgs, SavedCheckpointInfo,
};
pub use config::{BackendChoice, DynamicLossScale, Precision, Resume, TrainConfig};
pub use context::{PREDICT_TOWER, ResumeInfo, TrainContext};
pub use counters::{LoopCounters, ResumePoint};
pub use data_parallel::{
    AsyncMultiGPUTrainer, AsyncTowers, AsyncTrainer, BroadcastReplicas, DataParallelStrategy,
    Device, ParameterDevice, ParameterServerTowers, ParameterServerTrainer, ReplicatedTowers,
    ReplicatedTrainer, SyncMultiGPUTrainerParameterServer, SyncMultiGPUTrainerReplicated,
    TowerDevices, TowerPlacement,
};
pub use distributed::{
    DistributedOptions, DistributedTrainer, GradientEngine, HorovodTrainer, RankLogging,
};
pub use engine::{TrainReport, launch_train_with_config};
pub use error::{ConfigError, DistributedError, SetupError, TrainError};
pub use input::{DummyConstantInput, FeedInput, InputSource, QueueInput};
pub use model::{ModelDesc, ModelFn};
pub use monitors::{JSONWriter, Monitors, ScalarPrinter, TFEventWriter, TrainingMonitor};
pub use predict::{OfflinePredictor, OnlinePredictor, PredictConfig};
pub use session_init::{
    ChainInit, DictRestore, InitOutcome, JustCurrentSession, SaverRestore, SessionInit, SmartInit,
};
pub use tower_trainer::{
    NoOpTrainer, SimpleTrainer, SingleTower, TowerGraph, TowerStrategy, TowerTrainer,
    TrainingGraph, apply_optimizer, build_training_graph, build_training_towers_on,
    tower_gradients,
};
pub use trainer::{BuiltGraph, GraphSetup, StepRunner, Trainer};
