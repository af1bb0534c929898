//! Collective engines: the participants ("ranks") of a distributed job and the reductions and
//! broadcasts between them. [`CollectiveEngine`] extends the backend-facing
//! [`Collective`] (which carries out `Op::AllReduce` kernels) with what a
//! distributed trainer needs besides: broadcasts, explicit wire formats, the local rank.
//!
//! Engines: `mpi` (Open MPI through rsmpi, feature `mpi`; one process per rank, with a
//! heartbeat watchdog so a lost rank ends the job with an error naming it instead of a hang),
//! [`local`] (ranks as threads of one process: tests and single-machine experiments) and
//! `nccl` (feature `nccl`: gradient all-reduces of GPU ranks on device memory, bootstrapped
//! over another engine with [`share_bootstrap_id`]).

pub mod local;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "nccl")]
pub mod nccl;
mod watch;
pub mod wire;

pub use local::LocalGroup;
pub use wire::WireFormat;

use super::{BackendError, Collective};
use crate::ir::ReduceOp;

/// Why a collective operation failed. Every variant names the rank(s) at fault when known.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CollectiveError {
    /// A peer stopped sending heartbeats: it died, hangs, or its host is unreachable.
    #[error(
        "rank {rank} (on {host}) was lost: no heartbeat for {silent_secs:.1} s while this rank \
         waited for {during}"
    )]
    PeerLost {
        rank: usize,
        host: String,
        silent_secs: f64,
        during: String,
    },
    /// A peer shut its engine down while this rank still waited for it.
    #[error("rank {rank} (on {host}) left the job while this rank waited for {during}")]
    PeerLeft {
        rank: usize,
        host: String,
        during: String,
    },
    /// A peer's run ended with an error (its own log says which); this rank stops too.
    #[error("rank {rank} failed (see its log); rank {this} stops as well")]
    PeerFailed { rank: usize, this: usize },
    /// Every peer is alive but the operation did not complete in time.
    #[error(
        "{during} did not complete within {waited_secs:.1} s although every rank is alive; \
         ranks {lagging:?} have not reached it (do all ranks run the same steps?)"
    )]
    Timeout {
        during: String,
        waited_secs: f64,
        lagging: Vec<usize>,
    },
    /// The underlying library reported an error.
    #[error("{call} failed with error {code}: {message}")]
    Library {
        call: String,
        code: i32,
        message: String,
    },
    /// An earlier operation failed; the engine refuses further work (its buffers may still be
    /// in use by the transport).
    #[error("the collective engine failed earlier and cannot be used again: {first}")]
    Failed { first: String },
    /// The engine cannot be created here.
    #[error("collective engine `{engine}` is unavailable: {reason}")]
    Unavailable { engine: String, reason: String },
    /// A caller mistake (a root out of range, a size the transport cannot address).
    #[error("invalid collective call: {0}")]
    Invalid(String),
}

impl From<CollectiveError> for BackendError {
    fn from(e: CollectiveError) -> BackendError {
        BackendError::Collective(e)
    }
}

/// A collective engine as distributed trainers use it.
///
/// Every participant must call the same operations in the same order with the same sizes (the
/// MPI rule). [`Collective::all_reduce`] sends gradients in the engine's
/// [`gradient_wire`](CollectiveEngine::gradient_wire) format; trainers' control messages use
/// [`all_reduce_as`](CollectiveEngine::all_reduce_as) with an explicit (exact) format.
pub trait CollectiveEngine: Collective {
    /// Index of this participant among those on its host (selects its device).
    fn local_rank(&self) -> usize;
    /// Number of participants on this participant's host.
    fn local_size(&self) -> usize;
    /// Where this participant runs (host name), for messages.
    fn host(&self) -> String;
    /// Replaces `data` by its elementwise reduction over every participant, sent as `wire`.
    /// `Max` and `Min` always travel as f32.
    fn all_reduce_as(
        &self,
        data: &mut [f32],
        op: ReduceOp,
        wire: WireFormat,
    ) -> Result<(), CollectiveError>;
    /// Replaces `data` on every participant by `root`'s `data` (all pass the same length).
    fn broadcast(&self, data: &mut [u8], root: usize) -> Result<(), CollectiveError>;
    /// The format gradients travel in through [`Collective::all_reduce`].
    fn gradient_wire(&self) -> WireFormat;
    /// Sets the format of [`Collective::all_reduce`] (e.g. bf16 compression of gradients).
    fn set_gradient_wire(&self, wire: WireFormat);
}

/// Elementwise `data ← data / size` for a mean made of a sum over `size` participants.
fn finish_mean(data: &mut [f32], op: ReduceOp, size: usize) {
    if op == ReduceOp::Mean && size > 1 {
        let inv = 1.0 / size as f32;
        data.iter_mut().for_each(|x| *x *= inv);
    }
}

/// Whether this process was started by an MPI launcher (`mpirun`/`mpiexec` of Open MPI or
/// MPICH/Hydra, or PMIx-based launchers such as `srun --mpi=pmix`): the environment variables
/// they set for every rank. Works without the `mpi` feature, so a program can pick its trainer
/// before initializing MPI.
pub fn launched_by_mpi() -> bool {
    [
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_RANK",
        "MPI_LOCALNRANKS",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
}

/// The bootstrap of a second engine over a first one: `root` creates an opaque id (NCCL's
/// `ncclUniqueId`, 128 bytes) and every participant receives it. The NCCL engine of GPU ranks
/// is created this way over MPI: `ncclGetUniqueId` on rank 0, this broadcast, then
/// `ncclCommInitRank(size, id, rank)` on every rank. When `make` fails on the root, every
/// participant gets an error (the root's says why), so none waits for the others.
pub fn share_bootstrap_id<const N: usize>(
    engine: &dyn CollectiveEngine,
    root: usize,
    make: impl FnOnce() -> Result<[u8; N], String>,
) -> Result<[u8; N], CollectiveError> {
    // Byte 0: whether the root made an id; then the id.
    let mut message = vec![0u8; N + 1];
    let mut failure = None;
    if engine.rank() == root {
        match make() {
            Ok(id) => {
                message[0] = 1;
                message[1..].copy_from_slice(&id);
            }
            Err(e) => failure = Some(e),
        }
    }
    engine.broadcast(&mut message, root)?;
    if message[0] != 1 {
        let reason = failure.unwrap_or_else(|| "see its log".into());
        return Err(CollectiveError::Unavailable {
            engine: "bootstrap".into(),
            reason: format!("rank {root} could not create the shared id: {reason}"),
        });
    }
    let mut id = [0u8; N];
    id.copy_from_slice(&message[1..]);
    Ok(id)
}

/// The collective of a single process: every operation is the identity.
#[derive(Debug, Default)]
pub struct SingleProcess {
    wire: std::sync::atomic::AtomicU8,
}

impl Collective for SingleProcess {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_reduce(&self, _data: &mut [f32], _op: ReduceOp) -> Result<(), BackendError> {
        Ok(())
    }
}

impl CollectiveEngine for SingleProcess {
    fn local_rank(&self) -> usize {
        0
    }
    fn local_size(&self) -> usize {
        1
    }
    fn host(&self) -> String {
        "this process".into()
    }
    fn all_reduce_as(
        &self,
        _: &mut [f32],
        _: ReduceOp,
        _: WireFormat,
    ) -> Result<(), CollectiveError> {
        Ok(())
    }
    fn broadcast(&self, _data: &mut [u8], root: usize) -> Result<(), CollectiveError> {
        if root != 0 {
            return Err(CollectiveError::Invalid(format!(
                "broadcast from rank {root} in a job of 1"
            )));
        }
        Ok(())
    }
    fn gradient_wire(&self) -> WireFormat {
        WireFormat::from_u8(self.wire.load(std::sync::atomic::Ordering::Relaxed))
    }
    fn set_gradient_wire(&self, wire: WireFormat) {
        self.wire
            .store(wire as u8, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_bootstrap_id_made_on_the_root_reaches_every_participant_or_its_failure_does() {
        let members = LocalGroup::new(3, Duration::from_secs(10));
        let threads: Vec<_> = members
            .into_iter()
            .map(|m| {
                std::thread::spawn(move || {
                    let m: Arc<dyn CollectiveEngine> = m;
                    let ok = share_bootstrap_id(m.as_ref(), 1, || Ok([7u8; 128]));
                    let failed =
                        share_bootstrap_id(m.as_ref(), 0, || Err::<[u8; 4], _>("no".into()));
                    (ok, failed)
                })
            })
            .collect();
        for (rank, t) in threads.into_iter().enumerate() {
            let (ok, failed) = t.join().expect("member");
            assert_eq!(ok.expect("bootstrap"), [7u8; 128]);
            let e = failed.expect_err("the root failed").to_string();
            let why = if rank == 0 { "no" } else { "see its log" };
            assert!(
                e.contains(&format!("rank 0 could not create the shared id: {why}")),
                "{e}"
            );
        }
    }

    #[test]
    fn a_single_process_reduces_nothing_and_refuses_other_roots() {
        let one = SingleProcess::default();
        let mut x = [1.5f32, -2.0];
        one.all_reduce_as(&mut x, ReduceOp::Mean, WireFormat::Bf16)
            .expect("identity");
        assert_eq!(x, [1.5, -2.0]);
        assert!(one.broadcast(&mut [0u8; 4], 1).is_err());
    }
}
