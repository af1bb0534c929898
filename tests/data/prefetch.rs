//! PrefetchData: ordered delivery equal to the unprefetched flow for any number of workers,
//! exact resume through it (the composed augmenting pipeline), error and panic propagation,
//! and shutdown on drop.

use crate::data_common;

use data_common::*;
use std::sync::Arc;
use towerpack::data::{
    AugmentImageComponent, BatchData, CenterPaste, DataError, DataFlow, DataFromList, Datapoint,
    Flip, FlowState, ImageAugmentor, MapData, PrefetchData, RandomCrop, RepeatedData, Skipped,
};
use towerpack::tensor::HostTensor;

#[test]
fn prefetch_delivers_exactly_the_unprefetched_sequence() {
    for (name, build) in pipelines() {
        let full = run(ready(build()).as_mut(), 40);
        for workers in [1, 2, 3] {
            for queue in [1, 5] {
                let mut pre = ready(Box::new(
                    PrefetchData::new(build(), workers, queue).expect("p"),
                ));
                assert_eq!(pre.len(), build().len());
                assert_eq!(
                    run(pre.as_mut(), 40),
                    full,
                    "{name}: {workers} workers, queue {queue}"
                );
            }
        }
    }
}

#[test]
fn resume_through_prefetch_at_every_position() {
    for (name, build) in pipelines() {
        let wrapped = move || -> Box<dyn DataFlow> {
            Box::new(PrefetchData::new(build(), 2, 4).expect("prefetch"))
        };
        check_resume_everywhere(name, &wrapped, 25);
    }
}

/// Small random HWC `u8` images with labels, as an image data set would yield.
fn images(n: usize) -> Vec<Datapoint> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
    (0..n)
        .map(|i| {
            let px: Vec<f64> = (0..6 * 6 * 3)
                .map(|_| f64::from(rng.random::<u8>()))
                .collect();
            vec![
                HostTensor::from_f64_values(towerpack::tensor::DType::U8, &[6, 6, 3], px)
                    .expect("image"),
                HostTensor::from_i32(&[], vec![i as i32]).expect("label"),
            ]
        })
        .collect()
}

/// DataFromList(shuffle) → augment (paste, random crop, flip) → BatchData → PrefetchData
/// (without the prefetcher for `workers = 0`).
fn composed(workers: usize) -> Box<dyn DataFlow> {
    let augmentors: Vec<Arc<dyn ImageAugmentor>> = vec![
        Arc::new(CenterPaste::new(10, 10)),
        Arc::new(RandomCrop::new(6, 6)),
        Arc::new(Flip::horizontal()),
    ];
    let source = DataFromList::shuffled(images(23), 2024);
    let augmented = AugmentImageComponent::new(source, 0, augmentors, 99);
    let batched = BatchData::new(augmented, 4, true).expect("batch");
    if workers == 0 {
        return Box::new(batched);
    }
    Box::new(PrefetchData::new(batched, workers, 6).expect("prefetch"))
}

#[test]
fn composed_pipeline_resumes_bit_identically_mid_pass() {
    // 3 passes of 6 batches (5 full + remainder of 3) with their end markers.
    let total = 3 * 7;
    let full = run(ready(composed(2)).as_mut(), total);
    assert_eq!(full.iter().filter(|b| b.is_none()).count(), 3);
    // Augmentation really varies: the same image is cropped/flipped differently across passes.
    let unaugmented = run(
        ready(Box::new(
            BatchData::new(DataFromList::shuffled(images(23), 2024), 4, true).expect("b"),
        ))
        .as_mut(),
        total,
    );
    assert_ne!(full, unaugmented);
    assert_eq!(run(ready(composed(0)).as_mut(), total), full);
    for k in [0, 1, 3, 6, 7, 8, 12, 13, 17, 20] {
        let mut a = ready(composed(2));
        assert_eq!(run(a.as_mut(), k), full[..k]);
        let json = a.state().to_json();
        drop(a);
        for workers in [1, 2, 3] {
            let mut b = ready(composed(workers));
            b.restore(&FlowState::from_json(&json).expect("json"))
                .expect("restore");
            assert_eq!(
                run(b.as_mut(), total - k),
                full[k..],
                "cut {k}, {workers} workers"
            );
        }
    }
}

#[test]
fn a_worker_error_arrives_in_order_and_the_flow_recovers() {
    let build = || {
        let map = MapData::new(DataFromList::new(items(20)), |dp, ctx| {
            if ctx.index == 7 {
                Err(DataError::msg("datapoint seven is broken"))
            } else {
                Ok(dp)
            }
        });
        PrefetchData::new(map, 3, 4).expect("prefetch")
    };
    let mut flow = build();
    flow.reset_state().expect("reset");
    for i in 0..7 {
        assert_eq!(
            ids(&flow
                .next_datapoint()
                .expect("before the error")
                .expect("item")),
            vec![i]
        );
    }
    let err = flow.next_datapoint().unwrap_err();
    assert!(err.to_string().contains("seven is broken"), "{err}");
    // The position is unchanged by the error: retrying hits it again, deterministically.
    let err = flow.next_datapoint().unwrap_err();
    assert!(err.to_string().contains("datapoint 7 of pass 0"), "{err}");
    // Skipping past it works.
    assert_eq!(
        flow.skip(1).expect("skip"),
        Skipped {
            count: 1,
            pass_ended: false
        }
    );
    assert_eq!(
        ids(&flow.next_datapoint().expect("after").expect("item")),
        vec![8]
    );
}

#[test]
fn a_panicking_worker_is_an_error_not_a_hang() {
    let map = MapData::new(DataFromList::new(items(10)), |dp, ctx| {
        assert!(ctx.index != 4, "worker bug at index 4");
        Ok(dp)
    });
    let mut flow = PrefetchData::new(map, 2, 2).expect("prefetch");
    flow.reset_state().expect("reset");
    let mut result = Ok(None);
    for _ in 0..10 {
        result = flow.next_datapoint();
        if result.is_err() {
            break;
        }
    }
    match result {
        Err(DataError::WorkerPanicked { message, .. }) => {
            assert!(message.contains("worker bug at index 4"), "{message}")
        }
        other => panic!("expected a worker panic, got {other:?}"),
    }
}

#[test]
fn drop_stops_workers_blocked_on_a_full_queue() {
    for workers in [1, 4] {
        let forever = RepeatedData::new(DataFromList::new(items(3)), None).expect("rep");
        let mut flow = PrefetchData::new(forever, workers, 2).expect("prefetch");
        flow.reset_state().expect("reset");
        assert!(flow.next_datapoint().expect("runs").is_some());
        std::thread::sleep(std::time::Duration::from_millis(20));
        drop(flow); // Joins: the test would hang here if workers did not stop.
    }
}

/// A user flow without `fork`.
struct Counter {
    next: u64,
    ready: bool,
}

impl DataFlow for Counter {
    fn name(&self) -> &'static str {
        "Counter"
    }
    fn reset_state(&mut self) -> Result<(), DataError> {
        self.ready = true;
        Ok(())
    }
    fn len(&self) -> Option<usize> {
        None
    }
    fn next_datapoint(&mut self) -> Result<Option<Datapoint>, DataError> {
        assert!(self.ready);
        self.next += 1;
        Ok(Some(vec![HostTensor::scalar_i64(self.next as i64)]))
    }
    fn state(&self) -> FlowState {
        FlowState::new("Counter", vec![self.next], Vec::new())
    }
    fn restore(&mut self, state: &FlowState) -> Result<(), DataError> {
        state.check("Counter", 1, 0)?;
        self.next = state.counters[0];
        Ok(())
    }
}

#[test]
fn one_worker_needs_no_fork_several_do() {
    let mut one = PrefetchData::new(
        Counter {
            next: 0,
            ready: false,
        },
        1,
        3,
    )
    .expect("prefetch");
    one.reset_state().expect("reset");
    let got: Vec<f64> = (0..5)
        .map(|_| {
            one.next_datapoint().expect("ok").expect("item")[0]
                .scalar_value()
                .expect("scalar")
        })
        .collect();
    assert_eq!(got, vec![1.0, 2.0, 3.0, 4.0, 5.0]);
    let state = one.state();
    one.restore(&state).expect("restore");
    assert_eq!(
        one.next_datapoint().expect("ok").expect("item")[0]
            .scalar_value()
            .expect("s"),
        6.0
    );

    let mut two = PrefetchData::new(
        Counter {
            next: 0,
            ready: false,
        },
        2,
        3,
    )
    .expect("prefetch");
    two.reset_state().expect("reset");
    assert!(matches!(
        two.next_datapoint(),
        Err(DataError::NotForkable { flow: "Counter" })
    ));
    assert!(
        PrefetchData::new(
            Counter {
                next: 0,
                ready: false
            },
            0,
            3
        )
        .is_err()
    );
}
