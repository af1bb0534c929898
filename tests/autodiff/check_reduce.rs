//! Gradient checks of reductions, moments, softmaxes, cross-entropy and matrix products against
//! central differences in f64, on random inputs of random small shapes (batched and not).

use crate::autodiff_support;

use autodiff_support::{Case, Worst, symbolic};
use towerpack::ir::{Op, ReduceOp, Shape, TensorType, UnaryOp, Value};
use towerpack::tensor::DType;

const CASES: u64 = 16;

fn dims(c: &mut Case, rank_lo: usize, rank_hi: usize) -> Vec<usize> {
    let rank = c.size(rank_lo, rank_hi);
    (0..rank).map(|_| c.size(1, 4)).collect()
}

/// A random non-empty subset of `0..rank`, in increasing order.
fn axes(c: &mut Case, rank: usize) -> Vec<usize> {
    loop {
        let a: Vec<usize> = (0..rank).filter(|_| c.coin()).collect();
        if !a.is_empty() {
            return a;
        }
    }
}

#[test]
fn reductions_match_finite_differences() {
    let mut worst = Worst("reduce", 0.0);
    for op in ReduceOp::ALL {
        for i in 0..CASES {
            let mut c = Case::new(3000 + 100 * op as u64 + i);
            let d = dims(&mut c, 1, 4);
            // Every other case reduces over a batch axis (the count is computed in the graph).
            let batched = i % 2 == 0 || c.coin();
            let n = d.iter().product();
            // Distinct values: max/min have a unique arg (no kinks under the step).
            let values = c.distinct(n, -2.0, 2.0);
            let x = c.input("x", symbolic(&d, batched), &d, values);
            let mut axes = axes(&mut c, d.len());
            if i % 2 == 0 && axes[0] != 0 {
                axes.insert(0, 0);
            }
            let keep_dims = c.coin();
            let y = c.node(
                "y",
                Op::Reduce {
                    op,
                    axes,
                    keep_dims,
                },
                &[x],
            );
            worst.see(c.check(&[y], &[x]));
        }
    }
}

#[test]
fn max_ties_share_the_gradient_like_tensorflow() {
    // With two equal maxima the symbolic gradient gives each half (TF's rule); this is not a
    // derivative (there is none at a tie), so it is checked against the rule directly.
    let mut c = Case::new(3500);
    let x = c.input("x", Shape::fixed(&[4]), &[4], vec![1.0, 3.0, 3.0, -1.0]);
    let y = c.node(
        "y",
        Op::Reduce {
            op: ReduceOp::Max,
            axes: vec![0],
            keep_dims: false,
        },
        &[x],
    );
    let g = towerpack::autodiff::gradients_of_values(&mut c.graph, y, &[x], "gradients")
        .expect("gradient")[0]
        .expect("reached");
    assert_eq!(c.eval(&[g])[0].to_f64_vec(), vec![0.0, 0.5, 0.5, 0.0]);
}

#[test]
fn moments_match_finite_differences_for_each_output() {
    let mut worst = Worst("moments", 0.0);
    for i in 0..CASES * 2 {
        let mut c = Case::new(3600 + i);
        let d = dims(&mut c, 1, 4);
        let batched = c.coin();
        let x = c.random_input("x", &d, batched, -2.0, 2.0);
        let axes = axes(&mut c, d.len());
        let keep_dims = c.coin();
        let m = c.node("m", Op::Moments { axes, keep_dims }, &[x]);
        let mean = Value::new(m.node, 0);
        let var = Value::new(m.node, 1);
        let outputs: Vec<Value> = match i % 3 {
            0 => vec![mean, var],
            1 => vec![mean],
            _ => vec![var],
        };
        worst.see(c.check(&outputs, &[x]));
    }
}

#[test]
fn batch_norm_style_normalisation_matches_finite_differences() {
    // (x - mean) * rsqrt(var + eps) over the N, H, W axes of an NHWC batch.
    let mut worst = Worst("batch norm", 0.0);
    for i in 0..CASES {
        let mut c = Case::new(3700 + i);
        let d = [c.size(2, 3), c.size(1, 3), c.size(1, 3), c.size(1, 3)];
        let x = c.random_input("x", &d, true, -2.0, 2.0);
        let m = c.node(
            "m",
            Op::Moments {
                axes: vec![0, 1, 2],
                keep_dims: false,
            },
            &[x],
        );
        let eps = c.input("eps", Shape::scalar(), &[], vec![1e-3]);
        let var = c.node(
            "v",
            Op::Binary(towerpack::ir::BinaryOp::Add),
            &[Value::new(m.node, 1), eps],
        );
        let inv = c.node("inv", Op::Unary(UnaryOp::Rsqrt), &[var]);
        let centered = c.node(
            "centered",
            Op::Binary(towerpack::ir::BinaryOp::Sub),
            &[x, Value::new(m.node, 0)],
        );
        let y = c.node(
            "y",
            Op::Binary(towerpack::ir::BinaryOp::Mul),
            &[centered, inv],
        );
        worst.see(c.check(&[y], &[x]));
    }
}

#[test]
fn softmax_and_log_softmax_match_finite_differences() {
    let mut worst = Worst("softmax/log_softmax", 0.0);
    for i in 0..CASES * 2 {
        let mut c = Case::new(3800 + i);
        let d = dims(&mut c, 1, 3);
        let batched = c.coin();
        let x = c.random_input("x", &d, batched, -2.0, 2.0);
        let axis = c.size(0, d.len() - 1);
        let op = if i % 2 == 0 {
            Op::Softmax { axis }
        } else {
            Op::LogSoftmax { axis }
        };
        let y = c.node("y", op, &[x]);
        worst.see(c.check(&[y], &[x]));
    }
}

#[test]
fn sparse_softmax_cross_entropy_matches_finite_differences() {
    let mut worst = Worst("sparse xent", 0.0);
    for i in 0..CASES {
        let mut c = Case::new(3900 + i);
        let (n, classes) = (c.size(1, 4), c.size(2, 5));
        let batched = c.coin();
        let logits = c.random_input("logits", &[n, classes], batched, -2.0, 2.0);
        let labels: Vec<f64> = (0..n).map(|_| c.size(0, classes - 1) as f64).collect();
        let dtype = if c.coin() { DType::I64 } else { DType::I32 };
        let ty = TensorType::new(dtype, symbolic(&[n], batched));
        let labels = c.typed_input("labels", ty, &[n], labels);
        let loss = c.node("loss", Op::SparseSoftmaxCrossEntropy, &[logits, labels]);
        let cost = c.node(
            "mean",
            Op::Reduce {
                op: ReduceOp::Mean,
                axes: vec![0],
                keep_dims: false,
            },
            &[loss],
        );
        worst.see(c.check(&[loss, cost], &[logits]));
    }
}

#[test]
fn matmul_matches_finite_differences_for_every_transpose() {
    let mut worst = Worst("matmul", 0.0);
    for i in 0..CASES * 4 {
        let mut c = Case::new(4000 + i);
        let (ta, tb) = (i % 2 == 1, (i / 2) % 2 == 1);
        let (m, k, n) = (c.size(1, 4), c.size(1, 4), c.size(1, 4));
        // 0: rank 2; 1: batched left, rank-2 right; 2: both with the same fixed batch;
        // 3: both batched by N.
        let mode = (i / 4) % 4;
        let a_mat = if ta { [k, m] } else { [m, k] };
        let b_mat = if tb { [n, k] } else { [k, n] };
        let batch = c.size(1, 3);
        let (da, db, batched) = match mode {
            0 => (a_mat.to_vec(), b_mat.to_vec(), false),
            1 => ([&[batch][..], &a_mat].concat(), b_mat.to_vec(), c.coin()),
            2 => (
                [&[batch][..], &a_mat].concat(),
                [&[batch][..], &b_mat].concat(),
                false,
            ),
            _ => (
                [&[batch][..], &a_mat].concat(),
                [&[batch][..], &b_mat].concat(),
                true,
            ),
        };
        let a = c.random_input("a", &da, batched, -1.0, 1.0);
        let b = c.random_input("b", &db, batched && db.len() > 2, -1.0, 1.0);
        let z = c.node(
            "z",
            Op::MatMul {
                transpose_a: ta,
                transpose_b: tb,
            },
            &[a, b],
        );
        worst.see(c.check(&[z], &[a, b]));
    }
}
