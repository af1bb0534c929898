//! Numerics of the layers and ops, run on the reference executor with seeded random inputs:
//! BatchNorm (batch statistics, EMA updates, inference with the EMAs), Dropout (rate, scaling,
//! per-step masks, identity in inference), losses, regularization and the operators.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use towerpack::backend::reference::ReferenceSession;
use towerpack::backend::{Session, Step};
use towerpack::dsl::prelude::*;
use towerpack::ir::{Graph, NodeId, Value};
use towerpack::tensor::HostTensor;
use towerpack::tower::UPDATE_OPS;

const TOL: f64 = 1e-5;

fn random(rng: &mut ChaCha8Rng, shape: &[usize], lo: f32, hi: f32) -> HostTensor {
    let n = shape.iter().product();
    let data = (0..n).map(|_| rng.random_range(lo..hi)).collect();
    HostTensor::from_f32(shape, data).expect("shape")
}

/// One tower `ctx` over `sig` returning `f`'s outputs; the graph, the input nodes and the
/// output values.
fn build(
    ctx: TowerContext,
    sig: &[InputSpec],
    f: impl Fn(&[Tensor]) -> Vec<Tensor>,
) -> (Graph, Vec<NodeId>, Vec<Value>) {
    let b = Builder::with_seed(9);
    let outs = std::cell::RefCell::new(Vec::new());
    let h = b
        .build_tower(ctx, sig, |x| {
            let ts = f(x);
            let cost = ts[0].sum();
            *outs.borrow_mut() = ts.iter().map(|t| t.value().expect("value")).collect();
            cost
        })
        .unwrap_or_else(|e| panic!("{e}"));
    let graph = b.finish().expect("graph");
    let inputs = h.inputs.iter().map(|(_, id)| *id).collect();
    (graph, inputs, outs.into_inner())
}

fn session(g: &Graph) -> ReferenceSession {
    let mut s = ReferenceSession::new(g.clone()).expect("session");
    s.initialize_variables(1).expect("init");
    s
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + b.abs())
}

fn train() -> TowerContext {
    TowerContext::training("", "", 0, 1)
}

#[test]
fn batchnorm_normalizes_with_batch_moments_and_updates_the_emas() {
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let sig = [InputSpec::new("x", DType::F32, Shape::batched(&[3, 3, 4]))];
    let (g, ins, outs) = build(train(), &sig, |x| vec![BatchNorm("bn", &x[0]).build()]);
    let x = random(&mut rng, &[5, 3, 3, 4], -2.0, 3.0);
    let mut s = session(&g);
    let updates: Vec<NodeId> = g.collection(UPDATE_OPS).iter().map(|v| v.node).collect();
    let y = s
        .run(&Step::new(outs.clone(), updates), &[(ins[0], x.clone())])
        .expect("step")
        .remove(0)
        .to_f64_vec();
    let xs = x.to_f64_vec();
    let per_channel =
        |v: &[f64], c: usize| -> Vec<f64> { v.iter().skip(c).step_by(4).copied().collect() };
    for c in 0..4 {
        let (xc, yc) = (per_channel(&xs, c), per_channel(&y, c));
        let n = xc.len() as f64;
        let mean = xc.iter().sum::<f64>() / n;
        let var = xc.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        for (xi, yi) in xc.iter().zip(&yc) {
            let expected = (xi - mean) / (var + 1e-5).sqrt();
            assert!(close(*yi, expected, TOL), "channel {c}: {yi} vs {expected}");
        }
        let ema_mean = s
            .read_variable(g.find_variable("bn/mean/EMA").expect("ema"))
            .expect("read");
        let ema_var = s
            .read_variable(g.find_variable("bn/variance/EMA").expect("ema"))
            .expect("read");
        assert!(close(ema_mean.to_f64_vec()[c], 0.1 * mean, TOL));
        assert!(close(ema_var.to_f64_vec()[c], 0.9 + 0.1 * var, TOL));
    }
}

#[test]
fn batchnorm_in_inference_uses_the_emas() {
    let mut rng = ChaCha8Rng::seed_from_u64(22);
    let sig = [InputSpec::new("x", DType::F32, Shape::batched(&[3]))];
    let b = Builder::new();
    b.build_tower(train(), &sig, |x| BatchNorm("bn", &x[0]).build().sum())
        .expect("train");
    let h = build_inference_tower(&b, &sig, "InferenceTower", "", &|x: &[Tensor]| {
        BatchNorm("bn", &x[0]).build().sum()
    })
    .expect("infer");
    let g = b.finish().expect("graph");
    let mut s = session(&g);
    let params: Vec<(&str, HostTensor)> = vec![
        ("bn/gamma", random(&mut rng, &[3], 0.5, 2.0)),
        ("bn/beta", random(&mut rng, &[3], -1.0, 1.0)),
        ("bn/mean/EMA", random(&mut rng, &[3], -1.0, 1.0)),
        ("bn/variance/EMA", random(&mut rng, &[3], 0.5, 2.0)),
    ];
    for (name, v) in &params {
        s.write_variable(g.find_variable(name).expect(name), v)
            .expect("write");
    }
    let p: Vec<Vec<f64>> = params.iter().map(|(_, v)| v.to_f64_vec()).collect();
    let x = random(&mut rng, &[6, 3], -3.0, 3.0);
    let out = h.get_tensor(&g, "bn/output").expect("output");
    let y = s
        .run(&Step::fetch(vec![out]), &[(h.inputs[0].1, x.clone())])
        .expect("step")
        .remove(0)
        .to_f64_vec();
    for (i, (xi, yi)) in x.to_f64_vec().iter().zip(&y).enumerate() {
        let c = i % 3;
        let expected = (xi - p[2][c]) / (p[3][c] + 1e-5).sqrt() * p[0][c] + p[1][c];
        assert!(close(*yi, expected, TOL), "{i}: {yi} vs {expected}");
    }
}

#[test]
fn dropout_drops_at_the_rate_scales_the_rest_and_redraws_each_step() {
    let sig = [InputSpec::new("x", DType::F32, Shape::batched(&[50]))];
    let (g, ins, outs) = build(train(), &sig, |x| {
        vec![Dropout("drop", &x[0]).rate(0.3).build()]
    });
    let ones = HostTensor::from_f32(&[64, 50], vec![1.0; 64 * 50]).expect("ones");
    let mut s = session(&g);
    let gs = g.find_variable("global_step").expect("global_step");
    let mut masks = Vec::new();
    for step in 0..2 {
        s.write_variable(gs, &HostTensor::scalar_i64(step))
            .expect("step");
        let y = s
            .run(&Step::fetch(outs.clone()), &[(ins[0], ones.clone())])
            .expect("run")
            .remove(0)
            .to_f64_vec();
        let dropped = y.iter().filter(|v| **v == 0.0).count() as f64 / y.len() as f64;
        assert!((dropped - 0.3).abs() < 0.03, "dropped {dropped}");
        assert!(y.iter().all(|v| *v == 0.0 || close(*v, 1.0 / 0.7, 1e-6)));
        masks.push(y);
    }
    assert_ne!(masks[0], masks[1], "a new mask each global step");

    let (g, ins, outs) = build(TowerContext::inference("", ""), &sig, |x| {
        vec![Dropout("drop", &x[0]).rate(0.3).build()]
    });
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    let x = random(&mut rng, &[4, 50], -1.0, 1.0);
    let mut s = session(&g);
    let y = s
        .run(&Step::fetch(outs), &[(ins[0], x.clone())])
        .expect("run");
    assert_eq!(y[0], x, "identity in inference");
}

#[test]
fn losses_match_their_definitions() {
    let mut rng = ChaCha8Rng::seed_from_u64(24);
    let sig = [
        InputSpec::new("logits", DType::F32, Shape::batched(&[5])),
        InputSpec::new("label", DType::I32, Shape::batched(&[])),
        InputSpec::new("target", DType::F32, Shape::batched(&[5])),
    ];
    let (g, ins, outs) = build(train(), &sig, |x| {
        vec![
            sparse_softmax_cross_entropy(&x[0], &x[1]),
            sigmoid_cross_entropy_with_logits(&x[0], &x[2]),
            x[0].in_top_k(&x[1], 1).logical_not().cast(DType::F32),
        ]
    });
    let logits = random(&mut rng, &[7, 5], -5.0, 5.0);
    let labels: Vec<i32> = (0..7).map(|_| rng.random_range(0..5)).collect();
    let targets = random(&mut rng, &[7, 5], 0.0, 1.0);
    let feeds = [
        (ins[0], logits.clone()),
        (
            ins[1],
            HostTensor::from_i32(&[7], labels.clone()).expect("labels"),
        ),
        (ins[2], targets.clone()),
    ];
    let got = session(&g).run(&Step::fetch(outs), &feeds).expect("run");
    let l = logits.to_f64_vec();
    let mut xent = 0.0;
    for (i, &label) in labels.iter().enumerate() {
        let row = &l[i * 5..i * 5 + 5];
        let max = row.iter().cloned().fold(f64::MIN, f64::max);
        let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
        xent += (lse - row[label as usize]) / 7.0;
        let argmax = (0..5)
            .max_by(|&a, &b| row[a].total_cmp(&row[b]))
            .expect("row");
        let wrong = if argmax == label as usize { 0.0 } else { 1.0 };
        assert_eq!(got[2].to_f64_vec()[i], wrong, "wrong_vector row {i}");
    }
    assert!(close(got[0].scalar_value().expect("scalar"), xent, TOL));
    for ((x, z), y) in l.iter().zip(targets.to_f64_vec()).zip(got[1].to_f64_vec()) {
        let sig = 1.0 / (1.0 + (-x).exp());
        let expected = -(z * sig.ln() + (1.0 - z) * (1.0 - sig).ln());
        assert!(close(y, expected, 1e-4), "{y} vs {expected}");
    }
}

#[test]
fn regularize_cost_and_dense_layers_compute_what_they_say() {
    let mut rng = ChaCha8Rng::seed_from_u64(25);
    let sig = [InputSpec::new("x", DType::F32, Shape::batched(&[4]))];
    let (g, ins, outs) = build(train(), &sig, |x| {
        let y = FullyConnected("fc", &x[0]).units(3).build();
        vec![y, regularize_cost("fc/W", 0.02)]
    });
    let mut s = session(&g);
    let bias = random(&mut rng, &[3], -1.0, 1.0);
    s.write_variable(g.find_variable("fc/b").expect("b"), &bias)
        .expect("b");
    let w = s
        .read_variable(g.find_variable("fc/W").expect("W"))
        .expect("W")
        .to_f64_vec();
    let x = random(&mut rng, &[2, 4], -1.0, 1.0);
    let got = s
        .run(&Step::fetch(outs), &[(ins[0], x.clone())])
        .expect("run");
    let xs = x.to_f64_vec();
    let bs = bias.to_f64_vec();
    for r in 0..2 {
        for c in 0..3 {
            let expected: f64 = (0..4).map(|k| xs[r * 4 + k] * w[k * 3 + c]).sum::<f64>() + bs[c];
            assert!(close(got[0].to_f64_vec()[r * 3 + c], expected, TOL));
        }
    }
    let l2 = 0.02 * w.iter().map(|v| v * v).sum::<f64>() / 2.0;
    assert!(close(got[1].scalar_value().expect("scalar"), l2, TOL));
}

#[test]
fn operators_compute_elementwise_with_broadcasting() {
    let mut rng = ChaCha8Rng::seed_from_u64(26);
    let sig = [
        InputSpec::new("x", DType::F32, Shape::batched(&[3])),
        InputSpec::new("y", DType::F32, Shape::fixed(&[3])),
    ];
    let (g, ins, outs) = build(train(), &sig, |t| {
        let (x, y) = (&t[0], &t[1]);
        vec![(1.0 - x) * y, 2.0 * x / y + -x, x.leaky_relu(0.1)]
    });
    let x = random(&mut rng, &[4, 3], -2.0, 2.0);
    let y = random(&mut rng, &[3], 0.5, 2.0);
    let got = session(&g)
        .run(
            &Step::fetch(outs),
            &[(ins[0], x.clone()), (ins[1], y.clone())],
        )
        .expect("run");
    let (xs, ys) = (x.to_f64_vec(), y.to_f64_vec());
    for (i, xi) in xs.iter().enumerate() {
        let yi = ys[i % 3];
        assert!(close(got[0].to_f64_vec()[i], (1.0 - xi) * yi, TOL));
        assert!(close(got[1].to_f64_vec()[i], 2.0 * xi / yi - xi, TOL));
        let lrelu = if *xi > 0.0 { *xi } else { 0.1 * xi };
        assert!(close(got[2].to_f64_vec()[i], lrelu, TOL));
    }
}
