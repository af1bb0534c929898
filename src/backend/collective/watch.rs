//! [`PeerWatch`]: what a rank knows of its peers' liveness, shared between the heartbeat thread
//! (which records every heartbeat) and the thread waiting on a collective (which asks for a
//! verdict). A peer is *lost* when it has been silent longer than the timeout and has not said
//! goodbye; it has *left* when it said goodbye.
#![cfg_attr(not(feature = "mpi"), allow(dead_code))]

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How a peer ended its part of the job, as its last heartbeat says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Goodbye {
    /// Still running.
    None = 0,
    /// Shut its engine down cleanly.
    Clean = 1,
    /// Shut down after a failure.
    Failed = 2,
}

impl Goodbye {
    pub(crate) fn from_u64(v: u64) -> Goodbye {
        match v {
            1 => Goodbye::Clean,
            2 => Goodbye::Failed,
            _ => Goodbye::None,
        }
    }
}

struct Peer {
    /// Milliseconds since the watch began at the last heartbeat.
    last_heard_ms: AtomicU64,
    /// Collectives the peer had completed at its last heartbeat.
    progress: AtomicU64,
    goodbye: AtomicU8,
}

/// A verdict on the peers of a waiting rank.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Verdict {
    Lost { rank: usize, silent: Duration },
    Left { rank: usize },
}

/// Liveness and progress of every rank of the job, as seen by one rank.
pub(crate) struct PeerWatch {
    began: Instant,
    rank: usize,
    peers: Vec<Peer>,
}

impl PeerWatch {
    /// A watch of `size` ranks held by `rank`; every peer counts as just heard.
    pub(crate) fn new(size: usize, rank: usize) -> PeerWatch {
        PeerWatch {
            began: Instant::now(),
            rank,
            peers: (0..size)
                .map(|_| Peer {
                    last_heard_ms: AtomicU64::new(0),
                    progress: AtomicU64::new(0),
                    goodbye: AtomicU8::new(Goodbye::None as u8),
                })
                .collect(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.began.elapsed().as_millis() as u64
    }

    /// Records a heartbeat of `peer`.
    pub(crate) fn heard(&self, peer: usize, progress: u64, goodbye: Goodbye) {
        self.heard_at(peer, progress, goodbye, self.now_ms());
    }

    fn heard_at(&self, peer: usize, progress: u64, goodbye: Goodbye, now_ms: u64) {
        let p = &self.peers[peer];
        p.last_heard_ms.fetch_max(now_ms, Ordering::Relaxed);
        p.progress.fetch_max(progress, Ordering::Relaxed);
        if goodbye != Goodbye::None {
            p.goodbye.store(goodbye as u8, Ordering::Relaxed);
        }
    }

    /// This rank's own progress, sent in its heartbeats.
    pub(crate) fn set_own_progress(&self, progress: u64) {
        self.peers[self.rank]
            .progress
            .store(progress, Ordering::Relaxed);
    }

    pub(crate) fn own_progress(&self) -> u64 {
        self.peers[self.rank].progress.load(Ordering::Relaxed)
    }

    /// How `peer` ended, if it did.
    pub(crate) fn goodbye(&self, peer: usize) -> Goodbye {
        Goodbye::from_u64(u64::from(self.peers[peer].goodbye.load(Ordering::Relaxed)))
    }

    /// The first peer lost (silent longer than `timeout`) or, failing that, the first that left.
    pub(crate) fn verdict(&self, timeout: Duration) -> Option<Verdict> {
        self.verdict_at(timeout, self.now_ms())
    }

    fn verdict_at(&self, timeout: Duration, now_ms: u64) -> Option<Verdict> {
        let others = || (0..self.peers.len()).filter(|&r| r != self.rank);
        let lost = others().find_map(|r| {
            let p = &self.peers[r];
            let silent = now_ms.saturating_sub(p.last_heard_ms.load(Ordering::Relaxed));
            (self.goodbye(r) == Goodbye::None && silent > timeout.as_millis() as u64).then_some(
                Verdict::Lost {
                    rank: r,
                    silent: Duration::from_millis(silent),
                },
            )
        });
        lost.or_else(|| {
            others()
                .find(|&r| self.goodbye(r) != Goodbye::None)
                .map(|rank| Verdict::Left { rank })
        })
    }

    /// Peers whose last reported progress is below `progress` (they have not reached the
    /// collective numbered `progress`).
    pub(crate) fn lagging(&self, progress: u64) -> Vec<usize> {
        (0..self.peers.len())
            .filter(|&r| {
                r != self.rank && self.peers[r].progress.load(Ordering::Relaxed) < progress
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_peer_is_lost_after_the_timeout_and_a_goodbye_is_not_a_loss() {
        let w = PeerWatch::new(3, 0);
        let t = Duration::from_millis(1000);
        w.heard_at(1, 5, Goodbye::None, 400);
        w.heard_at(2, 4, Goodbye::None, 900);
        assert_eq!(w.verdict_at(t, 1300), None);
        assert_eq!(
            w.verdict_at(t, 1500),
            Some(Verdict::Lost {
                rank: 1,
                silent: Duration::from_millis(1100)
            })
        );
        w.heard_at(1, 6, Goodbye::Clean, 1500);
        assert_eq!(w.verdict_at(t, 1600), Some(Verdict::Left { rank: 1 }));
        // Rank 2 silent past the timeout outranks rank 1's goodbye.
        assert_eq!(
            w.verdict_at(t, 2000),
            Some(Verdict::Lost {
                rank: 2,
                silent: Duration::from_millis(1100)
            })
        );
        assert_eq!(w.lagging(5), vec![2]);
        // Heartbeats arriving out of order never move time or progress backwards.
        w.heard_at(2, 1, Goodbye::None, 100);
        assert_eq!(w.lagging(5), vec![2]);
        assert_eq!(w.peers[2].last_heard_ms.load(Ordering::Relaxed), 900);
    }
}
