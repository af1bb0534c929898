//! Issue 3's end-to-end checks: models learn on the embedded mnist10k data, with
//! `SimpleTrainer`'s training graph (`build_training_graph`) stepped on the compiled CPU
//! backend by a bare loop (no callbacks), measured on the 2,000 held-out images (never trained
//! on), and the MLP's training graph is snapshotted in textual form.

use std::sync::Arc;
use std::time::Instant;
use towerpack::backend::cpu::{CpuOptions, CpuSession};
use towerpack::backend::{Feed, Session, Step};
use towerpack::data::{
    AugmentImageComponent, BatchData, CenterPaste, DataFlow, ImageAugmentor, RandomCrop,
    mnist10k_split,
};
use towerpack::dsl::TowerHandle;
use towerpack::models::{ConvNet, Mlp};
use towerpack::optim::{LEARNING_RATE, Optimizer};
use towerpack::tensor::HostTensor;
use towerpack::train::{ModelFn, build_training_graph};

/// A bare training loop over `SimpleTrainer`'s graph of a model and an inference tower
/// sharing its variables: what the trainer's step counter, `RunUpdateOps`, a learning-rate
/// schedule and a validation callback would do, without the callbacks.
struct Driver {
    session: CpuSession,
    step: Step,
    train: TowerHandle,
    inference: TowerHandle,
}

/// One feed per tower input, in signature order.
fn feeds(tower: &TowerHandle, batch: &[HostTensor]) -> Vec<Feed> {
    assert_eq!(batch.len(), tower.inputs.len(), "one tensor per input");
    tower
        .inputs
        .iter()
        .zip(batch)
        .map(|((_, id), t)| (*id, t.clone()))
        .collect()
}

impl Driver {
    /// The graph of `model` (graph and initialization seed 0) on a CPU session, one worker
    /// thread per core.
    fn new(model: &ModelFn) -> Driver {
        let mut tg = build_training_graph(model, 0).expect("training graph");
        let inference = tg
            .add_inference_tower(model, "InferenceTower")
            .expect("inference tower");
        let mut session = CpuSession::new(tg.graph, CpuOptions::default()).expect("session");
        session.initialize_variables(0).expect("initialize");
        Driver {
            session,
            step: tg.step,
            train: tg.tower,
            inference,
        }
    }

    /// Sets the optimizer's `learning_rate` variable (what a schedule callback does).
    fn set_learning_rate(&mut self, lr: f64) {
        let var = self
            .session
            .graph()
            .find_variable(LEARNING_RATE)
            .expect("learning_rate");
        self.session
            .write_variable(var, &HostTensor::scalar_f32(lr as f32))
            .expect("write learning_rate");
    }

    /// Runs one pass of `flow` (batched datapoints) and returns the mean cost.
    fn train_epoch(&mut self, flow: &mut dyn DataFlow) -> f64 {
        let (mut sum, mut n) = (0.0, 0usize);
        while let Some(batch) = flow.next_datapoint().expect("datapoint") {
            let out = self
                .session
                .run(&self.step, &feeds(&self.train, &batch))
                .expect("training step");
            sum += out[0].scalar_value().expect("scalar cost");
            n += 1;
        }
        sum / n.max(1) as f64
    }

    /// The fraction of examples of one pass of `flow` whose inference-tower `wrong_vector` is
    /// set: the exact error rate, whatever the last batch's size.
    fn error_rate(&mut self, flow: &mut dyn DataFlow) -> f64 {
        let wrong = self
            .inference
            .get_tensor(self.session.graph(), "wrong_vector")
            .expect("wrong_vector");
        let step = Step::fetch(vec![wrong]);
        let (mut wrong_sum, mut count) = (0.0, 0usize);
        while let Some(batch) = flow.next_datapoint().expect("datapoint") {
            let out = self
                .session
                .run(&step, &feeds(&self.inference, &batch))
                .expect("validation step");
            wrong_sum += out[0].to_f64_vec().iter().sum::<f64>();
            count += out[0].len();
        }
        wrong_sum / count.max(1) as f64
    }
}

/// Training batches (shuffled, and shifted by up to ±2 pixels when `augment`) and validation
/// batches (the 2,000 held-out images, unaugmented).
fn flows(batch: usize, seed: u64, augment: bool) -> (BatchData, BatchData) {
    let split = mnist10k_split().expect("embedded data");
    let train = split
        .train
        .to_f32(1.0 / 255.0)
        .to_flow(Some(seed))
        .expect("flow");
    let shift: Vec<Arc<dyn ImageAugmentor>> = if augment {
        vec![
            Arc::new(CenterPaste::new(32, 32)),
            Arc::new(RandomCrop::new(28, 28)),
        ]
    } else {
        Vec::new()
    };
    let train = AugmentImageComponent::new(train, 0, shift, seed);
    let val = split
        .validation
        .to_f32(1.0 / 255.0)
        .to_flow(None)
        .expect("flow");
    let mut train = BatchData::new(train, batch, false).expect("batch");
    let mut val = BatchData::new(val, 500, true).expect("batch");
    train.reset_state().expect("reset");
    val.reset_state().expect("reset");
    (train, val)
}

/// Trains with `schedule` (learning rate per epoch) and checks the final held-out accuracy.
fn train_to(trainer: &mut Driver, schedule: &[f64], augment: bool, want_accuracy: f64, what: &str) {
    let (mut train, mut val) = flows(64, 1, augment);
    let start = Instant::now();
    let mut accuracy = 0.0;
    for (epoch, &lr) in (1..).zip(schedule) {
        trainer.set_learning_rate(lr);
        let cost = trainer.train_epoch(&mut train);
        accuracy = 1.0 - trainer.error_rate(&mut val);
        eprintln!(
            "{what}: epoch {epoch}: mean cost {cost:.4}, held-out accuracy {:.2}% ({:.1} s)",
            accuracy * 100.0,
            start.elapsed().as_secs_f64()
        );
    }
    assert!(
        accuracy >= want_accuracy,
        "{what}: held-out accuracy {:.2}% < {:.1}%",
        accuracy * 100.0,
        want_accuracy * 100.0
    );
}

#[test]
fn mlp_reaches_96_percent_on_held_out_digits() {
    // 8,000 training images are few for an MLP: PyTorch reaches 95.4% with the plain model
    // (same data, same schedule); small random shifts and dropout 0.2 bring it to ~97%.
    // Measured (issue 21), held-out accuracy after the last epoch by SIMD level
    // (TOWERPACK_SIMD) × threads: scalar 97.65 / 97.65, avx2 97.50 / 97.50, avx512 97.50 /
    // 97.50 (1 / 2 threads): 1.5 points clear of the bar on every path.
    let model = Mlp {
        input_shape: vec![28, 28, 1],
        dropout_rate: 0.2,
        ..Mlp::default()
    };
    let mut t = Driver::new(&ModelFn::new(
        model.inputs(),
        move |x| model.build(x),
        Optimizer::momentum(0.05, 0.9),
    ));
    let schedule = [0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.005, 0.005, 0.005];
    train_to(&mut t, &schedule, true, 0.96, "mlp");
}

#[test]
fn convnet_reaches_98_percent_on_held_out_digits() {
    let model = ConvNet {
        dropout_rate: 0.25,
        ..ConvNet::default()
    };
    let mut t = Driver::new(&ModelFn::new(
        model.inputs(),
        move |x| model.build(x),
        Optimizer::momentum(0.05, 0.9),
    ));
    // 16 epochs: 8 at 0.05, 4 at 0.01, 4 at 0.002. The former recipe (6 at 0.05, 3 at 0.005)
    // stopped while the model was still underfitting (training cost ~0.17) and landed ON the
    // bar: 97.75–98.30% over init seeds and SIMD paths here, 97.80% on an AVX2-only AMD EPYC
    // (issue 21), so a change of summation order alone could fail it. Longer training with a
    // gentler decay (tried: 12 epochs 0.05/0.005, a 12-epoch cosine, weight decay 5e-4 and
    // dropout 0.5 — the regularised ones underfit further, 97.5–97.9%) lifts the plateau.
    // Measured held-out accuracy of this recipe after the last epoch, by SIMD level
    // (TOWERPACK_SIMD) × threads (RAYON_NUM_THREADS), on an AVX-512 Xeon (avx2 forced: the
    // same convolution bits — conv1 runs Winograd, bit-identical at both levels — and the GEMM
    // crate's AVX2 kernels for the dense layers), 2026-11-28:
    //   avx512: 98.45 (1 thread), 98.45 (2 threads)
    //   avx2:   98.50 (1 thread), 98.50 (2 threads)
    // Before Winograd (direct kernels): avx512 98.40 / 98.50, avx2 98.30 / 98.35, init seed 1:
    // 98.70. Spread 98.30–98.70 over both: 0.3 points clear of the bar at worst. The scalar
    // level was not measured (about 10× slower here); epochs 13–16 wander by ±0.15 on every
    // path, so this model's plateau on 8,000 images is about 98.5%.
    let schedule = [
        0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.01, 0.01, 0.01, 0.01, 0.002, 0.002,
        0.002, 0.002,
    ];
    train_to(&mut t, &schedule, true, 0.98, "convnet");
}

#[test]
fn mlp_training_graph_snapshot() {
    let model = Mlp {
        input_shape: vec![28, 28, 1],
        ..Mlp::default()
    };
    let model = ModelFn::new(
        model.inputs(),
        move |x| model.build(x),
        Optimizer::momentum(0.05, 0.9),
    );
    let tg = build_training_graph(&model, 0).expect("training graph");
    let text = towerpack::ir::text::print(&tg.graph);
    insta::with_settings!({snapshot_path => "../../snapshots", prepend_module_to_snapshot => false}, {
        insta::assert_snapshot!("train_mlp_training_graph", text);
    });
}
