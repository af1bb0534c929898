//! Predictors: [`OnlinePredictor`] runs named inputs to named outputs of an inference tower in an
//! existing session (what `trainer.get_predictor` returns to callbacks); [`OfflinePredictor`]
//! builds its own graph from a [`PredictConfig`] (a tower with no name scope, as tensorpack's),
//! loads a checkpoint, and runs on the CPU backend.

use std::sync::Arc;

use crate::backend::{Feed, Session, Step};
use crate::dsl::{Builder, TowerHandle};
use crate::ir::{Graph, NodeId, Op, TensorType};
use crate::tensor::HostTensor;
use crate::tower::TowerContext;

use super::error::{ConfigError, TrainError};
use super::feed_check::check_feed;
use super::model::ModelDesc;
use super::session_init::SessionInit;
use super::suggest::{closest_names, did_you_mean, tower_tensor_names};
use crate::backend::BackendChoice;

/// Named inputs to named outputs of one tower, run in a session given at each call.
#[derive(Clone, Debug, PartialEq)]
pub struct OnlinePredictor {
    input_names: Vec<String>,
    inputs: Vec<(NodeId, TensorType)>,
    output_names: Vec<String>,
    step: Step,
}

impl OnlinePredictor {
    /// Resolves `input_names` (signature names, or names of `Input` nodes) and `output_names`
    /// (tensor names inside the tower, then the tower's inputs) in `tower`.
    pub fn from_tower(
        graph: &Graph,
        tower: &TowerHandle,
        input_names: &[&str],
        output_names: &[&str],
    ) -> Result<OnlinePredictor, TrainError> {
        if output_names.is_empty() {
            return Err(ConfigError::PredictorWithoutOutputs.into());
        }
        let not_found = |name: &str| {
            let known = tower_tensor_names(graph, tower);
            let suggestions = closest_names(name, known.iter().map(String::as_str));
            let place = if tower.ns_name.is_empty() {
                " of the predictor's tower".to_string()
            } else {
                format!(" in tower `{}`", tower.ns_name)
            };
            TrainError::TensorNotFound {
                name: name.to_string(),
                hint: format!("{place}{}", did_you_mean(&suggestions)),
            }
        };
        let mut inputs = Vec::with_capacity(input_names.len());
        for &name in input_names {
            let node = tower
                .input(name)
                .or_else(|| graph.find(name))
                .ok_or_else(|| not_found(name))?;
            let Op::Input { ty, .. } = &graph.node(node).op else {
                return Err(ConfigError::PredictorInputNotInTower {
                    input: name.to_string(),
                    tower: tower.ns_name.clone(),
                }
                .into());
            };
            inputs.push((node, ty.clone()));
        }
        let fetches = output_names
            .iter()
            .map(|&n| tower.get_tensor(graph, n).ok_or_else(|| not_found(n)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(OnlinePredictor {
            input_names: input_names.iter().map(|s| s.to_string()).collect(),
            inputs,
            output_names: output_names.iter().map(|s| s.to_string()).collect(),
            step: Step::fetch(fetches),
        })
    }

    /// The input names, in call order.
    pub fn input_names(&self) -> &[String] {
        &self.input_names
    }

    /// The output names, in result order.
    pub fn output_names(&self) -> &[String] {
        &self.output_names
    }

    /// Runs the outputs on `inputs` (one per input name, each of the input's dtype and shape:
    /// nothing is cast silently; use [`HostTensor::cast`] to convert).
    pub fn run(
        &self,
        session: &mut dyn Session,
        inputs: &[HostTensor],
    ) -> Result<Vec<HostTensor>, TrainError> {
        if inputs.len() != self.inputs.len() {
            return Err(ConfigError::PredictorArity {
                inputs: self.input_names.clone(),
                got: inputs.len(),
            }
            .into());
        }
        let feeds: Vec<Feed> = self
            .inputs
            .iter()
            .zip(&self.input_names)
            .zip(inputs)
            .map(|(((node, ty), name), t)| {
                check_feed("the predictor's caller", name, ty, t)?;
                Ok((*node, t.clone()))
            })
            .collect::<Result<_, TrainError>>()?;
        Ok(session.run(&self.step, &feeds)?)
    }
}

/// What an [`OfflinePredictor`] builds and loads (tensorpack's `PredictConfig`).
pub struct PredictConfig {
    pub model: Arc<dyn ModelDesc>,
    /// Default: every input of the signature.
    pub input_names: Option<Vec<String>>,
    pub output_names: Vec<String>,
    /// Usually a `SaverRestore` of a checkpoint; `None` keeps the initial values.
    pub session_init: Option<Box<dyn SessionInit>>,
    pub backend: BackendChoice,
    /// Seed of the graph and of the initial values (which a checkpoint then overwrites).
    pub seed: u64,
}

impl PredictConfig {
    /// Predicts `output_names` of `model`, on the CPU backend.
    pub fn new(model: Arc<dyn ModelDesc>, output_names: &[&str]) -> PredictConfig {
        PredictConfig {
            model,
            input_names: None,
            output_names: output_names.iter().map(|s| s.to_string()).collect(),
            session_init: None,
            backend: BackendChoice::default(),
            seed: 0,
        }
    }

    /// Feeds only these inputs.
    pub fn input_names(mut self, names: &[&str]) -> PredictConfig {
        self.input_names = Some(names.iter().map(|s| s.to_string()).collect());
        self
    }

    /// Initializes variables with `init` (e.g. `SaverRestore::new(dir)`).
    pub fn session_init(mut self, init: impl SessionInit + 'static) -> PredictConfig {
        self.session_init = Some(Box::new(init));
        self
    }

    /// Runs on `backend`.
    pub fn backend(mut self, backend: BackendChoice) -> PredictConfig {
        self.backend = backend;
        self
    }
}

/// A predictor with its own graph and session (tensorpack's `OfflinePredictor`).
pub struct OfflinePredictor {
    session: Box<dyn Session>,
    predictor: OnlinePredictor,
}

impl OfflinePredictor {
    /// Builds the model's inference tower (no name scope, own variables), creates the session,
    /// and runs the session init.
    pub fn new(mut config: PredictConfig) -> Result<OfflinePredictor, TrainError> {
        let signature = config.model.inputs();
        let builder = Builder::with_seed(config.seed);
        let model = Arc::clone(&config.model);
        let tower = builder.build_tower(TowerContext::inference("", ""), &signature, |x| {
            model.build_graph(x)
        })?;
        let mut graph = builder.finish()?;
        let input_names: Vec<String> = config
            .input_names
            .clone()
            .unwrap_or_else(|| signature.iter().map(|s| s.name.clone()).collect());
        let inputs: Vec<&str> = input_names.iter().map(String::as_str).collect();
        let outputs: Vec<&str> = config.output_names.iter().map(String::as_str).collect();
        let predictor = OnlinePredictor::from_tower(&graph, &tower, &inputs, &outputs)?;
        if let Some(init) = config.session_init.as_mut() {
            init.setup_graph(&mut graph)?;
        }
        let mut session = config.backend.create_session(graph)?;
        session.initialize_variables(config.seed)?;
        if let Some(init) = config.session_init.as_mut() {
            init.run_init(session.as_mut())?;
        }
        Ok(OfflinePredictor { session, predictor })
    }

    /// Runs the outputs on `inputs`.
    pub fn predict(&mut self, inputs: &[HostTensor]) -> Result<Vec<HostTensor>, TrainError> {
        self.predictor.run(self.session.as_mut(), inputs)
    }

    /// The session (e.g. to read variables).
    pub fn session(&mut self) -> &mut dyn Session {
        self.session.as_mut()
    }
}
