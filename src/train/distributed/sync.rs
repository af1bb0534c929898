//! What keeps the ranks of a distributed run in lock step besides the gradient all-reduces:
//! the [`Agreement`] round before every step and epoch broadcast (so a rank that stops — a
//! chief-only callback, unequal data, an error — ends every rank cleanly instead of leaving them
//! waiting), the broadcast of the chief's variables, and the chief's resume point.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

use crate::backend::collective::{CollectiveEngine, CollectiveError, WireFormat};
use crate::backend::{BackendError, Session};
use crate::ir::ReduceOp;
use crate::tensor::HostTensor;
use crate::train::callback::Callback;
use crate::train::context::TrainContext;
use crate::train::counters::ResumePoint;
use crate::train::error::{DistributedError, TrainError};
use crate::train::resume::{FoundResume, ResumeState};

/// The chief: the rank whose variables, checkpoints and resume point the job follows.
pub(crate) const CHIEF: usize = 0;

/// Where a rank is when it takes part in an agreement round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Point {
    /// About to run a training step.
    Step = 1,
    /// About to broadcast the chief's variables at the end of an epoch.
    EpochSync = 2,
    /// Its loop ended normally or by a clean stop.
    Done = 3,
    /// Its loop ended with an error.
    Failed = 4,
}

impl Point {
    fn from_code(c: f32) -> Option<Point> {
        [Point::Step, Point::EpochSync, Point::Done, Point::Failed]
            .into_iter()
            .find(|p| *p as u8 as f32 == c)
    }

    fn describe(self, global_step: u64) -> String {
        match self {
            Point::Step => format!("at step {global_step}"),
            Point::EpochSync => format!("at the end of an epoch (step {global_step})"),
            Point::Done => format!("finished (step {global_step})"),
            Point::Failed => format!("failed (step {global_step})"),
        }
    }
}

/// The per-step agreement of the ranks: each tells the others where it is; any rank that has
/// ended its loop ends everyone's. Exact f32 values (ranks' slots are one-hot, so the sum of
/// the contributions is each rank's own value).
pub(crate) struct Agreement {
    engine: Arc<dyn CollectiveEngine>,
    ended: AtomicBool,
}

impl Agreement {
    pub(crate) fn new(engine: Arc<dyn CollectiveEngine>) -> Agreement {
        Agreement {
            engine,
            ended: AtomicBool::new(false),
        }
    }

    /// One round from `point` at `global_step`. `Ok` when every rank is at the same point and
    /// step (or, for an ending rank, always); a clean stop when another rank ended normally;
    /// an error when one failed or the ranks are out of step.
    pub(crate) fn round(&self, point: Point, global_step: u64) -> Result<(), TrainError> {
        let (rank, size) = (self.engine.rank(), self.engine.size());
        if size == 1 {
            return Ok(());
        }
        // Steps travel modulo 2²⁴ (exact in f32): enough to tell ranks out of step.
        let step_code = (global_step % (1 << 24)) as f32;
        let mut slots = vec![0f32; 2 * size];
        slots[rank] = point as u8 as f32;
        slots[size + rank] = step_code;
        self.engine
            .all_reduce_as(&mut slots, ReduceOp::Sum, WireFormat::F32)
            .map_err(collective)?;
        let points: Vec<Option<Point>> =
            slots[..size].iter().map(|&c| Point::from_code(c)).collect();
        let ended = |p: Point| points.iter().position(|q| *q == Some(p));
        if let Some(r) = ended(Point::Failed).or_else(|| ended(Point::Done)) {
            self.ended.store(true, Ordering::Relaxed);
            if matches!(point, Point::Done | Point::Failed) {
                return Ok(());
            }
            if points[r] == Some(Point::Failed) {
                return Err(collective(CollectiveError::PeerFailed {
                    rank: r,
                    this: rank,
                }));
            }
            return Err(TrainError::stop(format!(
                "rank {r} ended its run at global_step {}",
                slots[size + r]
            )));
        }
        let out_of_step =
            (0..size).any(|r| points[r] != Some(point) || slots[size + r] != step_code);
        if out_of_step {
            let at: Vec<String> = (0..size)
                .map(|r| {
                    let p = points[r]
                        .map_or("lost".to_string(), |p| p.describe(slots[size + r] as u64));
                    format!("rank {r} {p}")
                })
                .collect();
            return Err(DistributedError::OutOfStep { ranks: at }.into());
        }
        Ok(())
    }

    /// Tells the other ranks this one's loop ended (unless a round already ended the job).
    pub(crate) fn leave(&self, outcome: &Result<(), TrainError>, global_step: u64) {
        if self.ended.load(Ordering::Relaxed) {
            return;
        }
        if let Err(TrainError::Backend(e)) = outcome
            && matches!(**e, BackendError::Collective(_))
        {
            // The engine itself failed (a lost rank): it cannot carry a goodbye round.
            return;
        }
        let point = match outcome {
            Ok(()) | Err(TrainError::Stop { .. }) => Point::Done,
            Err(_) => Point::Failed,
        };
        if let Err(e) = self.round(point, global_step) {
            log::error!(target: "towerpack", "rank {}: telling the others it ended: {e}", self.engine.rank());
        }
    }
}

pub(crate) fn collective(e: CollectiveError) -> TrainError {
    TrainError::from(BackendError::Collective(e))
}

/// `name dtype shape` of every variable, one a line: what must agree across ranks.
fn variable_signature(session: &dyn Session) -> Vec<String> {
    session
        .graph()
        .variable_ids()
        .map(|(_, def)| format!("{} {}", def.name, def.ty))
        .collect()
}

/// The chief's `bytes` on every rank, whatever length the others hold (sent first).
fn broadcast_blob(engine: &dyn CollectiveEngine, bytes: &mut Vec<u8>) -> Result<(), TrainError> {
    let mut len = (bytes.len() as u64).to_le_bytes();
    engine.broadcast(&mut len, CHIEF).map_err(collective)?;
    bytes.resize(u64::from_le_bytes(len) as usize, 0);
    engine.broadcast(bytes, CHIEF).map_err(collective)
}

/// Errors on every rank unless every rank's graph has the chief's variables (names, dtypes and
/// shapes, in order); the rank that differs names the first differing variable.
pub(crate) fn check_same_variables(
    engine: &dyn CollectiveEngine,
    session: &dyn Session,
) -> Result<(), TrainError> {
    let mine = variable_signature(session);
    let mut blob = mine.join("\n").into_bytes();
    broadcast_blob(engine, &mut blob)?;
    let chief = String::from_utf8_lossy(&blob).into_owned();
    let chief: Vec<&str> = chief.split('\n').filter(|l| !l.is_empty()).collect();
    let local_problem = if chief.len() != mine.len() {
        Some(format!(
            "rank {} has {} variables, the chief {}",
            engine.rank(),
            mine.len(),
            chief.len()
        ))
    } else {
        mine.iter().zip(&chief).find(|(a, b)| a != b).map(|(a, b)| {
            format!(
                "rank {} has variable `{a}` where the chief has `{b}`",
                engine.rank()
            )
        })
    };
    let size = engine.size();
    let mut flags = vec![0f32; size];
    flags[engine.rank()] = f32::from(u8::from(local_problem.is_some()));
    engine
        .all_reduce_as(&mut flags, ReduceOp::Sum, WireFormat::F32)
        .map_err(collective)?;
    if let Some(p) = local_problem {
        return Err(DistributedError::GraphDiffers { difference: p }.into());
    }
    let differing: Vec<usize> = (0..size).filter(|&r| flags[r] != 0.0).collect();
    if !differing.is_empty() {
        return Err(DistributedError::GraphsDiffer { ranks: differing }.into());
    }
    Ok(())
}

/// Sets every rank's variables to the chief's (one broadcast of all their bytes).
pub(crate) fn broadcast_variables(
    engine: &dyn CollectiveEngine,
    session: &mut dyn Session,
) -> Result<(), TrainError> {
    let vars: Vec<_> = session
        .graph()
        .variable_ids()
        .map(|(id, def)| (id, def.ty.dtype, def.ty.shape.to_static()))
        .collect();
    let chief = engine.rank() == CHIEF;
    let mut blob = Vec::new();
    let mut layout = Vec::with_capacity(vars.len());
    for (id, dtype, shape) in &vars {
        let shape = shape.clone().ok_or_else(|| {
            TrainError::from(DistributedError::DynamicVariable {
                variable: session.graph().variable(*id).name.clone(),
            })
        })?;
        let bytes = dtype.size_bytes() * shape.iter().product::<usize>();
        if chief {
            blob.extend(session.read_variable(*id)?.to_le_bytes());
        } else {
            blob.resize(blob.len() + bytes, 0);
        }
        layout.push((*id, *dtype, shape, bytes));
    }
    engine.broadcast(&mut blob, CHIEF).map_err(collective)?;
    if !chief {
        let mut at = 0;
        for (id, dtype, shape, bytes) in layout {
            let value = HostTensor::from_le_bytes(dtype, &shape, &blob[at..at + bytes]).map_err(
                |source| DistributedError::Broadcast {
                    variable: session.graph().variable(id).name.clone(),
                    source,
                },
            )?;
            session.write_variable(id, &value)?;
            at += bytes;
        }
    }
    Ok(())
}

/// [`FoundResume`] as it travels from the chief.
#[derive(Serialize, Deserialize)]
struct SharedResume {
    checkpoint: PathBuf,
    start: ResumePoint,
    state: Option<ResumeState>,
}

/// The callback recording the shape of the job in checkpoints (its state: the number of
/// ranks), so a resume knows whether the data positions still apply.
pub(crate) struct JobRecord {
    pub(crate) ranks: usize,
}

/// The registration key of [`JobRecord`], also its key in the resume state.
pub(crate) const JOB_RECORD: &str = "DistributedJob";

impl Callback for JobRecord {
    fn name(&self) -> String {
        JOB_RECORD.into()
    }
    fn chief_only(&self) -> bool {
        false
    }
    fn save_state(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({ "ranks": self.ranks }))
    }
    fn restore_state(&mut self, _state: &serde_json::Value) -> Result<(), TrainError> {
        Ok(())
    }
}

/// The chief's resume on every rank: the others continue from the chief's checkpoint (its
/// variables arrive by broadcast), loop position, data position and callback state. A
/// checkpoint of a job with another number of ranks keeps its variables and loop position, but
/// not the data position: the ranks' shards changed, so each rank's data starts afresh.
pub(crate) fn agree_on_resume(
    engine: &dyn CollectiveEngine,
    found: Option<FoundResume>,
) -> Result<Option<FoundResume>, TrainError> {
    let shared = found.map(|mut f| {
        if let Some(state) = &mut f.state {
            let ranks = state
                .callbacks
                .get(JOB_RECORD)
                .and_then(|v| v.get("ranks"))
                .and_then(serde_json::Value::as_u64);
            if ranks != Some(engine.size() as u64) && state.input.is_some() {
                log::warn!(
                    target: "towerpack",
                    "Resume: {} was written by a job of {} ranks, this one has {}; the data \
                     position is not restored (each rank's data starts from its beginning)",
                    f.checkpoint.display(),
                    ranks.map_or("an unknown number of".to_string(), |r| r.to_string()),
                    engine.size()
                );
                state.input = None;
            }
        }
        SharedResume {
            checkpoint: f.checkpoint,
            start: f.start,
            state: f.state,
        }
    });
    let mut blob = if engine.rank() == CHIEF {
        serde_json::to_vec(&shared)
            .map_err(|e| TrainError::Resume(format!("cannot share the resume state: {e}")))?
    } else {
        Vec::new()
    };
    broadcast_blob(engine, &mut blob)?;
    let agreed: Option<SharedResume> = serde_json::from_slice(&blob)
        .map_err(|e| TrainError::Resume(format!("the chief's resume state is unreadable: {e}")))?;
    if engine.rank() != CHIEF
        && let Some(r) = &agreed
    {
        log::info!(
            target: "towerpack",
            "Rank {} resumes with the chief from {} (epoch {}, step {} of the epoch)",
            engine.rank(),
            r.checkpoint.display(),
            r.start.epoch,
            r.start.next_local_step
        );
    }
    Ok(agreed.map(|r| FoundResume {
        checkpoint: r.checkpoint,
        start: r.start,
        state: r.state,
    }))
}

/// Broadcasts the chief's variables at the end of every epoch (after an agreement round), so
/// ranks that drifted apart (non-associative sums over 3+ ranks, bf16 wire) start every epoch
/// identical.
pub(crate) struct EpochBroadcast {
    pub(crate) engine: Arc<dyn CollectiveEngine>,
    pub(crate) agreement: Arc<Agreement>,
}

impl Callback for EpochBroadcast {
    fn name(&self) -> String {
        "EpochBroadcast".into()
    }
    fn chief_only(&self) -> bool {
        false
    }
    fn trigger_epoch(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.agreement.round(Point::EpochSync, ctx.global_step())?;
        let session = ctx.session("broadcasting the chief's variables")?;
        broadcast_variables(self.engine.as_ref(), session)
    }
}
