//! The `fused` section: the CPU engine for fused elementwise expressions on ResNet-20's own
//! prologue and epilogue expressions (copied from the lowered program, in the text form
//! `FusedExpr` prints), over one 128×32×32×16 activation, on one thread. Figures are
//! nanoseconds per point: what a convolution's prologue or epilogue adds to it.

use towerpack::backend::cpu::fused::FusedProgram;
use towerpack::backend::cpu::memory::RawBuf;
use towerpack::ir::{BinaryOp, UnaryOp};
use towerpack::lower::{ExprOp, FusedExpr};
use towerpack::tensor::DType;

/// Batch norm's normalisation and the ReLU: the prologue of every 3×3 convolution after the
/// first (operand 0 the previous convolution's output, 1–4 mean, 1/σ, γ, β per channel).
const BN_RELU: &str = "v0:f32=in0; v1:f32=in1; v2:f32=sub(v0,v1); v3:f32=in2; v4:f32=mul(v2,v3); \
     v5:f32=in3; v6:f32=mul(v4,v5); v7:f32=in4; v8:f32=add(v6,v7); v9:f32=relu(v8) -> v9";

/// The backward-input convolution's epilogue before a batch norm + ReLU: the ReLU's gradient
/// (stored in bf16) and the four per-channel sums batch norm's gradient needs (operand 0 the
/// kernel's rows, 1 the zero, 2 the forward convolution's output, 3–6 mean, 1/σ, γ, β).
const RELU_GRAD_BN_SUMS: &str = "v0:f32=in2; v1:f32=in3; v2:f32=sub(v0,v1); v3:f32=in4; \
     v4:f32=mul(v2,v3); v5:f32=in5; v6:f32=mul(v4,v5); v7:f32=in6; v8:f32=add(v6,v7); \
     v9:f32=relu(v8); v10:f32=in1; v11:bool=gt(v9,v10); v12:f32=in0; \
     v13:f32=select(v11,v12,v10); v14:bf16=cast(v13); v15:f32=cast(v14); v16:f32=mul(v15,v4); \
     v17:f32=mul(v15,v5); v18:f32=mul(v17,v2); v19:f32=mul(v17,v3) -> v15,v15,v16,v18,v19";

/// The forward convolution's epilogue in a bf16 program: the output rounded to bf16 (stored)
/// and its per-channel sum (batch norm's mean).
const ROUND_AND_SUM: &str = "v0:f32=in0; v1:bf16=cast(v0); v2:f32=cast(v1) -> v2,v2";

/// Parses the text form of a [`FusedExpr`] (`v0:f32=in0; v1:f32=add(v0,v0) -> v1`).
fn parse(text: &str) -> FusedExpr {
    let (body, outputs) = text
        .split_once(" -> ")
        .expect("an expression names its outputs");
    let value = |s: &str| -> u32 { s.trim().trim_start_matches('v').parse().expect("vN") };
    let mut e = FusedExpr::default();
    for (i, instruction) in body.split(';').enumerate() {
        let (lhs, rhs) = instruction.trim().split_once('=').expect("vN:dtype=op");
        let dtype = match lhs.split_once(':').expect("vN:dtype").1 {
            "f32" => DType::F32,
            "bf16" => DType::BF16,
            "bool" => DType::Bool,
            other => panic!("dtype {other}"),
        };
        let op = if let Some(k) = rhs.strip_prefix("in") {
            ExprOp::Load(k.parse().expect("inN"))
        } else {
            let (name, args) = rhs.trim_end_matches(')').split_once('(').expect("op(args)");
            let args: Vec<u32> = args.split(',').map(value).collect();
            if name == "cast" {
                ExprOp::Cast(args[0])
            } else if name == "select" {
                ExprOp::Select(args[0], args[1], args[2])
            } else if let Some(u) = UnaryOp::ALL.iter().find(|u| u.name() == name) {
                ExprOp::Unary(*u, args[0])
            } else {
                let b = BinaryOp::ALL.iter().find(|b| b.name() == name);
                ExprOp::Binary(*b.unwrap_or_else(|| panic!("op {name}")), args[0], args[1])
            }
        };
        assert_eq!(e.push(op, dtype), i as u32);
    }
    e.outputs = outputs.split(',').map(value).collect();
    e
}

fn raw<T>(v: &mut [T], dtype: DType) -> RawBuf {
    RawBuf {
        ptr: v.as_mut_ptr().cast(),
        dtype,
        len: v.len(),
    }
}

/// bf16 bit patterns of `xs` (truncated: the values only need to be plausible).
fn bf16(xs: &[f32]) -> Vec<u16> {
    xs.iter().map(|x| (x.to_bits() >> 16) as u16).collect()
}

/// Runs the section: `time(f)` gives the seconds per call of `f`, `line(name, secs, points)`
/// reports one measurement.
pub fn bench(
    data: impl Fn(usize, usize) -> Vec<f32>,
    time: impl Fn(&mut dyn FnMut()) -> f64,
    line: impl Fn(&str, f64, usize),
) {
    let (rows, c) = (128 * 32 * 32, 16);
    let points = rows * c;
    let shape = [rows, c];
    let (whole, channel, scalar): (&[usize], &[usize], &[usize]) = (&[c, 1], &[0, 1], &[0, 0]);
    let x = data(points, 1);
    let mut x_bf16 = bf16(&x);
    let mut x = x;
    let mut stats: Vec<Vec<f32>> = (0..4).map(|i| data(c, 10 + i)).collect();
    for s in &mut stats[1] {
        *s = s.abs() + 0.5; // 1/σ > 0
    }
    let mut zero = vec![0.0f32];
    let stat_bufs: Vec<RawBuf> = stats.iter_mut().map(|s| raw(s, DType::F32)).collect();

    // The prologue, from f32 and from bf16 storage.
    let expr = parse(BN_RELU);
    let views = [
        (0, whole),
        (0, channel),
        (0, channel),
        (0, channel),
        (0, channel),
    ];
    let program = FusedProgram::new(&expr, &shape, &views);
    // Image by image into one image's buffer, as a convolution computes its input.
    let image = 32 * 32 * c;
    let mut out = vec![0.0f32; image];
    for (name, input) in [
        ("bn+relu prologue, f32 input", raw(&mut x, DType::F32)),
        (
            "bn+relu prologue, bf16 input",
            raw(&mut x_bf16, DType::BF16),
        ),
    ] {
        let mut inputs = vec![input];
        inputs.extend_from_slice(&stat_bufs);
        let secs = time(&mut || {
            // SAFETY: every operand covers the iteration space (views above).
            for start in (0..points).step_by(image) {
                unsafe { program.run_into(start, &inputs, &mut out) }
            }
        });
        line(name, secs, points);
        // The same on one image again and again (in cache): the engine's own cost.
        let secs = time(&mut || {
            // SAFETY: as above.
            unsafe { program.run_into(0, &inputs, &mut out) }
        });
        line(&format!("{name}, cached"), secs, image);
    }

    // The forward epilogue: bf16 rounding, stored, and a per-channel sum.
    let expr = parse(ROUND_AND_SUM);
    let program = FusedProgram::new_epilogue(&expr, &shape, &[(0, whole)], 1);
    let mut rows_out = data(points, 2);
    let mut stored = vec![0u16; points];
    let outputs = [
        raw(&mut stored, DType::BF16),
        raw(&mut zero.clone(), DType::F32),
    ];
    let mut sums = vec![0.0f64; c];
    let mut rows_copy = rows_out.clone();
    let placeholder = [raw(&mut rows_copy, DType::F32)];
    let secs = time(&mut || {
        // SAFETY: as above; output 0 holds every point.
        unsafe { program.run_epilogue(&mut rows_out, 0, &placeholder, &outputs, 1, c, &mut sums) }
    });
    line("bf16 round + sum epilogue", secs, points);

    // The backward epilogue: ReLU's gradient and batch norm's sums.
    let expr = parse(RELU_GRAD_BN_SUMS);
    let views = [
        (0, whole),
        (0, scalar),
        (0, whole),
        (0, channel),
        (0, channel),
        (0, channel),
        (0, channel),
    ];
    let program = FusedProgram::new_epilogue(&expr, &shape, &views, 1);
    let mut inputs = vec![
        placeholder[0],
        raw(&mut zero, DType::F32),
        raw(&mut x_bf16, DType::BF16),
    ];
    inputs.extend_from_slice(&stat_bufs);
    let mut sums = vec![0.0f64; 4 * c];
    let secs = time(&mut || {
        // SAFETY: as above.
        unsafe { program.run_epilogue(&mut rows_out, 0, &inputs, &outputs, 1, c, &mut sums) }
    });
    line("relu grad + bn sums epilogue", secs, points);
}
