//! Your own model, written against `towerpack::prelude` alone (the README's "Your own model"):
//! a small convnet as a tower function, trained on the embedded MNIST digits with validation
//! every epoch, a learning-rate schedule and checkpoints, then a predictor restored from the
//! last checkpoint.
//!
//! ```text
//! cargo run --release --example own_model
//! ```

use std::sync::Arc;

use towerpack::prelude::*;

/// One replica of the model: images and labels in, the cost to minimize out
/// (`classification_loss` also names the mean `cross_entropy_loss`).
fn tower(inputs: &[Tensor]) -> Tensor {
    let (image, label) = (&inputs[0], &inputs[1]);
    let logits = graph! {
        let l = Conv2D("conv0", image, filters = 32, kernel_size = 3, activation = relu);
        let l = MaxPooling("pool0", l, pool_size = 2);
        let l = Conv2D("conv1", l, filters = 64, kernel_size = 3, activation = relu);
        let l = MaxPooling("pool1", l, pool_size = 2);
        let l = FullyConnected("fc0", l, units = 128, activation = relu);
        FullyConnected("linear", l, units = 10)
    };
    classification_loss(&logits, label)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let digits = mnist10k_split()?;
    let train = digits.train.to_f32(1.0 / 255.0);
    let validation = digits.validation.to_f32(1.0 / 255.0);
    let inputs = vec![
        InputSpec::new("input", DType::F32, Shape::batched(&[28, 28, 1])),
        InputSpec::new("label", DType::I32, Shape::batched(&[])),
    ];
    let model = ModelFn::new(inputs, tower, Optimizer::momentum(0.05, 0.9));

    let validators: Vec<Box<dyn Inferencer>> = vec![
        Box::new(ScalarStats::new(&["cross_entropy_loss"])),
        Box::new(ClassificationError::from_logits("linear/output", "label")),
    ];
    let config = TrainConfig::new(model.clone())
        .dataflow(BatchData::new(train.to_flow(Some(1))?, 64, false)?)
        .callback(ModelSaver::new())
        .callback(InferenceRunner::new(
            BatchData::new(validation.to_flow(None)?, 200, true)?,
            validators,
        ))
        .callback(ScheduledHyperParamSetter::new(
            "learning_rate",
            &[(3, 0.01)],
        ))
        .logdir("train_log/own_model")
        .logdir_action(LogDirAction::Backup)
        .max_epoch(5);
    let report = launch_train_with_config(config, &mut SimpleTrainer::new())?;
    if let Some(&(_, error)) = report.history("validation_error").last() {
        println!("validation accuracy {:.2}%", (1.0 - error) * 100.0);
    }
    let logdir = report.logdir.ok_or("the run wrote no logdir")?;

    // Inference: the model's tower without training ops, weights from the last checkpoint.
    let mut predictor = OfflinePredictor::new(
        PredictConfig::new(Arc::new(model), &["linear/output"])
            .input_names(&["input"])
            .session_init(SaverRestore::new(&logdir)),
    )?;
    let logits = predictor.predict(&[validation.images().clone()])?[0].to_f32_vec();
    let labels = validation.labels().to_f32_vec();
    let right = logits
        .chunks(10)
        .zip(&labels)
        .filter(|&(row, &label)| argmax(row) == label as usize)
        .count();
    println!(
        "restored from {}: {right} of {} held-out digits right",
        logdir.display(),
        labels.len()
    );
    Ok(())
}

/// The index of the first largest value.
fn argmax(row: &[f32]) -> usize {
    (0..row.len()).fold(0, |best, i| if row[i] > row[best] { i } else { best })
}
