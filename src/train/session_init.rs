//! Session initializers (tensorpack's `SessionInit`): restore variables from a checkpoint file or
//! directory ([`SaverRestore`], exact; [`SaverRestore::relaxed`], reshaping and casting), from a
//! name→tensor map ([`DictRestore`]), in sequence ([`ChainInit`]), or pick one from what is
//! given ([`SmartInit`]). Names on one side only are reported both ways (optimizer slots and
//! other training-only names excepted), by the checkpoint layer's `match_for_restore`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::backend::Session;
use crate::ir::Graph;
use crate::tensor::HostTensor;
use crate::tower::VarCollection;

use super::checkpoint::{
    RestoreOptions, RestorePlan, RestoreReport, VariableSpec, load_checkpoint, match_for_restore,
};
use super::error::{ConfigError, TrainError};

/// What an initializer did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InitOutcome {
    /// The checkpoint file restored, if any.
    pub checkpoint: Option<PathBuf>,
    /// Its metadata (resume state, by towerpack's convention).
    pub metadata: BTreeMap<String, String>,
    /// The mismatches.
    pub report: RestoreReport,
    /// Variables assigned.
    pub restored: usize,
}

/// Initializes the variables of a new session.
pub trait SessionInit {
    /// Before the session exists: may add ops (none of the built-ins do).
    fn setup_graph(&mut self, _graph: &mut Graph) -> Result<(), TrainError> {
        Ok(())
    }

    /// After variables got their initial values (chief only).
    fn run_init(&mut self, session: &mut dyn Session) -> Result<InitOutcome, TrainError>;
}

/// The global (saved) variables of `graph` as restore targets.
pub fn global_variable_specs(graph: &Graph) -> Vec<VariableSpec> {
    VarCollection::Global
        .variables(graph)
        .into_iter()
        .map(|id| {
            let def = graph.variable(id);
            VariableSpec {
                name: def.name.clone(),
                dtype: def.ty.dtype,
                shape: def.ty.shape.to_static().unwrap_or_default(),
            }
        })
        .collect()
}

/// Writes a plan's values into the session and logs its mismatches.
fn apply_plan(
    session: &mut dyn Session,
    plan: RestorePlan,
    source: &str,
) -> Result<InitOutcome, TrainError> {
    for warning in plan.report.warnings() {
        log::warn!(target: "towerpack", "{source}: {warning}");
    }
    let restored = plan.assignments.len();
    for (name, value) in &plan.assignments {
        let id = session
            .graph()
            .find_variable(name)
            .ok_or_else(|| TrainError::UnknownVariable { name: name.clone() })?;
        session.write_variable(id, value)?;
    }
    log::info!(target: "towerpack", "Restored {restored} variables from {source}");
    Ok(InitOutcome {
        report: plan.report,
        restored,
        ..InitOutcome::default()
    })
}

/// Does nothing (tensorpack's `JustCurrentSession`, the default).
#[derive(Clone, Copy, Debug, Default)]
pub struct JustCurrentSession;

impl SessionInit for JustCurrentSession {
    fn run_init(&mut self, _: &mut dyn Session) -> Result<InitOutcome, TrainError> {
        Ok(InitOutcome::default())
    }
}

/// Restores variables from a checkpoint: a file, a `model-123` prefix, a directory or its
/// `checkpoint` index (the latest).
#[derive(Clone, Debug)]
pub struct SaverRestore {
    path: PathBuf,
    options: RestoreOptions,
}

impl SaverRestore {
    /// Exact restore: dtype and shape must match.
    pub fn new(path: impl AsRef<Path>) -> SaverRestore {
        SaverRestore {
            path: path.as_ref().to_path_buf(),
            options: RestoreOptions::exact(),
        }
    }

    /// tensorpack's `SaverRestoreRelaxed`: reshape and cast when possible, else skip.
    pub fn relaxed(path: impl AsRef<Path>) -> SaverRestore {
        SaverRestore {
            path: path.as_ref().to_path_buf(),
            options: RestoreOptions::relaxed(),
        }
    }

    /// Graph variables `<prefix>/x` load checkpoint key `x`.
    pub fn prefix(mut self, prefix: &str) -> SaverRestore {
        self.options.prefix = Some(prefix.to_string());
        self
    }

    /// Leaves these names alone.
    pub fn ignore(mut self, names: &[&str]) -> SaverRestore {
        self.options.ignore = names.iter().map(|s| s.to_string()).collect();
        self
    }

    /// The path as given.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl SessionInit for SaverRestore {
    fn run_init(&mut self, session: &mut dyn Session) -> Result<InitOutcome, TrainError> {
        let checkpoint = load_checkpoint(&self.path)?;
        let specs = global_variable_specs(session.graph());
        let plan = match_for_restore(&specs, &checkpoint.tensors, &self.options)?;
        let source = checkpoint.path.display().to_string();
        let mut outcome = apply_plan(session, plan, &source)?;
        outcome.checkpoint = Some(checkpoint.path);
        outcome.metadata = checkpoint.metadata;
        Ok(outcome)
    }
}

/// Assigns values from a name→tensor map (tensorpack's `DictRestore`): converts like the relaxed
/// mode; a value that cannot fit is an error unless `ignore_mismatch`.
#[derive(Clone, Debug)]
pub struct DictRestore {
    values: BTreeMap<String, HostTensor>,
    ignore_mismatch: bool,
}

impl DictRestore {
    /// Restores `values` (names with or without `:0`).
    pub fn new(values: BTreeMap<String, HostTensor>) -> DictRestore {
        DictRestore {
            values,
            ignore_mismatch: false,
        }
    }

    /// Skips (with a warning) values that cannot fit instead of failing.
    pub fn ignore_mismatch(mut self, on: bool) -> DictRestore {
        self.ignore_mismatch = on;
        self
    }
}

impl SessionInit for DictRestore {
    fn run_init(&mut self, session: &mut dyn Session) -> Result<InitOutcome, TrainError> {
        let specs = global_variable_specs(session.graph());
        let plan = match_for_restore(&specs, &self.values, &RestoreOptions::relaxed())?;
        if !self.ignore_mismatch
            && let Some(a) = plan.report.incompatible.first()
        {
            return Err(ConfigError::InitMismatch {
                init: "DictRestore".into(),
                variable: a.name.clone(),
                in_graph: a.to.clone(),
                value: a.from.clone(),
            }
            .into());
        }
        apply_plan(session, plan, "a dict")
    }
}

/// Runs several initializers in order (tensorpack's `ChainInit`); the outcome is the last one
/// that restored a checkpoint (or the last one).
pub struct ChainInit {
    inits: Vec<Box<dyn SessionInit>>,
}

impl ChainInit {
    /// Chains `inits`.
    pub fn new(inits: Vec<Box<dyn SessionInit>>) -> ChainInit {
        ChainInit { inits }
    }
}

impl SessionInit for ChainInit {
    fn setup_graph(&mut self, graph: &mut Graph) -> Result<(), TrainError> {
        self.inits.iter_mut().try_for_each(|i| i.setup_graph(graph))
    }

    fn run_init(&mut self, session: &mut dyn Session) -> Result<InitOutcome, TrainError> {
        let mut result = InitOutcome::default();
        for init in &mut self.inits {
            let outcome = init.run_init(session)?;
            if outcome.checkpoint.is_some() || result.checkpoint.is_none() {
                result = outcome;
            }
        }
        Ok(result)
    }
}

/// tensorpack's `SmartInit` (`get_model_loader`): picks an initializer from what it is given.
pub enum SmartInit {
    /// A path: empty → nothing; `~` expanded; a checkpoint file, prefix, directory or index →
    /// [`SaverRestore`] (relaxed with `ignore_mismatch`). npz/npy files are not supported.
    Path { path: String, ignore_mismatch: bool },
    /// A name→tensor map → [`DictRestore`].
    Dict {
        values: BTreeMap<String, HostTensor>,
        ignore_mismatch: bool,
    },
}

impl SmartInit {
    /// From a path (may be empty).
    pub fn new(path: &str) -> SmartInit {
        SmartInit::Path {
            path: path.to_string(),
            ignore_mismatch: false,
        }
    }

    /// From a map of values.
    pub fn from_dict(values: BTreeMap<String, HostTensor>) -> SmartInit {
        SmartInit::Dict {
            values,
            ignore_mismatch: false,
        }
    }

    /// Convert or skip mismatching values instead of failing.
    pub fn ignore_mismatch(mut self, on: bool) -> SmartInit {
        match &mut self {
            SmartInit::Path {
                ignore_mismatch, ..
            }
            | SmartInit::Dict {
                ignore_mismatch, ..
            } => *ignore_mismatch = on,
        }
        self
    }

    /// The initializer this resolves to.
    pub fn resolve(&self) -> Result<Box<dyn SessionInit>, TrainError> {
        match self {
            SmartInit::Dict {
                values,
                ignore_mismatch,
            } => Ok(Box::new(
                DictRestore::new(values.clone()).ignore_mismatch(*ignore_mismatch),
            )),
            SmartInit::Path {
                path,
                ignore_mismatch,
            } => {
                if path.is_empty() {
                    return Ok(Box::new(JustCurrentSession));
                }
                let expanded = match (path.strip_prefix("~/"), std::env::var_os("HOME")) {
                    (Some(rest), Some(home)) => Path::new(&home).join(rest),
                    _ => PathBuf::from(path),
                };
                if path.ends_with(".npz") || path.ends_with(".npy") {
                    return Err(ConfigError::UnsupportedInitFormat {
                        init: "SmartInit".into(),
                        path: path.clone(),
                    }
                    .into());
                }
                crate::train::checkpoint::resolve_checkpoint_path(&expanded)?;
                Ok(Box::new(if *ignore_mismatch {
                    SaverRestore::relaxed(expanded)
                } else {
                    SaverRestore::new(expanded)
                }))
            }
        }
    }
}

impl SessionInit for SmartInit {
    fn run_init(&mut self, session: &mut dyn Session) -> Result<InitOutcome, TrainError> {
        self.resolve()?.run_init(session)
    }
}
