//! [`MpiEngine`]: the collective engine of CPU ranks, one process per rank, over Open MPI (or
//! any MPI) through rsmpi (feature `mpi`).
//!
//! Every all-reduce and broadcast is nonblocking (`MPI_Iallreduce`, `MPI_Ibcast`) on a
//! duplicate of the world communicator, tested in a loop that also watches the peers: a
//! heartbeat thread ([`heartbeat`]) exchanges small messages with every peer on a second
//! communicator. A peer silent for longer than [`MpiOptions::peer_timeout`] is *lost*: the
//! waiting operation fails with [`CollectiveError::PeerLost`] naming it (its rank and host),
//! instead of hanging as a blocking MPI call would. After a failure the engine refuses further
//! work, leaks the buffers the transport may still use, and skips `MPI_Finalize` (which would
//! wait for the lost peer); the process then exits with its error, and the MPI launcher ends
//! the remaining ranks. Data go through engine-owned staging buffers for that reason.

mod heartbeat;
mod raw;

use std::os::raw::c_void;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use self::heartbeat::Heartbeat;
use self::raw::{Comm, Elem, Request, UserOp};
use super::watch::{Goodbye, PeerWatch, Verdict};
use super::wire::{WireFormat, from_bf16_bits, to_bf16_bits};
use super::{CollectiveEngine, CollectiveError, finish_mean};
use crate::backend::{BackendError, Collective};
use crate::ir::ReduceOp;

/// Largest element count of one MPI call (counts are C ints); longer buffers go in pieces.
const MAX_CHUNK: usize = 1 << 28;
/// How long a peer that said goodbye may still complete the operation being waited for.
const GOODBYE_GRACE: Duration = Duration::from_secs(2);

/// Timeouts of the MPI engine.
#[derive(Clone, Debug, PartialEq)]
pub struct MpiOptions {
    /// How often each rank tells every peer it is alive.
    pub heartbeat_interval: Duration,
    /// A peer silent this long is lost, and operations waiting for it fail.
    pub peer_timeout: Duration,
    /// An operation waiting this long fails although every peer is alive (a rank stuck
    /// outside the collective). `None`: wait as long as every peer is alive — the chief may
    /// legitimately run a long validation while the others wait at the next all-reduce.
    pub collective_timeout: Option<Duration>,
    /// The wire format of gradient all-reduces.
    pub gradient_wire: WireFormat,
}

impl Default for MpiOptions {
    fn default() -> MpiOptions {
        MpiOptions {
            heartbeat_interval: Duration::from_millis(500),
            peer_timeout: Duration::from_secs(20),
            collective_timeout: None,
            gradient_wire: WireFormat::F32,
        }
    }
}

/// Environment variables overriding [`MpiOptions`] (seconds, decimals allowed).
pub const ENV_HEARTBEAT: &str = "TOWERPACK_MPI_HEARTBEAT_SECS";
/// See [`ENV_HEARTBEAT`].
pub const ENV_PEER_TIMEOUT: &str = "TOWERPACK_MPI_PEER_TIMEOUT_SECS";
/// See [`ENV_HEARTBEAT`].
pub const ENV_COLLECTIVE_TIMEOUT: &str = "TOWERPACK_MPI_COLLECTIVE_TIMEOUT_SECS";

impl MpiOptions {
    /// The defaults, overridden by the `TOWERPACK_MPI_*_SECS` environment variables (so a
    /// launcher can set them for every rank: `mpirun -x TOWERPACK_MPI_PEER_TIMEOUT_SECS=60`).
    pub fn from_env() -> Result<MpiOptions, CollectiveError> {
        let secs = |name: &str| -> Result<Option<Duration>, CollectiveError> {
            let Ok(text) = std::env::var(name) else {
                return Ok(None);
            };
            match text.trim().parse::<f64>() {
                Ok(s) if s.is_finite() && s > 0.0 => Ok(Some(Duration::from_secs_f64(s))),
                _ => Err(CollectiveError::Invalid(format!(
                    "environment variable {name}={text:?} is not a positive number of seconds"
                ))),
            }
        };
        let mut o = MpiOptions::default();
        if let Some(d) = secs(ENV_HEARTBEAT)? {
            o.heartbeat_interval = d;
        }
        if let Some(d) = secs(ENV_PEER_TIMEOUT)? {
            o.peer_timeout = d;
        }
        if let Some(d) = secs(ENV_COLLECTIVE_TIMEOUT)? {
            o.collective_timeout = Some(d);
        }
        if o.peer_timeout <= o.heartbeat_interval * 2 {
            return Err(CollectiveError::Invalid(format!(
                "the peer timeout ({:?}) must exceed two heartbeat intervals ({:?})",
                o.peer_timeout, o.heartbeat_interval
            )));
        }
        Ok(o)
    }
}

/// Buffers the transport reads and writes, owned by the engine so that an abandoned operation
/// never touches freed memory.
#[derive(Default)]
struct Staging {
    send_f32: Vec<f32>,
    recv_f32: Vec<f32>,
    send_u16: Vec<u16>,
    recv_u16: Vec<u16>,
    bytes: Vec<u8>,
    /// Operations started so far.
    started: u64,
}

/// One MPI rank's collective engine. Create it once per process with [`MpiEngine::init`];
/// MPI is finalized when the last reference is dropped (on the main thread, before `main`
/// returns).
pub struct MpiEngine {
    universe: Mutex<Option<mpi::environment::Universe>>,
    data: Comm,
    beats: Comm,
    rank: usize,
    size: usize,
    local_rank: usize,
    local_size: usize,
    hosts: Vec<String>,
    options: MpiOptions,
    watch: Arc<PeerWatch>,
    heartbeat: Mutex<Option<Heartbeat>>,
    staging: Mutex<Staging>,
    failed: Mutex<Option<CollectiveError>>,
    wire: AtomicU8,
    bf16_sum: Mutex<Option<UserOp>>,
}

impl MpiEngine {
    /// Initializes MPI (`MPI_THREAD_MULTIPLE`), learns this rank's place in the job and starts
    /// the heartbeat thread. Errors when MPI is already initialized in this process or lacks
    /// thread support.
    pub fn init(options: MpiOptions) -> Result<Arc<MpiEngine>, CollectiveError> {
        let unavailable = |reason: String| CollectiveError::Unavailable {
            engine: "mpi".into(),
            reason,
        };
        let (universe, threading) = mpi::initialize_with_threading(mpi::Threading::Multiple)
            .ok_or_else(|| {
                unavailable(
                    "MPI is already initialized in this process (one engine per process)".into(),
                )
            })?;
        if threading != mpi::Threading::Multiple {
            return Err(unavailable(format!(
                "the MPI library provides {threading:?} thread support; the heartbeat watchdog \
                 needs MPI_THREAD_MULTIPLE"
            )));
        }
        let world = Comm::world();
        let (rank, size) = world.rank_and_size()?;
        let (local_rank, local_size) = world.local_rank_and_size()?;
        let host = format!("{} pid {}", raw::processor_name(), std::process::id());
        let hosts = world.all_gather_strings(&host, size, 256)?;
        let data = world.dup_returning_errors()?;
        let beats = world.dup_returning_errors()?;
        let bf16_sum = UserOp::commutative(Some(raw::bf16_sum))?;
        let watch = Arc::new(PeerWatch::new(size, rank));
        let heartbeat = Heartbeat::start(
            beats,
            watch.clone(),
            rank,
            size,
            options.heartbeat_interval,
            options.peer_timeout,
        )?;
        log::info!(
            target: "towerpack",
            "MPI rank {rank} of {size} (local rank {local_rank} of {local_size}) on {host}"
        );
        Ok(Arc::new(MpiEngine {
            universe: Mutex::new(Some(universe)),
            data,
            beats,
            rank,
            size,
            local_rank,
            local_size,
            hosts,
            wire: AtomicU8::new(options.gradient_wire as u8),
            options,
            watch,
            heartbeat: Mutex::new(Some(heartbeat)),
            staging: Mutex::new(Staging::default()),
            failed: Mutex::new(None),
            bf16_sum: Mutex::new(Some(bf16_sum)),
        }))
    }

    /// [`MpiEngine::init`] with [`MpiOptions::from_env`].
    pub fn init_from_env() -> Result<Arc<MpiEngine>, CollectiveError> {
        MpiEngine::init(MpiOptions::from_env()?)
    }

    /// The options the engine runs with.
    pub fn options(&self) -> &MpiOptions {
        &self.options
    }

    /// `host pid N` of every rank, in rank order.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
        // A poisoned lock means a thread panicked inside an operation; the engine's own state
        // stays valid (the failure, if any, is recorded separately).
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The staging buffers for a new operation, or the earlier failure.
    fn begin(&self) -> Result<MutexGuard<'_, Staging>, CollectiveError> {
        if let Some(e) = Self::lock(&self.failed).as_ref() {
            return Err(CollectiveError::Failed {
                first: e.to_string(),
            });
        }
        Ok(Self::lock(&self.staging))
    }

    /// Records `e` as the engine's failure and leaks the staging buffers (a pending operation
    /// may still use them). Returns `e`.
    fn fail(&self, staging: &mut Staging, e: CollectiveError) -> CollectiveError {
        std::mem::forget(std::mem::take(staging));
        log::error!(target: "towerpack", "MPI rank {}: {e}", self.rank);
        Self::lock(&self.failed).get_or_insert(e.clone());
        e
    }

    /// Waits for `req`, watching the peers. `during` describes the operation for errors.
    fn wait(&self, mut req: Request, started: u64, during: &str) -> Result<(), CollectiveError> {
        let began = Instant::now();
        let mut left_at: Option<Instant> = None;
        let mut polls: u32 = 0;
        loop {
            if req.test("MPI_Test")? {
                return Ok(());
            }
            match self.watch.verdict(self.options.peer_timeout) {
                Some(Verdict::Lost { rank, silent }) => {
                    return Err(CollectiveError::PeerLost {
                        rank,
                        host: self.hosts[rank].clone(),
                        silent_secs: silent.as_secs_f64(),
                        during: during.to_string(),
                    });
                }
                // The peer may have finished its part of this very operation just before
                // leaving: give the transport a moment to deliver it.
                Some(Verdict::Left { rank })
                    if left_at.get_or_insert_with(Instant::now).elapsed() > GOODBYE_GRACE =>
                {
                    return Err(if self.watch.goodbye(rank) == Goodbye::Failed {
                        CollectiveError::PeerFailed {
                            rank,
                            this: self.rank,
                        }
                    } else {
                        CollectiveError::PeerLeft {
                            rank,
                            host: self.hosts[rank].clone(),
                            during: during.to_string(),
                        }
                    });
                }
                _ => {}
            }
            if let Some(limit) = self.options.collective_timeout
                && began.elapsed() > limit
            {
                return Err(CollectiveError::Timeout {
                    during: during.to_string(),
                    waited_secs: began.elapsed().as_secs_f64(),
                    lagging: self.watch.lagging(started),
                });
            }
            // Nonblocking collectives advance only inside MPI calls: poll without sleeping
            // while the operation may be moving, and back off once the wait is long (a peer
            // busy elsewhere, e.g. the chief validating).
            polls = polls.saturating_add(1);
            if !polls.is_multiple_of(64) || began.elapsed() < Duration::from_millis(20) {
                std::hint::spin_loop();
            } else if began.elapsed() < Duration::from_secs(1) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    /// Counts a new operation (reported in heartbeats) and returns its number.
    fn start(&self, staging: &mut Staging) -> u64 {
        staging.started += 1;
        self.watch.set_own_progress(staging.started);
        staging.started
    }

    fn all_reduce_chunk(
        &self,
        s: &mut Staging,
        data: &mut [f32],
        op: ReduceOp,
        bf16: bool,
    ) -> Result<(), CollectiveError> {
        let n = data.len();
        let started = self.start(s);
        let during = format!(
            "all-reduce #{started} ({n} elements{})",
            if bf16 { " as bf16" } else { "" }
        );
        let req = if bf16 {
            s.send_u16.resize(n, 0);
            s.recv_u16.resize(n, 0);
            to_bf16_bits(data, &mut s.send_u16);
            let guard = Self::lock(&self.bf16_sum);
            let op = guard
                .as_ref()
                .map(|o| o.0)
                .ok_or_else(|| CollectiveError::Invalid("the engine is shutting down".into()))?;
            // SAFETY: both staging buffers hold `n` elements and belong to the engine; they are
            // neither touched nor freed until the request completes (`fail` leaks them).
            unsafe {
                raw::iallreduce(
                    self.data,
                    s.send_u16.as_ptr().cast::<c_void>(),
                    s.recv_u16.as_mut_ptr().cast::<c_void>(),
                    n,
                    Elem::U16,
                    op,
                )?
            }
        } else {
            s.send_f32.clear();
            s.send_f32.extend_from_slice(data);
            s.recv_f32.resize(n, 0.0);
            // SAFETY: as above.
            unsafe {
                raw::iallreduce(
                    self.data,
                    s.send_f32.as_ptr().cast::<c_void>(),
                    s.recv_f32.as_mut_ptr().cast::<c_void>(),
                    n,
                    Elem::F32,
                    raw::predefined_op(op),
                )?
            }
        };
        self.wait(req, started, &during)?;
        if bf16 {
            from_bf16_bits(&s.recv_u16[..n], data);
            finish_mean(data, op, self.size);
        } else if op == ReduceOp::Mean {
            // The mean's scaling joins the copy out of the staging buffer: one pass.
            let inv = 1.0 / self.size as f32;
            for (d, r) in data.iter_mut().zip(&s.recv_f32[..n]) {
                *d = r * inv;
            }
        } else {
            data.copy_from_slice(&s.recv_f32[..n]);
        }
        Ok(())
    }
}

impl Collective for MpiEngine {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn all_reduce(&self, data: &mut [f32], op: ReduceOp) -> Result<(), BackendError> {
        Ok(self.all_reduce_as(data, op, self.gradient_wire())?)
    }
}

impl CollectiveEngine for MpiEngine {
    fn local_rank(&self) -> usize {
        self.local_rank
    }
    fn local_size(&self) -> usize {
        self.local_size
    }
    fn host(&self) -> String {
        self.hosts[self.rank].clone()
    }

    fn all_reduce_as(
        &self,
        data: &mut [f32],
        op: ReduceOp,
        wire: WireFormat,
    ) -> Result<(), CollectiveError> {
        let bf16 = wire == WireFormat::Bf16 && matches!(op, ReduceOp::Sum | ReduceOp::Mean);
        let mut s = self.begin()?;
        for chunk in data.chunks_mut(MAX_CHUNK) {
            if let Err(e) = self.all_reduce_chunk(&mut s, chunk, op, bf16) {
                return Err(self.fail(&mut s, e));
            }
        }
        Ok(())
    }

    fn broadcast(&self, data: &mut [u8], root: usize) -> Result<(), CollectiveError> {
        if root >= self.size {
            return Err(CollectiveError::Invalid(format!(
                "broadcast from rank {root} in a job of {}",
                self.size
            )));
        }
        let mut s = self.begin()?;
        for chunk in data.chunks_mut(MAX_CHUNK) {
            let started = self.start(&mut s);
            let during = format!(
                "broadcast #{started} ({} bytes from rank {root})",
                chunk.len()
            );
            s.bytes.clear();
            s.bytes.extend_from_slice(chunk);
            // SAFETY: the staging buffer holds the chunk's bytes and belongs to the engine; it
            // is neither touched nor freed until the request completes (`fail` leaks it).
            let result = unsafe {
                raw::ibcast(
                    self.data,
                    s.bytes.as_mut_ptr().cast::<c_void>(),
                    chunk.len(),
                    Elem::U8,
                    root,
                )
            }
            .and_then(|req| self.wait(req, started, &during));
            if let Err(e) = result {
                return Err(self.fail(&mut s, e));
            }
            chunk.copy_from_slice(&s.bytes);
        }
        Ok(())
    }

    fn gradient_wire(&self) -> WireFormat {
        WireFormat::from_u8(self.wire.load(Ordering::Relaxed))
    }

    fn set_gradient_wire(&self, wire: WireFormat) {
        self.wire.store(wire as u8, Ordering::Relaxed);
    }
}

impl Drop for MpiEngine {
    fn drop(&mut self) {
        let failed = Self::lock(&self.failed).is_some();
        let goodbye = if failed {
            Goodbye::Failed
        } else {
            Goodbye::Clean
        };
        let clean = Self::lock(&self.heartbeat)
            .take()
            .is_some_and(|h| h.stop(goodbye));
        let universe = Self::lock(&self.universe).take();
        if clean && !failed {
            if let Some(op) = Self::lock(&self.bf16_sum).take() {
                op.free();
            }
            for comm in [self.data, self.beats] {
                if let Err(e) = comm.free() {
                    log::warn!(target: "towerpack", "MPI rank {}: {e}", self.rank);
                }
            }
            drop(universe); // MPI_Finalize
        } else {
            // Finalizing waits for every rank, lost ones included: skip it. The process exits
            // with its own error, and the launcher ends the job.
            log::error!(
                target: "towerpack",
                "MPI rank {}: not finalizing MPI after a failure of the job",
                self.rank
            );
            std::mem::forget(universe);
        }
    }
}
