//! `launch_train_with_config`: builds the graph, registers the callbacks in tensorpack's order,
//! creates and initializes the session, applies a resume, and runs the loop
//! `for epoch in starting_epoch..=max_epoch { for local_step in 0..steps_per_epoch { run_step } }`
//! with its lifecycle points, then `after_train` whatever happened.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use crate::backend::Session;
use crate::ir::Graph;
use crate::optim::GLOBAL_STEP;

use super::callback::Callback;
use super::callbacks::{LossScaleMonitor, MaintainStepCounter, default_callbacks};
use super::checkpoint::{load_checkpoint, resolve_checkpoint_path};
use super::config::{Resume, TrainConfig};
use super::context::{Phase, ResumeInfo, TrainContext};
use super::counters::{LoopCounters, ResumePoint};
use super::dispatch::CallbackList;
use super::error::{ConfigError, TrainError};
use super::input::InputSource;
use super::interrupt::{self, InterruptGuard};
use super::monitors::{MonitorSetup, Monitors, default_monitors};
use super::resume::{FoundResume, ResumeState, find_auto_resume};
use super::session_init::{InitOutcome, JustCurrentSession, SaverRestore, SessionInit};
use super::trainer::{GraphSetup, StepRunner, Trainer};

/// What a finished (or cleanly stopped) run leaves.
pub struct TrainReport {
    /// `Some(reason)` when a callback stopped training early.
    pub stopped: Option<String>,
    /// The counters at the end.
    pub counters: LoopCounters,
    /// The monitors, with the history of every scalar.
    pub monitors: Monitors,
    /// The callbacks, in call order (get one back with [`TrainReport::callback`]).
    pub callbacks: Vec<Box<dyn Callback>>,
    /// Their registration keys (also the keys of their resume state).
    pub callback_keys: Vec<String>,
    /// The session, with the final variables.
    pub session: Box<dyn Session>,
    /// Where the run was resumed from, if it was.
    pub resumed: Option<ResumeInfo>,
    /// The directory the run wrote to (after [`TrainConfig::logdir_action`]: a backup or a new
    /// sibling may have been made), if it had one.
    pub logdir: Option<PathBuf>,
}

impl TrainReport {
    /// The first callback of type `C`.
    pub fn callback<C: Callback>(&self) -> Option<&C> {
        self.callbacks_of::<C>().into_iter().next()
    }

    /// Every callback of type `C`, in call order.
    pub fn callbacks_of<C: Callback>(&self) -> Vec<&C> {
        self.callbacks
            .iter()
            .filter_map(|c| (**c).as_any().downcast_ref::<C>())
            .collect()
    }

    /// The `(global_step, value)` history of scalar `name`.
    pub fn history(&self, name: &str) -> &[(u64, f64)] {
        self.monitors.get_history(name)
    }
}

/// The run's input source. The engine owns it (it feeds the steps and restores a resumed
/// position) and shares it with [`StartInput`]; the [`TrainContext`] does not own it, it sees
/// the consumed position the engine records after every call that can move it.
type SharedInput = Rc<RefCell<Box<dyn InputSource>>>;

/// Records `input`'s consumed position in the context.
fn record_position(ctx: &mut TrainContext, input: &dyn InputSource) {
    ctx.input_position = input.consumed_state();
}

/// Starts the input source first in `before_train` and stops it first in `after_train`
/// (tensorpack registers the input source's callbacks first).
struct StartInput {
    input: SharedInput,
}

impl StartInput {
    /// The input source, or an error naming it when it is in use (never: the engine borrows
    /// it only inside steps and around the loop, never during `before_train`/`after_train`).
    fn input(&self) -> Result<std::cell::RefMut<'_, Box<dyn InputSource>>, TrainError> {
        self.input.try_borrow_mut().map_err(|_| TrainError::Input {
            source_name: "InputSource".into(),
            message: "the input source is in use elsewhere".into(),
        })
    }
}

impl Callback for StartInput {
    fn name(&self) -> String {
        "InputSource".into()
    }
    fn chief_only(&self) -> bool {
        false
    }
    fn before_train(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let mut input = self.input()?;
        let started = input.start();
        record_position(ctx, input.as_ref());
        started
    }
    fn after_train(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let mut input = self.input()?;
        input.stop();
        record_position(ctx, input.as_ref());
        Ok(())
    }
}

/// The monitors as one callback, registered last: they see everything the other callbacks put
/// in the same lifecycle point.
struct MonitorDispatch;

impl Callback for MonitorDispatch {
    fn name(&self) -> String {
        "Monitors".into()
    }
    fn chief_only(&self) -> bool {
        false
    }
    fn before_train(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let setup = MonitorSetup {
            logdir: ctx.logdir.clone(),
            counters: ctx.counters,
            resumed_at: ctx.resumed.as_ref().map(|r| r.global_step),
        };
        ctx.monitors.setup(&setup)
    }
    fn trigger_step(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let at = ctx.counters;
        ctx.monitors.trigger_step(&at)
    }
    fn trigger_epoch(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let at = ctx.counters;
        ctx.monitors.trigger_epoch(&at)
    }
    fn after_train(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let at = ctx.counters;
        ctx.monitors.after_train(&at)
    }
}

/// Where the resume of `config` comes from; replaces its `session_init` with the checkpoint.
fn resolve_resume(
    config: &mut TrainConfig,
    logdir: Option<&Path>,
) -> Result<Option<FoundResume>, TrainError> {
    let found = match &config.resume {
        Resume::No => return Ok(None),
        Resume::Auto { always } => {
            let Some(dir) = logdir else {
                log::warn!(target: "towerpack", "AutoResume: no logdir is set; starting fresh");
                return Ok(None);
            };
            if !always && config.session_init.is_some() {
                log::info!(target: "towerpack", "AutoResume: the given session_init wins");
                return Ok(None);
            }
            find_auto_resume(dir)?
        }
        Resume::From(path) => {
            let file = resolve_checkpoint_path(path)?;
            let loaded = load_checkpoint(&file)?;
            let state = ResumeState::from_metadata(&loaded.metadata, &file)?.ok_or_else(|| {
                TrainError::Resume(format!(
                    "{} has no resume metadata; restore it with session_init and set \
                     starting_epoch instead",
                    file.display()
                ))
            })?;
            Some(FoundResume {
                checkpoint: file,
                start: state.next,
                state: Some(state),
            })
        }
    };
    if let Some(f) = &found {
        log::info!(
            target: "towerpack",
            "Resuming from {}: epoch {}, step {} of the epoch",
            f.checkpoint.display(),
            f.start.epoch,
            f.start.next_local_step
        );
        if config.session_init.is_some() {
            log::info!(
                target: "towerpack",
                "The run resumes from its logdir's checkpoint; the given session_init (e.g. \
                 --load) is not used"
            );
        }
        config.session_init = Some(Box::new(SaverRestore::new(&f.checkpoint)));
    }
    Ok(found)
}

/// The file in the logdir holding the training graph's textual IR.
pub const GRAPH_FILE_NAME: &str = "graph.tp";

/// Trains with `config` and `trainer` (tensorpack's `launch_train_with_config`).
///
/// Callback order (= call order at every lifecycle point): the input source's, the trainer's,
/// the step counter, `config.callbacks`, `config.extra_callbacks` (default
/// [`default_callbacks`]), then the monitors. A clean stop returns `Ok` with
/// [`TrainReport::stopped`] set; `after_train` runs in every case, every callback's even if one
/// fails.
pub fn launch_train_with_config(
    mut config: TrainConfig,
    trainer: &mut dyn Trainer,
) -> Result<TrainReport, TrainError> {
    // Log lines go to stderr even when the application installed no logger, and to the
    // logdir's log.log while the run lasts.
    super::logdir::install_logger();
    let (logdir, _run_log) = match &config.logdir {
        Some(dir) => {
            let dir = super::logdir::prepare_logger_dir(dir, config.logdir_action)?;
            let run_log = super::logdir::attach_run_log(&dir)?;
            (Some(dir), Some(run_log))
        }
        None => (super::logdir::logger_dir(), None),
    };
    let found = resolve_resume(&mut config, logdir.as_deref())?;
    let found = trainer.agree_on_resume(found)?;
    let input = match (config.dataflow.take(), config.data.take()) {
        (Some(flow), None) => trainer.default_input(flow),
        (None, Some(input)) => input,
        (Some(_), Some(_)) => {
            return Err(ConfigError::DataflowAndInput.into());
        }
        (None, None) => {
            return Err(ConfigError::NoData.into());
        }
    };
    let mut input = input;
    let mut ctx = TrainContext::new(Graph::new(), config.seed, config.model.clone());
    record_position(&mut ctx, input.as_ref());
    if let Some(model) = &config.model {
        let set = input.setup(&model.inputs());
        record_position(&mut ctx, input.as_ref());
        set?;
    }
    if config.precision.loss_scaling() && config.loss_scale.is_none() {
        log::warn!(
            target: "towerpack",
            "Training in {} without a loss scale: gradients under 2^-24 vanish and over 65504 \
             overflow as 16-bit operands (TrainConfig::precision sets one; loss_scale(None) \
             removed it)",
            config.precision
        );
    }
    let built = {
        let Phase::Building(graph) = &mut ctx.phase else {
            return Err(TrainError::GraphFinalized {
                what: "trainer setup".into(),
            });
        };
        let mut setup = GraphSetup {
            graph,
            seed: config.seed,
            input: input.as_mut(),
            model: ctx.model.clone(),
            loss_scale: config.loss_scale,
        };
        let built = trainer.setup_graph(&mut setup);
        record_position(&mut ctx, input.as_ref());
        built?
    };
    log::info!(target: "towerpack", "Built the training graph of {}", trainer.name());
    ctx.info.towers = built.towers;
    ctx.info.losses = built.losses;
    ctx.info.gradients = built.gradients;
    ctx.info.numeric_checks = built.numeric_checks;
    let (placement, bucket_bytes) = (built.placement, built.bucket_bytes);

    let steps_per_epoch = match config.steps_per_epoch {
        Some(s) => s,
        None => input.size().map(|n| n as u64).ok_or_else(|| {
            TrainError::from(ConfigError::UnknownEpochSize {
                input: input.name().to_string(),
            })
        })?,
    };
    ctx.counters = LoopCounters::new(steps_per_epoch, config.starting_epoch, config.max_epoch);
    ctx.logdir = logdir;
    ctx.is_chief = trainer.is_chief();
    ctx.monitors = Monitors::new(config.monitors.take().unwrap_or_else(default_monitors));

    let is_chief = ctx.is_chief;
    let mut callbacks = CallbackList::default();
    let input_callbacks = input.callbacks();
    record_position(&mut ctx, input.as_ref());
    let input: SharedInput = Rc::new(RefCell::new(input));
    callbacks.register(
        Box::new(StartInput {
            input: Rc::clone(&input),
        }),
        is_chief,
    );
    for cb in input_callbacks {
        callbacks.register(cb, is_chief);
    }
    for cb in built.callbacks {
        callbacks.register(cb, is_chief);
    }
    callbacks.register(Box::new(MaintainStepCounter::new()), is_chief);
    // The user's own monitor (another fetch period) replaces the default one.
    let own_monitor = config
        .callbacks
        .iter()
        .any(|c| (**c).as_any().is::<LossScaleMonitor>());
    if config.loss_scale.is_some() && !own_monitor {
        callbacks.register(Box::new(LossScaleMonitor::new()), is_chief);
    }
    for cb in std::mem::take(&mut config.callbacks) {
        callbacks.register(cb, is_chief);
    }
    let extra = config
        .extra_callbacks
        .take()
        .unwrap_or_else(default_callbacks);
    for cb in extra {
        callbacks.register(cb, is_chief);
    }
    callbacks.register(Box::new(MonitorDispatch), is_chief);
    callbacks.setup_graph(&mut ctx)?;

    let mut init: Box<dyn SessionInit> = config
        .session_init
        .take()
        .unwrap_or_else(|| Box::new(JustCurrentSession));
    init.setup_graph(ctx.graph_mut("session init")?)?;
    let graph = std::mem::take(ctx.graph_mut("creating the session")?);
    // The training graph in textual form, as tensorpack writes its graph for TensorBoard:
    // `towerpack check|lower graph.tp` reads it.
    if let (true, Some(dir)) = (is_chief, &ctx.logdir) {
        // The logdir may not exist yet (a distributed chief creates it when it first saves).
        std::fs::create_dir_all(dir).map_err(TrainError::io(dir))?;
        let path = dir.join(GRAPH_FILE_NAME);
        crate::atomic_file::write_atomically(&path, crate::ir::text::print(&graph).as_bytes())
            .map_err(TrainError::io(&path))?;
    }
    let mut session =
        config
            .backend
            .create_session_with(graph, &placement, bucket_bytes, config.precision)?;
    session.initialize_variables(config.seed)?;
    let outcome = if is_chief {
        init.run_init(session.as_mut())?
    } else {
        InitOutcome::default()
    };
    trainer.initialize_session(session.as_mut())?;
    ctx.phase = Phase::Running(session);
    ctx.counters.global_step = read_global_step(&mut ctx)?;

    let mut start = ResumePoint::epoch_start(config.starting_epoch);
    if let Some(found) = found {
        start = apply_resume(&mut ctx, &input, &mut callbacks, found, &outcome)?;
        if let Some(message) = already_finished(start, &ctx.counters) {
            log::warn!(target: "towerpack", "{message}");
        }
    }
    let engine = Engine {
        ctx,
        input,
        callbacks,
        reads_input: HashMap::new(),
    };
    engine.run(trainer, start)
}

/// A resume continues the SAME model: a checkpoint that lacks variables of this graph, or holds
/// variables it does not have, was written by another model (a logdir reused by mistake), and
/// training on would silently mix the two. (An explicit `session_init` may restore partially,
/// as tensorpack's does; only resuming is strict.)
fn check_same_model(
    checkpoint: &Path,
    report: &crate::train::checkpoint::RestoreReport,
) -> Result<(), TrainError> {
    let describe = |names: &[String]| {
        let shown: Vec<&str> = names.iter().take(5).map(String::as_str).collect();
        let more = names.len().saturating_sub(shown.len());
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        format!("{} ({}{more})", names.len(), shown.join(", "))
    };
    let mut problems = Vec::new();
    if !report.only_in_graph.is_empty() {
        problems.push(format!(
            "{} variables of this model are not in it",
            describe(&report.only_in_graph)
        ));
    }
    if !report.only_in_checkpoint.is_empty() {
        problems.push(format!(
            "it holds {} variables this model does not have",
            describe(&report.only_in_checkpoint)
        ));
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(TrainError::Resume(format!(
        "{} was written by a different model: {}; train in another logdir \
         or start afresh",
        checkpoint.display(),
        problems.join("; ")
    )))
}

/// Restores the loop position, the input position and the callbacks' state of `found`.
fn apply_resume(
    ctx: &mut TrainContext,
    input: &SharedInput,
    callbacks: &mut CallbackList,
    found: FoundResume,
    outcome: &InitOutcome,
) -> Result<ResumePoint, TrainError> {
    let mut start = found.start;
    start.next_local_step = start.next_local_step.min(ctx.counters.steps_per_epoch);
    if outcome.checkpoint.is_none() && ctx.is_chief {
        return Err(TrainError::Resume(format!(
            "{} was not restored",
            found.checkpoint.display()
        )));
    }
    check_same_model(&found.checkpoint, &outcome.report)?;
    if let Some(state) = &found.state {
        if state.seed != ctx.seed {
            log::warn!(
                target: "towerpack",
                "Resume: the checkpoint was written with seed {}, this run has seed {}; the \
                 continuation is not exact",
                state.seed,
                ctx.seed
            );
        }
        if state.steps_per_epoch != ctx.counters.steps_per_epoch {
            log::warn!(
                target: "towerpack",
                "Resume: steps_per_epoch was {}, is now {}",
                state.steps_per_epoch,
                ctx.counters.steps_per_epoch
            );
        }
        if state.global_step != ctx.counters.global_step {
            return Err(TrainError::Resume(format!(
                "{}: the metadata says global_step {}, the variable holds {}",
                found.checkpoint.display(),
                state.global_step,
                ctx.counters.global_step
            )));
        }
        match &state.input {
            Some(flow) => {
                let mut input = input.borrow_mut();
                let restored = input.restore(flow);
                record_position(ctx, input.as_ref());
                restored?;
            }
            None => log::warn!(target: "towerpack", "Resume: no data position was saved"),
        }
        callbacks.restore_states(&state.callbacks)?;
    }
    ctx.counters.starting_epoch = start.epoch;
    ctx.counters.epoch_num = start.epoch.saturating_sub(1);
    ctx.resumed = Some(ResumeInfo {
        exact: found.state.is_some(),
        checkpoint: found.checkpoint,
        global_step: ctx.counters.global_step,
        point: start,
    });
    Ok(start)
}

/// The message for a resumed logdir that has nothing left to train: the loop would start after
/// `max_epoch` and end at once. `None` when there is work left (a resume point at the end of
/// `max_epoch` still has that epoch's end-of-epoch callbacks to run).
fn already_finished(start: ResumePoint, counters: &LoopCounters) -> Option<String> {
    (start.epoch > counters.max_epoch).then(|| {
        format!(
            "Nothing to train: the logdir is already at max_epoch {} (global_step {}); use \
             --fresh or raise --max-epoch (LogDirAction::Backup or a larger \
             TrainConfig::max_epoch)",
            counters.max_epoch, counters.global_step
        )
    })
}

/// The value of the `global_step` variable (0 if the graph has none).
fn read_global_step(ctx: &mut TrainContext) -> Result<u64, TrainError> {
    let Some(id) = ctx.graph().find_variable(GLOBAL_STEP) else {
        return Ok(0);
    };
    let value = ctx.session("reading global_step")?.read_variable(id)?;
    let step = value.scalar_value().unwrap_or(0.0);
    Ok(if step > 0.0 { step as u64 } else { 0 })
}

struct Engine {
    ctx: TrainContext,
    input: SharedInput,
    callbacks: CallbackList,
    reads_input: HashMap<crate::backend::Step, bool>,
}

impl Engine {
    fn run(
        mut self,
        trainer: &mut dyn Trainer,
        start: ResumePoint,
    ) -> Result<TrainReport, TrainError> {
        // From here until the end-of-training hooks ran, SIGINT/SIGTERM stop the loop at the
        // next step boundary (a second one exits at once).
        let interruptible = InterruptGuard::new();
        let result = self.main_loop(trainer, start);
        trainer.loop_ended(&result);
        let after = self.callbacks.after_train(&mut self.ctx);
        {
            let mut input = self.input.borrow_mut();
            input.stop();
            record_position(&mut self.ctx, input.as_ref());
        }
        drop(interruptible);
        let stopped = match result {
            Ok(()) => None,
            Err(TrainError::Stop { reason }) => {
                log::info!(target: "towerpack", "Training was stopped: {reason}");
                Some(reason)
            }
            Err(e @ TrainError::Interrupted { .. }) => {
                log::warn!(target: "towerpack", "Training was {e}");
                return Err(e);
            }
            Err(e) => {
                log::error!(
                    target: "towerpack",
                    "Training failed at global_step={}: {e}",
                    self.ctx.counters.global_step
                );
                return Err(e);
            }
        };
        let count = after.len();
        if let Some(first) = after.into_iter().next() {
            return Err(TrainError::AfterTrain {
                count,
                first: Box::new(first),
            });
        }
        let callback_keys = self.callbacks.keys();
        let Phase::Running(session) = self.ctx.phase else {
            return Err(TrainError::NoSession {
                what: "the training report".into(),
            });
        };
        Ok(TrainReport {
            stopped,
            counters: self.ctx.counters,
            monitors: self.ctx.monitors,
            callbacks: self.callbacks.into_callbacks(),
            callback_keys,
            session,
            resumed: self.ctx.resumed,
            logdir: self.ctx.logdir,
        })
    }

    fn main_loop(
        &mut self,
        trainer: &mut dyn Trainer,
        start: ResumePoint,
    ) -> Result<(), TrainError> {
        let ctx = &mut self.ctx;
        ctx.counters.epoch_num = start.epoch.saturating_sub(1);
        ctx.counters.local_step = -1;
        self.callbacks.before_train(ctx, start)?;
        ctx.counters.global_step = read_global_step(ctx)?;
        let spe = ctx.counters.steps_per_epoch;
        for epoch in start.epoch..=ctx.counters.max_epoch {
            ctx.counters.epoch_num = epoch;
            let first = if epoch == start.epoch {
                start.next_local_step.min(spe)
            } else {
                0
            };
            self.callbacks.before_epoch(ctx)?;
            let began = Instant::now();
            for local_step in first..spe {
                ctx.counters.local_step = local_step as i64;
                {
                    // Borrowed for the step only: `StartInput` uses it outside the loop.
                    let mut input = self.input.borrow_mut();
                    let mut runner = StepRunner {
                        ctx,
                        input: input.as_mut(),
                        callbacks: &mut self.callbacks,
                        reads_input: &mut self.reads_input,
                    };
                    trainer.run_step(&mut runner)?;
                }
                self.callbacks.trigger_step(ctx)?;
                if let Some(signal) = interrupt::requested() {
                    let saved = self.callbacks.save_after_interrupt(ctx)?;
                    return Err(TrainError::Interrupted {
                        signal,
                        global_step: ctx.counters.global_step,
                        checkpoint: saved.into_iter().next(),
                    });
                }
            }
            if spe > 0 {
                ctx.counters.local_step = spe as i64 - 1;
            }
            self.callbacks.after_epoch(ctx)?;
            log::info!(
                target: "towerpack",
                "Epoch {epoch} (global_step {}) finished, time: {:.3} sec.",
                ctx.counters.global_step,
                began.elapsed().as_secs_f64()
            );
            self.callbacks.trigger_epoch(ctx)?;
        }
        Ok(())
    }
}
