//! Gradient checks of elementwise ops (unary, broadcasting binary, select, casts) against
//! central differences in f64, on random inputs of random small shapes.

use crate::autodiff_support;

use autodiff_support::{Case, Worst, symbolic};
use towerpack::ir::{BinaryOp, Op, Shape, TensorType, UnaryOp, Value};
use towerpack::tensor::DType;

const CASES: u64 = 12;

/// Random dims of rank 1..=3, sizes 1..=4.
fn dims(c: &mut Case) -> Vec<usize> {
    let rank = c.size(1, 3);
    (0..rank).map(|_| c.size(1, 4)).collect()
}

/// Two operand shapes that broadcast together, sometimes with a leading batch on the first.
/// Returns `(dims_a, batched_a, dims_b, batched_b)`.
fn broadcast_pair(c: &mut Case) -> (Vec<usize>, bool, Vec<usize>, bool) {
    let rank = c.size(1, 3);
    let full: Vec<usize> = (0..rank).map(|_| c.size(2, 4)).collect();
    let mut a = full.clone();
    for d in a.iter_mut() {
        if c.size(0, 3) == 0 {
            *d = 1;
        }
    }
    let keep = c.size(0, rank);
    let mut b: Vec<usize> = full[rank - keep..].to_vec();
    for d in b.iter_mut() {
        if c.size(0, 3) == 0 {
            *d = 1;
        }
    }
    let batched = c.coin();
    let (mut a, mut b) = if c.coin() { (a, b) } else { (b, a) };
    let (mut ba, mut bb) = (false, false);
    if batched {
        let n = c.size(1, 3);
        // The longer operand gets the batch; the other stays unbatched (it broadcasts).
        if a.len() >= b.len() {
            a.insert(0, n);
            ba = true;
        } else {
            b.insert(0, n);
            bb = true;
        }
    }
    (a, ba, b, bb)
}

fn signed(c: &mut Case, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let m = c.uniform(1, lo, hi)[0];
            if c.coin() { m } else { -m }
        })
        .collect()
}

#[test]
fn unary_ops_match_finite_differences() {
    let mut worst = Worst("unary", 0.0);
    for op in UnaryOp::ALL {
        if op == UnaryOp::Not {
            continue;
        }
        for i in 0..CASES {
            let mut c = Case::new(100 + 17 * i + op as u64 * 1000);
            let d = dims(&mut c);
            let batched = c.coin();
            let n: usize = d.iter().product();
            let values = match op {
                UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Recip => {
                    c.uniform(n, 0.5, 2.0)
                }
                // Away from the kinks and jumps (0, the integers).
                UnaryOp::Abs | UnaryOp::Relu | UnaryOp::Sign => signed(&mut c, n, 0.1, 1.5),
                UnaryOp::Floor => (0..n)
                    .map(|_| c.size(0, 4) as f64 - 2.0 + c.uniform(1, 0.2, 0.8)[0])
                    .collect(),
                _ => c.uniform(n, -2.0, 2.0),
            };
            let x = c.input("x", symbolic(&d, batched), &d, values);
            let y = c.node("y", Op::Unary(op), &[x]);
            worst.see(c.check(&[y], &[x]));
        }
    }
}

#[test]
fn binary_ops_match_finite_differences_with_broadcasting() {
    let mut worst = Worst("binary", 0.0);
    let ops = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
    ];
    for op in ops {
        for i in 0..CASES + 3 {
            let mut c = Case::new(7 + 31 * i + op as u64 * 1000);
            let (da, ba, db, bb) = broadcast_pair(&mut c);
            let (na, nb) = (da.iter().product::<usize>(), db.iter().product::<usize>());
            let (va, vb) = match op {
                BinaryOp::Div => (c.uniform(na, -2.0, 2.0), signed(&mut c, nb, 0.5, 2.0)),
                BinaryOp::Pow => (c.uniform(na, 0.5, 2.0), c.uniform(nb, -1.5, 1.5)),
                BinaryOp::Maximum | BinaryOp::Minimum => {
                    let all = c.distinct(na + nb, -2.0, 2.0);
                    (all[..na].to_vec(), all[na..].to_vec())
                }
                _ => (c.uniform(na, -2.0, 2.0), c.uniform(nb, -2.0, 2.0)),
            };
            let a = c.input("a", symbolic(&da, ba), &da, va);
            let b = c.input("b", symbolic(&db, bb), &db, vb);
            let z = c.node("z", Op::Binary(op), &[a, b]);
            worst.see(c.check(&[z], &[a, b]));
        }
    }
}

#[test]
fn an_operand_used_twice_accumulates_both_adjoints() {
    let mut worst = Worst("x*x + exp(x)", 0.0);
    for i in 0..CASES {
        let mut c = Case::new(500 + i);
        let d = dims(&mut c);
        let x = c.random_input("x", &d, false, -1.0, 1.0);
        let sq = c.node("sq", Op::Binary(BinaryOp::Mul), &[x, x]);
        let e = c.node("e", Op::Unary(UnaryOp::Exp), &[x]);
        let y = c.node("y", Op::Binary(BinaryOp::Add), &[sq, e]);
        worst.see(c.check(&[y], &[x]));
    }
}

#[test]
fn select_routes_the_adjoint_by_condition_with_broadcasting() {
    let mut worst = Worst("select", 0.0);
    for i in 0..CASES + 3 {
        let mut c = Case::new(900 + i);
        let (da, ba, db, bb) = broadcast_pair(&mut c);
        let a = c.random_input("a", &da, ba, -1.0, 1.0);
        let b = c.random_input("b", &db, bb, -1.0, 1.0);
        // The condition has the broadcast shape of both (rank and batch of the longer one).
        let out_dims = c
            .eval(&[a, b])
            .iter()
            .fold(Vec::new(), |acc, t| broadcast_dims(&acc, t.shape()));
        let n: usize = out_dims.iter().product();
        let bits: Vec<f64> = (0..n).map(|_| f64::from(u8::from(c.coin()))).collect();
        let batched = ba || bb;
        let ty = TensorType::new(DType::Bool, symbolic(&out_dims, batched));
        let cond = c.typed_input("cond", ty, &out_dims, bits);
        let z = c.node("z", Op::Select, &[cond, a, b]);
        worst.see(c.check(&[z], &[a, b]));
    }
}

fn broadcast_dims(a: &[usize], b: &[usize]) -> Vec<usize> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let da = (i + a.len()).checked_sub(r).map_or(1, |j| a[j]);
            let db = (i + b.len()).checked_sub(r).map_or(1, |j| b[j]);
            da.max(db)
        })
        .collect()
}

#[test]
fn float_casts_and_identity_pass_the_adjoint_through() {
    let mut worst = Worst("cast/identity", 0.0);
    for i in 0..CASES {
        let mut c = Case::new(1300 + i);
        let d = dims(&mut c);
        let batched = c.coin();
        let x = c.random_input("x", &d, batched, -1.0, 1.0);
        let wide = c.node("wide", Op::Cast { to: DType::F64 }, &[x]);
        let t = c.node("t", Op::Unary(UnaryOp::Tanh), &[wide]);
        let back = c.node("back", Op::Cast { to: DType::F32 }, &[t]);
        let id = c.node("id", Op::Identity, &[back]);
        let y = c.node("y", Op::Binary(BinaryOp::Mul), &[id, x]);
        worst.see(c.check(&[y, t], &[x]));
    }
}

#[test]
fn integer_paths_carry_no_gradient() {
    // y = x * cast(argmax(x)): the argmax path is locally constant, so only the direct path
    // contributes, and the pass must not fail on it.
    let mut worst = Worst("argmax path", 0.0);
    for i in 0..CASES {
        let mut c = Case::new(1700 + i);
        let (n, k) = (c.size(1, 3), c.size(2, 5));
        let values = c.distinct(n * k, -1.0, 1.0);
        let x = c.input("x", Shape::batched(&[k]), &[n, k], values);
        let am = c.node("am", Op::ArgMax { axis: 1 }, &[x]);
        let f = c.node("f", Op::Cast { to: DType::F32 }, &[am]);
        let f = c.node(
            "f2",
            Op::Reshape {
                shape: Shape::batched(&[1]),
            },
            &[f],
        );
        let y: Value = c.node("y", Op::Binary(BinaryOp::Mul), &[x, f]);
        worst.see(c.check(&[y], &[x]));
    }
}
