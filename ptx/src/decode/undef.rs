//! Which registers a kernel may read before writing them. A forward "definitely written"
//! dataflow over the decoded instructions (per lane, so divergence does not matter; guarded
//! writes do not count). Only the registers it reports are zeroed when a warp starts a CTA — the
//! rest are always written first, so stale values from a previous CTA are never observed and
//! results stay deterministic without clearing whole register files.

use crate::inst::{AddrBase, Inst, Op, R};
use crate::kernel::RegCounts;

/// A register of one of the three files.
#[derive(Clone, Copy)]
enum Reg {
    R32(R),
    R64(R),
    Pred(R),
}

/// Registers read and written by an operation (writes exclude the guard's effect).
fn uses(op: &Op, reads: &mut Vec<Reg>, writes: &mut Vec<Reg>) {
    use Reg::{Pred as P, R32 as A, R64 as B};
    let base = |b: AddrBase, reads: &mut Vec<Reg>| match b {
        AddrBase::R32(r) => reads.push(A(r)),
        AddrBase::R64(r) => reads.push(B(r)),
        AddrBase::None => {}
    };
    match *op {
        Op::Nop | Op::Fence | Op::Bra { .. } | Op::Exit | Op::Trap => {}
        Op::Mov32 { d, a } | Op::S32ToF32 { d, a } | Op::U32ToF32 { d, a } => {
            reads.push(A(a));
            writes.push(A(d));
        }
        Op::Mov64 { d, a } => {
            reads.push(B(a));
            writes.push(B(d));
        }
        Op::MovPred { d, a } | Op::PredNot { d, a } => {
            reads.push(P(a));
            writes.push(P(d));
        }
        Op::SetPred { d, .. } => writes.push(P(d)),
        Op::Special { d, wide, .. } => writes.push(if wide { B(d) } else { A(d) }),
        Op::Activemask { d } => writes.push(A(d)),
        Op::Pack16 { d, lo, hi } => {
            reads.extend([A(lo), A(hi)]);
            writes.push(A(d));
        }
        Op::Pack32 { d, lo, hi } => {
            reads.extend([A(lo), A(hi)]);
            writes.push(B(d));
        }
        Op::Unpack16 { lo, hi, a } | Op::Unpack32 { lo, hi, a } => {
            reads.push(if matches!(op, Op::Unpack32 { .. }) {
                B(a)
            } else {
                A(a)
            });
            writes.extend(lo.into_iter().chain(hi).map(A));
        }
        Op::Int32 { d, a, b, .. }
        | Op::Int16 { d, a, b, .. }
        | Op::Shift32 { d, a, b, .. }
        | Op::Shift16 { d, a, b, .. }
        | Op::MulWide16 { d, a, b, .. } => {
            reads.extend([A(a), A(b)]);
            writes.push(A(d));
        }
        Op::F32Bin { d, a, b, .. } | Op::CvtPack { d, a, b, .. } => {
            reads.extend([A(a), A(b)]);
            writes.push(A(d));
        }
        Op::Int64 { d, a, b, .. } | Op::F64Bin { d, a, b, .. } => {
            reads.extend([B(a), B(b)]);
            writes.push(B(d));
        }
        Op::Shift64 { d, a, b, .. } => {
            reads.extend([B(a), A(b)]);
            writes.push(B(d));
        }
        Op::IntUn32 { d, a, .. } | Op::F32Un { d, a, .. } => {
            reads.push(A(a));
            writes.push(A(d));
        }
        Op::IntUn64 { d, a, .. } | Op::F64Un { d, a, .. } => {
            reads.push(B(a));
            writes.push(B(d));
        }
        Op::Popc { d, a, wide } | Op::Clz { d, a, wide } => {
            reads.push(if wide { B(a) } else { A(a) });
            writes.push(A(d));
        }
        Op::Mad32 { d, a, b, c, .. }
        | Op::Prmt { d, a, b, c }
        | Op::Lop3 { d, a, b, c, .. }
        | Op::Dot { d, a, b, c, .. } => {
            reads.extend([A(a), A(b), A(c)]);
            writes.push(A(d));
        }
        Op::F32Fma { d, a, b, c, .. } | Op::Half { d, a, b, c, .. } => {
            reads.extend([A(a), A(b), A(c)]);
            writes.push(A(d));
        }
        Op::Mad64 { d, a, b, c, .. } | Op::F64Fma { d, a, b, c, .. } => {
            reads.extend([B(a), B(b), B(c)]);
            writes.push(B(d));
        }
        Op::MulWide { d, a, b, .. } => {
            reads.extend([A(a), A(b)]);
            writes.push(B(d));
        }
        Op::MadWide { d, a, b, c, .. } => {
            reads.extend([A(a), A(b), B(c)]);
            writes.push(B(d));
        }
        Op::Bfe32 { d, a, pos, len, .. } => {
            reads.extend([A(a), A(pos), A(len)]);
            writes.push(A(d));
        }
        Op::Bfe64 { d, a, pos, len, .. } => {
            reads.extend([B(a), A(pos), A(len)]);
            writes.push(B(d));
        }
        Op::Bfi32 { d, f, b, pos, len } => {
            reads.extend([A(f), A(b), A(pos), A(len)]);
            writes.push(A(d));
        }
        Op::Bfi64 { d, f, b, pos, len } => {
            reads.extend([B(f), B(b), A(pos), A(len)]);
            writes.push(B(d));
        }
        Op::Setp {
            ty,
            p,
            q,
            a,
            b,
            combine,
            ..
        } => {
            use crate::inst::CmpTy;
            let wide = matches!(ty, CmpTy::S64 | CmpTy::U64 | CmpTy::F64);
            reads.extend(if wide { [B(a), B(b)] } else { [A(a), A(b)] });
            if let Some((_, c, _)) = combine {
                reads.push(P(c));
            }
            writes.extend(std::iter::once(p).chain(q).map(P));
        }
        Op::Testp { wide, p, a, .. } => {
            reads.push(if wide { B(a) } else { A(a) });
            writes.push(P(p));
        }
        Op::Selp32 { d, a, b, p } => {
            reads.extend([A(a), A(b), P(p)]);
            writes.push(A(d));
        }
        Op::Selp64 { d, a, b, p } => {
            reads.extend([B(a), B(b), P(p)]);
            writes.push(B(d));
        }
        Op::PredBin { d, a, b, .. } => {
            reads.extend([P(a), P(b)]);
            writes.push(P(d));
        }
        Op::SignExtend32To64 { d, a } | Op::ZeroExtend32To64 { d, a } => {
            reads.push(A(a));
            writes.push(B(d));
        }
        Op::Truncate64To32 { d, a } => {
            reads.push(B(a));
            writes.push(A(d));
        }
        Op::Cvt {
            d,
            a,
            wide_src,
            wide_dst,
            ..
        } => {
            reads.push(if wide_src { B(a) } else { A(a) });
            writes.push(if wide_dst { B(d) } else { A(d) });
        }
        Op::Ld { m, d } => {
            base(m.base, reads);
            let file = if m.wide_regs { B } else { A };
            writes.extend(d.iter().take(m.count as usize).map(|&r| file(r)));
        }
        Op::St { m, s } => {
            base(m.base, reads);
            let file = if m.wide_regs { B } else { A };
            reads.extend(s.iter().take(m.count as usize).map(|&r| file(r)));
        }
        Op::Atom {
            base: b,
            ty,
            d,
            b: x,
            c,
            ..
        } => {
            use crate::inst::AtomTy;
            base(b, reads);
            let file = if matches!(ty, AtomTy::U64 | AtomTy::S64 | AtomTy::F64) {
                B
            } else {
                A
            };
            reads.extend([file(x), file(c)]);
            writes.extend(d.map(file));
        }
        Op::Shfl {
            d,
            p,
            a,
            b,
            c,
            mask,
            ..
        } => {
            reads.extend([A(a), A(b), A(c), A(mask)]);
            writes.push(A(d));
            writes.extend(p.map(P));
        }
        Op::Vote {
            mode, d, a, mask, ..
        } => {
            reads.extend([P(a), A(mask)]);
            writes.push(if mode == crate::inst::VoteMode::Ballot {
                A(d)
            } else {
                P(d)
            });
        }
        Op::WarpSync { mask } => reads.push(A(mask)),
        Op::CvtTf32 { d, a, .. } => {
            reads.push(A(a));
            writes.push(A(d));
        }
        Op::Mma { d, a, b, c, .. } => {
            reads.extend(a.iter().chain(&b).chain(&c).map(|&r| A(r)));
            writes.extend(d.map(A));
        }
        Op::Ldmatrix {
            num, d, base: b, ..
        } => {
            base(b, reads);
            writes.extend(d.iter().take(num as usize).map(|&r| A(r)));
        }
        Op::CpAsync { dst, src, from, .. } => {
            base(dst.0, reads);
            base(src.0, reads);
            match from {
                crate::inst::CpAsyncSrc::Full => {}
                crate::inst::CpAsyncSrc::Bytes(r) => reads.push(A(r)),
                crate::inst::CpAsyncSrc::Ignore(p, _) => reads.push(P(p)),
            }
        }
        Op::CpAsyncCommit | Op::CpAsyncWait { .. } => {}
        Op::Bar { id } => reads.push(A(id)),
    }
}

/// A set of registers over all three files, as a bitset.
#[derive(Clone, PartialEq)]
struct Set(Vec<u64>);

impl Set {
    fn new(bits: usize, full: bool) -> Set {
        Set(vec![if full { u64::MAX } else { 0 }; bits.div_ceil(64)])
    }
    fn insert(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn contains(&self, i: usize) -> bool {
        self.0[i / 64] >> (i % 64) & 1 == 1
    }
    /// `self &= other`; true when `self` changed.
    fn meet(&mut self, other: &Set) -> bool {
        let mut changed = false;
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            let n = *a & b;
            changed |= n != *a;
            *a = n;
        }
        changed
    }
}

/// Registers to zero when a warp starts: (32-bit, 64-bit, predicate) indices.
pub(crate) struct MaybeUndefined {
    pub r32: Vec<R>,
    pub r64: Vec<R>,
    pub pred: Vec<R>,
}

/// Runs the dataflow. `consts32`/`consts64` are constant registers (written at warp start).
pub(crate) fn maybe_undefined(
    code: &[Inst],
    counts: RegCounts,
    consts32: &[(u32, u32)],
    consts64: &[(u32, u64)],
) -> MaybeUndefined {
    let (n32, n64) = (counts.r32, counts.r64);
    let total = n32 + n64 + counts.pred;
    let index = |r: Reg| match r {
        Reg::R32(i) => i as usize,
        Reg::R64(i) => n32 + i as usize,
        Reg::Pred(i) => n32 + n64 + i as usize,
    };
    let mut entry = Set::new(total, false);
    consts32.iter().for_each(|&(r, _)| entry.insert(r as usize));
    consts64
        .iter()
        .for_each(|&(r, _)| entry.insert(n32 + r as usize));
    // Per instruction: registers definitely written on every path reaching it (top = all).
    let mut defined: Vec<Set> = vec![Set::new(total, true); code.len()];
    if code.is_empty() {
        return MaybeUndefined {
            r32: vec![],
            r64: vec![],
            pred: vec![],
        };
    }
    defined[0] = entry;
    let (mut reads, mut writes) = (Vec::new(), Vec::new());
    let mut work: Vec<usize> = vec![0];
    let mut queued = vec![false; code.len()];
    queued[0] = true;
    while let Some(pc) = work.pop() {
        queued[pc] = false;
        let inst = &code[pc];
        let mut out = defined[pc].clone();
        if inst.guard.is_none() {
            reads.clear();
            writes.clear();
            uses(&inst.op, &mut reads, &mut writes);
            writes.iter().for_each(|&w| out.insert(index(w)));
        }
        let fallthrough =
            !matches!(inst.op, Op::Bra { .. } | Op::Exit | Op::Trap) || inst.guard.is_some();
        let target = match inst.op {
            Op::Bra { target } => Some(target as usize),
            _ => None,
        };
        let next = (pc + 1 < code.len() && fallthrough).then_some(pc + 1);
        for succ in next.into_iter().chain(target) {
            if defined[succ].meet(&out) && !queued[succ] {
                queued[succ] = true;
                work.push(succ);
            }
        }
    }
    let mut undefined = Set::new(total, false);
    for (pc, inst) in code.iter().enumerate() {
        reads.clear();
        writes.clear();
        uses(&inst.op, &mut reads, &mut writes);
        if let Some((p, _)) = inst.guard {
            reads.push(Reg::Pred(p));
        }
        for &r in &reads {
            if !defined[pc].contains(index(r)) {
                undefined.insert(index(r));
            }
        }
    }
    let pick = |lo: usize, hi: usize| {
        (lo..hi)
            .filter(|&i| undefined.contains(i))
            .map(|i| (i - lo) as R)
            .collect()
    };
    MaybeUndefined {
        r32: pick(0, n32),
        r64: pick(n32, n32 + n64),
        pred: pick(n32 + n64, total),
    }
}

#[cfg(test)]
mod tests {
    use crate::module::Module;

    fn undefined_of(body: &str) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
        let src = format!(
            ".version 8.8\n.target sm_80\n.address_size 64\n.visible .entry k()\n{{\n\
             .reg .b32 %r<6>;\n.reg .b64 %rd<3>;\n.reg .pred %p<3>;\n{body}\n}}"
        );
        let m = Module::load(&src).unwrap();
        let k = &m.kernels()[0];
        (k.zero32.clone(), k.zero64.clone(), k.zero_pred.clone())
    }

    #[test]
    fn straight_line_code_needs_no_zeroing() {
        let (r32, r64, p) = undefined_of(
            "mov.u32 %r1, 5;\nadd.s32 %r2, %r1, %r1;\nmul.wide.s32 %rd1, %r2, 4;\nret;",
        );
        assert!(r32.is_empty() && r64.is_empty() && p.is_empty());
    }

    #[test]
    fn reads_on_some_path_or_after_guarded_writes_are_reported() {
        // %r2 is written on one branch only; %r3 only under a guard; %p2 never.
        let (r32, _, p) = undefined_of(
            "mov.u32 %r1, %tid.x;\nsetp.eq.s32 %p1, %r1, 0;\n@%p1 bra L;\nmov.u32 %r2, 1;\n\
             L:\n@%p1 mov.u32 %r3, 2;\nadd.s32 %r4, %r2, %r3;\n@%p2 ret;\nret;",
        );
        assert_eq!(r32, vec![2, 3]);
        assert_eq!(p, vec![2]);
    }

    #[test]
    fn loop_carried_values_defined_before_the_loop_are_fine() {
        let (r32, _, _) = undefined_of(
            "mov.u32 %r1, 0;\nL:\nadd.s32 %r1, %r1, 1;\nsetp.lt.s32 %p1, %r1, 10;\n@%p1 bra L;\nret;",
        );
        assert!(r32.is_empty(), "{r32:?}");
    }
}
