//! Predictors and session initializers: the trainer's online predictor and an offline predictor
//! restored from the run's checkpoint agree; SaverRestore reports mismatches both ways, relaxed
//! and dict restores convert or skip, SmartInit picks the right initializer.

use crate::train_common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use towerpack::backend::Session;
use towerpack::backend::cpu::{CpuOptions, CpuSession};
use towerpack::data::DataFlow;
use towerpack::dsl::prelude::*;
use towerpack::models::Mlp;
use towerpack::tensor::HostTensor;
use towerpack::train::callbacks::ModelSaver;
use towerpack::train::*;
use train_common::*;

/// Gets a predictor in setup_graph and runs it on a fixed batch after training.
struct UsePredictor {
    predictor: Option<OnlinePredictor>,
    batch: Vec<HostTensor>,
    out: Arc<Mutex<Vec<f32>>>,
}

impl Callback for UsePredictor {
    fn setup_graph(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.predictor = Some(ctx.get_predictor(&["input"], &["linear/output"])?);
        // A second request reuses the same tower.
        ctx.get_predictor(&["input", "label"], &["wrong_vector"])?;
        Ok(())
    }
    fn after_train(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let p = self.predictor.as_ref().expect("setup");
        let out = p.run(ctx.session("predict")?, &self.batch[..1])?;
        *self.out.lock().expect("out") = out[0].to_f32_vec();
        Ok(())
    }
}

fn first_val_batch() -> Vec<HostTensor> {
    let mut flow = val_flow(16, 16);
    flow.reset_state().expect("reset");
    flow.next_datapoint().expect("batch").expect("one batch")
}

#[test]
fn online_and_offline_predictors_agree() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Arc::new(Mutex::new(Vec::new()));
    let c = bare(config(
        mlp_model(0.1),
        train_flow(128, 32, 2),
        Some(dir.path()),
    ))
    .callback(UsePredictor {
        predictor: None,
        batch: first_val_batch(),
        out: Arc::clone(&out),
    })
    .callback(ModelSaver::new())
    .max_epoch(2);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    assert!(
        report
            .session
            .graph()
            .find(&format!("{PREDICT_TOWER}/linear/output"))
            .is_some()
    );
    let online = out.lock().expect("out").clone();
    assert_eq!(online.len(), 16 * 10);

    let config = PredictConfig::new(Arc::new(mlp_model(0.1)), &["linear/output"])
        .input_names(&["input"])
        .session_init(SaverRestore::new(dir.path().join("checkpoint")))
        .backend(cpu());
    let mut offline = OfflinePredictor::new(config).expect("predictor");
    let offline = offline.predict(&first_val_batch()[..1]).expect("predict")[0].to_f32_vec();
    for (a, b) in online.iter().zip(&offline) {
        assert!(close(f64::from(*a), f64::from(*b), 1e-5), "{a} vs {b}");
    }
    // An untrained predictor gives other logits.
    let config =
        PredictConfig::new(Arc::new(mlp_model(0.1)), &["linear/output"]).input_names(&["input"]);
    let mut fresh = OfflinePredictor::new(config).expect("predictor");
    assert_ne!(
        fresh.predict(&first_val_batch()[..1]).expect("predict")[0].to_f32_vec(),
        offline
    );
}

/// A session of `mlp`'s inference tower with initial values.
fn inference_session(mlp: Mlp) -> CpuSession {
    let sig = mlp.inputs();
    let builder = Builder::with_seed(1);
    builder
        .build_tower(TowerContext::inference("", ""), &sig, |x| mlp.build(x))
        .expect("tower");
    let mut s =
        CpuSession::new(builder.finish().expect("graph"), CpuOptions::default()).expect("session");
    s.initialize_variables(1).expect("init");
    s
}

fn mlp(hidden: usize) -> Mlp {
    Mlp {
        input_shape: vec![28, 28, 1],
        hidden: vec![hidden],
        classes: 10,
        ..Mlp::default()
    }
}

fn trained_checkpoint(dir: &std::path::Path) {
    let c = bare(config(mlp_model(0.1), train_flow(64, 32, 2), Some(dir)))
        .callback(ModelSaver::new())
        .max_epoch(1);
    launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
}

fn read(s: &CpuSession, name: &str) -> HostTensor {
    s.read_variable(s.graph().find_variable(name).expect(name))
        .expect("read")
}

#[test]
fn saver_restore_matches_names_and_reports_both_ways() {
    let dir = tempfile::tempdir().expect("tempdir");
    trained_checkpoint(dir.path());
    let ckpt = towerpack::train::checkpoint::load_checkpoint(dir.path()).expect("ckpt");

    let mut s = inference_session(mlp(32));
    let outcome = SaverRestore::new(dir.path())
        .run_init(&mut s)
        .expect("restore");
    assert_eq!(
        outcome.checkpoint.as_deref(),
        Some(dir.path().join("model-2.safetensors").as_path())
    );
    assert_eq!(outcome.restored, 4);
    assert_eq!(read(&s, "fc0/W"), ckpt.tensors["fc0/W"]);
    // Training state has no variable in an inference graph: reported, slots as expected.
    let report = &outcome.report;
    assert!(
        report
            .only_in_checkpoint
            .contains(&"global_step".to_string())
    );
    assert!(
        report
            .only_in_checkpoint
            .contains(&"learning_rate".to_string())
    );
    assert!(
        report
            .training_only_unmatched
            .contains(&"fc0/W/Momentum".to_string())
    );
    assert!(report.only_in_graph.is_empty());
    assert!(outcome.metadata.contains_key("towerpack.resume"));

    // A wider hidden layer: exact mode names the variable and both shapes.
    let mut s = inference_session(mlp(16));
    let err = SaverRestore::new(dir.path())
        .run_init(&mut s)
        .expect_err("mismatch");
    let msg = err.to_string();
    assert!(
        msg.contains("fc0/W") && msg.contains("[784, 16]") && msg.contains("[784, 32]"),
        "{msg}"
    );
    // Relaxed mode skips what cannot fit and restores the rest.
    let outcome = SaverRestore::relaxed(dir.path())
        .run_init(&mut s)
        .expect("relaxed");
    let skipped: Vec<&str> = outcome
        .report
        .incompatible
        .iter()
        .map(|a| a.name.as_str())
        .collect();
    assert_eq!(skipped, ["fc0/W", "fc0/b", "linear/W"]);
    assert_eq!(read(&s, "linear/b"), ckpt.tensors["linear/b"]);

    // A prefix and an ignore list.
    let mut s = inference_session(mlp(32));
    let outcome = SaverRestore::new(dir.path())
        .ignore(&["fc0/b"])
        .run_init(&mut s)
        .expect("restore");
    assert_eq!(outcome.restored, 3);
    assert_eq!(outcome.report.ignored, ["fc0/b"]);
}

#[test]
fn dict_chain_and_smart_inits() {
    let dir = tempfile::tempdir().expect("tempdir");
    trained_checkpoint(dir.path());
    // DictRestore converts dtype and shape when the element count fits.
    let mut values = BTreeMap::new();
    values.insert(
        "linear/b:0".to_string(),
        HostTensor::from_f32(&[2, 5], (0..10).map(|i| i as f32).collect())
            .expect("t")
            .cast(towerpack::tensor::DType::F64),
    );
    values.insert("extra".to_string(), HostTensor::scalar_f32(1.0));
    let mut s = inference_session(mlp(32));
    let outcome = DictRestore::new(values.clone())
        .run_init(&mut s)
        .expect("dict");
    assert_eq!(
        read(&s, "linear/b").to_f32_vec(),
        (0..10).map(|i| i as f32).collect::<Vec<_>>()
    );
    assert_eq!(outcome.report.converted.len(), 1);
    assert_eq!(outcome.report.only_in_checkpoint, ["extra"]);
    assert!(outcome.report.only_in_graph.contains(&"fc0/W".to_string()));
    // An impossible value is an error unless ignored.
    values.insert("fc0/b".to_string(), HostTensor::scalar_f32(1.0));
    let err = DictRestore::new(values.clone())
        .run_init(&mut s)
        .expect_err("mismatch");
    assert!(err.to_string().contains("fc0/b"), "{err}");
    DictRestore::new(values.clone())
        .ignore_mismatch(true)
        .run_init(&mut s)
        .expect("ignored");

    // ChainInit: the dict overrides one variable of the checkpoint.
    let ckpt = towerpack::train::checkpoint::load_checkpoint(dir.path()).expect("ckpt");
    let mut only_b = BTreeMap::new();
    only_b.insert(
        "linear/b".to_string(),
        HostTensor::zeros(towerpack::tensor::DType::F32, &[10]),
    );
    let mut chain = ChainInit::new(vec![
        Box::new(SaverRestore::new(dir.path())),
        Box::new(DictRestore::new(only_b)),
    ]);
    let outcome = chain.run_init(&mut s).expect("chain");
    assert!(outcome.checkpoint.is_some());
    assert_eq!(read(&s, "fc0/W"), ckpt.tensors["fc0/W"]);
    assert!(read(&s, "linear/b").to_f32_vec().iter().all(|&x| x == 0.0));

    // SmartInit: empty is a no-op, a prefix restores, npz and missing paths are errors.
    let before = read(&s, "linear/b");
    SmartInit::new("").run_init(&mut s).expect("no-op");
    assert_eq!(read(&s, "linear/b"), before);
    let prefix = dir.path().join("model-2");
    SmartInit::new(prefix.to_str().expect("utf-8"))
        .run_init(&mut s)
        .expect("restore");
    assert_eq!(read(&s, "linear/b"), ckpt.tensors["linear/b"]);
    let err = SmartInit::new("weights.npz")
        .run_init(&mut s)
        .expect_err("npz");
    assert!(err.to_string().contains("npz"), "{err}");
    let missing = dir.path().join("nothing-here");
    let err = SmartInit::new(missing.to_str().expect("utf-8"))
        .run_init(&mut s)
        .expect_err("missing");
    assert!(err.to_string().contains("nothing-here"), "{err}");
}

#[test]
fn a_run_initialized_from_a_checkpoint_starts_from_its_weights() {
    let dir = tempfile::tempdir().expect("tempdir");
    trained_checkpoint(dir.path());
    let ckpt = towerpack::train::checkpoint::load_checkpoint(dir.path()).expect("ckpt");
    let probe = CallbackFactory::new("probe").on_before_train(move |ctx| {
        assert_eq!(ctx.read_variable("fc0/W")?, ckpt.tensors["fc0/W"]);
        // tensorpack: the checkpoint restores global_step too.
        assert_eq!(ctx.global_step(), 2);
        Ok(())
    });
    let c = bare(config(mlp_model(0.1), train_flow(64, 32, 2), None))
        .session_init(SaverRestore::new(dir.path()))
        .callback(probe)
        .starting_epoch(2)
        .max_epoch(2);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    assert_eq!(report.counters.global_step, 4);
}

#[test]
fn a_misspelled_predictor_output_suggests_the_closest_tensor_names() {
    let model: Arc<dyn ModelDesc> = Arc::new(mlp_model(0.1));
    let err = OfflinePredictor::new(PredictConfig::new(model, &["linear/ouptut"]))
        .err()
        .expect("the misspelled output is not found");
    assert!(
        matches!(&err, TrainError::TensorNotFound { name, .. } if name == "linear/ouptut"),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("did you mean `linear/output`"), "{text}");
    assert!(!text.contains("tower ``"), "{text}");
    // A name close to nothing suggests nothing.
    let model: Arc<dyn ModelDesc> = Arc::new(mlp_model(0.1));
    let err = OfflinePredictor::new(PredictConfig::new(model, &["zzzzzzzzzzzz"]))
        .err()
        .expect("not found");
    assert!(!err.to_string().contains("did you mean"), "{err}");
}

#[test]
fn a_misspelled_inferencer_fetch_suggests_the_closest_tensor_names() {
    use towerpack::train::callbacks::{InferenceRunner, Inferencer, ScalarStats};
    let infs: Vec<Box<dyn Inferencer>> = vec![Box::new(ScalarStats::new(&["cross_entropy_los"]))];
    let c = bare(config(mlp_model(0.1), train_flow(64, 32, 1), None))
        .callback(InferenceRunner::new(val_flow(40, 20), infs))
        .max_epoch(1);
    let err = launch_train_with_config(c, &mut SimpleTrainer::new())
        .err()
        .expect("the misspelled fetch is not found");
    let text = err.to_string();
    assert!(text.contains("did you mean `cross_entropy_loss`"), "{text}");
}
