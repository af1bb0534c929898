//! The generated CUDA C follows the IR's scalar semantics op by op: every unary and binary op,
//! casts between every dtype, selects, counter-based random numbers, and the layout and
//! fixed-function ops around them run on the emulated device (or the GPU:
//! `TOWERPACK_TEST_CUDA=gpu`) and agree with the reference
//! executor on inputs full of edge cases (NaN, infinities, signed zeros, huge and tiny values).
//! Exactly rounded ops must match bit for bit; transcendental functions within 4 ulp.

use crate::cuda_common;

use cuda_common::ops::{C, N, build};
use rand::{Rng, SeedableRng};
use towerpack::backend::cuda::CudaOptions;
use towerpack::backend::reference::ReferenceSession;
use towerpack::backend::{Session, Step};
use towerpack::tensor::{DType, HostTensor};

/// Edge cases first, then random values of every magnitude.
fn floats(rng: &mut rand_chacha::ChaCha8Rng, n: usize) -> Vec<f32> {
    let special = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -2.5,
        1e-30,
        -1e30,
        3e9,
        -3e9,
        300.7,
        -0.99,
        f32::MIN_POSITIVE,
    ];
    (0..n)
        .map(|k| {
            if k < special.len() {
                special[k]
            } else {
                let m: f32 = rng.random_range(-3.0..3.0);
                m * 10f32.powi(rng.random_range(-3..4))
            }
        })
        .collect()
}

fn ints(rng: &mut rand_chacha::ChaCha8Rng, n: usize) -> Vec<i32> {
    let special = [
        0,
        1,
        -1,
        7,
        -7,
        i32::MAX,
        i32::MIN,
        46341,
        -46341,
        300,
        -300,
        2,
    ];
    (0..n)
        .map(|k| {
            special
                .get(k)
                .copied()
                .unwrap_or_else(|| rng.random_range(-50..50))
        })
        .collect()
}

fn ulp_key(x: f32) -> i64 {
    let b = x.to_bits() as i32;
    i64::from(if b < 0 { i32::MIN.wrapping_sub(b) } else { b })
}

fn agree(got: &HostTensor, want: &HostTensor, ulps: u32) -> Result<(), String> {
    if got.shape() != want.shape() || got.dtype() != want.dtype() {
        return Err(format!(
            "{}{:?} vs {}{:?}",
            got.dtype(),
            got.shape(),
            want.dtype(),
            want.shape()
        ));
    }
    for (k, (a, b)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        let same = (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits();
        let close = got.dtype() == DType::F32
            && a.is_finite()
            && b.is_finite()
            && (ulp_key(*a as f32) - ulp_key(b as f32)).unsigned_abs() <= u64::from(ulps);
        if !same && !close {
            return Err(format!("element {k}: {a:e} vs reference {b:e}"));
        }
    }
    Ok(())
}

#[test]
fn generated_kernels_follow_the_scalar_semantics_of_every_op() {
    cuda_common::require_nvrtc();
    let c = build();
    let step = Step::new(c.fetches.iter().map(|f| f.1).collect(), Vec::new());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let n = N * C;
    let feeds = vec![
        (
            c.x.node,
            HostTensor::from_f32(&[N, C], floats(&mut rng, n)).expect("x"),
        ),
        (
            c.y.node,
            HostTensor::from_f32(&[N, C], floats(&mut rng, n)).expect("y"),
        ),
        (
            c.i.node,
            HostTensor::from_i32(&[N, C], ints(&mut rng, n)).expect("i"),
        ),
        (
            c.j.node,
            HostTensor::from_i32(&[N, C], ints(&mut rng, n)).expect("j"),
        ),
        (c.counter.node, HostTensor::scalar_i64(12345)),
    ];
    let options = CudaOptions {
        cache_dir: None,
        ..CudaOptions::default()
    };
    let mut emu = cuda_common::session(c.graph.clone(), 1, options);
    let mut reference = ReferenceSession::new(c.graph.clone()).expect("reference");
    let got = emu.run(&step, &feeds).expect("emulated step");
    let want = reference.run(&step, &feeds).expect("reference step");
    let failures: Vec<String> = c
        .fetches
        .iter()
        .zip(got.iter().zip(&want))
        .filter_map(|((name, _, ulps), (g, w))| {
            agree(g, w, *ulps).err().map(|e| format!("{name}: {e}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Pooling and its gradients where windows abut (ResNet's 2×2/2 shortcut), overlap, are padded
/// (SAME, and explicitly on one side more than the other), leave cells no window covers, or
/// cover a cell many times: the device's gradients gather, per input cell, the windows covering
/// it (the first and last found by division by the compile-time geometry, `kernels/pool_grad.cu`)
/// and agree bit for bit with the CPU backend's scatter, which visits the windows in the same
/// order; and with the reference executor: the forward passes within 4 ulp (it averages in
/// f64), the gradients within 4·16 ε of the largest gradient (it adds a cell's terms in
/// another order: up to 16 of them here).
#[test]
fn pooling_and_its_gradients_agree_with_the_reference_on_every_window_geometry() {
    use towerpack::ir::{Graph, Op, Padding, PoolAttrs, PoolKind, Shape, TensorType, Value};
    cuda_common::require_nvrtc();
    let (batch, h, w, c) = (2, 7, 9, 3);
    let mut g = Graph::new();
    let input = |g: &mut Graph, name: &str, dims: &[usize]| {
        let ty = TensorType::new(DType::F32, Shape::batched(dims));
        let op = Op::Input {
            name: name.into(),
            ty,
        };
        Value::first(g.add_node(name, op, &[]).expect("input"))
    };
    let x = input(&mut g, "x", &[h, w, c]);
    let geometries = [
        ([2, 2], [2, 2], Padding::Valid),
        ([3, 3], [2, 2], Padding::Same),
        ([3, 2], [1, 2], Padding::Valid),
        ([1, 1], [2, 3], Padding::Valid),
        ([2, 3], [3, 2], Padding::Explicit([(1, 2), (0, 1)])),
        ([4, 4], [1, 1], Padding::Same),
    ];
    let mut fetches: Vec<(String, Value, u32)> = Vec::new();
    let mut dys = Vec::new();
    for (i, (window, strides, padding)) in geometries.into_iter().enumerate() {
        for kind in [PoolKind::Max, PoolKind::Avg] {
            let attrs = PoolAttrs {
                kind,
                window,
                strides,
                padding,
            };
            let ulps = if kind == PoolKind::Max { 0 } else { 4 };
            let name = format!("{kind:?}_{i}");
            let y = Value::first(g.add_node(&name, Op::Pool(attrs), &[x]).expect("pool"));
            let dims = g.value_type(y).shape.resolve(batch);
            let dy = input(&mut g, &format!("dy_{name}"), &dims[1..]);
            dys.push((dy, dims));
            let grad = match kind {
                PoolKind::Max => {
                    g.add_node(&format!("{name}_grad"), Op::MaxPoolGrad(attrs), &[x, dy])
                }
                PoolKind::Avg => g.add_node(
                    &format!("{name}_grad"),
                    Op::AvgPoolGrad {
                        attrs,
                        input_hw: [h, w],
                    },
                    &[dy],
                ),
            };
            fetches.push((name.clone(), y, ulps));
            fetches.push((
                format!("{name}_grad"),
                Value::first(grad.expect("grad")),
                ulps,
            ));
        }
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(17);
    let mut random = |dims: &[usize]| {
        let n = dims.iter().product();
        let v = (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect();
        HostTensor::from_f32(dims, v).expect("tensor")
    };
    let mut feeds = vec![(x.node, random(&[batch, h, w, c]))];
    for (dy, dims) in &dys {
        feeds.push((dy.node, random(dims)));
    }
    let step = Step::new(fetches.iter().map(|f| f.1).collect(), Vec::new());
    let options = CudaOptions {
        cache_dir: None,
        ..CudaOptions::default()
    };
    let got = cuda_common::session(g.clone(), 1, options)
        .run(&step, &feeds)
        .expect("emulated step");
    let cpu = towerpack::backend::cpu::CpuSession::new(g.clone(), Default::default())
        .expect("cpu session")
        .run(&step, &feeds)
        .expect("cpu step");
    let want = ReferenceSession::new(g)
        .expect("reference")
        .run(&step, &feeds)
        .expect("reference step");
    let mut failures: Vec<String> = Vec::new();
    for ((name, _, ulps), ((got, cpu), want)) in fetches.iter().zip(got.iter().zip(&cpu).zip(&want))
    {
        if let Err(e) = agree(got, cpu, 0) {
            failures.push(format!("{name} against the CPU backend: {e}"));
        }
        let scale = want.to_f64_vec().iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for (k, (a, b)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
            let bound = if name.ends_with("_grad") {
                4.0 * 16.0 * scale * f64::from(f32::EPSILON)
            } else {
                f64::from(*ulps) * b.abs() * f64::from(f32::EPSILON)
            };
            if (a - b).abs() > bound {
                failures.push(format!(
                    "{name}[{k}]: {a:e} vs reference {b:e} (bound {bound:e})"
                ));
                break;
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
