//! The decoded instruction set: what `decode` produces once per module and the executor runs.
//! Operands are indices into one of three per-warp register files — 32-bit (`.b16`/`.b32`/`.f32`
//! and friends, 16-bit values zero-extended), 64-bit, and predicates (one bit per lane).
//! Immediates and symbol addresses are decoded into read-only constant registers, so every handler
//! reads registers only: no per-lane operand-kind branches.

/// Every opcode root the decoder understands (modifiers permitting).
pub const OPCODES: &[&str] = &[
    "abs",
    "activemask",
    "add",
    "and",
    "atom",
    "bar",
    "barrier",
    "bfe",
    "bfi",
    "bra",
    "brev",
    "brkpt",
    "clz",
    "cnot",
    "copysign",
    "cos",
    "cp",
    "cvt",
    "cvta",
    "div",
    "dp2a",
    "dp4a",
    "ex2",
    "exit",
    "fence",
    "fma",
    "ld",
    "ldmatrix",
    "ldu",
    "lg2",
    "lop3",
    "mad",
    "max",
    "membar",
    "min",
    "mma",
    "mov",
    "mul",
    "nanosleep",
    "neg",
    "not",
    "or",
    "popc",
    "prefetch",
    "prefetchu",
    "prmt",
    "rcp",
    "red",
    "rem",
    "ret",
    "rsqrt",
    "selp",
    "setp",
    "shfl",
    "shl",
    "shr",
    "sin",
    "sqrt",
    "st",
    "sub",
    "tanh",
    "testp",
    "trap",
    "vote",
    "xor",
];

/// A register index into the file the instruction implies.
pub type R = u32;

/// Round-to-nearest-even, toward zero, toward −∞, toward +∞.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rnd {
    Rn,
    Rz,
    Rm,
    Rp,
}

/// Modifiers of float arithmetic: flush subnormals to zero, saturate to [0, 1].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FFlags {
    pub ftz: bool,
    pub sat: bool,
}

/// Two-operand integer operations (32- and 64-bit files alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntOp {
    Add,
    AddSatS,
    Sub,
    SubSatS,
    MulLo,
    MulHiS,
    MulHiU,
    MinS,
    MinU,
    MaxS,
    MaxU,
    And,
    Or,
    Xor,
    DivS,
    DivU,
    RemS,
    RemU,
}

/// Shifts; the shift amount is always a 32-bit register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShiftOp {
    Shl,
    ShrS,
    ShrU,
}

/// One-operand integer operations. `Popc`/`Clz` on the 64-bit file write a 32-bit register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntUnOp {
    Neg,
    Not,
    Cnot,
    Abs,
    Brev,
}

/// Two-operand float operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FBinOp {
    Add,
    Sub,
    Mul,
    /// Add/sub/mul with a directed rounding mode (exact software rounding).
    AddR(Rnd),
    SubR(Rnd),
    MulR(Rnd),
    /// IEEE division (`div.rn`, and `div.full`, whose ≤ 2 ulp error we do not model).
    Div,
    DivR(Rnd),
    /// `div.approx`: `a * (1 / b)`.
    DivApprox,
    Min,
    Max,
    /// `copysign d, a, b`: the magnitude of `b` with the sign of `a`.
    Copysign,
}

/// One-operand float operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FUnOp {
    Neg,
    Abs,
    Sqrt,
    SqrtR(Rnd),
    Rcp,
    RcpR(Rnd),
    /// `.approx` functions are computed in f64 and rounded: within hardware's error bounds.
    SqrtApprox,
    RcpApprox,
    Rsqrt,
    Ex2,
    Lg2,
    Sin,
    Cos,
    Tanh,
}

/// Comparison of `setp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    /// Unordered float forms: true when either operand is NaN.
    Equ,
    Neu,
    Ltu,
    Leu,
    Gtu,
    Geu,
    Num,
    Nan,
}

/// The operand type of `setp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpTy {
    /// 16-bit integers (zero-extended in the 32-bit file).
    S16,
    U16,
    S32,
    U32,
    S64,
    U64,
    F32,
    F64,
    F16,
    BF16,
}

/// Predicate logic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoolOp {
    And,
    Or,
    Xor,
}

/// A scalar value type, as far as conversions and half arithmetic need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scalar {
    U8,
    U16,
    U32,
    U64,
    S8,
    S16,
    S32,
    S64,
    B8,
    B16,
    B32,
    B64,
    F16,
    BF16,
    F32,
    F64,
}

impl Scalar {
    pub fn bits(self) -> u32 {
        use Scalar::*;
        match self {
            U8 | S8 | B8 => 8,
            U16 | S16 | B16 | F16 | BF16 => 16,
            U32 | S32 | B32 | F32 => 32,
            U64 | S64 | B64 | F64 => 64,
        }
    }
    pub fn is_float(self) -> bool {
        matches!(self, Scalar::F16 | Scalar::BF16 | Scalar::F32 | Scalar::F64)
    }
    pub fn is_signed(self) -> bool {
        matches!(self, Scalar::S8 | Scalar::S16 | Scalar::S32 | Scalar::S64)
    }
}

/// A fully specified `cvt`: source and destination types plus modifiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CvtSpec {
    pub from: Scalar,
    pub to: Scalar,
    /// Rounding for float results (`.rn` ...) or, with `integral`, rounding to an integer (`.rni` ...).
    pub rnd: Rnd,
    pub integral: bool,
    pub ftz: bool,
    pub sat: bool,
    pub relu: bool,
    /// `.satfinite` (half destinations): a result beyond the largest finite value, infinities
    /// included, becomes that value with its sign; NaN stays NaN.
    pub satfinite: bool,
}

/// Rounding of `cvt.{rna,rn,rz}.tf32.f32`: `Rna` rounds to nearest with ties away from zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tf32Rnd {
    Rna,
    Rn,
    Rz,
}

/// Element type of the multiplicands of a tensor-core `mma` (accumulators are f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MmaTy {
    F16,
    BF16,
    /// f32 bit patterns of which the multiplier reads the sign, exponent and the top 10
    /// fraction bits (the low 13 bits are ignored).
    TF32,
}

/// The shape of a tensor-core `mma`: M = 16 and N = 8 always; K = 16 (f16/bf16) or 8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MmaShape {
    M16N8K16,
    M16N8K8,
}

/// Where a `cp.async` reads its source from when it reads fewer bytes than it writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpAsyncSrc {
    /// All `size` bytes.
    Full,
    /// `src-size` bytes (a register), the rest of the destination zero-filled.
    Bytes(R),
    /// `ignore-src` predicate (negated when the bool is set): when true, zeros only.
    Ignore(R, bool),
}

/// Half-precision arithmetic formats (scalars in the low 16 bits, or two lanes packed in 32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HalfTy {
    F16,
    F16x2,
    BF16,
    BF16x2,
}

/// Half-precision operations (each element computed exactly and rounded once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HalfOp {
    Add,
    Sub,
    Mul,
    Fma,
    Min,
    Max,
    Neg,
    Abs,
}

/// Special registers readable with `mov`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecialReg {
    Tid(u8),
    Ntid(u8),
    Ctaid(u8),
    Nctaid(u8),
    LaneId,
    WarpId,
    NWarpId,
    SmId,
    LanemaskEq,
    LanemaskLt,
    LanemaskLe,
    LanemaskGt,
    LanemaskGe,
    /// `%clock`/`%clock64`: the CTA's warp-instruction counter.
    Clock,
}

/// Memory state space of a load/store/atomic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemSpace {
    Global,
    Shared,
    Local,
    Param,
    Generic,
}

/// An address: `[base + offset]`; `base` is a register of the 32- or 64-bit file, or absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrBase {
    None,
    R32(R),
    R64(R),
}

/// `ld`/`st` element description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemAccess {
    pub space: MemSpace,
    pub base: AddrBase,
    pub offset: i64,
    /// Bytes per element: 1, 2, 4 or 8.
    pub width: u8,
    /// Elements: 1, 2 or 4 (`.v2`/`.v4`).
    pub count: u8,
    /// Sign-extend narrow loads.
    pub signed: bool,
    /// Registers live in the 64-bit file.
    pub wide_regs: bool,
}

/// Atomic read-modify-write operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomOp {
    Add,
    Min,
    Max,
    And,
    Or,
    Xor,
    Exch,
    Cas,
    Inc,
    Dec,
}

/// Atomic operand types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomTy {
    U32,
    S32,
    U64,
    S64,
    F32,
    F64,
}

/// Shuffle modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShflMode {
    Up,
    Down,
    Bfly,
    Idx,
}

/// Vote modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VoteMode {
    All,
    Any,
    Uni,
    Ballot,
}

/// A decoded operation. Field names: `d` destination, `a`/`b`/`c` sources, `p`/`q` predicates.
#[rustfmt::skip]
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Nop,
    /// `membar` / `fence`: a sequentially consistent fence over global memory, so the writes a
    /// CTA made before it are visible to a CTA (on another host thread) that observes a later
    /// atomic of the first (the last-block-combines pattern of split reductions).
    Fence,
    Mov32 { d: R, a: R },
    Mov64 { d: R, a: R },
    MovPred { d: R, a: R },
    /// `mov.pred d, 0|1`.
    SetPred { d: R, value: bool },
    Special { d: R, wide: bool, reg: SpecialReg },
    /// `mov.b32 d, {lo, hi}` (16-bit parts) or `mov.b64 d, {lo, hi}` (32-bit parts).
    Pack16 { d: R, lo: R, hi: R },
    Pack32 { d: R, lo: R, hi: R },
    /// The reverse; `None` is `_`.
    Unpack16 { lo: Option<R>, hi: Option<R>, a: R },
    Unpack32 { lo: Option<R>, hi: Option<R>, a: R },

    Int32 { op: IntOp, d: R, a: R, b: R },
    /// 16-bit arithmetic in the 32-bit file: operands (sign-)extended from 16 bits, result
    /// truncated to 16 bits (zero-extended).
    Int16 { op: IntOp, signed: bool, d: R, a: R, b: R },
    Int64 { op: IntOp, d: R, a: R, b: R },
    Shift32 { op: ShiftOp, d: R, a: R, b: R },
    /// A 16-bit shift in the 32-bit file (result zero-extended); the amount is 32-bit.
    Shift16 { op: ShiftOp, d: R, a: R, b: R },
    Shift64 { op: ShiftOp, d: R, a: R, b: R },
    IntUn32 { op: IntUnOp, d: R, a: R },
    IntUn64 { op: IntUnOp, d: R, a: R },
    /// `popc`/`clz`; `wide` reads the 64-bit file; the result is always 32-bit.
    Popc { d: R, a: R, wide: bool },
    Clz { d: R, a: R, wide: bool },
    /// `mad.lo`/`mad.hi`: `(a * b).lo/hi + c`.
    Mad32 { hi: bool, signed: bool, d: R, a: R, b: R, c: R },
    Mad64 { hi: bool, signed: bool, d: R, a: R, b: R, c: R },
    /// `mul.wide`: 32×32 → 64 (`d` in the 64-bit file); `mad.wide` adds a 64-bit `c`.
    MulWide { signed: bool, d: R, a: R, b: R },
    MadWide { signed: bool, d: R, a: R, b: R, c: R },
    /// `mul.wide.{s,u}16`: 16×16 → 32.
    MulWide16 { signed: bool, d: R, a: R, b: R },
    Bfe32 { signed: bool, d: R, a: R, pos: R, len: R },
    Bfe64 { signed: bool, d: R, a: R, pos: R, len: R },
    Bfi32 { d: R, f: R, b: R, pos: R, len: R },
    Bfi64 { d: R, f: R, b: R, pos: R, len: R },
    Prmt { d: R, a: R, b: R, c: R },
    /// `dp4a` (`half: None`): `c` plus the products of `a`'s and `b`'s four bytes; `dp2a`
    /// (`half: Some(hi)`): `c` plus the products of `a`'s two 16-bit halves with bytes 0, 1
    /// (`.lo`) or 2, 3 (`.hi`) of `b`. Each part is sign- or zero-extended by its operand's type;
    /// the sum wraps modulo 2^32.
    Dot { half: Option<bool>, a_signed: bool, b_signed: bool, d: R, a: R, b: R, c: R },
    Lop3 { d: R, a: R, b: R, c: R, lut: u8 },

    F32Bin { op: FBinOp, fl: FFlags, d: R, a: R, b: R },
    F64Bin { op: FBinOp, d: R, a: R, b: R },
    F32Un { op: FUnOp, fl: FFlags, d: R, a: R },
    F64Un { op: FUnOp, d: R, a: R },
    F32Fma { rnd: Rnd, fl: FFlags, d: R, a: R, b: R, c: R },
    F64Fma { rnd: Rnd, d: R, a: R, b: R, c: R },
    Half { op: HalfOp, ty: HalfTy, fl: FFlags, d: R, a: R, b: R, c: R },

    /// `setp.cmp.ty p[|q], a, b[, {!}c]` with optional `.and/.or/.xor` combination.
    Setp { cmp: Cmp, ty: CmpTy, p: R, q: Option<R>, a: R, b: R, combine: Option<(BoolOp, R, bool)> },
    /// `testp.{finite,infinite,number,notanumber,normal,subnormal}` on f32 or f64.
    Testp { kind: u8, wide: bool, p: R, a: R },
    Selp32 { d: R, a: R, b: R, p: R },
    Selp64 { d: R, a: R, b: R, p: R },
    PredBin { op: BoolOp, d: R, a: R, b: R },
    PredNot { d: R, a: R },

    SignExtend32To64 { d: R, a: R },
    ZeroExtend32To64 { d: R, a: R },
    Truncate64To32 { d: R, a: R },
    S32ToF32 { d: R, a: R },
    U32ToF32 { d: R, a: R },
    /// Any other `cvt`; `wide_src`/`wide_dst` say which files hold the operands.
    Cvt { spec: CvtSpec, d: R, a: R, wide_src: bool, wide_dst: bool },
    /// `cvt.rn.{f16x2,bf16x2}.f32 d, a, b`: `a` into the high half, `b` into the low.
    CvtPack { bf16: bool, rnd: Rnd, relu: bool, satfinite: bool, d: R, a: R, b: R },
    /// `cvt.{rna,rn,rz}[.relu][.satfinite].tf32.f32 d, a`: an f32 rounded to 10 fraction bits,
    /// as f32 bits with the low 13 bits zero.
    CvtTf32 { rnd: Tf32Rnd, relu: bool, satfinite: bool, d: R, a: R },

    /// `mma.sync.aligned.{m16n8k16,m16n8k8}.row.col.f32.ty.ty.f32 d, a, b, c`: a warp-wide
    /// D = A·B + C with the fragments of the PTX ISA tables; `a` and `b` hold as many registers
    /// as the shape and type take (unused slots repeat the last one).
    Mma { shape: MmaShape, ty: MmaTy, d: [R; 4], a: [R; 4], b: [R; 2], c: [R; 4] },
    /// `ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16 d, [addr]`: `num` 8×8
    /// matrices of 16-bit elements, row addresses from lanes 8i..8i+7 for matrix i.
    Ldmatrix { num: u8, trans: bool, d: [R; 4], base: AddrBase, offset: i64 },
    /// `cp.async.{ca,cg}.shared.global [dst], [src], size[, src-size | ignore-src]`: a
    /// per-thread copy of `size` bytes (4, 8, 16) from global to shared memory that lands when
    /// a later `cp.async.wait_group`/`wait_all` of the thread completes its group.
    CpAsync { dst: (AddrBase, i64), src: (AddrBase, i64), size: u8, from: CpAsyncSrc },
    /// `cp.async.commit_group`: the thread's uncommitted copies become one group.
    CpAsyncCommit,
    /// `cp.async.wait_group n` (`all`: `cp.async.wait_all`, which commits first): completes
    /// every committed group of the thread but the `n` most recent.
    CpAsyncWait { n: u32, all: bool },

    Ld { m: MemAccess, d: [R; 4] },
    St { m: MemAccess, s: [R; 4] },
    /// `atom` (with `d`) or `red` (without): `c` is only read by `cas`.
    Atom { space: MemSpace, base: AddrBase, offset: i64, op: AtomOp, ty: AtomTy, d: Option<R>, b: R, c: R },

    Shfl { mode: ShflMode, d: R, p: Option<R>, a: R, b: R, c: R, mask: R },
    Vote { mode: VoteMode, d: R, a: R, neg: bool, mask: R },
    Activemask { d: R },
    /// `bar.warp.sync mask`: the member lanes must converge here.
    WarpSync { mask: R },
    Bar { id: R },
    Bra { target: u32 },
    Exit,
    Trap,
}

/// One decoded instruction: an optional guard predicate (`@p` / `@!p`) and the operation.
#[derive(Debug, Clone, PartialEq)]
pub struct Inst {
    pub guard: Option<(R, bool)>,
    pub op: Op,
}
