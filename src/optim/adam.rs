//! Adam (TF's `AdamOptimizer` v1): per-variable first and second moments in the slots
//! `{var}/Adam` and `{var}/Adam_1`, and the step-wide `beta1_power`/`beta2_power` variables that
//! carry the bias correction.

use super::OptimError;
use super::builder::Builder;
use super::rule::VariableUpdate;
use super::state::{self, create_slot, read};
use crate::ir::{BinaryOp, Graph, TensorType, UnaryOp, Value, VarId};
use crate::tensor::DType;

/// Adam's updates: per-variable `m`, `v` and the shared beta powers.
pub(crate) fn adam(
    graph: &mut Graph,
    grads: &[(VarId, Value)],
    lr: Value,
    beta1: f64,
    beta2: f64,
    epsilon: f64,
) -> Result<Vec<VariableUpdate>, OptimError> {
    let scalar = TensorType::scalar(DType::F32);
    let flags = crate::ir::VarFlags::default();
    let init = |b: f64| crate::ir::Initializer::Constant(b);
    let b1p_var =
        state::get_or_create_unassigned(graph, "beta1_power", scalar.clone(), init(beta1), flags)?;
    let b2p_var =
        state::get_or_create_unassigned(graph, "beta2_power", scalar, init(beta2), flags)?;
    let mut out = Vec::new();
    // The step-wide scalars live on no particular device.
    let b1p = read(graph, b1p_var, "Adam/beta1_power/read", None)?;
    let b2p = read(graph, b2p_var, "Adam/beta2_power/read", None)?;
    let mut s = Builder::scalar(graph, "Adam/lr_t");
    let one = s.constant("one", 1.0)?;
    let one_minus_b2p = s.bin(BinaryOp::Sub, one, b2p)?;
    let root = s.un(UnaryOp::Sqrt, one_minus_b2p)?;
    let one_minus_b1p = s.bin(BinaryOp::Sub, one, b1p)?;
    let correction = s.bin(BinaryOp::Div, root, one_minus_b1p)?;
    let lr_t = s.bin(BinaryOp::Mul, lr, correction)?;
    let mut p = Builder::scalar(graph, "Adam/beta_powers");
    let b1 = p.constant("beta1", beta1)?;
    let b2 = p.constant("beta2", beta2)?;
    let b1p_new = p.bin(BinaryOp::Mul, b1p, b1)?;
    let b2p_new = p.bin(BinaryOp::Mul, b2p, b2)?;
    for &(var, g) in grads {
        let m_slot = create_slot(graph, var, "Adam")?;
        let v_slot = create_slot(graph, var, "Adam_1")?;
        let mut b = Builder::new(graph, "Adam", var, g);
        let (cur, m, v) = (b.read(var)?, b.read(m_slot)?, b.read(v_slot)?);
        let lr_t = b.cast(lr_t)?;
        let one_minus_b1 = b.constant("one_minus_beta1", 1.0 - beta1)?;
        let one_minus_b2 = b.constant("one_minus_beta2", 1.0 - beta2)?;
        let eps = b.constant("epsilon", epsilon)?;
        let g_minus_m = b.bin(BinaryOp::Sub, g, m)?;
        let dm = b.bin(BinaryOp::Mul, g_minus_m, one_minus_b1)?;
        let m_new = b.named("m", BinaryOp::Add, m, dm)?;
        let g2 = b.un(UnaryOp::Square, g)?;
        let g2_minus_v = b.bin(BinaryOp::Sub, g2, v)?;
        let dv = b.bin(BinaryOp::Mul, g2_minus_v, one_minus_b2)?;
        let v_new = b.named("v", BinaryOp::Add, v, dv)?;
        let root_v = b.un(UnaryOp::Sqrt, v_new)?;
        let denom = b.bin(BinaryOp::Add, root_v, eps)?;
        let ratio = b.bin(BinaryOp::Div, m_new, denom)?;
        let step = b.bin(BinaryOp::Mul, lr_t, ratio)?;
        let new = b.named("new", BinaryOp::Sub, cur, step)?;
        out.push(VariableUpdate {
            var,
            current: cur,
            new,
        });
        out.push(VariableUpdate {
            var: m_slot,
            current: m,
            new: m_new,
        });
        out.push(VariableUpdate {
            var: v_slot,
            current: v,
            new: v_new,
        });
    }
    out.push(VariableUpdate {
        var: b1p_var,
        current: b1p,
        new: b1p_new,
    });
    out.push(VariableUpdate {
        var: b2p_var,
        current: b2p,
        new: b2p_new,
    });
    Ok(out)
}
