//! `QueueInput`: a background thread reads the data flow into a bounded queue; the training
//! thread takes one batch per tower per hooked run. Each queued batch carries the flow position
//! right after it, so the consumed position is exact however far the thread has read ahead.
//!
//! The `QueueInput/queue_size` statistic is an exponential moving average (decay 0.5, as
//! tensorpack's) of the queue length seen before each take; near 0 means data is the bottleneck.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, bounded};

use crate::backend::Feed;
use crate::data::{DataFlow, Datapoint, FlowState};
use crate::dsl::InputSpec;
use crate::ir::NodeId;
use crate::train::callback::Callback;
use crate::train::context::TrainContext;
use crate::train::error::TrainError;

use super::{InputSource, TowerFeeds, next_endless};

const NAME: &str = "QueueInput";
/// The statistic's name.
pub const QUEUE_SIZE_STAT: &str = "QueueInput/queue_size";

type Item = Result<(Datapoint, FlowState), TrainError>;

struct Worker {
    rx: Receiver<Item>,
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Box<dyn DataFlow>>,
}

/// Prefetches a flow on a background thread (tensorpack's `QueueInput(ds)`, queue of 50).
pub struct QueueInput {
    flow: Option<Box<dyn DataFlow>>,
    len: Option<usize>,
    capacity: usize,
    feeds: TowerFeeds,
    consumed: Option<FlowState>,
    pending_restore: Option<FlowState>,
    worker: Option<Worker>,
    reset_done: bool,
    queue_size: Arc<Mutex<Option<f64>>>,
}

impl QueueInput {
    /// Prefetches `flow` into a queue of 50 batches.
    pub fn new(flow: impl DataFlow + 'static) -> QueueInput {
        QueueInput::from_boxed(Box::new(flow))
    }

    /// Prefetches an already boxed flow.
    pub fn from_boxed(flow: Box<dyn DataFlow>) -> QueueInput {
        QueueInput {
            len: flow.len(),
            flow: Some(flow),
            capacity: 50,
            feeds: TowerFeeds::default(),
            consumed: None,
            pending_restore: None,
            worker: None,
            reset_done: false,
            queue_size: Arc::new(Mutex::new(None)),
        }
    }

    /// Sets the queue capacity (at least 1).
    pub fn capacity(mut self, capacity: usize) -> QueueInput {
        self.capacity = capacity.max(1);
        self
    }

    /// The current moving average of the queue length, if any batch was taken.
    pub fn queue_size(&self) -> Option<f64> {
        *self
            .queue_size
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn error(message: impl Into<String>) -> TrainError {
        TrainError::Input {
            source_name: NAME.into(),
            message: message.into(),
        }
    }

    fn take(&mut self) -> Result<(Datapoint, FlowState), TrainError> {
        let worker = self
            .worker
            .as_ref()
            .ok_or_else(|| QueueInput::error("used before start() or after stop()"))?;
        let waiting = worker.rx.len() as f64;
        {
            let mut ema = self
                .queue_size
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            *ema = Some(ema.map_or(waiting, |e| 0.5 * e + 0.5 * waiting));
        }
        match worker.rx.recv() {
            Ok(item) => item,
            Err(_) => Err(QueueInput::error("the enqueue thread ended unexpectedly")),
        }
    }
}

impl InputSource for QueueInput {
    fn name(&self) -> &'static str {
        NAME
    }

    fn setup(&mut self, signature: &[InputSpec]) -> Result<(), TrainError> {
        self.feeds.setup(signature);
        Ok(())
    }

    fn register_tower(&mut self, inputs: &[(String, NodeId)]) -> Result<(), TrainError> {
        self.feeds.register(NAME, inputs)
    }

    fn input_nodes(&self) -> Vec<NodeId> {
        self.feeds.nodes()
    }

    fn size(&self) -> Option<usize> {
        self.len
    }

    fn start(&mut self) -> Result<(), TrainError> {
        if self.worker.is_some() {
            return Ok(());
        }
        let mut flow = self
            .flow
            .take()
            .ok_or_else(|| QueueInput::error("its data flow was lost in a panicked thread"))?;
        let prepared = (|| {
            if !self.reset_done {
                flow.reset_state()?;
                self.reset_done = true;
            }
            if let Some(state) = self.pending_restore.take() {
                flow.restore(&state)?;
            }
            Ok::<_, TrainError>(())
        })();
        if let Err(e) = prepared {
            self.flow = Some(flow);
            return Err(e);
        }
        self.consumed = Some(flow.state());
        let (tx, rx) = bounded::<Item>(self.capacity);
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let spawned = std::thread::Builder::new()
            .name("QueueInput".into())
            .spawn(move || {
                while !thread_stop.load(Ordering::Relaxed) {
                    let item = next_endless(NAME, &mut *flow);
                    let failed = item.is_err();
                    if tx.send(item).is_err() || failed {
                        break;
                    }
                }
                flow
            });
        match spawned {
            Ok(handle) => {
                self.worker = Some(Worker { rx, stop, handle });
                Ok(())
            }
            Err(e) => Err(QueueInput::error(format!(
                "cannot start the enqueue thread: {e}"
            ))),
        }
    }

    fn next_feeds(&mut self) -> Result<Vec<Feed>, TrainError> {
        let mut out = Vec::new();
        for tower in 0..self.feeds.towers() {
            let (dp, state) = self.take()?;
            out.extend(self.feeds.feeds(NAME, tower, dp)?);
            self.consumed = Some(state);
        }
        Ok(out)
    }

    fn stop(&mut self) {
        let Some(worker) = self.worker.take() else {
            return;
        };
        worker.stop.store(true, Ordering::Relaxed);
        // Dropping the receiver unblocks a thread waiting on a full queue.
        drop(worker.rx);
        match worker.handle.join() {
            Ok(flow) => {
                // The thread read ahead; put the flow back where training stopped consuming.
                let mut flow = flow;
                if let Some(state) = &self.consumed
                    && let Err(e) = flow.restore(state)
                {
                    log::warn!(target: "towerpack", "QueueInput: cannot rewind its flow: {e}");
                }
                self.flow = Some(flow);
            }
            Err(_) => log::error!(target: "towerpack", "QueueInput: the enqueue thread panicked"),
        }
    }

    fn consumed_state(&self) -> Option<FlowState> {
        self.consumed.clone()
    }

    fn restore(&mut self, state: &FlowState) -> Result<(), TrainError> {
        if self.worker.is_some() {
            return Err(QueueInput::error(
                "restore() while its thread runs; stop() first",
            ));
        }
        self.pending_restore = Some(state.clone());
        Ok(())
    }

    fn callbacks(&mut self) -> Vec<Box<dyn Callback>> {
        vec![Box::new(QueueSizeStat {
            queue_size: Arc::clone(&self.queue_size),
        })]
    }
}

impl Drop for QueueInput {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Puts `QueueInput/queue_size` at the end of every epoch.
struct QueueSizeStat {
    queue_size: Arc<Mutex<Option<f64>>>,
}

impl Callback for QueueSizeStat {
    fn name(&self) -> String {
        "QueueInput/queue_size".into()
    }

    fn chief_only(&self) -> bool {
        false
    }

    fn trigger_epoch(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let size = *self
            .queue_size
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match size {
            Some(v) => ctx.put_scalar(QUEUE_SIZE_STAT, v),
            None => Ok(()),
        }
    }
}
