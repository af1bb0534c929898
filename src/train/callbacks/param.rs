//! Hyper-parameter setters (tensorpack's `HyperParamSetter` family): they set a scalar graph
//! variable (usually `learning_rate`) between steps. Every change is logged and put into the
//! monitors under the variable's name, stamped with the global step.

use std::collections::VecDeque;

use serde_json::json;

use crate::optim::LEARNING_RATE;
use crate::tensor::HostTensor;
use crate::train::callback::Callback;
use crate::train::context::TrainContext;
use crate::train::error::{ConfigError, TrainError};

/// Sets float scalar variable `name` to `value` for callback `setter`; returns whether it
/// changed. A NaN or infinite value, or a negative learning rate, is an error naming both.
fn set_param(
    ctx: &mut TrainContext,
    setter: &str,
    name: &str,
    value: f64,
) -> Result<bool, TrainError> {
    let rule = if name == LEARNING_RATE {
        (!value.is_finite() || value < 0.0).then_some("finite and at least 0")
    } else {
        (!value.is_finite()).then_some("finite")
    };
    if let Some(rule) = rule {
        return Err(TrainError::InvalidHyperParam {
            name: name.to_string(),
            value,
            global_step: ctx.global_step(),
            setter: setter.to_string(),
            rule,
        });
    }
    let id = ctx.find_variable(name)?;
    let def = ctx.graph().variable(id).clone();
    if !def.ty.dtype.is_float() || def.ty.rank() != 0 {
        return Err(ConfigError::NotAHyperParam {
            name: name.into(),
            found: def.ty.to_string(),
        }
        .into());
    }
    let session = ctx.session("setting a hyper-parameter")?;
    let old = session
        .read_variable(id)?
        .scalar_value()
        .unwrap_or(f64::NAN);
    let new = HostTensor::scalar(def.ty.dtype, value);
    let stored = new.scalar_value().unwrap_or(value);
    if old.to_bits() == stored.to_bits() {
        return Ok(false);
    }
    session.write_variable(id, &new)?;
    let show = |v: f64| match def.ty.dtype {
        // Print what the variable holds, not its f64 widening (0.1f32 is not 0.1000000015).
        crate::tensor::DType::F32 => format!("{}", v as f32),
        _ => format!("{v}"),
    };
    log::info!(
        target: "towerpack",
        "[HyperParamSetter] At global_step={}, {name} changes from {} to {}",
        ctx.global_step(),
        show(old),
        show(stored)
    );
    ctx.put_scalar(name, stored)?;
    Ok(true)
}

/// The current value of float scalar variable `name`.
fn get_param(ctx: &mut TrainContext, name: &str) -> Result<f64, TrainError> {
    let value = ctx.read_variable(name)?;
    value.scalar_value().map_err(|_| {
        ConfigError::NotAHyperParam {
            name: name.into(),
            found: format!("{}{:?}", value.dtype(), value.shape()),
        }
        .into()
    })
}

/// How a schedule fills the points between its entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interpolation {
    /// Only the listed points set a value (tensorpack's `interp=None`).
    Step,
    /// Linear between neighbouring entries, nothing outside them (no extrapolation).
    Linear,
}

/// Sets a parameter from a schedule `[(point, value)]` (tensorpack's
/// `ScheduledHyperParamSetter`). Epoch-based: the value of `(e, v)` is set after epoch `e`
/// completes (in its `trigger_epoch`), and `e = 0` means before training. Step-based: `(s, v)` is
/// set after the hooked run that makes `global_step == s` (in `trigger_step`).
///
/// With `set_at_beginning` (default), `before_train` sets the value the schedule implies at the
/// current point — the last entry at or before it, interpolated if asked — so a run resumed
/// tensorpack-style (weights plus `starting_epoch`) re-derives its learning rate from the
/// schedule. An EXACT resume keeps the restored value instead (it is what the interrupted run
/// had, including changes by other setters), logging when the schedule disagrees.
#[derive(Clone, Debug)]
pub struct ScheduledHyperParamSetter {
    param: String,
    schedule: Vec<(u64, f64)>,
    interp: Interpolation,
    step_based: bool,
    set_at_beginning: bool,
}

impl ScheduledHyperParamSetter {
    /// Sets `param` by epoch from `schedule` (sorted here).
    pub fn new(param: &str, schedule: &[(u64, f64)]) -> ScheduledHyperParamSetter {
        let mut schedule = schedule.to_vec();
        schedule.sort_by_key(|&(p, _)| p);
        ScheduledHyperParamSetter {
            param: param.to_string(),
            schedule,
            interp: Interpolation::Step,
            step_based: false,
            set_at_beginning: true,
        }
    }

    /// Interpolates linearly between entries.
    pub fn linear(mut self) -> Self {
        self.interp = Interpolation::Linear;
        self
    }

    /// Points are global steps, not epochs.
    pub fn step_based(mut self) -> Self {
        self.step_based = true;
        self
    }

    /// Whether `before_train` sets the value of the current point (default true).
    pub fn set_at_beginning(mut self, on: bool) -> Self {
        self.set_at_beginning = on;
        self
    }

    /// The value set exactly at `point` (tensorpack's `_get_value_to_set_at_point`).
    pub fn value_at(&self, point: u64) -> Option<f64> {
        if let Some(&(_, v)) = self.schedule.iter().find(|&&(p, _)| p == point) {
            return Some(v);
        }
        if self.interp == Interpolation::Step {
            return None;
        }
        let after = self.schedule.iter().position(|&(p, _)| p > point)?;
        let (p1, v1) = self.schedule[after];
        let (p0, v0) = *self.schedule.get(after.checked_sub(1)?)?;
        Some(v0 + (point - p0) as f64 / (p1 - p0) as f64 * (v1 - v0))
    }

    /// The value the schedule implies at `point`: the latest value set at or before it.
    pub fn value_through(&self, point: u64) -> Option<f64> {
        let &(_, last_value) = self.schedule.iter().rev().find(|&&(p, _)| p <= point)?;
        Some(match self.interp {
            Interpolation::Step => last_value,
            // Between two entries it interpolates; past the last one the last value holds.
            Interpolation::Linear => self.value_at(point).unwrap_or(last_value),
        })
    }

    fn point(&self, ctx: &TrainContext) -> u64 {
        if self.step_based {
            ctx.global_step()
        } else {
            ctx.epoch_num()
        }
    }
}

impl Callback for ScheduledHyperParamSetter {
    fn name(&self) -> String {
        format!("ScheduledHyperParamSetter({})", self.param)
    }

    fn chief_only(&self) -> bool {
        false
    }

    fn before_train(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        if !self.set_at_beginning {
            return Ok(());
        }
        let point = self.point(ctx);
        let Some(v) = self.value_through(point) else {
            return Ok(());
        };
        let current = get_param(ctx, &self.param)?;
        let differs = (current - v).abs() > 1e-6 * v.abs().max(1e-12);
        match ctx.resumed().map(|r| r.exact) {
            // An exact resume restored the value the interrupted run had; other setters (a
            // plateau decay) may have changed it since the schedule set it, so it stays.
            Some(true) => {
                if differs {
                    log::info!(
                        target: "towerpack",
                        "The schedule gives {} = {v} at point {point}; keeping the restored {current}",
                        self.param
                    );
                }
            }
            resumed => {
                if resumed.is_some() && differs {
                    log::warn!(
                        target: "towerpack",
                        "According to the schedule, {} should be {v} at point {point}, but it \
                         is {current}; setting it",
                        self.param
                    );
                }
                set_param(ctx, &self.name(), &self.param, v)?;
            }
        }
        Ok(())
    }

    fn trigger_step(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        if self.step_based {
            self.trigger(ctx)?;
        }
        Ok(())
    }

    fn trigger_epoch(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        if !self.step_based {
            self.trigger(ctx)?;
        }
        Ok(())
    }

    fn trigger(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        if let Some(v) = self.value_at(self.point(ctx)) {
            set_param(ctx, &self.name(), &self.param, v)?;
        }
        Ok(())
    }
}

/// The function of a [`HyperParamSetterWithFunc`]: `(epoch_num, old value) -> new value`.
type ParamFn = Box<dyn FnMut(u64, f64) -> f64>;

/// Sets a parameter to `func(epoch_num, old)` on each trigger and before training (tensorpack's
/// `HyperParamSetterWithFunc`). A resumed run skips the `before_train` call: the restored value
/// already includes it, and applying a non-idempotent `func` again would break exactness.
pub struct HyperParamSetterWithFunc {
    param: String,
    func: ParamFn,
}

impl HyperParamSetterWithFunc {
    /// Sets `param` with `func`.
    pub fn new(param: &str, func: impl FnMut(u64, f64) -> f64 + 'static) -> Self {
        HyperParamSetterWithFunc {
            param: param.to_string(),
            func: Box::new(func),
        }
    }
}

impl Callback for HyperParamSetterWithFunc {
    fn name(&self) -> String {
        format!("HyperParamSetterWithFunc({})", self.param)
    }

    fn chief_only(&self) -> bool {
        false
    }

    fn before_train(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        if ctx.resumed().is_some() {
            return Ok(());
        }
        self.trigger(ctx)
    }

    fn trigger(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let old = get_param(ctx, &self.param)?;
        let new = (self.func)(ctx.epoch_num(), old);
        set_param(ctx, &self.name(), &self.param, new)?;
        Ok(())
    }
}

/// The function of a [`StatMonitorParamSetter`]: old value to new value.
type ValueFn = Box<dyn FnMut(f64) -> f64>;

/// Plateau decay (tensorpack's `StatMonitorParamSetter`): on each trigger, appends the latest
/// `(global_step, value)` of a statistic to a history of the last `last_k + 1` observations;
/// when it is full and the statistic did not drop below its first entry by more than
/// `threshold` (or, with `reverse`, rise above it), sets `value_func(old)` and clears the
/// history. Not applied before training. The history is part of the resume state.
pub struct StatMonitorParamSetter {
    param: String,
    stat: String,
    value_func: ValueFn,
    threshold: f64,
    last_k: usize,
    reverse: bool,
    history: VecDeque<(u64, f64)>,
}

impl StatMonitorParamSetter {
    /// Sets `param` to `value_func(old)` when `stat` has not decreased by more than
    /// `threshold` over the last `last_k` observations.
    pub fn new(
        param: &str,
        stat: &str,
        value_func: impl FnMut(f64) -> f64 + 'static,
        threshold: f64,
        last_k: usize,
    ) -> StatMonitorParamSetter {
        StatMonitorParamSetter {
            param: param.to_string(),
            stat: stat.to_string(),
            value_func: Box::new(value_func),
            threshold,
            last_k,
            reverse: false,
            history: VecDeque::new(),
        }
    }

    /// Watch for an increase instead.
    pub fn reverse(mut self) -> Self {
        self.reverse = true;
        self
    }

    /// The observations kept.
    pub fn history(&self) -> Vec<(u64, f64)> {
        self.history.iter().copied().collect()
    }
}

impl Callback for StatMonitorParamSetter {
    fn name(&self) -> String {
        format!("StatMonitorParamSetter({}, {})", self.param, self.stat)
    }

    fn chief_only(&self) -> bool {
        false
    }

    fn trigger(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let Some(&last) = ctx.monitors().get_history(&self.stat).last() else {
            log::warn!(target: "towerpack", "[StatMonitorParamSetter] No history data available for {}", self.stat);
            return Ok(());
        };
        if self.history.back().is_some_and(|h| h.0 == last.0) {
            log::warn!(
                target: "towerpack",
                "StatMonitorParamSetter is triggered, but no new data has been added since last time"
            );
            return Ok(());
        }
        self.history.push_back(last);
        while self.history.len() > self.last_k + 1 {
            self.history.pop_front();
        }
        if self.history.len() < self.last_k + 1 {
            return Ok(());
        }
        let first = self.history[0].1;
        let values = self.history.iter().map(|h| h.1);
        let plateau = if self.reverse {
            values.fold(f64::NEG_INFINITY, f64::max) <= first + self.threshold
        } else {
            values.fold(f64::INFINITY, f64::min) >= first - self.threshold
        };
        if !plateau {
            return Ok(());
        }
        log::info!(
            target: "towerpack",
            "[StatMonitorParamSetter] Triggered, history of {}: {:?}",
            self.stat,
            self.history.iter().map(|h| h.1).collect::<Vec<_>>()
        );
        self.history.clear();
        let old = get_param(ctx, &self.param)?;
        let new = (self.value_func)(old);
        set_param(ctx, &self.name(), &self.param, new)?;
        Ok(())
    }

    fn save_state(&self) -> Option<serde_json::Value> {
        Some(json!({ "history": self.history }))
    }

    fn restore_state(&mut self, state: &serde_json::Value) -> Result<(), TrainError> {
        self.history = serde_json::from_value(state["history"].clone())
            .map_err(|e| TrainError::Resume(format!("{}: bad state: {e}", self.name())))?;
        Ok(())
    }
}

/// Puts the current value of each hyper-parameter (by default `learning_rate`) into the monitors
/// at the end of every epoch, so stats.json and TensorBoard show it from epoch 1 even when no
/// setter ever changes it (one of [`default_callbacks`](super::default_callbacks)). A
/// hyper-parameter the graph lacks is skipped; one a setter already put at this global step is
/// not put twice.
#[derive(Clone, Debug)]
pub struct LogHyperParams {
    names: Vec<String>,
}

impl LogHyperParams {
    /// Logs `learning_rate`.
    pub fn new() -> LogHyperParams {
        LogHyperParams::of(&[LEARNING_RATE])
    }

    /// Logs the float scalar variables `names`.
    pub fn of(names: &[&str]) -> LogHyperParams {
        LogHyperParams {
            names: names.iter().map(|n| n.to_string()).collect(),
        }
    }
}

impl Default for LogHyperParams {
    fn default() -> LogHyperParams {
        LogHyperParams::new()
    }
}

impl Callback for LogHyperParams {
    fn name(&self) -> String {
        "LogHyperParams".into()
    }

    fn trigger_epoch(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let step = ctx.global_step();
        for name in &self.names {
            if ctx.graph().find_variable(name).is_none() {
                continue;
            }
            let put_already = ctx
                .monitors()
                .get_history(name)
                .last()
                .is_some_and(|&(at, _)| at == step);
            if !put_already {
                let value = get_param(ctx, name)?;
                ctx.put_scalar(name, value)?;
            }
        }
        Ok(())
    }
}
