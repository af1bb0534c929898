//! The engine against the expressions' scalar semantics.

use super::*;

/// A view of `v` as an `f32` buffer.
fn f32_buffer(v: &mut [f32]) -> RawBuf {
    RawBuf {
        ptr: v.as_mut_ptr().cast(),
        dtype: DType::F32,
        len: v.len(),
    }
}

/// Random chains of per-channel steps (the shapes [`plan`] fuses, in and out of order, with
/// values read twice, behind bf16 round trips) and selects on comparisons, on inputs with zeros of both signs, NaN,
/// infinities, overflowing and subnormal values: the engine's lanes are bitwise the
/// expression's scalar semantics, hoisted (a long run) or not (a short one).
#[test]
fn fused_chains_give_the_bits_of_one_pass_per_instruction() {
    use crate::ir::{BinaryOp, UnaryOp};
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let special = [
        0.0,
        -0.0,
        f32::NAN,
        f32::INFINITY,
        -f32::INFINITY,
        3e38,
        1e-40,
        -2.5,
    ];
    let value = |rng: &mut rand_chacha::ChaCha8Rng| {
        if rng.random_bool(0.1) {
            special[rng.random_range(0..special.len())]
        } else {
            rng.random_range(-4.0f32..4.0)
        }
    };
    let (rows, c) = (40, 16);
    let (mut chained, mut direct, mut summed, mut rounded, mut packed) = (0, 0, 0, 0, 0);
    const CASES: usize = 400;
    for case in 0..CASES {
        let f = DType::F32;
        let mut e = FusedExpr::default();
        let mut x = e.push(ExprOp::Load(0), f);
        let k: Vec<u32> = (1..=4).map(|i| e.push(ExprOp::Load(i), f)).collect();
        let mut outputs = Vec::new();
        for _ in 0..rng.random_range(1..8) {
            let kk = k[rng.random_range(0..4)];
            let op = match rng.random_range(0..13) {
                0 => ExprOp::Binary(BinaryOp::Sub, x, kk),
                1 => ExprOp::Binary(BinaryOp::Mul, x, kk),
                2 => ExprOp::Binary(BinaryOp::Mul, kk, x),
                3 => ExprOp::Binary(BinaryOp::Add, x, kk),
                4 => ExprOp::Binary(BinaryOp::Add, kk, x),
                5 => ExprOp::Unary(UnaryOp::Relu, x),
                6 => ExprOp::Binary(BinaryOp::Sub, kk, x),
                7 => {
                    let rounded = e.push(ExprOp::Cast(x), DType::BF16);
                    ExprOp::Cast(rounded)
                }
                8 => ExprOp::Unary(UnaryOp::Neg, x),
                12 => {
                    // Operand 0 loaded again and rounded to bf16 (read in place), what an
                    // output kept in bf16 stores.
                    let fresh = e.push(ExprOp::Load(0), f);
                    let rounded = e.push(ExprOp::Cast(fresh), DType::BF16);
                    ExprOp::Cast(rounded)
                }
                11 => {
                    // A select of operand 0, loaded again for it alone (read in place).
                    let fresh = e.push(ExprOp::Load(0), f);
                    let cond = e.push(ExprOp::Binary(BinaryOp::Ge, x, kk), DType::Bool);
                    ExprOp::Select(cond, fresh, kk)
                }
                choice => {
                    use BinaryOp::*;
                    let cmp = [Lt, Le, Gt, Ge, Eq, Ne][rng.random_range(0..6)];
                    let cond = e.push(ExprOp::Binary(cmp, x, kk), DType::Bool);
                    if choice == 10 {
                        // The condition read twice: it stays a register of its own.
                        let other = e.push(ExprOp::Select(cond, kk, x), f);
                        outputs.push(other);
                    }
                    ExprOp::Select(cond, x, kk)
                }
            };
            if rng.random_bool(0.15) {
                outputs.push(x);
            }
            x = e.push(op, f);
        }
        outputs.push(x);
        e.outputs = outputs;
        let whole: &[usize] = &[c, 1];
        let channel: &[usize] = &[0, 1];
        let views = [
            (0, whole),
            (0, channel),
            (0, channel),
            (0, channel),
            (0, channel),
        ];
        let program = FusedProgram::new(&e, &[rows, c], &views);
        let fused = |r: &Role| matches!(r, Role::Chain(_) | Role::SelectCompared(..));
        chained += usize::from(program.roles.iter().any(fused));
        let round_streams = |(i, (op, _)): (usize, &(ExprOp, DType))| {
            matches!(op, ExprOp::Cast(_)) && program.streamed.get(i) == Some(&Streamed::No) && {
                let ExprOp::Cast(a) = op else { return false };
                program.streamed[*a as usize] == Streamed::F32
            }
        };
        rounded += usize::from(e.ops.iter().enumerate().any(round_streams));
        let mut operands: Vec<Vec<f32>> = std::iter::once(rows * c)
            .chain([c; 4])
            .map(|len| (0..len).map(|_| value(&mut rng)).collect())
            .collect();
        let mut inputs: Vec<RawBuf> = operands.iter_mut().map(|v| f32_buffer(v)).collect();
        // Operand 0 stored in bf16 (a chain then widens it as it reads it) or in f32.
        let mut x16 = vec![0u16; rows * c];
        if rng.random_bool(0.4) {
            crate::backend::cpu::kernels::round::to_bf16_bits(&operands[0], &mut x16);
            crate::backend::cpu::kernels::round::from_bf16_bits(&x16, &mut operands[0]);
            inputs[0] = RawBuf {
                ptr: x16.as_mut_ptr().cast(),
                dtype: DType::BF16,
                len: x16.len(),
            };
        }
        let operands = operands;
        let want_at = |p: usize| {
            let load = |i: u16| {
                let v = &operands[usize::from(i)];
                f64::from(if i == 0 { v[p] } else { v[p % c] })
            };
            e.eval(load, &[p / c, p % c], p)
        };
        let same = |g: f32, w: f64| {
            let w = w as f32;
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan())
        };
        if e.outputs.len() > 1 {
            // As an epilogue whose outputs after the first are column sums: products only
            // the sums read are multiplied as they are summed, to the same bits.
            let stored = 1;
            let summing = FusedProgram::new_epilogue(&e, &[rows, c], &views, stored);
            summed += usize::from(summing.roles.iter().any(|r| matches!(r, Role::Summed(..))));
            let placeholder = [RawBuf {
                ptr: std::ptr::NonNull::<f32>::dangling().as_ptr().cast(),
                dtype: DType::F32,
                len: 0,
            }];
            // From a row start, and from inside a row (the sums' general path).
            let first = if case % 2 == 0 { 0 } else { c / 2 };
            let mut results = Vec::new();
            for p in [&program, &summing] {
                let mut rows_in = operands[0][first..].to_vec();
                let mut sums = vec![0.0f64; (e.outputs.len() - stored) * c];
                // SAFETY: as for `run` below; nothing is stored but output 0, in the rows.
                unsafe {
                    p.run_epilogue(
                        &mut rows_in,
                        first,
                        &inputs,
                        &placeholder,
                        stored,
                        c,
                        &mut sums,
                    )
                };
                results.push((rows_in, sums));
            }
            // Bitwise, any NaN matching any NaN (which NaN an addition keeps is the
            // compiler's choice of operand order).
            let bits = |v: &[f64]| {
                v.iter()
                    .map(|x| if x.is_nan() { u64::MAX } else { x.to_bits() })
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(&results[0].1), bits(&results[1].1), "case {case}: {e}");
            let rows_of = |i: usize| {
                results[i]
                    .0
                    .iter()
                    .map(|&x| f64::from(x))
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(&rows_of(0)), bits(&rows_of(1)), "case {case}: {e}");
        }
        {
            // As an epilogue: operand 0 is the rows, output 0 written back into them.
            let mut rows_in = operands[0].clone();
            let mut got = vec![vec![0.0f32; rows * c]; e.outputs.len()];
            let outs: Vec<RawBuf> = got.iter_mut().map(|v| f32_buffer(v)).collect();
            let stored = e.outputs.len();
            // SAFETY: as for `run` below; the rows are the whole space.
            unsafe { program.run_epilogue(&mut rows_in, 0, &inputs, &outs, stored, c, &mut []) };
            // Output 0 kept in bf16: the bits of the rows written back, rounded.
            let mut want_bits = vec![0u16; rows * c];
            crate::backend::cpu::kernels::round::to_bf16_bits(&rows_in, &mut want_bits);
            let mut scratch_rows = operands[0].clone();
            let mut bits = vec![0u16; rows * c];
            let mut got16 = vec![vec![0.0f32; rows * c]; e.outputs.len()];
            let outs16: Vec<RawBuf> = got16.iter_mut().map(|v| f32_buffer(v)).collect();
            // SAFETY: as above.
            unsafe {
                program.run_epilogue_to_bf16(
                    &mut scratch_rows,
                    0,
                    &inputs,
                    &outs16,
                    stored,
                    c,
                    &mut [],
                    &mut bits,
                )
            };
            let quiet = |b: u16| if b & 0x7fff > 0x7f80 { 0x7fc0 } else { b };
            let (got_q, want_q): (Vec<u16>, Vec<u16>) = (
                bits.iter().map(|&b| quiet(b)).collect(),
                want_bits.iter().map(|&b| quiet(b)).collect(),
            );
            assert_eq!(got_q, want_q, "case {case}: output 0 to bf16 in {e}");
            let same_outputs = got16[1..].iter().zip(&got[1..]).all(|(a, b)| {
                a.iter()
                    .zip(b)
                    .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
            });
            assert!(same_outputs, "case {case}: stored outputs to bf16 in {e}");
            packed += usize::from(Some(e.outputs[0]) != program.raw_load);
            for p in 0..rows * c {
                let want = want_at(p);
                assert!(
                    same(rows_in[p], want[0]),
                    "case {case}, epilogue point {p} in {e}"
                );
                for o in 1..stored {
                    assert!(
                        same(got[o][p], want[o]),
                        "case {case}, epilogue {o}, {p} in {e}"
                    );
                }
            }
        }
        for end in [rows * c, 100] {
            let mut got = vec![vec![0.0f32; rows * c]; e.outputs.len()];
            let outs: Vec<RawBuf> = got.iter_mut().map(|v| f32_buffer(v)).collect();
            // SAFETY: the operands cover `rows × c` points; outputs hold them all.
            unsafe { program.run(0, end, &inputs, &outs) };
            for p in 0..end {
                let load = |i: u16| {
                    let v = &operands[usize::from(i)];
                    f64::from(if i == 0 { v[p] } else { v[p % c] })
                };
                let want = e.eval(load, &[p / c, p % c], p);
                for (o, w) in want.iter().enumerate() {
                    let (g, w) = (got[o][p], *w as f32);
                    assert!(
                        g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                        "case {case}, point {p}, output {o}: {g:e} vs {w:e} in {e}"
                    );
                }
            }
        }
        if program.single_f32_output() {
            // As a prologue computes its input: from a start inside the run, into a slice
            // (straight from the last instruction where `direct` allows).
            direct += usize::from(program.direct.is_some());
            let (start, len) = (3 * c, rows * c - 5 * c);
            let mut got = vec![0.0f32; len];
            // SAFETY: as above.
            unsafe { program.run_into(start, &inputs, &mut got) };
            for (j, g) in got.iter().enumerate() {
                let p = start + j;
                let load = |i: u16| {
                    let v = &operands[usize::from(i)];
                    f64::from(if i == 0 { v[p] } else { v[p % c] })
                };
                let w = e.eval(load, &[p / c, p % c], p)[0] as f32;
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "case {case}, run_into point {p}: {g:e} vs {w:e} in {e}"
                );
            }
        }
    }
    assert!(
        chained > 100,
        "only {chained} of {CASES} expressions fused instructions"
    );
    assert!(
        summed > 30,
        "only {summed} of {CASES} summed a product as they added"
    );
    assert!(
        rounded > 15,
        "only {rounded} of {CASES} rounded operand 0 where it is stored"
    );
    assert!(
        packed > 100,
        "only {packed} of {CASES} packed output 0 to bf16"
    );
    assert!(
        direct > 15,
        "only {direct} of {CASES} wrote straight into a prologue's input"
    );
}

/// Prefetch ranges past the end of a buffer (the chunk loops ask for up to two chunks past
/// the last) are clamped, and values are untouched.
#[test]
fn prefetch_is_clamped_and_changes_nothing() {
    let mut data: Vec<f32> = (0..100).map(|i| i as f32).collect();
    let buf = f32_buffer(&mut data);
    for (start, n) in [
        (0, 100),
        (90, 1000),
        (100, 5),
        (usize::MAX - 3, 100),
        (5, usize::MAX),
    ] {
        buf.prefetch(start, n);
    }
    assert!(data.iter().enumerate().all(|(i, &x)| x == i as f32));
}
