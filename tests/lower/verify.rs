//! The `Program` verifier (`lower::verify`): every program of the example training steps
//! passes it, and each kind of broken program — a range with a member stored elsewhere, two
//! live values overlapping, a read before the write, a start value read after an in-place
//! write, a cross-device read without a wait, a view past its buffer — fails it with an error
//! naming the kernel, the value and the byte range.

use crate::model_steps;
use crate::training_graphs;

use model_steps::{TrainGraph, mlp, resnet20, training_graph_with};
use towerpack::lower::{
    BufferId, LowerOptions, Program, Storage, VerifyError, View, lower, verify,
};
use towerpack::models::{ConvNet, Dcgan, Mlp};
use towerpack::optim::Optimizer;
use towerpack::train::*;

fn lowered(tg: &TrainGraph, batch: usize) -> Program {
    let p = lower(&tg.graph, &tg.step, batch, &LowerOptions::default()).expect("lower");
    verify(&p).unwrap_or_else(|e| panic!("a lowered program fails verification: {e}"));
    p
}

fn adam_mlp() -> TrainGraph {
    let m = Mlp {
        input_shape: vec![8, 8],
        hidden: vec![64, 32],
        classes: 10,
        weight_decay: 1e-4,
        dropout_rate: 0.0,
    };
    training_graph_with(Optimizer::adam(1e-3), m.inputs(), |x| m.build(x))
}

fn broken(p: &Program) -> VerifyError {
    match verify(p) {
        Ok(()) => panic!("the broken program passed verification:\n{p}"),
        Err(e) => {
            eprintln!("{e}");
            e
        }
    }
}

/// Scratch buffers some kernel writes, with the kernel.
fn producer(p: &Program, b: BufferId) -> Option<usize> {
    p.kernels.iter().position(|k| k.outputs.contains(&b))
}

fn readers(p: &Program, b: BufferId) -> Vec<usize> {
    (0..p.kernels.len())
        .filter(|&k| p.kernels[k].inputs.iter().any(|v| v.buffer == b))
        .collect()
}

fn is_plain_scratch(p: &Program, b: BufferId) -> bool {
    let buf = p.buffer(b);
    matches!(buf.storage, Storage::Scratch { .. }) && buf.members.is_empty() && buf.bytes() > 0
}

#[test]
fn the_example_training_programs_verify() {
    for (what, tg, batch) in [
        ("mlp momentum", mlp(), 16),
        ("mlp adam", adam_mlp(), 16),
        ("resnet20 momentum", resnet20(), 2),
        ("convnet", model_steps::convnet(), 4),
    ] {
        eprintln!("{what}");
        lowered(&tg, batch);
    }
    let c = ConvNet {
        image_shape: [12, 12, 1],
        channels: [4, 8],
        hidden: 16,
        ..ConvNet::default()
    };
    lowered(
        &training_graph_with(Optimizer::adam(1e-3).accumulate(2), c.inputs(), |x| {
            c.build(x)
        }),
        4,
    );
    let gan = Dcgan::default();
    lowered(
        &training_graph_with(Optimizer::adam(2e-4), gan.inputs(), |x| gan.build(x)),
        4,
    );
}

#[test]
fn a_range_member_stored_elsewhere_is_an_unwritten_hole() {
    let p = lowered(&mlp(), 16);
    let (range, kernel) = p
        .kernels
        .iter()
        .enumerate()
        .find_map(|(k, kernel)| {
            kernel
                .inputs
                .iter()
                .find(|v| p.buffer(v.buffer).members.len() >= 2)
                .map(|v| (v.buffer, k))
        })
        .expect("a fused update reading a gradient arena");
    // The bug of issue 20: a member's producer writes into a variable's storage, the range
    // keeps its length.
    let mut bad = p.clone();
    bad.buffers[range.0 as usize].members.pop();
    let e = broken(&bad);
    assert!(e.at.contains(&p.kernels[kernel].name), "{e}");
    assert_eq!(e.value, p.buffer(range).name);
    assert!(e.problem.contains("belong to no member"), "{e}");
    let Storage::Scratch { offset, .. } = p.buffer(range).storage else {
        panic!("a range in scratch")
    };
    assert_eq!(e.end, offset + p.buffer(range).bytes());
    assert!(e.start > offset && e.start < e.end);

    // The member moved into a variable's storage.
    let mut bad = p.clone();
    let last = *p.buffer(range).members.last().expect("members");
    bad.buffers[last.0 as usize].storage = Storage::State {
        device: 0,
        offset: 0,
    };
    let e = broken(&bad);
    assert!(e.problem.contains("back to back"), "{e}");
}

#[test]
fn two_live_values_overlapping_are_named() {
    let p = lowered(&mlp(), 16);
    // A value A written by kernel i and read by kernel j, and a value B written by a kernel in
    // between: give B A's bytes.
    let mut case = None;
    'search: for (i, k) in p.kernels.iter().enumerate() {
        for &a in k.outputs.iter().filter(|&&a| is_plain_scratch(&p, a)) {
            let Some(&j) = readers(&p, a).last() else {
                continue;
            };
            for m in i + 1..j {
                let same_device = |b: BufferId| match (p.buffer(a).storage, p.buffer(b).storage) {
                    (Storage::Scratch { device: x, .. }, Storage::Scratch { device: y, .. }) => {
                        x == y
                    }
                    _ => false,
                };
                if let Some(&b) = p.kernels[m]
                    .outputs
                    .iter()
                    .find(|&&b| b != a && is_plain_scratch(&p, b) && same_device(b))
                {
                    case = Some((a, b, j));
                    break 'search;
                }
            }
        }
    }
    let (a, b, j) = case.expect("a value live across another kernel's output");
    let mut bad = p.clone();
    let Storage::Scratch { offset, .. } = p.buffer(a).storage else {
        unreachable!()
    };
    if let Storage::Scratch { offset: o, .. } = &mut bad.buffers[b.0 as usize].storage {
        *o = offset;
    }
    let e = broken(&bad);
    assert!(e.problem.contains("overlap"), "{e}");
    assert!(e.problem.contains(&p.buffer(b).name), "{e}");
    assert_eq!(e.value, p.buffer(a).name);
    // Reported at the first read of A after B's write, at the latest at kernel j.
    let at_kernel: usize = e.at["kernel k".len()..]
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a kernel index");
    assert!(at_kernel <= j, "{e}");
}

#[test]
fn a_read_before_its_write_is_named() {
    let p = lowered(&mlp(), 16);
    let fed: Vec<BufferId> = p.feeds.iter().map(|f| f.1).collect();
    let k = (0..p.kernels.len())
        .find(|&k| {
            p.kernels[k].inputs.iter().any(|v| {
                is_plain_scratch(&p, v.buffer)
                    && !fed.contains(&v.buffer)
                    && producer(&p, v.buffer).is_some_and(|w| w < k)
            })
        })
        .expect("a kernel reading another kernel's result");
    let mut bad = p.clone();
    let kernel = bad.kernels.remove(k);
    bad.kernels.insert(0, kernel);
    let e = broken(&bad);
    assert!(e.at.starts_with("kernel k0 "), "{e}");
    assert!(e.problem.contains("no earlier kernel"), "{e}");
}

#[test]
fn a_start_value_read_after_its_in_place_write_is_named() {
    let p = lowered(&adam_mlp(), 16);
    // A kernel writing a variable's new value in place (Adam's `v` slot of a bias).
    let (k, new_value) = p
        .kernels
        .iter()
        .enumerate()
        .find_map(|(k, kernel)| {
            kernel
                .outputs
                .iter()
                .find(|&&o| {
                    matches!(p.buffer(o).storage, Storage::State { .. })
                        && !p.buffer(o).name.starts_with("state[")
                })
                .map(|&o| (k, o))
        })
        .expect("an in-place assign");
    // Run it twice: the second run reads the start value the first overwrote.
    let mut bad = p.clone();
    let again = bad.kernels[k].clone();
    bad.kernels.insert(k, again);
    let e = broken(&bad);
    assert!(e.problem.contains("start of the step"), "{e}");
    assert!(e.problem.contains(&p.buffer(new_value).name), "{e}");
}

#[test]
fn a_view_past_its_buffer_is_named() {
    let p = lowered(&mlp(), 16);
    let k = p
        .kernels
        .iter()
        .position(|k| matches!(k.kind, towerpack::lower::KernelKind::Elementwise { .. }))
        .expect("an elementwise kernel");
    let mut bad = p.clone();
    let View { buffer, offset, .. } = &mut bad.kernels[k].inputs[0];
    *offset += p.buffer(*buffer).len();
    let e = broken(&bad);
    assert!(e.problem.contains("reaches element"), "{e}");
}

#[test]
fn a_cross_device_read_without_a_wait_is_named() {
    let m = training_graphs::mlp();
    let model = ModelFn::new(
        m.inputs(),
        move |x| m.build(x),
        Optimizer::momentum(0.1, 0.9),
    );
    let strategy = ReplicatedTowers::over(TowerPlacement {
        devices: TowerDevices::Count(2),
        bucket_bytes: None,
    });
    let b = training_graphs::build(model, |setup| {
        let built = strategy.build(setup).expect("build");
        (built.built.towers, built.train_op)
    });
    let p = lower(
        &b.graph,
        &b.step,
        training_graphs::BATCH,
        &LowerOptions::default(),
    )
    .expect("lower");
    verify(&p).expect("the replicated program verifies");
    assert!(p.waits.iter().any(|w| !w.is_empty()), "{p}");
    let mut bad = p.clone();
    bad.waits.iter_mut().for_each(Vec::clear);
    let e = broken(&bad);
    assert!(e.problem.contains("another device"), "{e}");
}
