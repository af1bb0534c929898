//! Scheduling wrappers: [`PeriodicTrigger`] calls a callback's `trigger` every k steps or epochs
//! (it can make it MORE frequent), [`EnableCallbackIf`] gates a callback's per-epoch and per-run
//! hooks on a predicate, and [`PeriodicCallback`] gates them periodically (LESS frequent).

use crate::tensor::HostTensor;
use crate::train::callback::{
    Callback, RunArgs, forward_hooks, forward_run_hooks, forward_state_hooks,
};
use crate::train::context::TrainContext;
use crate::train::error::{ConfigError, TrainError};

/// Calls `inner.trigger()` when `global_step % every_k_steps == 0` (checked after each step) or
/// `epoch_num % every_k_epochs == 0` (checked after each epoch), and optionally in
/// `before_train`. `inner.trigger_epoch` is NOT called; its other hooks pass through.
pub struct PeriodicTrigger {
    inner: Box<dyn Callback>,
    every_k_steps: Option<u64>,
    every_k_epochs: Option<u64>,
    before_train: bool,
}

impl PeriodicTrigger {
    /// Wraps `inner`; set at least one schedule.
    pub fn new(inner: impl Callback + 'static) -> PeriodicTrigger {
        PeriodicTrigger {
            inner: Box::new(inner),
            every_k_steps: None,
            every_k_epochs: None,
            before_train: false,
        }
    }

    /// Triggers when `global_step % k == 0`.
    pub fn every_k_steps(mut self, k: u64) -> Self {
        self.every_k_steps = Some(k);
        self
    }

    /// Triggers when `epoch_num % k == 0`.
    pub fn every_k_epochs(mut self, k: u64) -> Self {
        self.every_k_epochs = Some(k);
        self
    }

    /// Also triggers in `before_train`.
    pub fn before_train(mut self, on: bool) -> Self {
        self.before_train = on;
        self
    }

    /// The wrapped callback.
    pub fn inner(&self) -> &dyn Callback {
        self.inner.as_ref()
    }
}

impl Callback for PeriodicTrigger {
    fn name(&self) -> String {
        format!("PeriodicTrigger({})", self.inner.name())
    }

    fn chief_only(&self) -> bool {
        self.inner.chief_only()
    }

    fn setup_graph(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let zero = self.every_k_steps == Some(0) || self.every_k_epochs == Some(0);
        let none = self.every_k_steps.is_none() && self.every_k_epochs.is_none();
        if zero || (none && !self.before_train) {
            return Err(ConfigError::NoTrigger {
                callback: self.name(),
            }
            .into());
        }
        self.inner.setup_graph(ctx)
    }

    fn before_train(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.inner.before_train(ctx)?;
        if self.before_train {
            self.inner.trigger(ctx)?;
        }
        Ok(())
    }

    fn trigger_step(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.inner.trigger_step(ctx)?;
        if let Some(k) = self.every_k_steps
            && ctx.global_step().is_multiple_of(k)
        {
            self.inner.trigger(ctx)?;
        }
        Ok(())
    }

    fn trigger_epoch(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        if let Some(k) = self.every_k_epochs
            && ctx.epoch_num().is_multiple_of(k)
        {
            self.inner.trigger(ctx)?;
        }
        Ok(())
    }

    forward_hooks!(inner: before_epoch, after_epoch, trigger, after_train);
    forward_run_hooks!(inner);
    forward_state_hooks!(inner);
}

/// The predicate of an [`EnableCallbackIf`].
type Predicate = Box<dyn FnMut(&TrainContext) -> bool>;

/// Runs `inner`'s `before_epoch`, `after_epoch`, `before_run`/`after_run`, `trigger_epoch` and
/// `trigger_step` only when `pred` holds (for a hooked run, `pred` is evaluated in `before_run`
/// and `after_run` follows it). Other hooks pass through.
pub struct EnableCallbackIf {
    inner: Box<dyn Callback>,
    pred: Predicate,
    run_enabled: bool,
}

impl EnableCallbackIf {
    /// Gates `inner` on `pred`.
    pub fn new(
        inner: impl Callback + 'static,
        pred: impl FnMut(&TrainContext) -> bool + 'static,
    ) -> EnableCallbackIf {
        EnableCallbackIf::boxed(Box::new(inner), Box::new(pred))
    }

    fn boxed(inner: Box<dyn Callback>, pred: Predicate) -> EnableCallbackIf {
        EnableCallbackIf {
            inner,
            pred,
            run_enabled: false,
        }
    }

    /// The wrapped callback.
    pub fn inner(&self) -> &dyn Callback {
        self.inner.as_ref()
    }
}

macro_rules! gated {
    ($($hook:ident),*) => {
        $(
            fn $hook(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
                if (self.pred)(ctx) {
                    self.inner.$hook(ctx)?;
                }
                Ok(())
            }
        )*
    };
}

impl Callback for EnableCallbackIf {
    fn name(&self) -> String {
        format!("EnableCallbackIf({})", self.inner.name())
    }

    fn chief_only(&self) -> bool {
        self.inner.chief_only()
    }

    gated!(before_epoch, after_epoch, trigger_epoch, trigger_step);

    fn before_run(&mut self, ctx: &TrainContext) -> Result<RunArgs, TrainError> {
        self.run_enabled = (self.pred)(ctx);
        if self.run_enabled {
            self.inner.before_run(ctx)
        } else {
            Ok(RunArgs::none())
        }
    }

    fn after_run(
        &mut self,
        ctx: &mut TrainContext,
        fetched: &[HostTensor],
    ) -> Result<(), TrainError> {
        if self.run_enabled {
            self.inner.after_run(ctx, fetched)?;
        }
        Ok(())
    }

    forward_hooks!(inner: setup_graph, before_train, trigger, after_train);
    forward_state_hooks!(inner);
}

/// [`EnableCallbackIf`] with tensorpack's periodic predicate: true when `global_step %
/// every_k_steps == 0`, or `epoch_num % every_k_epochs == 0`, or on the very last step of
/// training.
pub struct PeriodicCallback {
    gate: EnableCallbackIf,
}

impl PeriodicCallback {
    /// Gates `inner` to every `every_k_steps` steps and/or `every_k_epochs` epochs.
    pub fn new(
        inner: impl Callback + 'static,
        every_k_steps: Option<u64>,
        every_k_epochs: Option<u64>,
    ) -> PeriodicCallback {
        let pred = move |ctx: &TrainContext| {
            let c = ctx.counters();
            every_k_steps.is_some_and(|k| k > 0 && c.global_step.is_multiple_of(k))
                || every_k_epochs.is_some_and(|k| k > 0 && c.epoch_num.is_multiple_of(k))
                || c.is_last_step_of_training()
        };
        PeriodicCallback {
            gate: EnableCallbackIf::boxed(Box::new(inner), Box::new(pred)),
        }
    }

    /// The wrapped callback.
    pub fn inner(&self) -> &dyn Callback {
        self.gate.inner()
    }
}

impl Callback for PeriodicCallback {
    fn name(&self) -> String {
        format!("PeriodicCallback({})", self.gate.inner.name())
    }

    fn chief_only(&self) -> bool {
        self.gate.chief_only()
    }

    forward_hooks!(gate: setup_graph, before_train, before_epoch, after_epoch, trigger_step,
        trigger_epoch, trigger, after_train);
    forward_run_hooks!(gate);
    forward_state_hooks!(gate);
}
