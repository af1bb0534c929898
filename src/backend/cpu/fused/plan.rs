//! How the chunk engine evaluates each instruction of a fused expression: most one pass over
//! the chunk each, but casts that change nothing share their operand's register, and chains of
//! per-channel affine steps (batch norm's `(x − μ)·σ⁻¹·γ + β`, a bias add, either followed by a
//! ReLU) run as one pass with the intermediate values kept in vector registers.
//!
//! Every pass reads and writes whole registers in L1, so on ResNet-20's prologues and
//! epilogues the engine's time is the number of passes; a chain is evaluated operation by
//! operation in the expression's order, so the results are bit-identical to the passes it
//! replaces.

use crate::ir::{BinaryOp, UnaryOp};
use crate::lower::{ExprId, ExprOp, FusedExpr};
use crate::tensor::DType;

/// The positions of a chain's steps, in the order they apply: `((x − a)·b)·c + d`.
const SUB: usize = 0;
const MUL: usize = 1;
const ADD: usize = 3;

/// A chain's value: `relu?(((x − a)·b)·c + d)` with per-channel invariant `a, b, c, d`; an
/// absent step is its identity (`x − 0`, `x·1`, `x + (−0)`: exact for every `x`).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct AffineChain {
    /// The varying value the chain starts from.
    pub x: ExprId,
    /// The invariant operand of each step (`None`: the step is absent).
    pub steps: [Option<ExprId>; 4],
    /// Whether a ReLU ends the chain.
    pub relu: bool,
}

/// What the engine does for one instruction.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Role {
    /// One pass, as the instruction says.
    Eval,
    /// Nothing: the value is `Alias`'s operand (a cast to `f32` of a value already exact in
    /// `f32`), and shares its register.
    Alias(ExprId),
    /// Nothing: the value is an intermediate step of a chain that a later instruction evaluates.
    Absorbed,
    /// The whole chain ending here, in one pass.
    Chain(AffineChain),
    /// A select whose condition, a comparison of `f32` values read by nothing else, is
    /// computed lane by lane in the same pass (a ReLU's gradient: `x > 0 ? dy : 0`).
    SelectCompared(BinaryOp, ExprId, ExprId),
    /// Nothing: a product read only by an epilogue's column sums, which multiply its operands
    /// as they add (batch norm's gradient sums `Σ dy·x̂`).
    Summed(ExprId, ExprId),
}

impl Role {
    /// Whether the instruction takes a pass over each chunk (and a register of its own).
    pub(super) fn takes_pass(&self) -> bool {
        matches!(self, Role::Eval | Role::Chain(_) | Role::SelectCompared(..))
    }
}

/// A chain being grown: the chain ending at a value, and how many steps it has.
#[derive(Clone)]
struct Partial {
    chain: AffineChain,
    /// The last step position filled (`4`: the ReLU).
    last: usize,
    len: usize,
}

/// Plans `expr`'s instructions: `f32_class(v)` says whether value `v` lives in `f32` registers,
/// `invariant(v)` whether it is the same in every chunk, `streamable(v)` whether it is a load
/// a fused instruction could read where it is stored; outputs from `summed` on are column
/// sums (an epilogue's reductions; `outputs.len()` where there are none). Also returns how
/// many instructions (and outputs) read each value's register.
pub(super) fn plan(
    expr: &FusedExpr,
    f32_class: impl Fn(ExprId) -> bool,
    invariant: impl Fn(ExprId) -> bool,
    streamable: impl Fn(ExprId) -> bool,
    summed: usize,
) -> (Vec<Role>, Vec<usize>) {
    let n = expr.ops.len();
    let mut roles = vec![Role::Eval; n];
    for (i, (op, dtype)) in expr.ops.iter().enumerate() {
        if let ExprOp::Cast(a) = op
            && *dtype == DType::F32
            && f32_class(*a)
        {
            roles[i] = Role::Alias(resolve(&roles, *a));
        }
    }
    // Readers of each register (an output counts as one; an alias's readers read its operand).
    let mut readers = vec![0usize; n];
    for (i, (op, _)) in expr.ops.iter().enumerate() {
        if matches!(roles[i], Role::Eval) {
            for v in op.operands() {
                readers[resolve(&roles, v) as usize] += 1;
            }
        }
    }
    for &o in &expr.outputs {
        readers[resolve(&roles, o) as usize] += 1;
    }
    for (i, (op, _)) in expr.ops.iter().enumerate() {
        let ExprOp::Select(cond, ..) = op else {
            continue;
        };
        let cond = resolve(&roles, *cond);
        if let (ExprOp::Binary(b, p, q), Role::Eval) = (&expr.ops[cond as usize].0, &roles[i])
            && b.is_comparison()
            && f32_class(*p)
            && f32_class(*q)
            && f32_class(i as ExprId)
            && readers[cond as usize] == 1
            && !invariant(i as ExprId)
        {
            roles[cond as usize] = Role::Absorbed;
            roles[i] = Role::SelectCompared(*b, *p, *q);
        }
    }
    // Products that only column sums read (each as it is summed: no register).
    for (i, (op, dtype)) in expr.ops.iter().enumerate() {
        let id = i as ExprId;
        if let ExprOp::Binary(BinaryOp::Mul, x, y) = op
            && *dtype == DType::F32
            && roles[i] == Role::Eval
            && !invariant(id)
            && f32_class(*x)
            && f32_class(*y)
            && readers[i] > 0
            && readers[i]
                == expr
                    .outputs
                    .iter()
                    .skip(summed)
                    .filter(|&&o| o == id)
                    .count()
        {
            roles[i] = Role::Summed(resolve(&roles, *x), resolve(&roles, *y));
        }
    }
    let mut partial: Vec<Option<Partial>> = vec![None; n];
    for (i, (op, dtype)) in expr.ops.iter().enumerate() {
        let id = i as ExprId;
        if *dtype != DType::F32 || invariant(id) || roles[i] != Role::Eval {
            continue;
        }
        // The step this instruction is, and the varying value it applies to.
        let channel = |k: ExprId| invariant(k) && f32_class(k);
        let varying = |v: ExprId| !invariant(v) && f32_class(v);
        let (position, x, k) = match op {
            ExprOp::Binary(BinaryOp::Sub, x, k) if varying(*x) && channel(*k) => {
                (SUB, *x, Some(*k))
            }
            ExprOp::Binary(b @ (BinaryOp::Mul | BinaryOp::Add), p, q) => {
                let position = if *b == BinaryOp::Mul { MUL } else { ADD };
                if varying(*p) && channel(*q) {
                    (position, *p, Some(*q))
                } else if varying(*q) && channel(*p) {
                    (position, *q, Some(*p))
                } else {
                    continue;
                }
            }
            ExprOp::Unary(UnaryOp::Relu, x) if varying(*x) => (4, *x, None),
            _ => continue,
        };
        let x = resolve(&roles, x);
        // Extend the chain ending at `x` if this step comes after its last one and nothing else
        // reads `x`; else start a new chain from `x`.
        let extended = partial[x as usize]
            .as_ref()
            .filter(|p| readers[x as usize] == 1 && fits(p, position))
            .cloned();
        let mut grown = match extended {
            Some(p) => {
                roles[x as usize] = Role::Absorbed;
                p
            }
            None => Partial {
                chain: AffineChain {
                    x,
                    steps: [None; 4],
                    relu: false,
                },
                last: 0,
                len: 0,
            },
        };
        let at = if position == MUL && grown.chain.steps[MUL].is_some() {
            MUL + 1
        } else {
            position
        };
        match k {
            Some(k) => grown.chain.steps[at] = Some(k),
            None => grown.chain.relu = true,
        }
        grown.last = at;
        grown.len += 1;
        partial[i] = Some(grown);
    }
    // A longer chain is evaluated where it ends (its earlier steps were marked absorbed as it
    // grew); a chain of one step is that instruction, unless it reads its `x` where it is
    // stored (saving the load's pass).
    for (i, p) in partial.into_iter().enumerate() {
        if let Some(p) = p
            && (p.len > 1 || (streamable(p.chain.x) && readers[p.chain.x as usize] == 1))
            && roles[i] == Role::Eval
        {
            roles[i] = Role::Chain(p.chain);
        }
    }
    (roles, readers)
}

/// Whether a step at `position` may follow the chain `p`: steps apply in the order
/// sub, mul, mul, add, ReLU, each at most once (two multiplications).
fn fits(p: &Partial, position: usize) -> bool {
    if p.chain.relu {
        return false;
    }
    match position {
        MUL => p.chain.steps[MUL + 1].is_none() && p.chain.steps[ADD].is_none(),
        _ => position > p.last,
    }
}

/// The value whose register `v` uses (through aliases).
fn resolve(roles: &[Role], mut v: ExprId) -> ExprId {
    while let Role::Alias(a) = roles[v as usize] {
        v = a;
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expr(ops: &[(ExprOp, DType)], outputs: &[ExprId]) -> FusedExpr {
        FusedExpr {
            ops: ops.to_vec(),
            outputs: outputs.to_vec(),
        }
    }

    /// Batch norm's normalisation and ReLU (operand 0 varying, 1–4 per channel) becomes one
    /// chain ending at the ReLU; its steps are absorbed.
    #[test]
    fn batch_norm_and_relu_are_one_chain() {
        use BinaryOp::*;
        let f = DType::F32;
        let e = expr(
            &[
                (ExprOp::Load(0), f),
                (ExprOp::Load(1), f),
                (ExprOp::Binary(Sub, 0, 1), f),
                (ExprOp::Load(2), f),
                (ExprOp::Binary(Mul, 2, 3), f),
                (ExprOp::Load(3), f),
                (ExprOp::Binary(Mul, 5, 4), f),
                (ExprOp::Load(4), f),
                (ExprOp::Binary(Add, 6, 7), f),
                (ExprOp::Unary(UnaryOp::Relu, 8), f),
            ],
            &[9],
        );
        let (roles, _) = plan(&e, |_| true, |v| [1, 3, 5, 7].contains(&v), |_| false, 1);
        assert_eq!(
            roles[9],
            Role::Chain(AffineChain {
                x: 0,
                steps: [Some(1), Some(3), Some(5), Some(7)],
                relu: true
            })
        );
        for i in [2, 4, 6, 8] {
            assert_eq!(roles[i], Role::Absorbed, "value {i}");
        }
        assert_eq!(roles[0], Role::Eval);
    }

    /// A product only column sums read is summed as it is multiplied; one that is also stored,
    /// read by an instruction, or read by nothing is an instruction as before.
    #[test]
    fn only_products_read_by_sums_alone_are_summed() {
        use BinaryOp::*;
        let f = DType::F32;
        let e = expr(
            &[
                (ExprOp::Load(0), f),           // v0
                (ExprOp::Load(1), f),           // v1
                (ExprOp::Binary(Mul, 0, 1), f), // v2: summed only
                (ExprOp::Binary(Mul, 0, 0), f), // v3: stored and summed
                (ExprOp::Binary(Mul, 1, 1), f), // v4: read by v5
                (ExprOp::Binary(Add, 4, 0), f), // v5: summed
                (ExprOp::Binary(Mul, 1, 0), f), // v6: dead
            ],
            &[3, 2, 3, 5, 2],
        );
        let (roles, _) = plan(&e, |_| true, |_| false, |_| false, 1);
        assert_eq!(roles[2], Role::Summed(0, 1));
        assert_eq!(roles[3], Role::Eval);
        assert_eq!(roles[4], Role::Eval);
        assert_eq!(roles[6], Role::Eval);
        // Without column sums, nothing is summed.
        let (roles, _) = plan(&e, |_| true, |_| false, |_| false, e.outputs.len());
        assert!(roles.iter().all(|r| !matches!(r, Role::Summed(..))));
    }

    /// A step whose input is read elsewhere starts a new chain; a step out of order (an add
    /// before a sub) ends one; a bf16 round trip's widening shares the rounded register.
    #[test]
    fn chains_stop_at_shared_values_and_out_of_order_steps() {
        use BinaryOp::*;
        let f = DType::F32;
        let e = expr(
            &[
                (ExprOp::Load(0), f),                 // v0 varying
                (ExprOp::Load(1), f),                 // v1 per channel
                (ExprOp::Binary(Mul, 0, 1), f),       // v2 = v0·k (read twice)
                (ExprOp::Binary(Add, 2, 1), f),       // v3 = v2 + k
                (ExprOp::Unary(UnaryOp::Relu, 3), f), // v4 = relu(v3): chain v2 → [add, relu]
                (ExprOp::Binary(Sub, 4, 1), f),       // v5: a sub after a ReLU: one step
                (ExprOp::Binary(Mul, 2, 4), f),       // v6 reads v2 and v4
                (ExprOp::Cast(6), DType::BF16),       // v7 rounded
                (ExprOp::Cast(7), f),                 // v8 = v7 exactly
            ],
            &[5, 8],
        );
        let (roles, readers) = plan(&e, |_| true, |v| v == 1, |_| false, 2);
        assert_eq!(readers[2], 2, "v2 is read by v3 and v6");
        assert_eq!(readers[7], 1, "v7 is the output, read through its alias v8");
        assert_eq!(roles[2], Role::Eval);
        assert_eq!(roles[3], Role::Absorbed, "v3 is read by the ReLU alone");
        assert_eq!(
            roles[4],
            Role::Chain(AffineChain {
                x: 2,
                steps: [None, None, None, Some(1)],
                relu: true
            })
        );
        assert_eq!(roles[5], Role::Eval);
        assert_eq!(roles[7], Role::Eval);
        assert_eq!(roles[8], Role::Alias(7));
    }
}
