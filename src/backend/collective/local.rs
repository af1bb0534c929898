//! [`LocalGroup`]: the ranks of a job as threads of one process. Every operation is an
//! exchange (each member deposits its bytes, all receive everyone's) reduced in rank order, so
//! every member gets bit-identical results. A member that is dropped (its thread ended or
//! panicked) makes the others' pending and later operations fail naming it, and a wait longer
//! than the group's timeout fails naming the members that have not arrived.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::wire::{WireFormat, add_bf16_bits, from_bf16_bits, to_bf16_bits};
use super::{CollectiveEngine, CollectiveError, finish_mean};
use crate::backend::{BackendError, Collective};
use crate::ir::ReduceOp;

/// One member of an in-process group of ranks.
pub struct LocalGroup {
    shared: Arc<Shared>,
    rank: usize,
    wire: AtomicU8,
}

struct Shared {
    size: usize,
    timeout: Duration,
    state: Mutex<Round>,
    changed: Condvar,
}

#[derive(Default)]
struct Round {
    /// Completed exchanges.
    generation: u64,
    /// Deposits of the exchange in progress, by rank.
    slots: Vec<Option<Vec<u8>>>,
    /// The deposits of the last completed exchange.
    last: Arc<Vec<Vec<u8>>>,
    /// Members dropped so far.
    left: Vec<bool>,
}

impl LocalGroup {
    /// A group of `size` members; each operation fails after waiting `timeout` for the others.
    /// Give member `r` to the thread playing rank `r`.
    pub fn new(size: usize, timeout: Duration) -> Vec<Arc<LocalGroup>> {
        let shared = Arc::new(Shared {
            size,
            timeout,
            state: Mutex::new(Round {
                slots: vec![None; size],
                left: vec![false; size],
                ..Round::default()
            }),
            changed: Condvar::new(),
        });
        (0..size)
            .map(|rank| {
                Arc::new(LocalGroup {
                    shared: shared.clone(),
                    rank,
                    wire: AtomicU8::new(0),
                })
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, Round> {
        // A poisoned lock means a member panicked while holding it; the round data are plain
        // buffers that stay consistent, and the panicked member counts as left when dropped.
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Deposits `mine` and returns every member's deposit, in rank order.
    fn exchange(&self, mine: Vec<u8>, during: &str) -> Result<Arc<Vec<Vec<u8>>>, CollectiveError> {
        let size = self.shared.size;
        let mut round = self.lock();
        let generation = round.generation;
        round.slots[self.rank] = Some(mine);
        if round.slots.iter().all(Option::is_some) {
            let all: Vec<Vec<u8>> = round.slots.iter_mut().filter_map(Option::take).collect();
            round.last = Arc::new(all);
            round.generation += 1;
            self.shared.changed.notify_all();
            return Ok(round.last.clone());
        }
        let began = Instant::now();
        loop {
            if round.generation != generation {
                return Ok(round.last.clone());
            }
            if let Some(rank) = (0..size).find(|&r| round.left[r]) {
                round.slots[self.rank] = None;
                return Err(CollectiveError::PeerLeft {
                    rank,
                    host: "this process".into(),
                    during: during.to_string(),
                });
            }
            let waited = began.elapsed();
            if waited >= self.shared.timeout {
                let lagging = (0..size).filter(|&r| round.slots[r].is_none()).collect();
                round.slots[self.rank] = None;
                return Err(CollectiveError::Timeout {
                    during: during.to_string(),
                    waited_secs: waited.as_secs_f64(),
                    lagging,
                });
            }
            round = self
                .shared
                .changed
                .wait_timeout(round, self.shared.timeout - waited)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
    }
}

impl Drop for LocalGroup {
    fn drop(&mut self) {
        self.lock().left[self.rank] = true;
        self.shared.changed.notify_all();
    }
}

impl Collective for LocalGroup {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.shared.size
    }
    fn all_reduce(&self, data: &mut [f32], op: ReduceOp) -> Result<(), BackendError> {
        Ok(self.all_reduce_as(data, op, self.gradient_wire())?)
    }
}

impl CollectiveEngine for LocalGroup {
    fn local_rank(&self) -> usize {
        self.rank
    }
    fn local_size(&self) -> usize {
        self.shared.size
    }
    fn host(&self) -> String {
        "this process".into()
    }

    fn all_reduce_as(
        &self,
        data: &mut [f32],
        op: ReduceOp,
        wire: WireFormat,
    ) -> Result<(), CollectiveError> {
        let during = format!("an all-reduce of {} elements", data.len());
        let bf16 = wire == WireFormat::Bf16 && matches!(op, ReduceOp::Sum | ReduceOp::Mean);
        let mine: Vec<u8> = if bf16 {
            let mut bits = vec![0u16; data.len()];
            to_bf16_bits(data, &mut bits);
            bits.iter().flat_map(|b| b.to_le_bytes()).collect()
        } else {
            data.iter().flat_map(|x| x.to_le_bytes()).collect()
        };
        let all = self.exchange(mine, &during)?;
        if all.iter().any(|d| d.len() != all[0].len()) {
            return Err(CollectiveError::Invalid(format!(
                "{during}: the members passed {:?} bytes",
                all.iter().map(Vec::len).collect::<Vec<_>>()
            )));
        }
        if bf16 {
            let bits = |d: &[u8]| -> Vec<u16> {
                d.chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect()
            };
            let mut acc = bits(&all[0]);
            for d in &all[1..] {
                add_bf16_bits(&mut acc, &bits(d));
            }
            from_bf16_bits(&acc, data);
        } else {
            for (i, x) in data.iter_mut().enumerate() {
                let at = |d: &Vec<u8>| {
                    f32::from_le_bytes([d[4 * i], d[4 * i + 1], d[4 * i + 2], d[4 * i + 3]])
                };
                *x = all[1..].iter().fold(at(&all[0]), |acc, d| match op {
                    ReduceOp::Sum | ReduceOp::Mean => acc + at(d),
                    ReduceOp::Max => acc.max(at(d)),
                    ReduceOp::Min => acc.min(at(d)),
                });
            }
        }
        finish_mean(data, op, self.shared.size);
        Ok(())
    }

    fn broadcast(&self, data: &mut [u8], root: usize) -> Result<(), CollectiveError> {
        if root >= self.shared.size {
            return Err(CollectiveError::Invalid(format!(
                "broadcast from rank {root} in a group of {}",
                self.shared.size
            )));
        }
        let during = format!("a broadcast of {} bytes from rank {root}", data.len());
        let mine = if self.rank == root {
            data.to_vec()
        } else {
            Vec::new()
        };
        let all = self.exchange(mine, &during)?;
        if all[root].len() != data.len() {
            return Err(CollectiveError::Invalid(format!(
                "{during}: rank {root} sent {} bytes",
                all[root].len()
            )));
        }
        data.copy_from_slice(&all[root]);
        Ok(())
    }

    fn gradient_wire(&self) -> WireFormat {
        WireFormat::from_u8(self.wire.load(Ordering::Relaxed))
    }

    fn set_gradient_wire(&self, wire: WireFormat) {
        self.wire.store(wire as u8, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T: Send + 'static>(
        size: usize,
        f: impl Fn(Arc<LocalGroup>) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let f = Arc::new(f);
        let handles: Vec<_> = LocalGroup::new(size, Duration::from_secs(10))
            .into_iter()
            .map(|m| {
                let f = f.clone();
                std::thread::spawn(move || f(m))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("member thread"))
            .collect()
    }

    #[test]
    fn all_reduce_mean_max_and_broadcast_agree_on_every_member() {
        let out = run(3, |m| {
            let r = m.rank() as f32;
            let mut mean = vec![r, 10.0 * r];
            m.all_reduce_as(&mut mean, ReduceOp::Mean, WireFormat::F32)
                .expect("mean");
            let mut max = vec![r, -r];
            m.all_reduce_as(&mut max, ReduceOp::Max, WireFormat::F32)
                .expect("max");
            let mut b = [m.rank() as u8; 3];
            m.broadcast(&mut b, 2).expect("broadcast");
            (mean, max, b)
        });
        for (mean, max, b) in out {
            assert_eq!(mean, vec![1.0, 10.0]);
            assert_eq!(max, vec![2.0, 0.0]);
            assert_eq!(b, [2, 2, 2]);
        }
    }

    #[test]
    fn bf16_wire_rounds_contributions() {
        let out = run(2, |m| {
            let mut x = vec![1.0 + 1.0 / 128.0 + m.rank() as f32 / 1024.0];
            m.all_reduce_as(&mut x, ReduceOp::Sum, WireFormat::Bf16)
                .expect("sum");
            x[0]
        });
        // Each contribution rounds to 1 + 2⁻⁷ (8 significant bits); the sum is exact.
        assert_eq!(out, vec![2.0 + 2.0 / 128.0; 2]);
    }

    #[test]
    fn a_dropped_member_fails_the_others_naming_it() {
        let mut members = LocalGroup::new(2, Duration::from_secs(30));
        let second = members.pop().expect("two members");
        let first = members.pop().expect("two members");
        let waiter = std::thread::spawn(move || {
            let mut x = vec![1.0];
            first.all_reduce_as(&mut x, ReduceOp::Sum, WireFormat::F32)
        });
        std::thread::sleep(Duration::from_millis(50));
        drop(second);
        let err = waiter.join().expect("thread").expect_err("the peer left");
        assert!(
            matches!(err, CollectiveError::PeerLeft { rank: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn a_member_that_never_arrives_times_out_naming_it() {
        let members = LocalGroup::new(2, Duration::from_millis(100));
        let mut x = vec![1.0];
        let err = members[0]
            .all_reduce_as(&mut x, ReduceOp::Sum, WireFormat::F32)
            .expect_err("rank 1 never arrives");
        match err {
            CollectiveError::Timeout { lagging, .. } => assert_eq!(lagging, vec![1]),
            e => panic!("unexpected {e}"),
        }
        // The abandoned exchange left nothing behind: a complete one works.
        let m1 = members[1].clone();
        let t = std::thread::spawn(move || {
            let mut y = vec![2.0];
            m1.all_reduce_as(&mut y, ReduceOp::Sum, WireFormat::F32)
                .map(|()| y)
        });
        members[0]
            .all_reduce_as(&mut x, ReduceOp::Sum, WireFormat::F32)
            .expect("second exchange");
        assert_eq!(x, vec![3.0]);
        assert_eq!(t.join().expect("thread").expect("rank 1"), vec![3.0]);
    }
}
