//! The [`Callback`] trait: tensorpack's lifecycle (setup_graph, before_train, before_epoch,
//! before_run/after_run around every hooked run, trigger_step, after_epoch, trigger_epoch,
//! trigger, after_train) plus what exact resume needs: `save_state`/`restore_state` and
//! `on_checkpoint_saved`.
//!
//! Any hook may return [`TrainError::Stop`] to end training cleanly; `after_train` always runs.

pub use super::any::AsAny;
use super::any::short_type_name;
use std::path::PathBuf;

use crate::backend::Feed;
use crate::ir::{NodeId, Value};
use crate::tensor::HostTensor;

use super::context::TrainContext;
use super::error::TrainError;

/// What a callback adds to a hooked run: values to fetch, side effects (assigns, groups) to run
/// and inputs to feed, all in the SAME step as the trainer's own (TF's `SessionRunArgs`).
#[derive(Clone, Debug, Default)]
pub struct RunArgs {
    pub fetches: Vec<Value>,
    pub targets: Vec<NodeId>,
    pub feeds: Vec<Feed>,
}

impl RunArgs {
    /// Nothing to add.
    pub fn none() -> RunArgs {
        RunArgs::default()
    }

    /// Fetch `fetches`.
    pub fn fetch(fetches: Vec<Value>) -> RunArgs {
        RunArgs {
            fetches,
            ..RunArgs::default()
        }
    }

    /// Run `targets`.
    pub fn run(targets: Vec<NodeId>) -> RunArgs {
        RunArgs {
            targets,
            ..RunArgs::default()
        }
    }

    /// True when nothing is added.
    pub fn is_empty(&self) -> bool {
        self.fetches.is_empty() && self.targets.is_empty() && self.feeds.is_empty()
    }
}

/// A checkpoint the trainer just wrote (see [`Callback::on_checkpoint_saved`]).
#[derive(Clone, Debug, PartialEq)]
pub struct SavedCheckpointInfo {
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// The new `model-<global_step>.safetensors`.
    pub path: PathBuf,
    pub global_step: u64,
}

/// A training callback. Every method has a do-nothing default.
///
/// Registration order is call order at every lifecycle point (see
/// [`launch_train_with_config`](super::launch_train_with_config)).
#[allow(unused_variables)]
pub trait Callback: AsAny {
    /// The name used in logs and as the key of the callback's resume state.
    fn name(&self) -> String {
        short_type_name(std::any::type_name_of_val(self))
    }

    /// Whether only the chief worker runs this callback (tensorpack's default: true).
    fn chief_only(&self) -> bool {
        true
    }

    /// Before the session exists: the only place to add ops to the graph
    /// ([`TrainContext::graph_mut`], [`TrainContext::with_builder`]).
    fn setup_graph(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        Ok(())
    }

    /// After session init and resume, right before the first epoch.
    fn before_train(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        Ok(())
    }

    /// Right before the steps of each epoch. Keep it fast.
    fn before_epoch(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        Ok(())
    }

    /// Before every hooked run: what to fetch, run and feed along with the step.
    fn before_run(&mut self, ctx: &TrainContext) -> Result<RunArgs, TrainError> {
        Ok(RunArgs::none())
    }

    /// After every hooked run, with the values of this callback's fetches, in order.
    fn after_run(
        &mut self,
        ctx: &mut TrainContext,
        fetched: &[HostTensor],
    ) -> Result<(), TrainError> {
        Ok(())
    }

    /// After each `run_step`. Keep it light.
    fn trigger_step(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        Ok(())
    }

    /// Right after the steps of each epoch. Keep it fast; prefer `trigger`.
    fn after_epoch(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        Ok(())
    }

    /// After each epoch (after `after_epoch`). Calls [`Callback::trigger`] by default.
    fn trigger_epoch(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.trigger(ctx)
    }

    /// "Do the periodic thing". Scheduled by `trigger_epoch` by default, or by wrappers such
    /// as [`PeriodicTrigger`](super::callbacks::PeriodicTrigger); may run inside an epoch.
    fn trigger(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        Ok(())
    }

    /// Always, at the end: after the last epoch, a stop or an error.
    fn after_train(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        Ok(())
    }

    /// After the trainer wrote a checkpoint (at the end of the trigger round in which some
    /// callback asked for it). `MinSaver` copies it here.
    fn on_checkpoint_saved(
        &mut self,
        ctx: &mut TrainContext,
        saved: &SavedCheckpointInfo,
    ) -> Result<(), TrainError> {
        Ok(())
    }

    /// State to store in checkpoints for an exact resume (e.g. a best value, a history).
    fn save_state(&self) -> Option<serde_json::Value> {
        None
    }

    /// Restores what [`Callback::save_state`] returned, before `before_train` of a resumed run.
    fn restore_state(&mut self, state: &serde_json::Value) -> Result<(), TrainError> {
        Ok(())
    }
}

/// Overrides the `chief_only` flag of a callback (tensorpack's `set_chief_only`).
pub struct ChiefOnly<C> {
    inner: C,
    chief_only: bool,
}

/// `.chief_only(bool)` on every callback.
pub trait CallbackExt: Callback + Sized {
    /// This callback with `chief_only` set to `value`.
    fn set_chief_only(self, value: bool) -> ChiefOnly<Self> {
        ChiefOnly {
            inner: self,
            chief_only: value,
        }
    }
}

impl<C: Callback> CallbackExt for C {}

/// Forwards the listed `fn(&mut self, &mut TrainContext)` hooks of a wrapper to its field.
macro_rules! forward_hooks {
    ($inner:ident: $($hook:ident),* $(,)?) => {
        $(
            fn $hook(
                &mut self,
                ctx: &mut $crate::train::TrainContext,
            ) -> Result<(), $crate::train::TrainError> {
                self.$inner.$hook(ctx)
            }
        )*
    };
}
pub(crate) use forward_hooks;

/// Forwards `before_run` and `after_run` of a wrapper to its field.
macro_rules! forward_run_hooks {
    ($inner:ident) => {
        fn before_run(
            &mut self,
            ctx: &$crate::train::TrainContext,
        ) -> Result<$crate::train::RunArgs, $crate::train::TrainError> {
            self.$inner.before_run(ctx)
        }
        fn after_run(
            &mut self,
            ctx: &mut $crate::train::TrainContext,
            fetched: &[$crate::tensor::HostTensor],
        ) -> Result<(), $crate::train::TrainError> {
            self.$inner.after_run(ctx, fetched)
        }
    };
}
pub(crate) use forward_run_hooks;

/// Forwards `chief_only`, `on_checkpoint_saved`, `save_state` and `restore_state` of a wrapper.
macro_rules! forward_state_hooks {
    ($inner:ident) => {
        fn on_checkpoint_saved(
            &mut self,
            ctx: &mut $crate::train::TrainContext,
            saved: &$crate::train::SavedCheckpointInfo,
        ) -> Result<(), $crate::train::TrainError> {
            self.$inner.on_checkpoint_saved(ctx, saved)
        }
        fn save_state(&self) -> Option<serde_json::Value> {
            self.$inner.save_state()
        }
        fn restore_state(
            &mut self,
            state: &serde_json::Value,
        ) -> Result<(), $crate::train::TrainError> {
            self.$inner.restore_state(state)
        }
    };
}
pub(crate) use forward_state_hooks;

impl<C: Callback> Callback for ChiefOnly<C> {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn chief_only(&self) -> bool {
        self.chief_only
    }
    forward_hooks!(inner: setup_graph, before_train, before_epoch, trigger_step, after_epoch,
        trigger_epoch, trigger, after_train);
    forward_run_hooks!(inner);
    forward_state_hooks!(inner);
}

/// The hooks of a [`CallbackFactory`].
type FactoryHook = Box<dyn FnMut(&mut TrainContext) -> Result<(), TrainError>>;

/// A callback made of closures (tensorpack's `CallbackFactory`): `setup_graph`,
/// `before_train`, `trigger` and `after_train`.
#[derive(Default)]
pub struct CallbackFactory {
    name: Option<String>,
    setup_graph: Option<FactoryHook>,
    before_train: Option<FactoryHook>,
    trigger: Option<FactoryHook>,
    after_train: Option<FactoryHook>,
    chief_only: bool,
}

impl CallbackFactory {
    /// A callback that does nothing yet (not chief-only).
    pub fn new(name: &str) -> CallbackFactory {
        CallbackFactory {
            name: Some(name.to_string()),
            ..CallbackFactory::default()
        }
    }

    /// Runs `f` in `setup_graph`.
    pub fn on_setup_graph(
        mut self,
        f: impl FnMut(&mut TrainContext) -> Result<(), TrainError> + 'static,
    ) -> Self {
        self.setup_graph = Some(Box::new(f));
        self
    }

    /// Runs `f` in `before_train`.
    pub fn on_before_train(
        mut self,
        f: impl FnMut(&mut TrainContext) -> Result<(), TrainError> + 'static,
    ) -> Self {
        self.before_train = Some(Box::new(f));
        self
    }

    /// Runs `f` in `trigger`.
    pub fn on_trigger(
        mut self,
        f: impl FnMut(&mut TrainContext) -> Result<(), TrainError> + 'static,
    ) -> Self {
        self.trigger = Some(Box::new(f));
        self
    }

    /// Runs `f` in `after_train`.
    pub fn on_after_train(
        mut self,
        f: impl FnMut(&mut TrainContext) -> Result<(), TrainError> + 'static,
    ) -> Self {
        self.after_train = Some(Box::new(f));
        self
    }
}

fn call(hook: &mut Option<FactoryHook>, ctx: &mut TrainContext) -> Result<(), TrainError> {
    hook.as_mut().map_or(Ok(()), |f| f(ctx))
}

impl Callback for CallbackFactory {
    fn name(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| "CallbackFactory".into())
    }
    fn chief_only(&self) -> bool {
        self.chief_only
    }
    fn setup_graph(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        call(&mut self.setup_graph, ctx)
    }
    fn before_train(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        call(&mut self.before_train, ctx)
    }
    fn trigger(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        call(&mut self.trigger, ctx)
    }
    fn after_train(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        call(&mut self.after_train, ctx)
    }
}
