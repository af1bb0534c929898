//! Everything a training script needs, in one `use towerpack::prelude::*;`: the tower DSL and
//! its layers ([`crate::dsl::prelude`]) with the `graph!` macro, the models' building blocks,
//! optimizers, trainers, [`TrainConfig`] and [`launch_train_with_config`], the callbacks and
//! monitors, session initializers and predictors, the logdir, and the data flows and loaders.
//!
//! The README's "Your own model" section is `examples/own_model.rs`, written against this
//! prelude alone.

pub use crate::dsl::prelude::*;
pub use crate::graph;

pub use crate::data::{
    AugmentImageComponent, BatchData, CastData, CenterPaste, CifarSplit, DataFlow, DataFromList,
    FixedSizeData, Flip, ImageAugmentor, LabeledImages, LocallyShuffleData, MapData,
    MapDataComponent, Normalize, PrefetchData, RandomCrop, RepeatedData, load_cifar10, load_mnist,
    mnist10k_split,
};
pub use crate::models::{ConvNet, Mlp, classification_loss, with_weight_decay};
pub use crate::optim::Optimizer;
pub use crate::tensor::HostTensor;
pub use crate::train::callbacks::{
    ClassificationError, EarlyStopping, EstimatedTimeLeft, HyperParamSetterWithFunc,
    InferenceRunner, Inferencer, Interpolation, MaxSaver, MinSaver, ModelSaver, NonFiniteGuard,
    PeriodicCallback, PeriodicTrigger, ProgressBar, ScalarStats, ScheduledHyperParamSetter,
    StatMonitorParamSetter, ThroughputTracker,
};
pub use crate::train::logdir::LogDirAction;
pub use crate::train::{
    BackendChoice, Callback, CallbackFactory, DistributedTrainer, DynamicLossScale, FeedInput,
    JSONWriter, ModelDesc, ModelFn, OfflinePredictor, OnlinePredictor, ParameterServerTrainer,
    Precision, PredictConfig, QueueInput, ReplicatedTrainer, SaverRestore, ScalarPrinter,
    SimpleTrainer, TFEventWriter, TrainConfig, TrainContext, TrainError, TrainReport, Trainer,
    launch_train_with_config,
};
