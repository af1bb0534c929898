//! Gradient checks of layout ops (reshape, transpose, broadcast, slice, concat, pad) against
//! central differences in f64, on random inputs of random small shapes.

use crate::autodiff_support;

use autodiff_support::{Case, Worst, symbolic};
use towerpack::ir::{Op, Shape, UnaryOp};

const CASES: u64 = 16;

fn dims(c: &mut Case, rank_lo: usize, rank_hi: usize) -> Vec<usize> {
    let rank = c.size(rank_lo, rank_hi);
    (0..rank).map(|_| c.size(1, 4)).collect()
}

/// A nonlinear op after the layout op, so the adjoint reaching it is not constant.
fn squash(c: &mut Case, y: towerpack::ir::Value) -> towerpack::ir::Value {
    let name = c.graph.unique_name("squash");
    c.node(&name, Op::Unary(UnaryOp::Tanh), &[y])
}

#[test]
fn reshape_reshapes_the_adjoint_back() {
    let mut worst = Worst("reshape", 0.0);
    for i in 0..CASES {
        let mut c = Case::new(2000 + i);
        let batched = c.coin();
        let d = dims(&mut c, 2 + usize::from(batched), 4);
        let x = c.random_input("x", &d, batched, -1.0, 1.0);
        // Merge the last two axes; with a batch, the batch stays leading.
        let r = d.len();
        let mut target: Vec<usize> = d[..r - 2].to_vec();
        target.push(d[r - 2] * d[r - 1]);
        if c.coin() {
            target.push(1);
        }
        let y = c.node(
            "y",
            Op::Reshape {
                shape: symbolic(&target, batched),
            },
            &[x],
        );
        let y = squash(&mut c, y);
        worst.see(c.check(&[y], &[x]));
    }
}

#[test]
fn transpose_applies_the_inverse_permutation() {
    let mut worst = Worst("transpose", 0.0);
    for i in 0..CASES {
        let mut c = Case::new(2100 + i);
        let d = dims(&mut c, 2, 4);
        let batched = c.coin();
        let x = c.random_input("x", &d, batched, -1.0, 1.0);
        let first = usize::from(batched);
        let mut perm: Vec<usize> = (0..d.len()).collect();
        for k in (first + 1..d.len()).rev() {
            let j = c.size(first, k);
            perm.swap(k, j);
        }
        let y = c.node("y", Op::Transpose { perm }, &[x]);
        let y = squash(&mut c, y);
        worst.see(c.check(&[y], &[x]));
    }
}

#[test]
fn broadcast_reduce_sums_the_adjoint() {
    let mut worst = Worst("broadcast", 0.0);
    for i in 0..CASES {
        let mut c = Case::new(2200 + i);
        let full = dims(&mut c, 1, 3);
        let keep = c.size(1, full.len());
        let mut small: Vec<usize> = full[full.len() - keep..].to_vec();
        for d in small.iter_mut() {
            if c.coin() {
                *d = 1;
            }
        }
        let x = c.random_input("x", &small, false, -1.0, 1.0);
        let batched = c.coin();
        let target = if batched {
            let mut t = vec![c.size(1, 3)];
            t.extend(&full);
            t
        } else {
            full.clone()
        };
        let y = c.node(
            "y",
            Op::Broadcast {
                shape: symbolic(&target, batched),
            },
            &[x],
        );
        let y = squash(&mut c, y);
        // Bind the batch size through another input when the target is batched.
        if batched {
            let _ = c.random_input("batch_binder", &target, true, 0.0, 1.0);
        }
        worst.see(c.check(&[y], &[x]));
    }
}

#[test]
fn slice_pads_the_adjoint_and_pad_slices_it() {
    let mut worst = Worst("slice/pad", 0.0);
    for i in 0..CASES {
        let mut c = Case::new(2300 + i);
        let mut d = dims(&mut c, 1, 3);
        let batched = c.coin() && d.len() > 1;
        let axis = c.size(usize::from(batched), d.len() - 1);
        d[axis] = c.size(2, 5);
        let x = c.random_input("x", &d, batched, -1.0, 1.0);
        let start = c.size(0, d[axis] - 1);
        let end = c.size(start + 1, d[axis]);
        let s = c.node("s", Op::Slice { axis, start, end }, &[x]);
        let s = squash(&mut c, s);
        let pads: Vec<(usize, usize)> = (0..d.len())
            .map(|a| {
                if batched && a == 0 {
                    (0, 0)
                } else {
                    (c.size(0, 2), c.size(0, 2))
                }
            })
            .collect();
        let p = c.node("p", Op::Pad { pads }, &[x]);
        let p = squash(&mut c, p);
        worst.see(c.check(&[s, p], &[x]));
    }
}

#[test]
fn concat_slices_the_adjoint_per_input() {
    let mut worst = Worst("concat", 0.0);
    for i in 0..CASES {
        let mut c = Case::new(2400 + i);
        let d = dims(&mut c, 1, 3);
        let batched = c.coin() && d.len() > 1;
        let axis = c.size(usize::from(batched), d.len() - 1);
        let parts = c.size(1, 3);
        let mut xs = Vec::new();
        for k in 0..parts {
            let mut dk = d.clone();
            dk[axis] = c.size(1, 3);
            xs.push(c.random_input(&format!("x{k}"), &dk, batched, -1.0, 1.0));
        }
        // Some inputs also feed other ops: their adjoints accumulate.
        let y = c.node("y", Op::Concat { axis }, &xs);
        let y = squash(&mut c, y);
        let extra = c.node("extra", Op::Unary(UnaryOp::Sigmoid), &[xs[0]]);
        worst.see(c.check(&[y, extra], &xs));
    }
}

#[test]
fn explicit_batch_shapes_survive_layout_gradients() {
    // [N, a, b] -> transpose -> reshape -> slice on a fixed axis, all under a batch.
    let mut worst = Worst("layout chain", 0.0);
    for i in 0..CASES {
        let mut c = Case::new(2500 + i);
        let (n, a, b) = (c.size(1, 3), c.size(2, 3), c.size(2, 3));
        let x = c.random_input("x", &[n, a, b], true, -1.0, 1.0);
        let t = c.node(
            "t",
            Op::Transpose {
                perm: vec![0, 2, 1],
            },
            &[x],
        );
        let r = c.node(
            "r",
            Op::Reshape {
                shape: Shape::batched(&[a * b]),
            },
            &[t],
        );
        let s = c.node(
            "s",
            Op::Slice {
                axis: 1,
                start: 1,
                end: a * b,
            },
            &[r],
        );
        let y = squash(&mut c, s);
        worst.see(c.check(&[y], &[x]));
    }
}

#[test]
fn all_reduce_passes_the_reduced_adjoint_through() {
    // In one process the collective has one participant: sum and mean are the identity, and
    // so is their gradient (an all-reduce of the adjoint).
    let mut worst = Worst("all_reduce", 0.0);
    for i in 0..CASES {
        let mut c = Case::new(2600 + i);
        let batched = c.coin();
        let d = dims(&mut c, 1 + usize::from(batched), 3);
        let x = c.random_input("x", &d, batched, -1.0, 1.0);
        let op = if c.coin() {
            towerpack::ir::ReduceOp::Sum
        } else {
            towerpack::ir::ReduceOp::Mean
        };
        let y = c.node("y", Op::AllReduce { op }, &[x]);
        let y = squash(&mut c, y);
        worst.see(c.check(&[y], &[x]));
    }
}
