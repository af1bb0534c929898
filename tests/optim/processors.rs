//! Gradient processors and gradient accumulation, run through the reference executor on random
//! gradients: clipping scales by the global norm, scaling and mapping follow their regexes
//! (full match, first rule wins, 0 or `None` drops), accumulation applies the sum every n
//! steps, and a non-finite gradient is an error naming its variable.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use towerpack::backend::Session;
use towerpack::backend::reference::{Precision, ReferenceSession, evaluate};
use towerpack::ir::{
    BinaryOp, Graph, Initializer, NodeId, Op, Shape, Step, TensorType, Value, VarFlags, VarId,
    VariableDef,
};
use towerpack::optim::{
    GradientProcessor, OptimError, Optimizer, check_numerics, process_gradients,
};
use towerpack::tensor::{DType, HostTensor};

/// Variables with gradient inputs fed from random values.
pub(crate) struct Fixture {
    pub(crate) graph: Graph,
    pub(crate) grads: Vec<(VarId, Value)>,
    pub(crate) feeds: Vec<(NodeId, HostTensor)>,
    pub(crate) values: Vec<Vec<f64>>,
}

pub(crate) fn fixture(names: &[(&str, &[usize])], seed: u64, scale: f64) -> Fixture {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut f = Fixture {
        graph: Graph::new(),
        grads: Vec::new(),
        feeds: Vec::new(),
        values: Vec::new(),
    };
    for (name, dims) in names {
        let ty = TensorType::f32(Shape::fixed(dims));
        let var = f
            .graph
            .declare_variable(VariableDef {
                name: (*name).into(),
                ty: ty.clone(),
                init: Initializer::Zeros,
                flags: VarFlags {
                    trainable: true,
                    ..VarFlags::default()
                },
            })
            .expect("declare");
        let input = f
            .graph
            .add_node(
                &format!("{name}/grad"),
                Op::Input {
                    name: "g".into(),
                    ty,
                },
                &[],
            )
            .expect("input");
        let n = dims.iter().product();
        let v: Vec<f64> = (0..n)
            .map(|_| f64::from((scale * rng.random_range(-1.0..1.0)) as f32))
            .collect();
        f.feeds.push((
            input,
            HostTensor::from_f64_values(DType::F32, dims, v.clone()).expect("feed"),
        ));
        f.values.push(v);
        f.grads.push((var, Value::first(input)));
    }
    f
}

impl Fixture {
    fn eval(&self, values: &[Value]) -> Vec<Vec<f64>> {
        evaluate(
            &self.graph,
            &HashMap::new(),
            &self.feeds,
            values,
            Precision::F64,
        )
        .expect("evaluate")
        .iter()
        .map(HostTensor::to_f64_vec)
        .collect()
    }

    fn name(&self, v: VarId) -> &str {
        &self.graph.variable(v).name
    }
}

fn assert_close(got: &[f64], want: &[f64], what: &str) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-6 * (1.0 + w.abs()),
            "{what}[{i}]: {g} vs {w}"
        );
    }
}

#[test]
fn global_norm_clip_scales_every_gradient_by_the_global_norm() {
    for (seed, scale) in [(1, 5.0), (2, 0.01), (3, 3.0)] {
        let mut f = fixture(&[("a/W", &[3, 2]), ("a/b", &[2]), ("c", &[])], seed, scale);
        let max_norm = 1.0;
        let clip = GradientProcessor::global_norm_clip(max_norm).expect("clip");
        let out = process_gradients(&mut f.graph, &f.grads, &[clip]).expect("process");
        assert_eq!(out.grads.len(), 3);
        let norm = f.values.iter().flatten().map(|x| x * x).sum::<f64>().sqrt();
        let factor = if norm > max_norm {
            max_norm / norm
        } else {
            1.0
        };
        let got = f.eval(&out.grads.iter().map(|(_, g)| *g).collect::<Vec<_>>());
        for (k, v) in f.values.iter().enumerate() {
            let want: Vec<f64> = v.iter().map(|x| x * factor).collect();
            assert_close(&got[k], &want, &format!("seed {seed} grad {k}"));
        }
        let clipped_norm = got.iter().flatten().map(|x| x * x).sum::<f64>().sqrt();
        assert!(clipped_norm <= max_norm * (1.0 + 1e-6), "{clipped_norm}");
    }
}

#[test]
fn scale_gradient_uses_the_first_full_match_and_drops_zeros() {
    let mut f = fixture(
        &[
            ("conv0/W", &[2, 2]),
            ("conv0/b", &[2]),
            ("fc/W", &[3]),
            ("conv0", &[1]),
        ],
        4,
        1.0,
    );
    let scale = GradientProcessor::scale_gradient(&[(".*/b", 2.0), ("conv0/.*", 0.0), ("fc", 5.0)])
        .expect("regexes");
    let out = process_gradients(&mut f.graph, &f.grads, &[scale]).expect("process");
    let kept: Vec<&str> = out.grads.iter().map(|(v, _)| f.name(*v)).collect();
    // conv0/W dropped (0); conv0/b doubled (first rule wins); `fc` does not fully match fc/W;
    // `conv0/.*` does not match `conv0`.
    assert_eq!(kept, vec!["conv0/b", "fc/W", "conv0"]);
    let got = f.eval(&out.grads.iter().map(|(_, g)| *g).collect::<Vec<_>>());
    let doubled: Vec<f64> = f.values[1].iter().map(|x| 2.0 * x).collect();
    assert_close(&got[0], &doubled, "conv0/b");
    assert_close(&got[1], &f.values[2], "fc/W");
    assert_eq!(
        out.grads[1].1, f.grads[2].1,
        "unmatched gradients are passed through"
    );

    let err = GradientProcessor::scale_gradient(&[("(", 1.0)]).unwrap_err();
    assert!(matches!(err, OptimError::InvalidRegex { .. }), "{err}");
}

#[test]
fn map_gradient_maps_matching_gradients_drops_on_none_and_warns_on_no_match() {
    let mut f = fixture(
        &[("fc0/W", &[2, 3]), ("fc1/W", &[3]), ("bn/gamma", &[3])],
        5,
        1.0,
    );
    let triple = GradientProcessor::map_gradient("fc.*", |g, scope, _var, grad| {
        let three = Value::first(g.add_node(
            &format!("{scope}/three"),
            Op::Constant {
                value: HostTensor::scalar_f32(3.0),
            },
            &[],
        )?);
        let y = g.add_node(
            &format!("{scope}/mul"),
            Op::Binary(BinaryOp::Mul),
            &[grad, three],
        )?;
        Ok(Some(Value::first(y)))
    })
    .expect("regex");
    let drop_bn = GradientProcessor::map_gradient("bn/.*", |_, _, _, _| Ok(None)).expect("regex");
    let nothing = GradientProcessor::map_gradient("W", |_, _, _, g| Ok(Some(g))).expect("regex");
    let out =
        process_gradients(&mut f.graph, &f.grads, &[triple, drop_bn, nothing]).expect("process");
    let kept: Vec<&str> = out.grads.iter().map(|(v, _)| f.name(*v)).collect();
    assert_eq!(kept, vec!["fc0/W", "fc1/W"]);
    let got = f.eval(&out.grads.iter().map(|(_, g)| *g).collect::<Vec<_>>());
    for (got, fed) in got.iter().zip(&f.values) {
        let want: Vec<f64> = fed.iter().map(|x| 3.0 * x).collect();
        assert_close(got, &want, "tripled");
    }
    assert_eq!(out.warnings.len(), 1, "{:?}", out.warnings);
    assert!(out.warnings[0].contains("`W`"), "{:?}", out.warnings);
}

#[test]
fn check_gradient_names_the_variable_with_a_non_finite_gradient() {
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let mut f = fixture(&[("conv0/W", &[2, 2]), ("fc/W", &[3])], 6, 1.0);
        let out = process_gradients(
            &mut f.graph,
            &f.grads,
            &[GradientProcessor::check_gradient()],
        )
        .expect("process");
        assert_eq!(out.grads, f.grads, "gradients pass through unchanged");
        let checks: Vec<Value> = out.checks.iter().map(|c| c.all_finite).collect();
        let run = |f: &Fixture| {
            evaluate(&f.graph, &HashMap::new(), &f.feeds, &checks, Precision::F32).expect("eval")
        };
        check_numerics(&out.checks, &run(&f)).expect("finite gradients pass");
        let mut v = f.values[1].clone();
        v[1] = bad;
        f.feeds[1].1 = HostTensor::from_f64_values(DType::F32, &[3], v).expect("feed");
        let err = check_numerics(&out.checks, &run(&f)).unwrap_err();
        assert_eq!(
            err,
            OptimError::NonFiniteGradient {
                variable: "fc/W".into()
            }
        );
        assert!(err.to_string().contains("fc/W"));
    }
}

/// SGD on gradients accumulated over `n` steps applies `lr * sum` every n-th step only.
#[test]
fn accumulation_applies_the_sum_every_n_steps() {
    for (n, inner) in [(3, Optimizer::sgd(0.5)), (2, Optimizer::momentum(0.5, 0.9))] {
        let mut f = fixture(&[("fc/W", &[4])], 7, 1.0);
        let (var, grad) = f.grads[0];
        let train = inner
            .clone()
            .accumulate(n)
            .apply_gradients(&mut f.graph, &f.grads, "train_op")
            .expect("apply");
        let mut s = ReferenceSession::new(f.graph.clone()).expect("session");
        s.initialize_variables(0).expect("init");
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        let mut w = vec![0.0; 4];
        let (mut sum, mut momentum) = (vec![0.0; 4], vec![0.0; 4]);
        for step in 1..=(3 * n + 1) {
            let g: Vec<f64> = (0..4)
                .map(|_| f64::from(rng.random_range(-1.0f32..1.0)))
                .collect();
            let feed = HostTensor::from_f64_values(DType::F32, &[4], g.clone()).expect("feed");
            s.run(
                &Step::new(vec![], vec![train.train_op]),
                &[(grad.node, feed)],
            )
            .expect("step");
            for i in 0..4 {
                sum[i] += g[i];
            }
            if step % n == 0 {
                for i in 0..4 {
                    let direction = match inner {
                        Optimizer::Momentum { momentum: mu, .. } => {
                            momentum[i] = mu * momentum[i] + sum[i];
                            momentum[i]
                        }
                        _ => sum[i],
                    };
                    w[i] -= 0.5 * direction;
                }
                sum = vec![0.0; 4];
            }
            let got = s.read_variable(var).expect("read").to_f64_vec();
            assert_close(&got, &w, &format!("n={n} step {step} W"));
            let acc = s.graph().find_variable("fc/W/AccumGrad").expect("slot");
            let acc = s.read_variable(acc).expect("read").to_f64_vec();
            assert_close(&acc, &sum, &format!("n={n} step {step} accum"));
            let counter = s
                .graph()
                .find_variable("AccumGrad/counter")
                .expect("counter");
            let c = s.read_variable(counter).expect("read").to_f64_vec()[0];
            assert_eq!(c, f64::from(step % n));
        }
    }
}

#[test]
fn an_infinite_gradient_makes_clipped_gradients_nan_so_the_check_reports_it() {
    let mut f = fixture(&[("a/W", &[2]), ("b/W", &[2])], 9, 1.0);
    f.feeds[1].1 = HostTensor::from_f32(&[2], vec![1.0, f32::INFINITY]).expect("feed");
    let procs = [
        GradientProcessor::global_norm_clip(1.0).expect("clip"),
        GradientProcessor::check_gradient(),
    ];
    let out = process_gradients(&mut f.graph, &f.grads, &procs).expect("process");
    let clipped = f.eval(&[out.grads[0].1]);
    assert!(clipped[0].iter().all(|x| x.is_nan()), "{clipped:?}");
    let checks: Vec<Value> = out.checks.iter().map(|c| c.all_finite).collect();
    let fetched =
        evaluate(&f.graph, &HashMap::new(), &f.feeds, &checks, Precision::F32).expect("eval");
    let err = check_numerics(&out.checks, &fetched).unwrap_err();
    assert_eq!(
        err,
        OptimError::NonFiniteGradient {
            variable: "a/W".into()
        }
    );
}
