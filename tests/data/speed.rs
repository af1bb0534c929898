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

/// CPU seconds used by this process so far (all threads, joined ones included), from
/// `/proc/self/stat` (Linux; 0 elsewhere).
fn process_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesized command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<f64> = rest
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    // `rest` starts at field 3 (state, not numeric, skipped by the parse filter).
    fields
        .get(10)
        .zip(fields.get(11))
        .map_or(0.0, |(u, s)| (u + s) / 100.0)
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
            let cpu = process_cpu_seconds();
            let speed = test_data_speed(flow.as_mut(), 300).expect("speed");
            drop(flow);
            let cpu = process_cpu_seconds() - cpu;
            println!(
                "round {round}, {workers} workers: {:.1} batches/s ({:.0} images/s), {:.2} ms CPU per batch",
                speed.per_second(),
                speed.per_second() * 128.0,
                1000.0 * cpu / 300.0
            );
        }
    }
}
