//! `PrefetchData`: runs a flow on worker threads ahead of the consumer, delivering exactly the
//! datapoints of the unprefetched flow, in order.
//!
//! With `N` workers, worker `w` owns a copy of the flow (`fork`) and produces outputs `w, w+N, …`
//! of each pass, skipping the others (`skip`, free for one-to-one pipelines). The consumer reads
//! the workers' bounded queues round-robin, so delivery order and content do not depend on
//! thread timing. Every datapoint travels with its flow's `state()`, which is what `state()`
//! here returns: a resumed run (with any number of workers) continues exactly.

use super::DataError;
use super::flow::{DataFlow, Datapoint, FlowState, Skipped};
use crossbeam_channel::{Receiver, Sender, bounded};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

const NAME: &str = "PrefetchData";

enum Message {
    /// A datapoint and the position of the flow right after it.
    Item(Datapoint, FlowState),
    /// The pass ended; the position at the start of the next pass.
    EndOfPass(FlowState),
    /// The worker's flow failed; the worker has stopped.
    Failed(DataError),
}

struct Workers {
    receivers: Vec<Receiver<Message>>,
    handles: Vec<JoinHandle<Box<dyn DataFlow>>>,
    stop: Arc<AtomicBool>,
}

/// Prefetches a flow on `workers` threads with a bounded queue, preserving order.
///
/// Workers start at the first `next_datapoint` and stop (joined) on `restore`, `end_pass`,
/// `skip`, after an error, and on drop. An error of the flow is returned at the position where
/// the unprefetched flow would return it; a panicking worker becomes
/// [`DataError::WorkerPanicked`]. After an error the next call restarts the workers from the
/// last delivered position. With more than one worker the flow must support `fork`.
pub struct PrefetchData {
    /// The flow, at `last_state`, while no worker runs (worker 0 holds it while they run).
    template: Option<Box<dyn DataFlow>>,
    inner_name: &'static str,
    inner_len: Option<usize>,
    workers: usize,
    queue_per_worker: usize,
    /// Position of the flow after the last datapoint (or end of pass) delivered.
    last_state: FlowState,
    running: Option<Workers>,
    /// Messages consumed since the workers started or the pass began (selects the worker).
    cursor: usize,
}

impl PrefetchData {
    /// Prefetches `inner` on `workers` threads, holding at most about `queue_size` datapoints.
    pub fn new(
        inner: impl DataFlow + 'static,
        workers: usize,
        queue_size: usize,
    ) -> Result<PrefetchData, DataError> {
        if workers == 0 || queue_size == 0 {
            return Err(DataError::Config {
                flow: NAME,
                what: format!(
                    "workers ({workers}) and queue_size ({queue_size}) must be at least 1"
                ),
            });
        }
        let last_state = inner.state();
        Ok(PrefetchData {
            inner_name: inner.name(),
            inner_len: inner.len(),
            template: Some(Box::new(inner)),
            workers,
            queue_per_worker: queue_size.div_ceil(workers),
            last_state,
            running: None,
            cursor: 0,
        })
    }

    fn template_mut(&mut self) -> Result<&mut Box<dyn DataFlow>, DataError> {
        let inner_name = self.inner_name;
        self.template.as_mut().ok_or_else(|| DataError::Config {
            flow: NAME,
            what: format!("its {inner_name} was lost in a panicked worker"),
        })
    }

    fn start(&mut self) -> Result<(), DataError> {
        let workers = self.workers;
        let template = self.template_mut()?;
        let mut flows: Vec<Box<dyn DataFlow>> = Vec::with_capacity(workers);
        for _ in 1..workers {
            flows.push(template.fork()?);
        }
        if let Some(template) = self.template.take() {
            flows.insert(0, template);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut running = Workers {
            receivers: Vec::with_capacity(workers),
            handles: Vec::with_capacity(workers),
            stop: Arc::clone(&stop),
        };
        self.cursor = 0;
        for (worker, flow) in flows.into_iter().enumerate() {
            let (tx, rx) = bounded(self.queue_per_worker);
            let stop = Arc::clone(&stop);
            let spawned = std::thread::Builder::new()
                .name(format!("prefetch-{worker}"))
                .spawn(move || run_worker(flow, worker, workers, tx, stop));
            match spawned {
                Ok(handle) => {
                    running.handles.push(handle);
                    running.receivers.push(rx);
                }
                Err(e) => {
                    // Join what started (worker 0 gives the flow back, unless it was this one).
                    self.running = Some(running);
                    self.stop()?;
                    return Err(DataError::Config {
                        flow: NAME,
                        what: format!("cannot start worker thread {worker}: {e}"),
                    });
                }
            }
        }
        self.running = Some(running);
        Ok(())
    }

    /// Stops and joins the workers, and puts the flow back at `last_state`.
    fn stop(&mut self) -> Result<(), DataError> {
        let Some(running) = self.running.take() else {
            return Ok(());
        };
        running.stop.store(true, Ordering::Relaxed);
        // Dropping the receivers unblocks workers waiting on a full queue.
        drop(running.receivers);
        let mut panicked = None;
        for (worker, handle) in running.handles.into_iter().enumerate() {
            match handle.join() {
                Ok(flow) if worker == 0 => self.template = Some(flow),
                Ok(_) => {}
                Err(payload) => {
                    panicked.get_or_insert(DataError::WorkerPanicked {
                        worker,
                        message: panic_message(payload.as_ref()),
                    });
                }
            }
        }
        if let Some(template) = self.template.as_mut() {
            template.restore(&self.last_state)?;
        }
        panicked.map_or(Ok(()), Err)
    }

    /// Stops the workers after a failure and returns the error to report.
    fn fail(&mut self, error: DataError) -> DataError {
        match self.stop() {
            // A closed queue only says a worker died; the join says why.
            Err(panic @ DataError::WorkerPanicked { .. })
                if matches!(error, DataError::WorkerPanicked { .. }) =>
            {
                panic
            }
            _ => error,
        }
    }

    fn receive(&mut self, worker: usize) -> Result<Message, DataError> {
        let running = self.running.as_ref().ok_or_else(|| DataError::Config {
            flow: NAME,
            what: "workers are not running".to_string(),
        })?;
        running.receivers[worker]
            .recv()
            .map_err(|_| DataError::WorkerPanicked {
                worker,
                message: "exited without a result".to_string(),
            })
    }
}

fn run_worker(
    mut flow: Box<dyn DataFlow>,
    worker: usize,
    workers: usize,
    tx: Sender<Message>,
    stop: Arc<AtomicBool>,
) -> Box<dyn DataFlow> {
    if let Err(e) = produce(flow.as_mut(), worker, workers, &tx, &stop) {
        let _ = tx.send(Message::Failed(e));
    }
    flow
}

/// Sends outputs `worker, worker + workers, …` of every pass until stopped.
fn produce(
    flow: &mut dyn DataFlow,
    worker: usize,
    workers: usize,
    tx: &Sender<Message>,
    stop: &AtomicBool,
) -> Result<(), DataError> {
    // Outputs of other workers to skip before our next one.
    let mut lead = worker;
    while !stop.load(Ordering::Relaxed) {
        let message = if lead > 0 && flow.skip(lead)?.pass_ended {
            lead = worker;
            Message::EndOfPass(flow.state())
        } else {
            match flow.next_datapoint()? {
                Some(dp) => {
                    lead = workers - 1;
                    Message::Item(dp, flow.state())
                }
                None => {
                    lead = worker;
                    Message::EndOfPass(flow.state())
                }
            }
        };
        if tx.send(message).is_err() {
            break; // The consumer is gone.
        }
    }
    Ok(())
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

impl DataFlow for PrefetchData {
    fn name(&self) -> &'static str {
        NAME
    }

    fn reset_state(&mut self) -> Result<(), DataError> {
        self.stop()?;
        let template = self.template_mut()?;
        template.reset_state()?;
        self.inner_len = template.len();
        Ok(())
    }

    fn len(&self) -> Option<usize> {
        self.inner_len
    }

    fn next_datapoint(&mut self) -> Result<Option<Datapoint>, DataError> {
        if self.running.is_none() {
            self.start()?;
        }
        let worker = self.cursor % self.workers;
        let message = match self.receive(worker) {
            Ok(m) => m,
            Err(e) => return Err(self.fail(e)),
        };
        match message {
            Message::Item(dp, state) => {
                self.last_state = state;
                self.cursor += 1;
                Ok(Some(dp))
            }
            Message::EndOfPass(state) => {
                // Every other worker's next message is its end of this pass too.
                for other in (0..self.workers).filter(|&w| w != worker) {
                    match self.receive(other) {
                        Ok(Message::EndOfPass(_)) => {}
                        Ok(Message::Failed(e)) | Err(e) => return Err(self.fail(e)),
                        Ok(Message::Item(..)) => {
                            let e = DataError::Config {
                                flow: NAME,
                                what: format!(
                                    "worker {other} produced more datapoints than worker {worker} in one pass: its {} is not deterministic",
                                    self.inner_name
                                ),
                            };
                            return Err(self.fail(e));
                        }
                    }
                }
                self.last_state = state;
                self.cursor = 0;
                Ok(None)
            }
            Message::Failed(e) => Err(self.fail(e)),
        }
    }

    fn skip(&mut self, n: usize) -> Result<Skipped, DataError> {
        self.stop()?;
        let template = self.template_mut()?;
        let skipped = template.skip(n)?;
        self.last_state = template.state();
        Ok(skipped)
    }

    fn end_pass(&mut self) -> Result<(), DataError> {
        self.stop()?;
        let template = self.template_mut()?;
        template.end_pass()?;
        self.last_state = template.state();
        Ok(())
    }

    /// No counters; the input state is the flow's position after the last delivered datapoint,
    /// independent of the number of workers.
    fn state(&self) -> FlowState {
        FlowState::new(NAME, Vec::new(), vec![self.last_state.clone()])
    }

    fn restore(&mut self, state: &FlowState) -> Result<(), DataError> {
        state.check(NAME, 0, 1)?;
        self.stop()?;
        self.template_mut()?.restore(&state.inner[0])?;
        self.last_state = state.inner[0].clone();
        Ok(())
    }
}

impl Drop for PrefetchData {
    fn drop(&mut self) {
        // Errors cannot be reported from drop; the workers are joined either way.
        let _ = self.stop();
    }
}
