//! `gradient_finiteness` and `record_first_non_finite` (what `NonFiniteGuard` adds): on
//! random gradients with NaN and ±inf planted at random places — the first and last element of
//! a variable among them — the per-row counts equal the counts computed here element by
//! element, on the reference executor and through the CPU backend's lowering (one join, one
//! reduction), and the first variable with a non-finite value is the one named; the record
//! keeps the first non-zero run's counts and the runs since.

use super::processors::fixture;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use towerpack::backend::Session;
use towerpack::backend::cpu::{CpuOptions, CpuSession};
use towerpack::backend::reference::{Precision, evaluate};
use towerpack::ir::{Graph, NodeId, Op, Shape, Step, TensorType, Value, VarId};
use towerpack::lower::{LowerOptions, lower};
use towerpack::optim::{FINITENESS_ROW, OptimError, gradient_finiteness, record_first_non_finite};
use towerpack::tensor::{DType, HostTensor};

/// Variables of these shapes: under a row, one row exactly, a row and a half, three rows of a
/// matrix, a scalar.
const SHAPES: &[(&str, &[usize])] = &[
    ("bn/beta", &[16]),
    ("fc/b", &[FINITENESS_ROW]),
    ("fc/W", &[1500]),
    ("conv/W", &[3, 700]),
    ("scale", &[]),
];

/// A graph with a variable per shape and a fed gradient input for each.
fn gradients() -> (Graph, Vec<(VarId, Value)>, Vec<NodeId>) {
    let f = fixture(SHAPES, 0, 1.0);
    let inputs = f.feeds.iter().map(|(n, _)| *n).collect();
    (f.graph, f.grads, inputs)
}

/// Random finite gradients with `bad` non-finite values planted, and the counts of non-finite
/// values per row of each variable, counted here.
fn planted(rng: &mut ChaCha8Rng, bad: usize) -> (Vec<Vec<f64>>, Vec<f64>) {
    let mut values: Vec<Vec<f64>> = SHAPES
        .iter()
        .map(|(_, dims)| {
            let n: usize = dims.iter().product();
            (0..n).map(|_| rng.random_range(-1e3..1e3)).collect()
        })
        .collect();
    for _ in 0..bad {
        let v = rng.random_range(0..values.len());
        let n = values[v].len();
        // A variable's edges half the time: where a row boundary would blur two variables.
        let i = match rng.random_range(0..4) {
            0 => 0,
            1 => n - 1,
            _ => rng.random_range(0..n),
        };
        values[v][i] = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY][rng.random_range(0..3)];
    }
    let mut counts = Vec::new();
    for v in &values {
        for row in v.chunks(FINITENESS_ROW) {
            counts.push(row.iter().filter(|x| !x.is_finite()).count() as f64);
        }
    }
    (values, counts)
}

fn feeds(inputs: &[NodeId], values: &[Vec<f64>]) -> Vec<(NodeId, HostTensor)> {
    inputs
        .iter()
        .zip(values)
        .zip(SHAPES)
        .map(|((&n, v), (_, dims))| {
            let t = HostTensor::from_f64_values(DType::F32, dims, v.clone()).expect("feed");
            (n, t)
        })
        .collect()
}

#[test]
fn every_row_counts_its_non_finite_values_and_the_first_bad_variable_is_named() {
    let (mut graph, grads, inputs) = gradients();
    let checks = gradient_finiteness(&mut graph, "guard", &grads).expect("checks");
    assert_eq!(checks.len(), 1, "one device, one dtype: one join");
    let check = &checks[0];
    let rows: Vec<(&str, std::ops::Range<usize>)> = check
        .rows
        .iter()
        .map(|r| (r.name.as_str(), r.rows.clone()))
        .collect();
    assert_eq!(
        rows,
        [
            ("the gradient of `bn/beta`", 0..1),
            ("the gradient of `fc/b`", 1..2),
            ("the gradient of `fc/W`", 2..4),
            ("the gradient of `conv/W`", 4..7),
            ("the gradient of `scale`", 7..8)
        ]
    );
    let step = Step::fetch(vec![check.counts]);
    let options = LowerOptions::default();
    let program = lower(&graph, &step, 1, &options).expect("lower");
    let kinds: Vec<&str> = program.kernels.iter().map(|k| k.kind.name()).collect();
    assert_eq!(kinds, ["concat", "reduce"], "{program}");
    let mut cpu = CpuSession::new(graph.clone(), CpuOptions::default()).expect("session");
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    for trial in 0..40 {
        let bad = [0, 1, 1, 2, 5][trial % 5];
        let (values, want) = planted(&mut rng, bad);
        let fed = feeds(&inputs, &values);
        let reference = evaluate(
            &graph,
            &HashMap::new(),
            &fed,
            &[check.counts],
            Precision::F32,
        )
        .expect("reference");
        let backend = cpu.run(&step, &fed).expect("cpu");
        for (who, got) in [("reference", &reference[0]), ("cpu", &backend[0])] {
            assert_eq!(got.to_f64_vec(), want, "trial {trial}, {who}");
            let first = SHAPES
                .iter()
                .zip(&values)
                .find(|(_, v)| v.iter().any(|x| !x.is_finite()))
                .map(|((name, _), _)| format!("the gradient of `{name}`"));
            assert_eq!(
                check.first_non_finite(got).expect("counts"),
                first.as_deref()
            );
        }
    }
}

#[test]
fn counts_of_another_length_are_an_error() {
    let (mut graph, grads, _) = gradients();
    let checks = gradient_finiteness(&mut graph, "guard", &grads).expect("checks");
    let short = HostTensor::from_f32(&[3], vec![0.0; 3]).expect("counts");
    assert_eq!(
        checks[0].first_non_finite(&short),
        Err(OptimError::CheckFetch {
            expected: 8,
            got: 3
        })
    );
}

#[test]
fn gradients_on_two_devices_are_joined_per_device() {
    let (mut graph, mut grads, _) = gradients();
    // The last two gradients, moved to device 1 (a copy of each there).
    for (i, g) in grads.iter_mut().enumerate().skip(3) {
        let moved = graph
            .add_node_on(&format!("moved{i}"), Op::Identity, &[g.1], Some(1))
            .expect("identity");
        g.1 = Value::first(moved);
    }
    let checks = gradient_finiteness(&mut graph, "guard", &grads).expect("checks");
    let names: Vec<Vec<&str>> = checks
        .iter()
        .map(|c| {
            c.rows
                .iter()
                .map(|r| r.name.trim_start_matches("the gradient of "))
                .collect()
        })
        .collect();
    assert_eq!(
        names,
        [
            vec!["`bn/beta`", "`fc/b`", "`fc/W`"],
            vec!["`conv/W`", "`scale`"]
        ]
    );
    assert_eq!(
        checks[1].rows[0].rows,
        0..3,
        "each join counts its rows from 0"
    );
}

/// `record_first_non_finite` over runs fed these counts: nothing recorded while they are zero;
/// then the first non-zero run's counts, kept however later runs count, and the runs since it,
/// this run counting 1. The same on the reference executor and the CPU backend.
#[test]
fn the_record_keeps_the_first_non_finite_run() {
    let mut graph = Graph::new();
    let ty = TensorType::f32(Shape::fixed(&[3]));
    let input = graph
        .add_node(
            "counts",
            Op::Input {
                name: "counts".into(),
                ty,
            },
            &[],
        )
        .expect("input");
    let record =
        record_first_non_finite(&mut graph, "record", &[Value::first(input)]).expect("record");
    let runs: [([f32; 3], f64, [f64; 3]); 5] = [
        ([0.0, 0.0, 0.0], 0.0, [0.0; 3]),
        ([0.0, 0.0, 0.0], 0.0, [0.0; 3]),
        ([0.0, 2.0, 1.0], 1.0, [0.0, 2.0, 1.0]),
        ([5.0, 0.0, 0.0], 2.0, [0.0, 2.0, 1.0]),
        ([0.0, 0.0, 0.0], 3.0, [0.0, 2.0, 1.0]),
    ];
    let step = Step::new(vec![record.since, record.first], vec![record.update]);
    let mut cpu = CpuSession::new(graph.clone(), CpuOptions::default()).expect("cpu");
    let mut reference =
        towerpack::backend::reference::ReferenceSession::new(graph.clone()).expect("reference");
    for session in [&mut cpu as &mut dyn Session, &mut reference] {
        session.initialize_variables(0).expect("init");
        for (i, (counts, since, first)) in runs.iter().enumerate() {
            let feed = HostTensor::from_f32(&[3], counts.to_vec()).expect("counts");
            let out = session.run(&step, &[(input, feed)]).expect("run");
            assert_eq!(out[0].scalar_value().ok(), Some(*since), "run {i}");
            assert_eq!(out[1].to_f64_vec(), first.to_vec(), "run {i}");
        }
    }
}

/// An empty gradient has no rows (nothing in it can be non-finite); only empty ones are an
/// error naming the scope.
#[test]
fn empty_gradients_have_no_rows() {
    let f = fixture(&[("a", &[3]), ("empty", &[0]), ("b", &[2])], 1, 1.0);
    let mut graph = f.graph;
    let checks = gradient_finiteness(&mut graph, "guard", &f.grads).expect("checks");
    let rows: Vec<std::ops::Range<usize>> = checks[0].rows.iter().map(|r| r.rows.clone()).collect();
    assert_eq!(rows, [0..1, 1..1, 1..2]);
    let f = fixture(&[("empty", &[0])], 1, 1.0);
    let mut graph = f.graph;
    let err = gradient_finiteness(&mut graph, "guard", &f.grads).unwrap_err();
    assert!(err.to_string().contains("guard"), "{err}");
}
