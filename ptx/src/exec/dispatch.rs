//! The instruction dispatch of a warp: one `match` over the decoded operation, calling the
//! handler for the active lanes; and the warp-wide bodies of `shfl.sync` and `vote.sync`.

use super::async_copy::{self, CopyArgs};
use super::lanes::{WARP, blend, blend_pred, lanes, map1_32, map1_64, map2_32, map3_32};
use super::memops::{self, AtomArgs, LaneFault};
use super::warp::Warp;
use super::{CtaEnv, cmp, convert, float, int, tensor};
use crate::inst::{Op, ShflMode, SpecialReg, VoteMode};

impl Warp {
    /// Executes a non-control operation for the lanes of `m` (non-empty).
    #[inline]
    pub(super) fn execute(&mut self, op: &Op, m: u32, env: &mut CtaEnv) -> Result<(), LaneFault> {
        let regs = &mut self.regs;
        match *op {
            Op::Nop => {}
            Op::Fence => std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst),
            Op::Mov32 { d, a } => map1_32(&mut regs.r32, m, d, a, |x| x),
            Op::Mov64 { d, a } => map1_64(&mut regs.r64, m, d, a, |x| x),
            Op::SetPred { d, value } => blend_pred(
                &mut regs.pred[d as usize],
                if value { u32::MAX } else { 0 },
                m,
            ),
            Op::MovPred { d, a } => {
                let v = regs.pred[a as usize];
                blend_pred(&mut regs.pred[d as usize], v, m)
            }
            Op::Special { d, wide, reg } => {
                let vals = self.special(reg, env);
                if wide {
                    blend(&mut self.regs.r64[d as usize], &vals, m);
                } else {
                    blend(&mut self.regs.r32[d as usize], &vals.map(|v| v as u32), m);
                }
            }
            Op::Pack16 { d, lo, hi } => {
                map2_32(&mut regs.r32, m, d, lo, hi, |l, h| (l & 0xffff) | (h << 16))
            }
            Op::Pack32 { d, lo, hi } => {
                let (lv, hv) = (regs.r32[lo as usize], regs.r32[hi as usize]);
                let out: [u64; WARP] =
                    std::array::from_fn(|l| u64::from(lv[l]) | (u64::from(hv[l]) << 32));
                blend(&mut regs.r64[d as usize], &out, m);
            }
            Op::Unpack16 { lo, hi, a } => {
                let av = regs.r32[a as usize];
                if let Some(lo) = lo {
                    blend(&mut regs.r32[lo as usize], &av.map(|x| x & 0xffff), m);
                }
                if let Some(hi) = hi {
                    blend(&mut regs.r32[hi as usize], &av.map(|x| x >> 16), m);
                }
            }
            Op::Unpack32 { lo, hi, a } => {
                let av = regs.r64[a as usize];
                if let Some(lo) = lo {
                    blend(&mut regs.r32[lo as usize], &av.map(|x| x as u32), m);
                }
                if let Some(hi) = hi {
                    blend(&mut regs.r32[hi as usize], &av.map(|x| (x >> 32) as u32), m);
                }
            }
            Op::Int32 { op, d, a, b } => int::int32(op, &mut regs.r32, m, d, a, b),
            Op::Int16 {
                op,
                signed,
                d,
                a,
                b,
            } => int::int16(op, signed, &mut regs.r32, m, d, a, b),
            Op::Int64 { op, d, a, b } => int::int64(op, &mut regs.r64, m, d, a, b),
            Op::Shift32 { op, d, a, b } => int::shift32(op, &mut regs.r32, m, d, a, b),
            Op::Shift16 { op, d, a, b } => int::shift16(op, &mut regs.r32, m, d, a, b),
            Op::Shift64 { op, d, a, b } => int::shift64(op, &mut regs.r64, &regs.r32, m, d, a, b),
            Op::IntUn32 { op, d, a } => int::unary32(op, &mut regs.r32, m, d, a),
            Op::IntUn64 { op, d, a } => int::unary64(op, &mut regs.r64, m, d, a),
            Op::Popc { d, a, wide: false } => map1_32(&mut regs.r32, m, d, a, u32::count_ones),
            Op::Clz { d, a, wide: false } => map1_32(&mut regs.r32, m, d, a, u32::leading_zeros),
            Op::Popc { d, a, wide: true } => int::count64(&mut regs.r32, &regs.r64, m, d, a, false),
            Op::Clz { d, a, wide: true } => int::count64(&mut regs.r32, &regs.r64, m, d, a, true),
            Op::Mad32 {
                hi,
                signed,
                d,
                a,
                b,
                c,
            } => int::mad32(&mut regs.r32, m, hi, signed, (d, a, b, c)),
            Op::Mad64 {
                hi,
                signed,
                d,
                a,
                b,
                c,
            } => int::mad64(&mut regs.r64, m, hi, signed, (d, a, b, c)),
            Op::MulWide { signed, d, a, b } => {
                int::mul_wide(&mut regs.r64, &regs.r32, m, signed, (d, a, b), None)
            }
            Op::MadWide { signed, d, a, b, c } => {
                int::mul_wide(&mut regs.r64, &regs.r32, m, signed, (d, a, b), Some(c))
            }
            Op::MulWide16 { signed, d, a, b } => int::mul_wide16(&mut regs.r32, m, signed, d, a, b),
            Op::Bfe32 {
                signed,
                d,
                a,
                pos,
                len,
            } => map3_32(&mut regs.r32, m, (d, a, pos, len), |x, p, n| {
                int::bfe(u64::from(x), p, n, 32, signed) as u32
            }),
            Op::Bfe64 {
                signed,
                d,
                a,
                pos,
                len,
            } => {
                let (av, pv, nv) = (
                    regs.r64[a as usize],
                    regs.r32[pos as usize],
                    regs.r32[len as usize],
                );
                let out: [u64; WARP] =
                    std::array::from_fn(|l| int::bfe(av[l], pv[l], nv[l], 64, signed));
                blend(&mut regs.r64[d as usize], &out, m);
            }
            Op::Bfi32 { d, f, b, pos, len } => {
                let (fv, bv) = (regs.r32[f as usize], regs.r32[b as usize]);
                let (pv, nv) = (regs.r32[pos as usize], regs.r32[len as usize]);
                let out: [u32; WARP] = std::array::from_fn(|l| {
                    int::bfi(u64::from(fv[l]), u64::from(bv[l]), pv[l], nv[l], 32) as u32
                });
                blend(&mut regs.r32[d as usize], &out, m);
            }
            Op::Bfi64 { d, f, b, pos, len } => {
                let (fv, bv) = (regs.r64[f as usize], regs.r64[b as usize]);
                let (pv, nv) = (regs.r32[pos as usize], regs.r32[len as usize]);
                let out: [u64; WARP] =
                    std::array::from_fn(|l| int::bfi(fv[l], bv[l], pv[l], nv[l], 64));
                blend(&mut regs.r64[d as usize], &out, m);
            }
            Op::Prmt { d, a, b, c } => map3_32(&mut regs.r32, m, (d, a, b, c), int::prmt),
            Op::Dot {
                half,
                a_signed,
                b_signed,
                d,
                a,
                b,
                c,
            } => map3_32(&mut regs.r32, m, (d, a, b, c), |x, y, z| {
                int::dot(half, a_signed, b_signed, x, y, z)
            }),
            Op::Lop3 { d, a, b, c, lut } => map3_32(&mut regs.r32, m, (d, a, b, c), |x, y, z| {
                int::lop3(x, y, z, lut)
            }),
            Op::F32Bin { op, fl, d, a, b } => float::f32_bin(op, fl, &mut regs.r32, m, d, a, b),
            Op::F64Bin { op, d, a, b } => float::f64_bin(op, &mut regs.r64, m, d, a, b),
            Op::F32Un { op, fl, d, a } => float::f32_un(op, fl, &mut regs.r32, m, d, a),
            Op::F64Un { op, d, a } => float::f64_un(op, &mut regs.r64, m, d, a),
            Op::F32Fma {
                rnd,
                fl,
                d,
                a,
                b,
                c,
            } => float::f32_fma(rnd, fl, env.hw_fma, &mut regs.r32, m, (d, a, b, c)),
            Op::F64Fma { rnd, d, a, b, c } => float::f64_fma(rnd, &mut regs.r64, m, (d, a, b, c)),
            Op::Half {
                op,
                ty,
                fl,
                d,
                a,
                b,
                c,
            } => float::half(op, ty, fl, &mut regs.r32, m, (d, a, b, c)),
            Op::Setp {
                cmp,
                ty,
                p,
                q,
                a,
                b,
                combine,
            } => cmp::setp(regs, m, cmp, ty, (p, q), a, b, combine),
            Op::Testp { kind, wide, p, a } => cmp::testp(regs, m, kind, wide, p, a),
            Op::Selp32 { d, a, b, p } => cmp::selp32(regs, m, d, a, b, p),
            Op::Selp64 { d, a, b, p } => cmp::selp64(regs, m, d, a, b, p),
            Op::PredBin { op, d, a, b } => cmp::pred_bin(regs, m, op, d, a, b),
            Op::PredNot { d, a } => {
                let v = !regs.pred[a as usize];
                blend_pred(&mut regs.pred[d as usize], v, m)
            }
            Op::SignExtend32To64 { d, a } => {
                let out = regs.r32[a as usize].map(|x| x as i32 as i64 as u64);
                blend(&mut regs.r64[d as usize], &out, m);
            }
            Op::ZeroExtend32To64 { d, a } => {
                let out = regs.r32[a as usize].map(u64::from);
                blend(&mut regs.r64[d as usize], &out, m);
            }
            Op::Truncate64To32 { d, a } => {
                let out = regs.r64[a as usize].map(|x| x as u32);
                blend(&mut regs.r32[d as usize], &out, m);
            }
            Op::S32ToF32 { d, a } => {
                map1_32(&mut regs.r32, m, d, a, |x| (x as i32 as f32).to_bits())
            }
            Op::U32ToF32 { d, a } => map1_32(&mut regs.r32, m, d, a, |x| (x as f32).to_bits()),
            Op::Cvt {
                spec,
                d,
                a,
                wide_src,
                wide_dst,
            } => {
                let src: [u64; WARP] = if wide_src {
                    regs.r64[a as usize]
                } else {
                    regs.r32[a as usize].map(u64::from)
                };
                let mut out = [0u64; WARP];
                for l in lanes(m) {
                    out[l] = convert::convert(&spec, src[l], wide_dst);
                }
                if wide_dst {
                    blend(&mut regs.r64[d as usize], &out, m);
                } else {
                    blend(&mut regs.r32[d as usize], &out.map(|v| v as u32), m);
                }
            }
            Op::CvtPack {
                bf16,
                rnd,
                relu,
                satfinite,
                d,
                a,
                b,
            } => map2_32(&mut regs.r32, m, d, a, b, |x, y| {
                convert::convert_pack(bf16, rnd, relu, satfinite, x, y)
            }),
            Op::CvtTf32 {
                rnd,
                relu,
                satfinite,
                d,
                a,
            } => map1_32(&mut regs.r32, m, d, a, |x| {
                convert::to_tf32(rnd, relu, satfinite, x)
            }),
            Op::Ld {
                m: ref access,
                ref d,
            } => {
                if count_global(env, access, m, false) && self.branched {
                    self.branched = false;
                    env.mem.load_epochs += 1;
                }
                memops::load(env, regs, &self.local, access, d, m)?
            }
            Op::St {
                m: ref access,
                ref s,
            } => {
                count_global(env, access, m, true);
                memops::store(env, regs, &mut self.local, access, s, m)?
            }
            Op::Atom {
                space,
                base,
                offset,
                op,
                ty,
                d,
                b,
                c,
            } => {
                let args = AtomArgs {
                    space,
                    base,
                    offset,
                    op,
                    ty,
                    d,
                    b,
                    c,
                };
                memops::atomic(env, regs, &args, m)?
            }
            Op::Mma {
                shape,
                ty,
                d,
                a,
                b,
                c,
            } => {
                self.require_uniform(m, env.kernel)?;
                tensor::mma(&mut self.regs, shape, ty, &d, &a, &b, &c);
            }
            Op::Ldmatrix {
                num,
                trans,
                d,
                base,
                offset,
            } => {
                self.require_uniform(m, env.kernel)?;
                tensor::ldmatrix(env, &mut self.regs, (num, trans), &d, base, offset)?;
            }
            Op::CpAsync {
                dst,
                src,
                size,
                from,
            } => {
                let args = CopyArgs {
                    dst,
                    src,
                    size,
                    from,
                };
                async_copy::issue(env, &self.regs, &mut self.copies, &args, m)?;
            }
            Op::CpAsyncCommit => async_copy::commit(&mut self.copies, m),
            Op::CpAsyncWait { n, all } => {
                if all {
                    async_copy::commit(&mut self.copies, m);
                }
                async_copy::wait(env, &mut self.copies, n, m);
            }
            Op::Activemask { d } => {
                let g = self.group;
                blend(&mut self.regs.r32[d as usize], &[g; WARP], m);
            }
            // Control flow and warp-synchronous operations are handled by `Warp::run`.
            Op::Bra { .. } | Op::Exit | Op::Trap | Op::Bar { .. } => {}
            Op::Shfl { .. } | Op::Vote { .. } | Op::WarpSync { .. } => {}
        }
        Ok(())
    }

    /// A `.sync.aligned` instruction executes only when every thread of the warp is active.
    fn require_uniform(&self, m: u32, kernel: &crate::kernel::Kernel) -> Result<(), LaneFault> {
        let missing = self.existing & !m;
        if missing == 0 {
            return Ok(());
        }
        let detail = self.whereabouts(missing, kernel);
        let fault = tensor::not_uniform(m, missing, detail);
        Err((m.trailing_zeros() as usize, fault))
    }

    fn special(&self, reg: SpecialReg, env: &CtaEnv) -> [u64; WARP] {
        let each = |f: &dyn Fn(usize) -> u64| -> [u64; WARP] { std::array::from_fn(f) };
        match reg {
            SpecialReg::Tid(a) => each(&|l| u64::from(self.tid[l][a as usize])),
            SpecialReg::Ntid(a) => [u64::from(env.block[a as usize]); WARP],
            SpecialReg::Ctaid(a) => [u64::from(env.cta[a as usize]); WARP],
            SpecialReg::Nctaid(a) => [u64::from(env.grid[a as usize]); WARP],
            SpecialReg::LaneId => each(&|l| l as u64),
            SpecialReg::WarpId => [u64::from(self.index); WARP],
            SpecialReg::NWarpId => [u64::from(env.nwarps); WARP],
            SpecialReg::SmId => [0; WARP],
            SpecialReg::LanemaskEq => each(&|l| 1u64 << l),
            SpecialReg::LanemaskLt => each(&|l| (1u64 << l) - 1),
            SpecialReg::LanemaskLe => each(&|l| (2u64 << l) - 1),
            SpecialReg::LanemaskGt => each(&|l| u64::from(u32::MAX) & !((2u64 << l) - 1)),
            SpecialReg::LanemaskGe => each(&|l| u64::from(u32::MAX) & !((1u64 << l) - 1)),
            SpecialReg::Clock => [env.steps; WARP],
        }
    }

    /// The warp-wide body of a converged `shfl.sync`/`vote.sync` for lanes `m`.
    pub(super) fn sync_execute(&mut self, op: &Op, m: u32) {
        let regs = &mut self.regs;
        match *op {
            Op::Shfl {
                mode,
                d,
                p,
                a,
                b,
                c,
                ..
            } => {
                let (av, bv, cv) = (
                    regs.r32[a as usize],
                    regs.r32[b as usize],
                    regs.r32[c as usize],
                );
                let mut out = [0u32; WARP];
                let mut valid = 0u32;
                for l in lanes(m) {
                    let lane = l as i32;
                    let (bval, cval, seg) = (
                        (bv[l] & 0x1f) as i32,
                        (cv[l] & 0x1f) as i32,
                        ((cv[l] >> 8) & 0x1f) as i32,
                    );
                    let max_lane = (lane & seg) | (cval & !seg);
                    let min_lane = lane & seg;
                    let (j, ok) = match mode {
                        ShflMode::Up => (lane - bval, lane - bval >= max_lane),
                        ShflMode::Down => (lane + bval, lane + bval <= max_lane),
                        ShflMode::Bfly => (lane ^ bval, (lane ^ bval) <= max_lane),
                        ShflMode::Idx => {
                            let j = min_lane | (bval & !seg);
                            (j, j <= max_lane)
                        }
                    };
                    let src = if ok { j as usize } else { l };
                    out[l] = av[src];
                    valid |= u32::from(ok) << l;
                }
                blend(&mut regs.r32[d as usize], &out, m);
                if let Some(p) = p {
                    blend_pred(&mut regs.pred[p as usize], valid, m);
                }
            }
            Op::Vote {
                mode, d, a, neg, ..
            } => {
                let bits = regs.pred[a as usize] ^ if neg { u32::MAX } else { 0 };
                let set = bits & m;
                match mode {
                    VoteMode::Ballot => blend(&mut regs.r32[d as usize], &[set; WARP], m),
                    VoteMode::All => blend_pred(
                        &mut regs.pred[d as usize],
                        if set == m { u32::MAX } else { 0 },
                        m,
                    ),
                    VoteMode::Any => blend_pred(
                        &mut regs.pred[d as usize],
                        if set != 0 { u32::MAX } else { 0 },
                        m,
                    ),
                    VoteMode::Uni => {
                        let uniform = set == 0 || set == m;
                        blend_pred(
                            &mut regs.pred[d as usize],
                            if uniform { u32::MAX } else { 0 },
                            m,
                        )
                    }
                }
            }
            _ => {}
        }
    }
}

/// Counts a warp's global (or generic) memory instruction and the bytes its active lanes move,
/// for the per-launch counters of [`super::LaunchStats`]; true when it was one.
#[inline(always)]
fn count_global(env: &mut CtaEnv, access: &crate::inst::MemAccess, mask: u32, store: bool) -> bool {
    use crate::inst::MemSpace;
    if mask == 0 || !matches!(access.space, MemSpace::Global | MemSpace::Generic) {
        return false;
    }
    let bytes = u64::from(access.width) * u64::from(access.count) * u64::from(mask.count_ones());
    if store {
        env.mem.global_stores += 1;
    } else {
        env.mem.global_loads += 1;
    }
    env.mem.global_bytes += bytes;
    true
}
