//! The heartbeat thread of an MPI rank: on its own communicator, it sends every peer a small
//! message (`[goodbye, progress, 0]` as u64) each interval and records the peers' messages in
//! the [`PeerWatch`], whatever the rank's main thread is doing (computing, or waiting in a
//! collective). At shutdown it says goodbye and, on a clean shutdown, waits for every live
//! peer's goodbye, so that no message is pending when MPI is finalized.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::raw::{Comm, Request, ipoint};
use crate::backend::collective::CollectiveError;
use crate::backend::collective::watch::{Goodbye, PeerWatch};

const TAG: i32 = 7;
const WORDS: usize = 3;
/// How often the thread looks at its requests (heartbeats go out every `interval`).
const POLL: Duration = Duration::from_millis(5);

/// The running heartbeat thread and how to stop it.
pub(crate) struct Heartbeat {
    stop: Arc<AtomicU8>,
    thread: JoinHandle<Result<bool, CollectiveError>>,
}

/// One peer's message slots. Boxed so the buffers do not move while MPI holds them.
struct Link {
    peer: usize,
    send_buf: Box<[u64; WORDS]>,
    send: Option<Request>,
    recv_buf: Box<[u64; WORDS]>,
    recv: Option<Request>,
    said_goodbye: bool,
}

impl Heartbeat {
    /// Starts the thread of `rank` among `size` on `comm`.
    pub(crate) fn start(
        comm: Comm,
        watch: Arc<PeerWatch>,
        rank: usize,
        size: usize,
        interval: Duration,
        peer_timeout: Duration,
    ) -> Result<Heartbeat, CollectiveError> {
        let stop = Arc::new(AtomicU8::new(Goodbye::None as u8));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("towerpack-heartbeat-{rank}"))
            .spawn(move || run(comm, &watch, rank, size, interval, peer_timeout, &flag))
            .map_err(|e| CollectiveError::Unavailable {
                engine: "mpi".into(),
                reason: format!("cannot start the heartbeat thread: {e}"),
            })?;
        Ok(Heartbeat { stop, thread })
    }

    /// Stops the thread: says `goodbye` to every peer; a clean goodbye also waits for every
    /// live peer's. Returns whether every peer said a clean goodbye and no message is pending
    /// (only then may MPI be finalized).
    pub(crate) fn stop(self, goodbye: Goodbye) -> bool {
        self.stop.store(goodbye as u8, Ordering::Relaxed);
        match self.thread.join() {
            Ok(Ok(clean)) => clean,
            Ok(Err(e)) => {
                log::error!(target: "towerpack", "MPI heartbeat thread: {e}");
                false
            }
            Err(_) => false,
        }
    }
}

fn run(
    comm: Comm,
    watch: &PeerWatch,
    rank: usize,
    size: usize,
    interval: Duration,
    peer_timeout: Duration,
    stop: &AtomicU8,
) -> Result<bool, CollectiveError> {
    let mut links: Vec<Link> = (0..size)
        .filter(|&p| p != rank)
        .map(|peer| Link {
            peer,
            send_buf: Box::new([0; WORDS]),
            send: None,
            recv_buf: Box::new([0; WORDS]),
            recv: None,
            said_goodbye: false,
        })
        .collect();
    let result = drive(comm, watch, &mut links, interval, peer_timeout, stop);
    if !matches!(result, Ok(true)) {
        // Requests may still be pending and own their buffers: leak them rather than free
        // memory MPI may write to.
        std::mem::forget(links);
    }
    result
}

fn drive(
    comm: Comm,
    watch: &PeerWatch,
    links: &mut [Link],
    interval: Duration,
    peer_timeout: Duration,
    stop: &AtomicU8,
) -> Result<bool, CollectiveError> {
    for l in links.iter_mut() {
        // SAFETY: the boxed buffer lives in `links` until the request completes; if it never
        // does, `run` leaks it.
        l.recv = Some(unsafe { ipoint(comm, l.recv_buf.as_mut_ptr(), WORDS, l.peer, TAG, false)? });
    }
    let mut next_beat = Instant::now();
    let mut stopping_since: Option<Instant> = None;
    loop {
        for l in links.iter_mut() {
            receive(comm, watch, l)?;
        }
        let goodbye = Goodbye::from_u64(u64::from(stop.load(Ordering::Relaxed)));
        let now = Instant::now();
        if goodbye != Goodbye::None {
            stopping_since.get_or_insert(now);
        }
        let beat = now >= next_beat;
        if beat {
            next_beat = now + interval;
        }
        for l in links.iter_mut() {
            if let Some(r) = &mut l.send
                && r.test("MPI_Test (heartbeat send)")?
            {
                l.send = None;
            }
            let due = if goodbye != Goodbye::None {
                !l.said_goodbye
            } else {
                beat
            };
            if l.send.is_none() && due {
                l.send_buf[0] = goodbye as u64;
                l.send_buf[1] = watch.own_progress();
                l.said_goodbye = goodbye != Goodbye::None;
                // SAFETY: as for the receive buffers.
                l.send = Some(unsafe {
                    ipoint(comm, l.send_buf.as_mut_ptr(), WORDS, l.peer, TAG, true)?
                });
            }
        }
        if let Some(since) = stopping_since {
            let sent = links.iter().all(|l| l.said_goodbye && l.send.is_none());
            let heard = links.iter().all(|l| l.recv.is_none());
            if sent && heard {
                return Ok(links
                    .iter()
                    .all(|l| watch.goodbye(l.peer) == Goodbye::Clean));
            }
            // A failed rank only tries to tell the others; a clean one waits for live peers.
            let give_up = if goodbye == Goodbye::Failed {
                since.elapsed() > interval * 4
            } else {
                watch.verdict(peer_timeout).is_some_and(|v| {
                    matches!(v, crate::backend::collective::watch::Verdict::Lost { .. })
                })
            };
            if give_up {
                return Ok(false);
            }
        }
        std::thread::sleep(POLL);
    }
}

/// Tests `l`'s receive; records a completed heartbeat and re-posts unless it was a goodbye.
fn receive(comm: Comm, watch: &PeerWatch, l: &mut Link) -> Result<(), CollectiveError> {
    let Some(r) = &mut l.recv else {
        return Ok(());
    };
    if !r.test("MPI_Test (heartbeat receive)")? {
        return Ok(());
    }
    l.recv = None;
    let goodbye = Goodbye::from_u64(l.recv_buf[0]);
    watch.heard(l.peer, l.recv_buf[1], goodbye);
    if goodbye == Goodbye::None {
        // SAFETY: as in `run`.
        l.recv = Some(unsafe { ipoint(comm, l.recv_buf.as_mut_ptr(), WORDS, l.peer, TAG, false)? });
    }
    Ok(())
}
