//! Throughput of the ResNet-style input pipeline on the embedded MNIST, without and with
//! prefetch workers. Ignored by default (timings are noisy on a shared machine and are never
//! asserted); run with `cargo test --release --test data_speed -- --ignored --nocapture`.

use std::sync::Arc;
use towerpack::data::{
    AugmentImageComponent, BatchData, CenterPaste, DataFlow, Flip, ImageAugmentor, Normalize,
    PrefetchData, RandomCrop, mnist10k_split, test_data_speed,
};

fn pipeline(workers: usize) -> Box<dyn DataFlow> {
    let train = mnist10k_split().expect("embedded").train;
    let rgb = train.pad_and_replicate(2, 3).expect("pad");
    let source = rgb.to_flow(Some(1)).expect("flow");
    let augmentors: Vec<Arc<dyn ImageAugmentor>> = vec![
        Arc::new(CenterPaste::new(40, 40)),
        Arc::new(RandomCrop::new(32, 32)),
        Arc::new(Flip::horizontal()),
        Arc::new(Normalize::per_channel(vec![33.0; 3], vec![78.0; 3])),
    ];
    let augmented = AugmentImageComponent::new(source, 0, augmentors, 7);
    let batched = BatchData::new(augmented, 128, false).expect("batch");
    if workers == 0 {
        Box::new(batched)
    } else {
        Box::new(PrefetchData::new(batched, workers, 8).expect("prefetch"))
    }
}

#[test]
#[ignore = "timing report, run explicitly"]
fn report_pipeline_speed() {
    let start = std::time::Instant::now();
    let set = mnist10k_split().expect("embedded");
    println!(
        "mnist10k parse + split: {:?} ({} train)",
        start.elapsed(),
        set.train.len()
    );
    for round in 0..2 {
        for workers in [0, 1, 2] {
            let mut flow = pipeline(workers);
            flow.reset_state().expect("reset");
            let speed = test_data_speed(flow.as_mut(), 40).expect("speed");
            println!(
                "round {round}, {workers} workers: {:.1} batches/s ({:.0} images/s)",
                speed.per_second(),
                speed.per_second() * 128.0
            );
        }
    }
}
