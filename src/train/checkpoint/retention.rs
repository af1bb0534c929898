//! Which old checkpoints to delete: `ModelSaver`'s `max_to_keep` and
//! `keep_checkpoint_every_n_hours`, with TensorFlow's semantics. Pure: times are passed in, so
//! tests drive it with a fake clock.
//!
//! Rule (TF `CheckpointManager._sweep`): after each save, while more than `max_to_keep`
//! checkpoints are managed, the oldest leaves the managed list; it is *preserved* (kept on disk
//! for good, never considered again) if it was saved at least `keep_every` after the last
//! preserved one (initially: the run's start), and deleted otherwise.

use std::time::Duration;

use super::index::IndexEntry;

/// The retention settings of a checkpoint directory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetentionPolicy {
    /// How many recent checkpoints to keep; 0 keeps all (TF's `max_to_keep=None/0`).
    pub max_to_keep: usize,
    /// Additionally keep one checkpoint per this interval for good; `None` disables it.
    pub keep_every: Option<Duration>,
}

impl RetentionPolicy {
    /// tensorpack's `ModelSaver` defaults: keep the last 10, plus one every 30 minutes.
    pub fn tensorpack_default() -> RetentionPolicy {
        RetentionPolicy {
            max_to_keep: 10,
            keep_every: Some(Duration::from_secs(30 * 60)),
        }
    }

    /// Never delete anything.
    pub fn keep_all() -> RetentionPolicy {
        RetentionPolicy {
            max_to_keep: 0,
            keep_every: None,
        }
    }
}

/// What one recorded save decided about older checkpoints (file names).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RetentionDecision {
    /// Checkpoints to delete now.
    pub delete: Vec<String>,
    /// Checkpoints that left the managed list but stay on disk for good (hourly rule).
    pub preserved: Vec<String>,
}

/// The managed checkpoints (oldest first) and the last preserved time.
#[derive(Clone, Debug, PartialEq)]
pub struct RetentionState {
    pub managed: Vec<IndexEntry>,
    pub last_preserved_timestamp: f64,
}

impl RetentionState {
    /// A run starting at `start_time` (seconds since the Unix epoch) with nothing saved yet.
    pub fn new(start_time: f64) -> RetentionState {
        RetentionState {
            managed: Vec::new(),
            last_preserved_timestamp: start_time,
        }
    }

    /// Records a save of `file` at `time` and applies `policy`. Saving a file name again (same
    /// step) moves it to the newest position instead of listing it twice.
    pub fn record_save(
        &mut self,
        policy: &RetentionPolicy,
        file: &str,
        time: f64,
    ) -> RetentionDecision {
        self.managed.retain(|e| e.file != file);
        self.managed.push(IndexEntry {
            file: file.to_string(),
            timestamp: time,
        });
        let mut decision = RetentionDecision::default();
        if policy.max_to_keep == 0 {
            return decision;
        }
        let interval = policy
            .keep_every
            .map(|d| d.as_secs_f64())
            .filter(|&s| s > 0.0);
        while self.managed.len() > policy.max_to_keep {
            let oldest = self.managed.remove(0);
            match interval {
                Some(secs) if oldest.timestamp - secs >= self.last_preserved_timestamp => {
                    self.last_preserved_timestamp = oldest.timestamp;
                    decision.preserved.push(oldest.file);
                }
                _ => decision.delete.push(oldest.file),
            }
        }
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Saves every `period` seconds from `start` and returns (deleted, preserved, managed).
    fn simulate(
        policy: RetentionPolicy,
        saves: usize,
        period: f64,
    ) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
        let start = 1000.0;
        let mut state = RetentionState::new(start);
        let (mut deleted, mut preserved) = (Vec::new(), Vec::new());
        for k in 1..=saves {
            let d = state.record_save(&policy, &k.to_string(), start + period * k as f64);
            let parse = |v: Vec<String>| v.into_iter().map(|s| s.parse::<usize>().expect("number"));
            deleted.extend(parse(d.delete));
            preserved.extend(parse(d.preserved));
        }
        let managed = state
            .managed
            .iter()
            .map(|e| e.file.parse().expect("number"))
            .collect();
        (deleted, preserved, managed)
    }

    #[test]
    fn max_to_keep_alone_keeps_the_newest() {
        let policy = RetentionPolicy {
            max_to_keep: 3,
            keep_every: None,
        };
        let (deleted, preserved, managed) = simulate(policy, 7, 60.0);
        assert_eq!(deleted, vec![1, 2, 3, 4]);
        assert!(preserved.is_empty());
        assert_eq!(managed, vec![5, 6, 7]);
    }

    #[test]
    fn hourly_rule_preserves_one_per_interval() {
        // A save every 10 minutes, keep 2, keep one per 30 minutes: saves at 10, 20, ... minutes.
        let policy = RetentionPolicy {
            max_to_keep: 2,
            keep_every: Some(Duration::from_secs(1800)),
        };
        let (deleted, preserved, managed) = simulate(policy, 10, 600.0);
        // Preserved: the first save at least 30 min after the start (save 3 at 30 min), then
        // each first save at least 30 min after the previous preserved one (6, 9).
        assert_eq!(preserved, vec![3, 6]);
        assert_eq!(deleted, vec![1, 2, 4, 5, 7, 8]);
        assert_eq!(managed, vec![9, 10]);
        // Save 9 will be preserved when it leaves the managed list; nothing is lost twice.
        let mut all: Vec<usize> = deleted
            .iter()
            .chain(&preserved)
            .chain(&managed)
            .copied()
            .collect();
        all.sort();
        assert_eq!(all, (1..=10).collect::<Vec<_>>());
    }

    #[test]
    fn zero_max_to_keep_keeps_everything_and_resave_moves_to_newest() {
        let (deleted, preserved, managed) = simulate(RetentionPolicy::keep_all(), 5, 1.0);
        assert!(deleted.is_empty() && preserved.is_empty());
        assert_eq!(managed, vec![1, 2, 3, 4, 5]);
        let mut state = RetentionState::new(0.0);
        let policy = RetentionPolicy {
            max_to_keep: 2,
            keep_every: None,
        };
        state.record_save(&policy, "a", 1.0);
        state.record_save(&policy, "b", 2.0);
        let d = state.record_save(&policy, "a", 3.0);
        assert!(d.delete.is_empty(), "re-saving `a` must not delete `b`");
        let names: Vec<_> = state.managed.iter().map(|e| e.file.as_str()).collect();
        assert_eq!(names, ["b", "a"]);
    }
}
