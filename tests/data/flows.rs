//! DataFlow combinators: per-combinator semantics (lengths, remainders, shuffles, continuation),
//! exact resume from a saved state at every position, and `skip` equal to pulling.

use crate::data_common;

use data_common::*;
use towerpack::data::{
    BatchData, DataError, DataFlow, DataFromList, DatapointContext, FixedSizeData, FlowState,
    LocallyShuffleData, MapData, MapDataComponent, RepeatedData, test_data_speed,
};
use towerpack::tensor::HostTensor;

#[test]
fn list_in_order_and_shuffled_per_pass() {
    let mut plain = ready(Box::new(DataFromList::new(items(6))));
    assert_eq!(plain.len(), Some(6));
    let p = passes(plain.as_mut(), 2);
    assert_eq!(p, vec![vec![0, 1, 2, 3, 4, 5]; 2]);

    let mut shuffled = ready(Box::new(DataFromList::shuffled(items(50), 3)));
    let p = passes(shuffled.as_mut(), 3);
    for pass in &p {
        let mut sorted = pass.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
    }
    assert_ne!(p[0], p[1], "passes are reshuffled");
    assert_ne!(p[1], p[2]);
    assert_ne!(p[0], (0..50).collect::<Vec<_>>());
    let mut again = ready(Box::new(DataFromList::shuffled(items(50), 3)));
    assert_eq!(passes(again.as_mut(), 3), p, "reproducible from the seed");
    let mut other = ready(Box::new(DataFromList::shuffled(items(50), 4)));
    assert_ne!(passes(other.as_mut(), 1)[0], p[0], "the seed matters");
}

#[test]
fn sources_refuse_to_run_before_reset_state() {
    let mut flow = DataFromList::new(items(3));
    assert!(matches!(
        flow.next_datapoint(),
        Err(DataError::NotReset { .. })
    ));
    let mut batch = BatchData::new(DataFromList::new(items(3)), 2, true).expect("batch");
    assert!(matches!(
        batch.next_datapoint(),
        Err(DataError::NotReset { .. })
    ));
    batch.reset_state().expect("reset");
    assert!(batch.next_datapoint().expect("runs").is_some());
}

#[test]
fn batch_lengths_remainder_and_stacking() {
    let mut with = ready(Box::new(
        BatchData::new(DataFromList::new(items(10)), 3, true).expect("b"),
    ));
    assert_eq!(with.len(), Some(4));
    let batches: Vec<_> = run(with.as_mut(), 5);
    let sizes: Vec<_> = batches
        .iter()
        .map(|b| b.as_ref().map(|b| b[1].shape()[0]))
        .collect();
    assert_eq!(sizes, vec![Some(3), Some(3), Some(3), Some(1), None]);
    let first = batches[0].as_ref().expect("batch");
    assert_eq!(first[0].shape(), &[3, 2]);
    assert_eq!(first[0].to_f32_vec(), vec![0.0, 0.0, 1.0, 10.0, 2.0, 20.0]);
    assert_eq!(first[1].shape(), &[3]);

    let mut without = ready(Box::new(
        BatchData::new(DataFromList::new(items(10)), 3, false).expect("b"),
    ));
    assert_eq!(without.len(), Some(3));
    assert_eq!(
        passes(without.as_mut(), 2),
        vec![(0..9).collect::<Vec<_>>(); 2]
    );

    let exact = BatchData::new(DataFromList::new(items(9)), 3, true).expect("b");
    assert_eq!(exact.len(), Some(3));
    assert!(matches!(
        BatchData::new(DataFromList::new(items(2)), 3, false),
        Err(DataError::Config { .. })
    ));
    assert!(BatchData::new(DataFromList::new(items(2)), 0, true).is_err());
}

#[test]
fn batch_errors_name_component_and_shapes() {
    let mut dps = items(4);
    dps[2][0] = HostTensor::from_f32(&[3], vec![0.0; 3]).expect("3");
    let mut flow = BatchData::new(DataFromList::new(dps), 4, false).expect("b");
    flow.reset_state().expect("reset");
    let err = flow.next_datapoint().unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("component 0") && text.contains("datapoint 2"),
        "{text}"
    );
    assert!(text.contains("[3]") && text.contains("[2]"), "{text}");

    let mut dps = items(2);
    dps[1].push(HostTensor::scalar_f32(1.0));
    let mut flow = BatchData::new(DataFromList::new(dps), 2, false).expect("b");
    flow.reset_state().expect("reset");
    let err = flow.next_datapoint().unwrap_err();
    assert!(matches!(
        err,
        DataError::ComponentCount {
            position: 1,
            expected: 2,
            got: 3
        }
    ));
}

#[test]
fn map_sees_pass_and_index_and_may_drop() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let map = MapData::new(
        DataFromList::new(items(3)),
        move |dp, ctx: DatapointContext| {
            log.lock().expect("lock").push((ctx.pass, ctx.index));
            Ok(dp)
        },
    );
    let mut flow = ready(Box::new(map));
    passes(flow.as_mut(), 2);
    let want = vec![(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)];
    assert_eq!(*seen.lock().expect("lock"), want);

    let mut filtered = ready(Box::new(drop_thirds(DataFromList::new(items(10)))));
    assert_eq!(
        filtered.len(),
        Some(10),
        "len may be inaccurate: it is the input's"
    );
    assert_eq!(passes(filtered.as_mut(), 1)[0], vec![1, 2, 4, 5, 7, 8]);

    let failing = MapData::new(DataFromList::new(items(5)), |dp, ctx| {
        if ctx.index == 3 {
            Err(DataError::msg("bad datapoint"))
        } else {
            Ok(dp)
        }
    });
    let mut flow = ready(Box::new(failing));
    run(flow.as_mut(), 3);
    let text = flow.next_datapoint().unwrap_err().to_string();
    assert!(
        text.contains("datapoint 3 of pass 0") && text.contains("bad datapoint"),
        "{text}"
    );
}

#[test]
fn map_component_touches_one_component() {
    let map = MapDataComponent::new(DataFromList::new(items(4)), 1, |t, _| {
        Ok(HostTensor::from_i32(
            &[],
            vec![t.scalar_value()? as i32 * 100],
        )?)
    });
    let mut flow = ready(Box::new(map));
    let out = flow.collect_pass().expect("pass");
    for (i, dp) in out.iter().enumerate() {
        assert_eq!(dp[0], item(i)[0]);
        assert_eq!(ids(dp), vec![100 * i as i64]);
    }
    let bad = MapDataComponent::new(DataFromList::new(items(1)), 5, |t, _| Ok(t));
    let mut flow = ready(Box::new(bad));
    let text = flow.next_datapoint().unwrap_err().to_string();
    assert!(
        text.contains("component index 5") && text.contains("2 components"),
        "{text}"
    );
}

#[test]
fn repeated_data_counts_and_forever() {
    let rep = RepeatedData::new(DataFromList::shuffled(items(5), 1), Some(3)).expect("rep");
    assert_eq!(rep.len(), Some(15));
    let mut flow = ready(Box::new(rep));
    let mut src = ready(Box::new(DataFromList::shuffled(items(5), 1)));
    let inner: Vec<i64> = passes(src.as_mut(), 6).concat();
    assert_eq!(
        passes(flow.as_mut(), 2),
        vec![inner[..15].to_vec(), inner[15..].to_vec()]
    );

    let forever = RepeatedData::new(DataFromList::new(items(2)), None).expect("rep");
    assert_eq!(forever.len(), None);
    let mut flow = ready(Box::new(forever));
    let got: Vec<i64> = run(flow.as_mut(), 9)
        .iter()
        .map(|d| ids(d.as_ref().expect("never ends"))[0])
        .collect();
    assert_eq!(got, vec![0, 1, 0, 1, 0, 1, 0, 1, 0]);

    let mut empty = ready(Box::new(
        RepeatedData::new(DataFromList::new(Vec::new()), None).expect("rep"),
    ));
    assert!(matches!(
        empty.next_datapoint(),
        Err(DataError::EmptyPass { .. })
    ));
    assert!(RepeatedData::new(DataFromList::new(items(1)), Some(0)).is_err());
}

#[test]
fn fixed_size_keep_state_continues_the_input() {
    let mut keep = ready(Box::new(FixedSizeData::new(
        DataFromList::new(items(10)),
        4,
        true,
    )));
    assert_eq!(keep.len(), Some(4));
    assert_eq!(
        passes(keep.as_mut(), 4),
        vec![
            vec![0, 1, 2, 3],
            vec![4, 5, 6, 7],
            vec![8, 9, 0, 1],
            vec![2, 3, 4, 5]
        ]
    );
    let mut fresh = ready(Box::new(FixedSizeData::new(
        DataFromList::new(items(10)),
        4,
        false,
    )));
    assert_eq!(passes(fresh.as_mut(), 3), vec![vec![0, 1, 2, 3]; 3]);
    // Without keep_state each pass starts a new (reshuffled) input pass.
    let mut src = ready(Box::new(DataFromList::shuffled(items(10), 5)));
    let inner = passes(src.as_mut(), 3);
    let mut fresh = ready(Box::new(FixedSizeData::new(
        DataFromList::shuffled(items(10), 5),
        4,
        false,
    )));
    let got = passes(fresh.as_mut(), 3);
    for (g, i) in got.iter().zip(&inner) {
        assert_eq!(g[..], i[..4]);
    }
    let mut empty = ready(Box::new(FixedSizeData::new(
        DataFromList::new(Vec::new()),
        2,
        true,
    )));
    assert!(matches!(
        empty.next_datapoint(),
        Err(DataError::EmptyPass { .. })
    ));
}

#[test]
fn local_shuffle_permutes_within_windows() {
    let local = LocallyShuffleData::new(DataFromList::new(items(10)), 4, 3).expect("local");
    let mut flow = ready(Box::new(local));
    let p = passes(flow.as_mut(), 3);
    for pass in &p {
        for (w, range) in [(0..4), (4..8), (8..10)].into_iter().enumerate() {
            let mut window = pass[range.clone()].to_vec();
            window.sort_unstable();
            assert_eq!(
                window,
                range.map(|i| i as i64).collect::<Vec<_>>(),
                "window {w}"
            );
        }
    }
    assert_ne!(p[0], (0..10).collect::<Vec<_>>());
    assert_ne!(p[0], p[1]);
    assert!(LocallyShuffleData::new(DataFromList::new(items(1)), 0, 1).is_err());
}

#[test]
fn resume_at_every_position_equals_the_uninterrupted_run() {
    for (name, build) in pipelines() {
        check_resume_everywhere(name, &build, 30);
    }
}

#[test]
fn skip_equals_pulling_at_every_position() {
    for (name, build) in pipelines() {
        check_skip_everywhere(name, &build, 20);
    }
}

#[test]
fn end_pass_abandons_the_rest_of_the_pass() {
    for (name, build) in pipelines() {
        let mut a = ready(build());
        let mut b = ready(build());
        run(a.as_mut(), 2);
        a.end_pass().expect("end_pass");
        // b reaches the same point by pulling to the end of its pass.
        run(b.as_mut(), 2);
        // For these, abandoning equals pulling to the end (FixedSizeData with keep_state instead
        // keeps its input where it was: checked below).
        if name != "repeat forever" && name != "fixed keep" {
            while b.next_datapoint().expect("next").is_some() {}
            assert_eq!(run(a.as_mut(), 10), run(b.as_mut(), 10), "{name}");
        }
    }
    let mut keep = ready(Box::new(FixedSizeData::new(
        DataFromList::new(items(10)),
        4,
        true,
    )));
    run(keep.as_mut(), 2);
    keep.end_pass().expect("end_pass");
    assert_eq!(
        passes(keep.as_mut(), 2),
        vec![vec![2, 3, 4, 5], vec![6, 7, 8, 9]]
    );
    let mut fresh = ready(Box::new(FixedSizeData::new(
        DataFromList::new(items(10)),
        4,
        false,
    )));
    run(fresh.as_mut(), 2);
    fresh.end_pass().expect("end_pass");
    assert_eq!(passes(fresh.as_mut(), 1), vec![vec![0, 1, 2, 3]]);
}

#[test]
fn states_refuse_other_pipelines() {
    let mut batch = ready(Box::new(
        BatchData::new(DataFromList::new(items(6)), 2, true).expect("b"),
    ));
    let list_state = DataFromList::new(items(6)).state();
    assert!(matches!(
        batch.restore(&list_state),
        Err(DataError::BadState { .. })
    ));
    let other_size = BatchData::new(DataFromList::new(items(6)), 3, true)
        .expect("b")
        .state();
    let text = batch.restore(&other_size).unwrap_err().to_string();
    assert!(text.contains("batch_size 3"), "{text}");
    let mut list = ready(Box::new(DataFromList::shuffled(items(6), 1)));
    let other_seed = DataFromList::shuffled(items(6), 2).state();
    assert!(list.restore(&other_seed).is_err());
    let other_len = DataFromList::shuffled(items(7), 1).state();
    assert!(list.restore(&other_len).is_err());
    assert!(FlowState::from_json("{not json").is_err());
}

#[test]
fn data_speed_counts_across_passes() {
    let mut flow = ready(Box::new(DataFromList::new(items(3))));
    let speed = test_data_speed(flow.as_mut(), 10).expect("speed");
    assert_eq!(speed.datapoints, 10);
    assert!(speed.per_second() > 0.0);
    let mut empty = ready(Box::new(DataFromList::new(Vec::new())));
    assert!(test_data_speed(empty.as_mut(), 1).is_err());
}
