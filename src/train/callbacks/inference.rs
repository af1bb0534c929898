//! Validation: [`InferenceRunner`] builds an inference tower of the model (name scope
//! `InferenceTower`, sharing the training tower's variables) in `setup_graph`, and on each
//! trigger runs it over one pass of a data flow, feeding [`Inferencer`]s that turn the fetched
//! values into monitor scalars: [`ScalarStats`] and [`ClassificationError`].

use serde_json::json;

use crate::backend::{Feed, Step};
use crate::data::{DataFlow, FlowState};
use crate::dsl::{INFERENCE_TOWER, TowerHandle};
use crate::ir::{Op, TensorType, Value};
use crate::tensor::HostTensor;
use crate::train::callback::Callback;
use crate::train::context::TrainContext;
use crate::train::error::TrainError;
use crate::train::feed_check::check_feed;
use crate::train::suggest::{closest_names, did_you_mean, tower_tensor_names};

/// Turns the values of some tensors, batch by batch, into statistics.
pub trait Inferencer {
    /// The name used in logs.
    fn name(&self) -> String;
    /// Called before each inference pass.
    fn before_inference(&mut self) {}
    /// Tensor names (inside the inference tower) to fetch for each batch.
    fn fetches(&self) -> Vec<String>;
    /// The values of [`Inferencer::fetches`] for one batch.
    fn on_fetches(&mut self, values: &[HostTensor]) -> Result<(), TrainError>;
    /// The statistics of the pass: `(name, value)` pairs put into the monitors.
    fn after_inference(&mut self) -> Vec<(String, f64)>;
}

/// Averages scalar tensors over the batches of a pass (an unweighted mean per batch, like
/// tensorpack's); reported as `<prefix>_<name>`.
#[derive(Clone, Debug)]
pub struct ScalarStats {
    names: Vec<String>,
    prefix: String,
    sums: Vec<f64>,
    batches: usize,
}

impl ScalarStats {
    /// Averages `names`, reported as `validation_<name>`.
    pub fn new(names: &[&str]) -> ScalarStats {
        ScalarStats {
            names: names.iter().map(|s| s.to_string()).collect(),
            prefix: "validation".into(),
            sums: Vec::new(),
            batches: 0,
        }
    }

    /// Reports as `<prefix>_<name>`.
    pub fn prefix(mut self, prefix: &str) -> ScalarStats {
        self.prefix = prefix.to_string();
        self
    }
}

impl Inferencer for ScalarStats {
    fn name(&self) -> String {
        format!("ScalarStats({})", self.names.join(", "))
    }

    fn before_inference(&mut self) {
        self.sums = vec![0.0; self.names.len()];
        self.batches = 0;
    }

    fn fetches(&self) -> Vec<String> {
        self.names.clone()
    }

    fn on_fetches(&mut self, values: &[HostTensor]) -> Result<(), TrainError> {
        for ((sum, v), name) in self.sums.iter_mut().zip(values).zip(&self.names) {
            *sum += v.scalar_value().map_err(|_| {
                TrainError::callback(
                    "ScalarStats",
                    format!("`{name}` is not a scalar (shape {:?})", v.shape()),
                )
            })?;
        }
        self.batches += 1;
        Ok(())
    }

    fn after_inference(&mut self) -> Vec<(String, f64)> {
        let n = self.batches.max(1) as f64;
        self.names
            .iter()
            .zip(&self.sums)
            .map(|(name, s)| {
                let base = name.rsplit('/').next().unwrap_or(name);
                (format!("{}_{base}", self.prefix), s / n)
            })
            .collect()
    }
}

/// The exact error rate `Σ wrong / Σ examples` over a pass (correct when the last batch is
/// smaller), from the model's logits and the labels ([`ClassificationError::from_logits`],
/// optionally top-k), or from a per-example 0/1 vector the model computes
/// ([`ClassificationError::new`], tensorpack's form).
#[derive(Clone, Debug)]
pub struct ClassificationError {
    source: WrongSource,
    summary_name: String,
    wrong: f64,
    total: usize,
}

/// Where [`ClassificationError`] learns which examples are wrong.
#[derive(Clone, Debug)]
enum WrongSource {
    /// A 0/1 vector computed by the model.
    Vector(String),
    /// Logits `[N, classes]` and integer labels `[N]`: wrong unless the label's logit is among
    /// the `k` largest (ties count as among them, as TensorFlow's `in_top_k`).
    Logits {
        logits: String,
        labels: String,
        k: usize,
    },
}

impl Default for ClassificationError {
    /// `wrong_vector` (what towerpack's models name it; tensorpack's default is
    /// `incorrect_vector`) reported as `validation_error`.
    fn default() -> ClassificationError {
        ClassificationError::new("wrong_vector", "validation_error")
    }
}

impl ClassificationError {
    /// Reads the 0/1 vector `wrong_tensor`, reports `summary_name`.
    pub fn new(wrong_tensor: &str, summary_name: &str) -> ClassificationError {
        ClassificationError {
            source: WrongSource::Vector(wrong_tensor.to_string()),
            summary_name: summary_name.to_string(),
            wrong: 0.0,
            total: 0,
        }
    }

    /// Compares the arg-max of `logits` (`[N, classes]`, e.g. `"linear/output"`) with the
    /// integer `labels` (`[N]`, e.g. the input `"label"`), reported as `validation_error`
    /// (rename with [`ClassificationError::summary_name`]). A non-finite logit of the label
    /// counts as wrong; a label outside `0..classes` is an error naming the tensor.
    pub fn from_logits(logits: &str, labels: &str) -> ClassificationError {
        ClassificationError {
            source: WrongSource::Logits {
                logits: logits.to_string(),
                labels: labels.to_string(),
                k: 1,
            },
            summary_name: "validation_error".into(),
            wrong: 0.0,
            total: 0,
        }
    }

    /// Top-k error (right when the label's logit is among the `k` largest, ties included),
    /// for an error built by [`ClassificationError::from_logits`]; reported as
    /// `validation_error_top<k>` unless renamed after. `k = 0` is taken as 1.
    pub fn top_k(mut self, k: usize) -> ClassificationError {
        if let WrongSource::Logits { k: current, .. } = &mut self.source {
            *current = k.max(1);
            if self.summary_name == "validation_error" && k > 1 {
                self.summary_name = format!("validation_error_top{k}");
            }
        }
        self
    }

    /// Reports the error rate as `name`.
    pub fn summary_name(mut self, name: &str) -> ClassificationError {
        self.summary_name = name.to_string();
        self
    }

    fn fault(&self, message: String) -> TrainError {
        TrainError::callback("ClassificationError", message)
    }

    /// Counts the wrong examples of one batch of logits and labels.
    fn count_logits(
        &self,
        names: (&str, &str),
        k: usize,
        logits: &HostTensor,
        labels: &HostTensor,
    ) -> Result<(f64, usize), TrainError> {
        let (logits_name, labels_name) = names;
        let shape = logits.shape();
        let [n, classes] = shape[..] else {
            return Err(self.fault(format!(
                "logits `{logits_name}` must be [batch, classes], got shape {shape:?}"
            )));
        };
        if labels.shape() != [n] {
            return Err(self.fault(format!(
                "labels `{labels_name}` must be [{n}] to match logits `{logits_name}` {shape:?}, \
                 got shape {:?}",
                labels.shape()
            )));
        }
        let values = logits.to_f64_vec();
        let mut wrong = 0.0;
        for (i, &label) in labels.to_f64_vec().iter().enumerate() {
            if label.fract() != 0.0 || label < 0.0 || label >= classes as f64 {
                return Err(self.fault(format!(
                    "label {label} of example {i} in `{labels_name}` is not a class of \
                     `{logits_name}` (0..{classes})"
                )));
            }
            let row = &values[i * classes..(i + 1) * classes];
            let target = row[label as usize];
            let above = row.iter().filter(|&&v| v > target).count();
            if !target.is_finite() || above >= k {
                wrong += 1.0;
            }
        }
        Ok((wrong, n))
    }
}

impl Inferencer for ClassificationError {
    fn name(&self) -> String {
        match &self.source {
            WrongSource::Vector(name) => format!("ClassificationError({name})"),
            WrongSource::Logits { logits, labels, k } => {
                format!("ClassificationError({logits}, {labels}, top {k})")
            }
        }
    }

    fn before_inference(&mut self) {
        self.wrong = 0.0;
        self.total = 0;
    }

    fn fetches(&self) -> Vec<String> {
        match &self.source {
            WrongSource::Vector(name) => vec![name.clone()],
            WrongSource::Logits { logits, labels, .. } => vec![logits.clone(), labels.clone()],
        }
    }

    fn on_fetches(&mut self, values: &[HostTensor]) -> Result<(), TrainError> {
        let (wrong, total) = match &self.source {
            WrongSource::Vector(name) => {
                let v = &values[0];
                if v.shape().len() != 1 {
                    return Err(self.fault(format!(
                        "`{name}` must be a vector, got shape {:?}",
                        v.shape()
                    )));
                }
                (v.to_f64_vec().iter().sum::<f64>(), v.len())
            }
            WrongSource::Logits { logits, labels, k } => {
                self.count_logits((logits, labels), *k, &values[0], &values[1])?
            }
        };
        self.wrong += wrong;
        self.total += total;
        Ok(())
    }

    fn after_inference(&mut self) -> Vec<(String, f64)> {
        vec![(
            self.summary_name.clone(),
            self.wrong / self.total.max(1) as f64,
        )]
    }
}

/// Runs inferencers over one pass of a data flow on each trigger (every epoch by default).
/// The flow's position is part of the resume state (a shuffled validation flow stays exact).
pub struct InferenceRunner {
    flow: Box<dyn DataFlow>,
    inferencers: Vec<Box<dyn Inferencer>>,
    tower_name: String,
    tower: Option<TowerHandle>,
    /// The type of each tower input, in signature order.
    input_types: Vec<TensorType>,
    /// Per inferencer: its fetches' positions in `step`.
    positions: Vec<Vec<usize>>,
    step: Option<Step>,
    started: bool,
    pending_restore: Option<FlowState>,
}

impl InferenceRunner {
    /// Runs `inferencers` over `flow` in tower `InferenceTower`.
    pub fn new(flow: impl DataFlow + 'static, inferencers: Vec<Box<dyn Inferencer>>) -> Self {
        InferenceRunner {
            flow: Box::new(flow),
            inferencers,
            tower_name: INFERENCE_TOWER.to_string(),
            tower: None,
            input_types: Vec::new(),
            positions: Vec::new(),
            step: None,
            started: false,
            pending_restore: None,
        }
    }

    /// Builds the tower under another name (two runners need two names).
    pub fn tower_name(mut self, name: &str) -> Self {
        self.tower_name = name.to_string();
        self
    }

    fn feeds(&self, tower: &TowerHandle, dp: Vec<HostTensor>) -> Result<Vec<Feed>, TrainError> {
        if dp.len() != tower.inputs.len() {
            return Err(TrainError::callback(
                self.name(),
                format!(
                    "a datapoint has {} components, the tower takes {} inputs",
                    dp.len(),
                    tower.inputs.len()
                ),
            ));
        }
        let who = format!("the validation data of {}", self.name());
        tower
            .inputs
            .iter()
            .zip(&self.input_types)
            .zip(dp)
            .map(|(((name, id), ty), v)| {
                check_feed(&who, name, ty, &v)?;
                Ok((*id, v))
            })
            .collect()
    }
}

impl Callback for InferenceRunner {
    fn name(&self) -> String {
        format!("InferenceRunner({})", self.tower_name)
    }

    fn setup_graph(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let tower = ctx.build_inference_tower(&self.tower_name)?;
        let graph = ctx.graph();
        self.input_types = tower
            .inputs
            .iter()
            .map(|(name, id)| match &graph.node(*id).op {
                Op::Input { ty, .. } => Ok(ty.clone()),
                _ => Err(TrainError::callback(
                    self.name(),
                    format!("tower input `{name}` is not an Input node"),
                )),
            })
            .collect::<Result<_, _>>()?;
        let mut fetches: Vec<Value> = Vec::new();
        self.positions = Vec::new();
        for inf in &self.inferencers {
            let mut mine = Vec::new();
            for name in inf.fetches() {
                let v = tower.get_tensor(graph, &name).ok_or_else(|| {
                    let known = tower_tensor_names(graph, &tower);
                    let suggestions = closest_names(&name, known.iter().map(String::as_str));
                    TrainError::TensorNotFound {
                        name: name.clone(),
                        hint: format!(
                            " (nor `{}/{name}` in the inference tower, needed by {}){}",
                            self.tower_name,
                            inf.name(),
                            did_you_mean(&suggestions)
                        ),
                    }
                })?;
                let pos = fetches.iter().position(|f| *f == v).unwrap_or_else(|| {
                    fetches.push(v);
                    fetches.len() - 1
                });
                mine.push(pos);
            }
            self.positions.push(mine);
        }
        self.step = Some(Step::fetch(fetches));
        self.tower = Some(tower);
        Ok(())
    }

    fn before_train(&mut self, _: &mut TrainContext) -> Result<(), TrainError> {
        if !self.started {
            self.flow.reset_state()?;
            if let Some(state) = self.pending_restore.take() {
                self.flow.restore(&state)?;
            }
            self.started = true;
        }
        Ok(())
    }

    fn trigger(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let (Some(tower), Some(step)) = (self.tower.clone(), self.step.clone()) else {
            return Ok(());
        };
        for inf in &mut self.inferencers {
            inf.before_inference();
        }
        let mut batches = 0usize;
        while let Some(dp) = self.flow.next_datapoint()? {
            let feeds = self.feeds(&tower, dp)?;
            let values = ctx.run(&step, &feeds)?;
            for (inf, pos) in self.inferencers.iter_mut().zip(&self.positions) {
                let mine: Vec<HostTensor> = pos.iter().map(|&i| values[i].clone()).collect();
                inf.on_fetches(&mine)?;
            }
            batches += 1;
        }
        if let Some(expected) = self.flow.len()
            && batches < expected
        {
            return Err(TrainError::callback(
                self.name(),
                format!("the input stopped after {batches} batches, before its len() {expected}"),
            ));
        }
        for inf in &mut self.inferencers {
            for (name, value) in inf.after_inference() {
                ctx.put_scalar(&name, value)?;
            }
        }
        Ok(())
    }

    fn save_state(&self) -> Option<serde_json::Value> {
        Some(json!({ "flow": self.flow.state() }))
    }

    fn restore_state(&mut self, state: &serde_json::Value) -> Result<(), TrainError> {
        let flow: FlowState = serde_json::from_value(state["flow"].clone())
            .map_err(|e| TrainError::Resume(format!("{}: bad state: {e}", self.name())))?;
        if self.started {
            self.flow.restore(&flow)?;
        } else {
            self.pending_restore = Some(flow);
        }
        Ok(())
    }
}
