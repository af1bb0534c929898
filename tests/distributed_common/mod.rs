//! Shared fixtures of the distributed tests: MNIST shards laid out so that N ranks at batch B
//! see exactly what one process at batch N·B sees, a model without batch statistics, configs,
//! and variable comparisons.
#![allow(dead_code)]

use std::sync::OnceLock;

use towerpack::backend::Session;
use towerpack::data::{BatchData, LabeledImages, mnist10k_split};
use towerpack::models::Mlp;
use towerpack::optim::Optimizer;
use towerpack::tensor::HostTensor;
use towerpack::train::{BackendChoice, ModelFn, TrainConfig};

/// Per-rank (per-tower) batch.
pub const B: usize = 8;

/// The first 1024 training digits as f32.
pub fn digits() -> &'static LabeledImages {
    static DIGITS: OnceLock<LabeledImages> = OnceLock::new();
    DIGITS.get_or_init(|| {
        let split = mnist10k_split().expect("mnist10k");
        split
            .train
            .slice(0, 1024)
            .expect("slice")
            .to_f32(1.0 / 255.0)
    })
}

/// The examples part `part` of `parts` sees at batch `batch` for `steps` steps: batch `k` of
/// the whole job covers examples `[k·parts·batch, (k+1)·parts·batch)`, and part `p` takes the
/// `p`-th `batch` of them. Parts are ranks (or a rank's towers, in tower order, consecutive).
pub fn shard(parts: usize, part: usize, batch: usize, steps: usize) -> LabeledImages {
    shard_of_steps(parts, part, batch, 0..steps)
}

/// [`shard`] of the job's batches `steps` only.
pub fn shard_of_steps(
    parts: usize,
    part: usize,
    batch: usize,
    steps: std::ops::Range<usize>,
) -> LabeledImages {
    let all = digits();
    let (mut images, mut labels) = (Vec::new(), Vec::new());
    let count = steps.len();
    for k in steps {
        let piece = all
            .slice(k * parts * batch + part * batch, batch)
            .expect("enough digits");
        images.extend(piece.images().to_f32_vec());
        labels.extend(piece.labels().to_f64_vec().into_iter().map(|l| l as i32));
    }
    let mut shape = all.images().shape().to_vec();
    shape[0] = count * batch;
    LabeledImages::new(
        HostTensor::from_f32(&shape, images).expect("images"),
        HostTensor::from_i32(&[count * batch], labels).expect("labels"),
    )
    .expect("shard")
}

/// Interleaves the shards of consecutive parts `first..first + count` batch by batch (a rank
/// with `count` towers reads one batch per tower each step).
pub fn rank_data(
    parts: usize,
    first: usize,
    count: usize,
    batch: usize,
    steps: usize,
) -> LabeledImages {
    let shards: Vec<LabeledImages> = (first..first + count)
        .map(|p| shard(parts, p, batch, steps))
        .collect();
    let (mut images, mut labels) = (Vec::new(), Vec::new());
    for k in 0..steps {
        for s in &shards {
            let piece = s.slice(k * batch, batch).expect("batch");
            images.extend(piece.images().to_f32_vec());
            labels.extend(piece.labels().to_f64_vec().into_iter().map(|l| l as i32));
        }
    }
    let mut shape = digits().images().shape().to_vec();
    shape[0] = steps * count * batch;
    LabeledImages::new(
        HostTensor::from_f32(&shape, images).expect("images"),
        HostTensor::from_i32(&[steps * count * batch], labels).expect("labels"),
    )
    .expect("rank data")
}

/// `data` in order (no shuffling), in batches of `batch`.
pub fn flow(data: &LabeledImages, batch: usize) -> BatchData {
    BatchData::new(data.to_flow(None).expect("flow"), batch, false).expect("batch")
}

/// A 784-32-10 MLP (weight decay, no batch statistics, no dropout) with momentum SGD.
pub fn model(hidden: usize) -> ModelFn {
    let mlp = Mlp {
        input_shape: vec![28, 28, 1],
        hidden: vec![hidden],
        classes: 10,
        ..Mlp::default()
    };
    ModelFn::new(
        mlp.inputs(),
        move |x| mlp.build(x),
        Optimizer::momentum(0.1, 0.9),
    )
}

/// Training `data` at `batch` for `epochs` epochs of `steps_per_epoch`, one CPU thread, no
/// default callbacks or monitors, seed 7.
pub fn config(
    data: &LabeledImages,
    batch: usize,
    steps_per_epoch: u64,
    epochs: u64,
) -> TrainConfig {
    TrainConfig::new(model(32))
        .dataflow(flow(data, batch))
        .backend(BackendChoice::Cpu { threads: 1 })
        .seed(7)
        .steps_per_epoch(steps_per_epoch)
        .max_epoch(epochs)
        .extra_callbacks(Vec::new())
        .monitors(Vec::new())
}

/// Every global variable's name and bytes.
pub fn variables(session: &dyn Session) -> Vec<(String, HostTensor)> {
    let graph = session.graph();
    towerpack::tower::VarCollection::Global
        .variables(graph)
        .into_iter()
        .map(|id| {
            let value = session.read_variable(id).expect("read");
            (graph.variable(id).name.clone(), value)
        })
        .collect()
}

/// The largest `max|a − b| / max|b|` over the f32 variables (the relative difference of each
/// variable as a whole); panics when the variable lists differ.
pub fn max_relative_difference(a: &[(String, HostTensor)], b: &[(String, HostTensor)]) -> f64 {
    assert_eq!(
        a.iter().map(|v| &v.0).collect::<Vec<_>>(),
        b.iter().map(|v| &v.0).collect::<Vec<_>>()
    );
    let mut worst = 0f64;
    for ((name, x), (_, y)) in a.iter().zip(b) {
        let (x, y) = (x.to_f64_vec(), y.to_f64_vec());
        let scale = y.iter().fold(0f64, |m, v| m.max(v.abs()));
        let diff = x
            .iter()
            .zip(&y)
            .fold(0f64, |m, (p, q)| m.max((p - q).abs()));
        let rel = if scale > 0.0 { diff / scale } else { diff };
        assert!(rel.is_finite(), "{name}");
        worst = worst.max(rel);
    }
    worst
}

/// Whether two variable lists are bit-identical.
pub fn identical(a: &[(String, HostTensor)], b: &[(String, HostTensor)]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.0 == y.0 && x.1.to_le_bytes() == y.1.to_le_bytes())
}
