//! Shared helpers of the data-flow tests: small datapoints, pipeline builders, and the generic
//! checks (resume equals the uninterrupted run; skip equals pulling).
#![allow(dead_code)]

use towerpack::data::{
    BatchData, DataFlow, DataFromList, Datapoint, FixedSizeData, FlowState, LocallyShuffleData,
    MapData, RepeatedData,
};
use towerpack::tensor::HostTensor;

/// Datapoint `i`: `[f32 [2] = (i, 10 i), i32 scalar i]`.
pub fn item(i: usize) -> Datapoint {
    vec![
        HostTensor::from_f32(&[2], vec![i as f32, 10.0 * i as f32]).expect("2 elements"),
        HostTensor::from_i32(&[], vec![i as i32]).expect("scalar"),
    ]
}

pub fn items(n: usize) -> Vec<Datapoint> {
    (0..n).map(item).collect()
}

/// The label (component 1) of datapoints or of a batch, as integers.
pub fn ids(dp: &Datapoint) -> Vec<i64> {
    dp[1].to_f64_vec().into_iter().map(|v| v as i64).collect()
}

/// `steps` results of `next_datapoint`, with `None` for each end of pass.
pub fn run(flow: &mut dyn DataFlow, steps: usize) -> Vec<Option<Datapoint>> {
    (0..steps)
        .map(|_| flow.next_datapoint().expect("flow runs"))
        .collect()
}

/// Pass contents as label lists: the datapoints up to each end of pass.
pub fn passes(flow: &mut dyn DataFlow, count: usize) -> Vec<Vec<i64>> {
    (0..count)
        .map(|_| {
            let mut out = Vec::new();
            while let Some(dp) = flow.next_datapoint().expect("flow runs") {
                out.extend(ids(&dp));
            }
            out
        })
        .collect()
}

pub fn ready(mut flow: Box<dyn DataFlow>) -> Box<dyn DataFlow> {
    flow.reset_state().expect("reset_state");
    flow
}

/// Adds noise keyed by `(seed, pass, index)` to component 0.
pub fn noisy(inner: impl DataFlow + 'static, seed: u64) -> MapData {
    MapData::new(inner, move |mut dp, ctx| {
        let key = ctx.key(seed);
        let v: Vec<f32> = dp[0]
            .to_f32_vec()
            .iter()
            .enumerate()
            .map(|(j, x)| x + key.uniform(j as u64) as f32)
            .collect();
        dp[0] = HostTensor::from_f32(&[2], v)?;
        Ok(dp)
    })
}

/// Drops datapoints whose label is a multiple of 3.
pub fn drop_thirds(inner: impl DataFlow + 'static) -> MapData {
    MapData::filter_map(inner, |dp, _| {
        let keep = dp[1].scalar_value()? as i64 % 3 != 0;
        Ok(keep.then_some(dp))
    })
}

pub type Builder = fn() -> Box<dyn DataFlow>;

/// Pipelines exercising every combinator, each cheap enough to check at every cut point.
pub fn pipelines() -> Vec<(&'static str, Builder)> {
    vec![
        ("list", || Box::new(DataFromList::new(items(7)))),
        ("shuffled", || Box::new(DataFromList::shuffled(items(7), 1))),
        ("batch remainder", || {
            Box::new(BatchData::new(DataFromList::shuffled(items(10), 2), 3, true).expect("batch"))
        }),
        ("batch drop", || {
            Box::new(BatchData::new(DataFromList::shuffled(items(10), 2), 3, false).expect("batch"))
        }),
        ("map batch", || {
            let map = noisy(DataFromList::shuffled(items(9), 3), 77);
            Box::new(BatchData::new(map, 2, true).expect("batch"))
        }),
        ("filter batch", || {
            let map = drop_thirds(DataFromList::shuffled(items(11), 4));
            Box::new(BatchData::new(map, 2, true).expect("batch"))
        }),
        ("repeat batch", || {
            let rep = RepeatedData::new(DataFromList::shuffled(items(5), 5), Some(2)).expect("rep");
            Box::new(BatchData::new(rep, 3, true).expect("batch"))
        }),
        ("repeat forever", || {
            let rep = RepeatedData::new(DataFromList::shuffled(items(5), 6), None).expect("rep");
            Box::new(BatchData::new(noisy(rep, 8), 4, false).expect("batch"))
        }),
        ("fixed keep", || {
            Box::new(FixedSizeData::new(
                DataFromList::shuffled(items(7), 7),
                4,
                true,
            ))
        }),
        ("fixed fresh", || {
            Box::new(FixedSizeData::new(
                noisy(DataFromList::shuffled(items(7), 7), 1),
                4,
                false,
            ))
        }),
        ("local shuffle", || {
            let local = LocallyShuffleData::new(DataFromList::new(items(8)), 3, 9).expect("local");
            Box::new(BatchData::new(local, 2, true).expect("batch"))
        }),
        ("everything", || {
            let map = noisy(DataFromList::shuffled(items(11), 10), 11);
            let local = LocallyShuffleData::new(map, 4, 12).expect("local");
            let rep = RepeatedData::new(local, Some(2)).expect("rep");
            let fixed = FixedSizeData::new(rep, 6, false);
            Box::new(BatchData::new(fixed, 4, true).expect("batch"))
        }),
    ]
}

/// Restoring the state taken after `k` steps (via JSON) continues exactly like the
/// uninterrupted run, for every `k < total`. `wrap` builds the flow under test around a
/// pipeline (identity, or a prefetcher).
pub fn check_resume_everywhere(name: &str, build: &dyn Fn() -> Box<dyn DataFlow>, total: usize) {
    let full = run(ready(build()).as_mut(), total);
    for k in 0..total {
        let mut a = ready(build());
        assert_eq!(run(a.as_mut(), k), full[..k], "{name}: prefix of {k}");
        let json = a.state().to_json();
        drop(a);
        let mut b = ready(build());
        let state = FlowState::from_json(&json).expect("state JSON");
        b.restore(&state).expect("restore");
        assert_eq!(
            run(b.as_mut(), total - k),
            full[k..],
            "{name}: resumed after {k}"
        );
    }
}

/// `skip(n)` after `k` steps leaves the same state and continuation as pulling `n` datapoints.
pub fn check_skip_everywhere(name: &str, build: &dyn Fn() -> Box<dyn DataFlow>, total: usize) {
    for k in 0..total {
        for n in [0, 1, 2, 3, 5, 8] {
            let mut a = ready(build());
            let mut b = ready(build());
            run(a.as_mut(), k);
            run(b.as_mut(), k);
            let skipped = a.skip(n).expect("skip");
            let mut pulled = 0;
            let mut ended = false;
            while pulled < n {
                if b.next_datapoint().expect("next").is_none() {
                    ended = true;
                    break;
                }
                pulled += 1;
            }
            assert_eq!(
                (skipped.count, skipped.pass_ended),
                (pulled, ended),
                "{name}: k={k} n={n}"
            );
            assert_eq!(a.state(), b.state(), "{name}: k={k} n={n}");
            assert_eq!(
                run(a.as_mut(), 12),
                run(b.as_mut(), 12),
                "{name}: k={k} n={n}"
            );
        }
    }
}
