//! Per-instruction integer and conversion semantics through real PTX: `cvt` rounding modes
//! (ties-to-even, truncation of negatives, saturation, NaN), f16/bf16 round-to-nearest-even with
//! subnormals, 64-bit arithmetic, `mul.hi`/`mad.hi`/`mul.wide`, bit fields, shifts, `setp` forms.

mod common;

use common::*;
use rand::Rng;

fn f(x: f32) -> u64 {
    u64::from(x.to_bits())
}

fn d(x: f64) -> u64 {
    x.to_bits()
}

/// (instruction, output bits, a, b, c, expected output)
type Row = (&'static str, u32, u64, u64, u64, u64);

fn check(rows: &[Row]) {
    for &(body, out, a, b, c, want) in rows {
        let got = run_op(body, out, &[a], &[b], &[c])[0];
        assert_eq!(
            got, want,
            "{body} with a={a:#x} b={b:#x} c={c:#x}: got {got:#x}, want {want:#x}"
        );
    }
}

#[test]
fn cvt_float_to_int_rounding_saturation_and_nan() {
    let neg = |v: i64| v as u32 as u64;
    check(&[
        ("cvt.rni.s32.f32 %ro, %ra;", 32, f(2.5), 0, 0, 2),
        ("cvt.rni.s32.f32 %ro, %ra;", 32, f(3.5), 0, 0, 4),
        ("cvt.rni.s32.f32 %ro, %ra;", 32, f(-2.5), 0, 0, neg(-2)),
        ("cvt.rzi.s32.f32 %ro, %ra;", 32, f(-2.7), 0, 0, neg(-2)),
        ("cvt.rmi.s32.f32 %ro, %ra;", 32, f(-2.2), 0, 0, neg(-3)),
        ("cvt.rpi.s32.f32 %ro, %ra;", 32, f(-2.7), 0, 0, neg(-2)),
        ("cvt.rzi.s32.f32 %ro, %ra;", 32, f(f32::NAN), 0, 0, 0),
        (
            "cvt.rzi.s32.f32 %ro, %ra;",
            32,
            f(3e9),
            0,
            0,
            i32::MAX as u64,
        ),
        (
            "cvt.rzi.s32.f32 %ro, %ra;",
            32,
            f(f32::NEG_INFINITY),
            0,
            0,
            neg(i32::MIN as i64),
        ),
        ("cvt.rzi.u32.f32 %ro, %ra;", 32, f(-7.5), 0, 0, 0),
        (
            "cvt.rni.s64.f32 %xo, %ra;",
            64,
            f(-1e10),
            0,
            0,
            (-10_000_000_000i64) as u64,
        ),
        ("cvt.rzi.ftz.s32.f32 %ro, %ra;", 32, f(-0.99), 0, 0, 0),
        ("cvt.rni.u8.f32 %ro, %ra;", 32, f(300.0), 0, 0, 255),
        ("cvt.rzi.s32.f64 %ro, %xa;", 32, d(-123.9), 0, 0, neg(-123)),
    ]);
}

#[test]
fn cvt_int_to_float_and_float_to_float() {
    let big = (1u64 << 24) + 1;
    check(&[
        (
            "cvt.rn.f32.s32 %ro, %ra;",
            32,
            (-3i32) as u32 as u64,
            0,
            0,
            f(-3.0),
        ),
        (
            "cvt.rn.f32.u32 %ro, %ra;",
            32,
            u64::from(u32::MAX),
            0,
            0,
            f(4294967296.0),
        ),
        ("cvt.rz.f32.u64 %ro, %xa;", 32, big, 0, 0, f(16777216.0)),
        ("cvt.rp.f32.u64 %ro, %xa;", 32, big, 0, 0, f(16777218.0)),
        (
            "cvt.rn.f32.s64 %ro, %xa;",
            32,
            (-(big as i64) - 2) as u64,
            0,
            0,
            f(-16777220.0),
        ),
        (
            "cvt.rn.f64.s32 %xo, %ra;",
            64,
            (-7i32) as u32 as u64,
            0,
            0,
            d(-7.0),
        ),
        (
            "cvt.f64.f32 %xo, %ra;",
            64,
            f(0.1),
            0,
            0,
            d(f64::from(0.1f32)),
        ),
        ("cvt.rn.f32.f64 %ro, %xa;", 32, d(0.1), 0, 0, f(0.1)),
        (
            "cvt.rz.f32.f64 %ro, %xa;",
            32,
            d(1.0 + 2f64.powi(-30)),
            0,
            0,
            f(1.0),
        ),
        (
            "cvt.rp.f32.f64 %ro, %xa;",
            32,
            d(1.0 + 2f64.powi(-30)),
            0,
            0,
            f(1.0 + f32::EPSILON),
        ),
        (
            "cvt.rn.f32.f64 %ro, %xa;",
            32,
            d(1e300),
            0,
            0,
            f(f32::INFINITY),
        ),
        ("cvt.rz.f32.f64 %ro, %xa;", 32, d(1e300), 0, 0, f(f32::MAX)),
        ("cvt.rni.f32.f32 %ro, %ra;", 32, f(2.5), 0, 0, f(2.0)),
        ("cvt.rmi.f32.f32 %ro, %ra;", 32, f(-0.5), 0, 0, f(-1.0)),
        ("cvt.rzi.f32.f32 %ro, %ra;", 32, f(-0.5), 0, 0, f(-0.0)),
        ("cvt.sat.f32.f32 %ro, %ra;", 32, f(1.5), 0, 0, f(1.0)),
        ("cvt.sat.f32.f32 %ro, %ra;", 32, f(f32::NAN), 0, 0, f(0.0)),
        ("cvt.ftz.f32.f32 %ro, %ra;", 32, 1, 0, 0, 0),
        ("cvt.f32.f32 %ro, %ra;", 32, 1, 0, 0, 1),
    ]);
}

#[test]
fn cvt_integer_widths() {
    check(&[
        (
            "cvt.s64.s32 %xo, %ra;",
            64,
            0xffff_fffe,
            0,
            0,
            (-2i64) as u64,
        ),
        ("cvt.u64.u32 %xo, %ra;", 64, 0xffff_fffe, 0, 0, 0xffff_fffe),
        (
            "cvt.u32.u64 %ro, %xa;",
            32,
            0x1_2345_6789,
            0,
            0,
            0x2345_6789,
        ),
        (
            "cvt.s64.s32 %xo, %xa;",
            64,
            0x7_8000_0000,
            0,
            0,
            0xffff_ffff_8000_0000,
        ),
        ("cvt.s32.s16 %ro, %ha;", 32, 0x8001, 0, 0, 0xffff_8001),
        ("cvt.u32.u16 %ro, %ha;", 32, 0x8001, 0, 0, 0x8001),
        ("cvt.u16.u32 %ho, %ra;", 16, 0x1_2345, 0, 0, 0x2345),
        (
            "cvt.sat.s32.s64 %ro, %xa;",
            32,
            1 << 40,
            0,
            0,
            i32::MAX as u64,
        ),
        (
            "cvt.sat.u8.s32 %ro, %ra;",
            32,
            (-5i32) as u32 as u64,
            0,
            0,
            0,
        ),
        ("cvt.s8.s32 %ro, %ra;", 32, 0x1ff, 0, 0, 0xffff_ffff),
    ]);
}

#[test]
fn half_precision_conversions_against_the_half_crate() {
    let mut r = rng(80);
    let mut x: Vec<f32> = (0..4000)
        .map(|_| f32::from_bits(r.random::<u32>()))
        .collect();
    x.extend([
        6.0e-8,
        5.9604645e-8,
        2.9802322e-8,
        65504.0,
        65519.9,
        65520.0,
        1.0 + 2f32.powi(-11),
        -0.0,
    ]);
    let (bits, zero) = (f32s(&x), vec![0u64; x.len()]);
    let h = run_op("cvt.rn.f16.f32 %ho, %ra;", 16, &bits, &zero, &zero);
    let b = run_op("cvt.rn.bf16.f32 %ho, %ra;", 16, &bits, &zero, &zero);
    let hz = run_op("cvt.rz.f16.f32 %ho, %ra;", 16, &bits, &zero, &zero);
    for (i, &v) in x.iter().enumerate() {
        if v.is_nan() {
            assert_eq!((h[i], b[i]), (0x7fff, 0x7fff), "NaN → canonical NaN");
            continue;
        }
        assert_eq!(
            h[i] as u16,
            half::f16::from_f32(v).to_bits(),
            "cvt.rn.f16.f32 {v:e}"
        );
        assert_eq!(
            b[i] as u16,
            half::bf16::from_f32(v).to_bits(),
            "cvt.rn.bf16.f32 {v:e}"
        );
        // Round toward zero: the result never exceeds |v| and the next f16 up does.
        let z = half::f16::from_bits(hz[i] as u16).to_f32();
        assert!(
            z.abs() <= v.abs() && z.is_sign_negative() == v.is_sign_negative() || z == 0.0,
            "rz {v:e} → {z:e}"
        );
        let next = half::f16::from_bits(hz[i] as u16 + 1).to_f32().abs();
        assert!(
            v.is_infinite() || z.abs() == 65504.0 || next > v.abs(),
            "rz {v:e} → {z:e} is not the largest below"
        );
    }
    let back = run_op(
        "cvt.f32.f16 %ro, %ha;",
        32,
        &h,
        &vec![0; h.len()],
        &vec![0; h.len()],
    );
    for i in 0..h.len() {
        let want = half::f16::from_bits(h[i] as u16).to_f32();
        assert!(
            back[i] as u32 == want.to_bits() || want.is_nan(),
            "cvt.f32.f16 {:#x}",
            h[i]
        );
    }
    check(&[
        (
            "cvt.rn.f16x2.f32 %ro, %ra, %rb;",
            32,
            f(1.0),
            f(-2.0),
            0,
            0x3c00_c000,
        ),
        ("cvt.rn.relu.bf16.f32 %ho, %ra;", 16, f(-3.0), 0, 0, 0),
        (
            "mov.b32 %ro, {%ha, %hb};",
            32,
            0x1234,
            0xabcd,
            0,
            0xabcd_1234,
        ),
        ("mov.b32 {%ho, _}, %ra;", 16, 0xdead_beef, 0, 0, 0xbeef),
        ("add.rn.f16 %ho, %ha, %hb;", 16, 0x3c00, 0x3c00, 0, 0x4000),
        (
            "mul.rn.bf16x2 %ro, %ra, %rb;",
            32,
            0x4000_3f80,
            0x4040_4000,
            0,
            0x40c0_4000,
        ),
    ]);
}

/// `cvt.rn.{bf16x2,f16x2}.f32 d, a, b` (the GEMM core's operand packing for the m16n8k16 mma):
/// `a` rounded into the high half, `b` into the low, each exactly as the `half` crate rounds
/// (to nearest, ties to even; overflow to infinity; f16 subnormals kept), NaN canonical.
#[test]
fn packed_half_conversions_against_the_half_crate() {
    let mut r = rng(81);
    let mut x: Vec<f32> = (0..4000)
        .map(|_| f32::from_bits(r.random::<u32>()))
        .collect();
    x.extend([
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        1.0 + 2f32.powi(-11),
        1.0 + 3.0 * 2f32.powi(-11),
        65519.0,
        65520.0,
        2f32.powi(-25),
        3.0 * 2f32.powi(-26),
        3.4e38,
        f32::from_bits(1),
        f32::INFINITY,
        -0.0,
        f32::NAN,
    ]);
    // Pairs (x[i], x[i+1]): every value lands in both halves.
    let hi = f32s(&x);
    let lo: Vec<u64> = hi.iter().cycle().skip(1).take(hi.len()).copied().collect();
    let zero = vec![0u64; x.len()];
    let bf = run_op("cvt.rn.bf16x2.f32 %ro, %ra, %rb;", 32, &hi, &lo, &zero);
    let hf = run_op("cvt.rn.f16x2.f32 %ro, %ra, %rb;", 32, &hi, &lo, &zero);
    for i in 0..x.len() {
        let (a, b) = (x[i], x[(i + 1) % x.len()]);
        let want_bf = |v: f32| {
            if v.is_nan() {
                0x7fff
            } else {
                half::bf16::from_f32(v).to_bits()
            }
        };
        let want_hf = |v: f32| {
            if v.is_nan() {
                0x7fff
            } else {
                half::f16::from_f32(v).to_bits()
            }
        };
        let wb = (u64::from(want_bf(a)) << 16) | u64::from(want_bf(b));
        let wh = (u64::from(want_hf(a)) << 16) | u64::from(want_hf(b));
        assert_eq!(bf[i], wb, "cvt.rn.bf16x2.f32 ({a:e}, {b:e})");
        assert_eq!(hf[i], wh, "cvt.rn.f16x2.f32 ({a:e}, {b:e})");
    }
}

#[test]
fn integer_arithmetic_and_bit_operations() {
    let m1 = u64::MAX;
    check(&[
        (
            "mul.hi.s32 %ro, %ra, %rb;",
            32,
            (-3i32) as u32 as u64,
            0x4000_0000,
            0,
            0xffff_ffff,
        ),
        (
            "mul.hi.u32 %ro, %ra, %rb;",
            32,
            0xffff_ffff,
            0xffff_ffff,
            0,
            0xffff_fffe,
        ),
        ("mul.hi.u64 %xo, %xa, %xb;", 64, m1, m1, 0, m1 - 1),
        ("mul.hi.s64 %xo, %xa, %xb;", 64, m1, 5, 0, m1),
        (
            "mul.lo.s64 %xo, %xa, %xb;",
            64,
            1 << 40,
            (1 << 30) + 1,
            0,
            1 << 40,
        ),
        ("mad.lo.s32 %ro, %ra, %rb, %rc;", 32, 7, 6, 0xffff_fff0, 26),
        ("mad.hi.u32 %ro, %ra, %rb, %rc;", 32, 0x8000_0000, 4, 1, 3),
        (
            "mul.wide.s32 %xo, %ra, %rb;",
            64,
            (-2i32) as u32 as u64,
            0x7fff_ffff,
            0,
            (-0xffff_fffei64) as u64,
        ),
        (
            "mul.wide.u32 %xo, %ra, %rb;",
            64,
            0xffff_ffff,
            2,
            0,
            0x1_ffff_fffe,
        ),
        ("mad.wide.u32 %xo, %ra, %rb, %xc;", 64, 3, 4, 100, 112),
        (
            "div.s64 %xo, %xa, %xb;",
            64,
            (-7i64) as u64,
            2,
            0,
            (-3i64) as u64,
        ),
        (
            "rem.s32 %ro, %ra, %rb;",
            32,
            (-7i32) as u32 as u64,
            3,
            0,
            (-1i32) as u32 as u64,
        ),
        ("div.u32 %ro, %ra, %rb;", 32, 7, 0, 0, 0xffff_ffff),
        (
            "add.sat.s32 %ro, %ra, %rb;",
            32,
            0x7fff_fff0,
            0x100,
            0,
            0x7fff_ffff,
        ),
        ("shl.b32 %ro, %ra, %rb;", 32, 1, 33, 0, 0),
        (
            "shr.s32 %ro, %ra, %rb;",
            32,
            0x8000_0000,
            40,
            0,
            0xffff_ffff,
        ),
        ("shr.u64 %xo, %xa, %rb;", 64, 1 << 63, 63, 0, 1),
        (
            "shl.b64 %xo, %xa, 4;",
            64,
            0x0f00_0000_0000_0001,
            0,
            0,
            0xf000_0000_0000_0010,
        ),
        ("bfe.u32 %ro, %ra, %rb, %rc;", 32, 0xabcd_1234, 8, 8, 0x12),
        (
            "bfe.s32 %ro, %ra, %rb, %rc;",
            32,
            0x0000_8000,
            12,
            4,
            0xffff_fff8,
        ),
        (
            "bfi.b32 %ro, %ra, %rb, 4, 8;",
            32,
            0xff,
            0xf000_000f,
            0,
            0xf000_0fff,
        ),
        (
            "prmt.b32 %ro, %ra, %rb, 0x5410;",
            32,
            0x1111_2222,
            0x3333_4444,
            0,
            0x4444_2222,
        ),
        ("popc.b64 %ro, %xa;", 32, m1, 0, 0, 64),
        ("clz.b32 %ro, %ra;", 32, 1, 0, 0, 31),
        ("brev.b32 %ro, %ra;", 32, 1, 0, 0, 0x8000_0000),
        (
            "lop3.b32 %ro, %ra, %rb, %rc, 0xe8;",
            32,
            0b1100,
            0b1010,
            0b0110,
            0b1110,
        ),
        ("min.s32 %ro, %ra, %rb;", 32, 0xffff_ffff, 1, 0, 0xffff_ffff),
        ("max.u64 %xo, %xa, %xb;", 64, m1, 1, 0, m1),
        ("abs.s32 %ro, %ra;", 32, (-5i32) as u32 as u64, 0, 0, 5),
        ("neg.s64 %xo, %xa;", 64, 5, 0, 0, (-5i64) as u64),
        ("not.b64 %xo, %xa;", 64, 0, 0, 0, m1),
        ("xor.b32 %ro, %ra, -1;", 32, 0x0f0f_0f0f, 0, 0, 0xf0f0_f0f0),
    ]);
}

#[test]
fn setp_and_selp_forms() {
    let sel = |setp: &str| format!("{setp}\n    selp.b32 %ro, 1, 0, %p1;");
    let rows: Vec<(String, u64, u64, u64, u64)> = vec![
        (sel("setp.lt.s32 %p1, %ra, %rb;"), 0xffff_ffff, 1, 0, 1),
        (sel("setp.lt.u32 %p1, %ra, %rb;"), 0xffff_ffff, 1, 0, 0),
        (sel("setp.lo.u32 %p1, %ra, %rb;"), 1, 2, 0, 1),
        (sel("setp.ge.s64 %p1, %xa, %xb;"), u64::MAX, 0, 0, 0),
        (sel("setp.lt.u64 %p1, %xa, %xb;"), 0, u64::MAX, 0, 1),
        (sel("setp.gtu.f32 %p1, %ra, %rb;"), f(f32::NAN), f(1.0), 0, 1),
        (sel("setp.gt.f32 %p1, %ra, %rb;"), f(f32::NAN), f(1.0), 0, 0),
        (sel("setp.neu.f32 %p1, %ra, %rb;"), f(1.0), f(1.0), 0, 0),
        (sel("setp.eq.f64 %p1, %xa, %xb;"), d(0.0), d(-0.0), 0, 1),
        (sel("setp.nan.f32 %p1, %ra, %rb;"), f(1.0), f(f32::NAN), 0, 1),
        (sel("setp.lt.f32 %p2, %ra, %rb;\n    setp.lt.and.f32 %p1, %rb, %rc, %p2;"), f(1.0), f(2.0), f(3.0), 1),
        (sel("setp.lt.f32 %p2, %ra, %rb;\n    setp.lt.and.f32 %p1, %rb, %rc, !%p2;"), f(1.0), f(2.0), f(3.0), 0),
        (sel("setp.eq.s32 %p2|%p1, %ra, %rb;"), 3, 4, 0, 1),
        (sel("setp.ne.s32 %p2, %ra, 0;\n    not.pred %p1, %p2;"), 0, 0, 0, 1),
        (sel("setp.ne.s32 %p2, %ra, 0;\n    setp.ne.s32 %p3, %rb, 0;\n    xor.pred %p1, %p2, %p3;"), 1, 0, 0, 1),
        (sel("testp.subnormal.f32 %p1, %ra;"), 1, 0, 0, 1),
        (sel("testp.finite.f64 %p1, %xa;"), d(f64::INFINITY), 0, 0, 0),
        ("setp.ne.s32 %p1, %ra, 0;\n    @%p1 add.s32 %ro, %rb, 1;\n    @!%p1 sub.s32 %ro, %rb, 1;".into(), 1, 10, 0, 11),
        ("setp.ne.s32 %p1, %ra, 0;\n    @%p1 add.s32 %ro, %rb, 1;\n    @!%p1 sub.s32 %ro, %rb, 1;".into(), 0, 10, 0, 9),
    ];
    for (body, a, b, c, want) in rows {
        let got = run_op(&body, 32, &[a], &[b], &[c])[0];
        assert_eq!(got, want, "{body}");
    }
}

#[test]
fn sixteen_bit_arithmetic_wraps_and_divides_in_16_bits() {
    let h = |v: i16| u64::from(v as u16);
    check(&[
        (
            "mul.lo.s16 %ho, %ha, %hb;",
            16,
            h(300),
            h(300),
            0,
            h((300i32 * 300) as i16),
        ),
        ("mul.lo.u16 %ho, %ha, %hb;", 16, 0xfff0, 0x10, 0, 0xff00),
        (
            "add.s16 %ho, %ha, %hb;",
            16,
            h(i16::MAX),
            h(1),
            0,
            h(i16::MIN),
        ),
        ("sub.u16 %ho, %ha, %hb;", 16, 0, 1, 0, 0xffff),
        ("div.s16 %ho, %ha, %hb;", 16, h(-7), h(2), 0, h(-3)),
        ("div.u16 %ho, %ha, %hb;", 16, 0xfff9, 2, 0, 0x7ffc),
        ("rem.s16 %ho, %ha, %hb;", 16, h(-7), h(2), 0, h(-1)),
        ("min.s16 %ho, %ha, %hb;", 16, h(-5), h(3), 0, h(-5)),
        ("min.u16 %ho, %ha, %hb;", 16, 0xfffb, 3, 0, 3),
        ("max.s16 %ho, %ha, %hb;", 16, h(-5), h(3), 0, h(3)),
        ("shl.b16 %ho, %ha, %rb;", 16, 0x8181, 1, 0, 0x0302),
        ("shl.b16 %ho, %ha, %rb;", 16, 0x8181, 16, 0, 0),
        ("shr.u16 %ho, %ha, %rb;", 16, 0x8180, 4, 0, 0x0818),
        ("shr.s16 %ho, %ha, %rb;", 16, 0x8180, 4, 0, 0xf818),
        ("shr.s16 %ho, %ha, %rb;", 16, 0x8180, 20, 0, 0xffff),
    ]);
}

#[test]
fn sixteen_bit_comparisons_respect_signedness() {
    let h = |v: i16| u64::from(v as u16);
    check(&[
        (
            "setp.lt.s16 %p1, %ha, %hb; selp.u32 %ro, 1, 0, %p1;",
            32,
            h(-1),
            h(1),
            0,
            1,
        ),
        (
            "setp.lt.u16 %p1, %ha, %hb; selp.u32 %ro, 1, 0, %p1;",
            32,
            h(-1),
            h(1),
            0,
            0,
        ),
        (
            "setp.ne.s16 %p1, %ha, 0; selp.u32 %ro, 1, 0, %p1;",
            32,
            h(0),
            0,
            0,
            0,
        ),
        (
            "setp.ge.s16 %p1, %ha, %hb; selp.u32 %ro, 1, 0, %p1;",
            32,
            h(-300),
            h(-300),
            0,
            1,
        ),
    ]);
}

/// `dp4a`/`dp2a` against the products written out with Rust's own byte and half casts, on fixed
/// rows (sign extension, wrap-around of the sum) and random operands of every type pairing.
#[test]
fn integer_dot_products_extend_each_part_by_its_type_and_wrap() {
    check(&[
        // 1·5 + 2·6 + 3·7 + 4·8 = 70, plus 1000.
        (
            "dp4a.u32.u32 %ro, %ra, %rb, %rc;",
            32,
            0x0403_0201,
            0x0807_0605,
            1000,
            1070,
        ),
        // a's bytes signed: -1·1 + -1·1 + -1·1 + -1·1 = -4.
        (
            "dp4a.s32.u32 %ro, %ra, %rb, %rc;",
            32,
            0xffff_ffff,
            0x0101_0101,
            0,
            0xffff_fffc,
        ),
        // Unsigned: 255·255·4 = 260100.
        (
            "dp4a.u32.u32 %ro, %ra, %rb, %rc;",
            32,
            0xffff_ffff,
            0xffff_ffff,
            0,
            260_100,
        ),
        // The sum wraps modulo 2^32.
        (
            "dp4a.u32.u32 %ro, %ra, %rb, %rc;",
            32,
            0x0000_0001,
            0x0000_0002,
            0xffff_ffff,
            1,
        ),
        // .lo: halves 3, 4 with bytes 0, 1 (5, 6); .hi: with bytes 2, 3 (7, 8).
        (
            "dp2a.lo.u32.u32 %ro, %ra, %rb, %rc;",
            32,
            0x0004_0003,
            0x0807_0605,
            10,
            49,
        ),
        (
            "dp2a.hi.u32.u32 %ro, %ra, %rb, %rc;",
            32,
            0x0004_0003,
            0x0807_0605,
            10,
            63,
        ),
        // Signed halves and bytes: -2·-3 + 1·2 = 8.
        (
            "dp2a.lo.s32.s32 %ro, %ra, %rb, %rc;",
            32,
            0x0001_fffe,
            0x0000_02fd,
            0,
            8,
        ),
    ]);
    let mut rng = rng(82);
    for (a_signed, b_signed) in [(false, false), (false, true), (true, false), (true, true)] {
        let t = |s: bool| if s { "s32" } else { "u32" };
        let (ta, tb) = (t(a_signed), t(b_signed));
        for _ in 0..50 {
            let (a, b, c): (u32, u32, u32) = (rng.random(), rng.random(), rng.random());
            let byte = |x: u32, i: u32, s: bool| -> i64 {
                let v = (x >> (8 * i)) as u8;
                if s { i64::from(v as i8) } else { i64::from(v) }
            };
            let half = |x: u32, i: u32, s: bool| -> i64 {
                let v = (x >> (16 * i)) as u16;
                if s { i64::from(v as i16) } else { i64::from(v) }
            };
            let four: i64 = (0..4)
                .map(|i| byte(a, i, a_signed) * byte(b, i, b_signed))
                .sum();
            let two = |first: u32| -> i64 {
                (0..2)
                    .map(|i| half(a, i, a_signed) * byte(b, first + i, b_signed))
                    .sum()
            };
            let cases = [
                (format!("dp4a.{ta}.{tb} %ro, %ra, %rb, %rc;"), four),
                (format!("dp2a.lo.{ta}.{tb} %ro, %ra, %rb, %rc;"), two(0)),
                (format!("dp2a.hi.{ta}.{tb} %ro, %ra, %rb, %rc;"), two(2)),
            ];
            for (body, sum) in cases {
                let want = u64::from(c.wrapping_add(sum as u32));
                let got = run_op(&body, 32, &[a.into()], &[b.into()], &[c.into()])[0];
                assert_eq!(got, want, "{body} a={a:#x} b={b:#x} c={c:#x}");
            }
        }
    }
}
