//! A [`FusedExpr`] as CUDA C statements, following `src/ir/scalar.rs` op by op.
//!
//! Every SSA value becomes a `const` local of its compute type: `float` for f32, f16 and bf16
//! (f16/bf16 results are rounded to their precision after every op, as the CPU backend rounds on
//! store), `double` for f64, `long long` for every integer type and `bool` for booleans. Loads,
//! iteration indices and the flat position come from a [`PointSource`], so the same renderer
//! serves elementwise kernels, reduction prologues and epilogues.

use super::RenderError;
use crate::ir::{BinaryOp, UnaryOp, scalar};
use crate::lower::{ExprOp, FusedExpr};
use crate::tensor::DType;
use std::fmt::Write as _;

/// The compute type of values of `dtype`.
pub fn compute_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => "float",
        DType::F64 => "double",
        DType::I32 | DType::I64 | DType::U8 => "long long",
        DType::Bool => "bool",
    }
}

/// What a point of the iteration space offers the expression.
pub trait PointSource {
    /// The C expression of operand `operand`'s element at this point, in its compute type.
    fn load(&self, operand: u16) -> Result<String, RenderError>;
    /// The coordinate along iteration axis `axis` (an index expression).
    fn index(&self, axis: u8) -> String;
    /// The row-major position of the point in the iteration space (an index expression).
    fn flat(&self) -> String;
}

/// Converts a stored element (`raw`, of the storage type) to the compute type of `dtype`.
pub fn from_storage(raw: &str, dtype: DType) -> String {
    match dtype {
        DType::F32 | DType::F64 => raw.to_string(),
        DType::F16 => format!("tp_f16_to_f32({raw})"),
        DType::BF16 => format!("tp_bf16_to_f32({raw})"),
        DType::I32 | DType::I64 | DType::U8 => format!("(long long){raw}"),
        DType::Bool => format!("({raw} != 0)"),
    }
}

/// Converts a compute value of `dtype` to its storage type (integers saturate, as a cast).
pub fn to_storage(value: &str, dtype: DType) -> String {
    match dtype {
        DType::F32 | DType::F64 | DType::I64 => value.to_string(),
        DType::F16 => format!("tp_f32_to_f16({value})"),
        DType::BF16 => format!("tp_f32_to_bf16({value})"),
        DType::I32 => format!("(int)tp_sat_i32({value})"),
        DType::U8 => format!("(unsigned char)tp_sat_u8({value})"),
        DType::Bool => format!("(unsigned char)({value})"),
    }
}

/// A literal of `dtype` (rounded to it first).
pub fn literal(c: f64, dtype: DType) -> String {
    let c = scalar::round_to(c, dtype);
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => {
            let f = c as f32;
            if f.is_nan() {
                "tp_nanf()".into()
            } else if f.is_infinite() {
                if f > 0.0 { "tp_inff()" } else { "(-tp_inff())" }.into()
            } else {
                format!("{f:?}f")
            }
        }
        DType::F64 => {
            if c.is_nan() {
                "tp_nan()".into()
            } else if c.is_infinite() {
                if c > 0.0 { "tp_inf()" } else { "(-tp_inf())" }.into()
            } else {
                format!("{c:?}")
            }
        }
        DType::I32 | DType::I64 | DType::U8 => format!("{}LL", c as i64),
        DType::Bool => if c != 0.0 { "true" } else { "false" }.into(),
    }
}

/// Brings an op's result to what `dtype` holds: floats rounded to their precision, integers
/// wrapped to their width (as the reference executor's native arithmetic).
fn rounded(e: String, dtype: DType) -> String {
    match dtype {
        DType::F16 => format!("tp_round_f16({e})"),
        DType::BF16 => format!("tp_round_bf16({e})"),
        DType::I32 => format!("tp_wrap_i32({e})"),
        DType::U8 => format!("tp_wrap_u8({e})"),
        _ => e,
    }
}

fn unary(op: UnaryOp, x: &str, operand: DType) -> String {
    let float = compute_type(operand) == "float";
    let double = operand == DType::F64;
    let f = |single: &str, dbl: &str| -> String {
        if float {
            format!("{single}({x})")
        } else if double {
            format!("{dbl}({x})")
        } else {
            // Integer operands of transcendental ops: evaluate in double, truncate (as a store).
            format!("tp_f2i64({dbl}((double){x}))")
        }
    };
    match op {
        UnaryOp::Neg => format!("(-{x})"),
        UnaryOp::Abs if float => format!("fabsf({x})"),
        UnaryOp::Abs if double => format!("fabs({x})"),
        UnaryOp::Abs => format!("({x} < 0 ? -{x} : {x})"),
        UnaryOp::Sign => format!("tp_sign({x})"),
        UnaryOp::Exp => f("expf", "exp"),
        UnaryOp::Log => f("logf", "log"),
        UnaryOp::Sqrt => f("sqrtf", "sqrt"),
        UnaryOp::Rsqrt if float => format!("(1.0f / sqrtf({x}))"),
        UnaryOp::Rsqrt if double => format!("(1.0 / sqrt({x}))"),
        UnaryOp::Rsqrt => format!("tp_f2i64(1.0 / sqrt((double){x}))"),
        UnaryOp::Square => format!("({x} * {x})"),
        UnaryOp::Recip if float => format!("(1.0f / {x})"),
        UnaryOp::Recip if double => format!("(1.0 / {x})"),
        UnaryOp::Recip => format!("tp_idiv(1, {x})"),
        UnaryOp::Relu => format!("tp_relu({x})"),
        UnaryOp::Sigmoid if float || double => format!("tp_sigmoid({x})"),
        UnaryOp::Sigmoid => format!("tp_f2i64(tp_sigmoid((double){x}))"),
        UnaryOp::Tanh => f("tanhf", "tanh"),
        UnaryOp::Floor if float => format!("floorf({x})"),
        UnaryOp::Floor if double => format!("floor({x})"),
        UnaryOp::Floor => x.to_string(),
        UnaryOp::Not => format!("({x} == 0)"),
    }
}

fn binary(op: BinaryOp, a: &str, b: &str, operand: DType) -> String {
    let float = compute_type(operand) == "float";
    let double = operand == DType::F64;
    let integer = !(float || double) && operand != DType::Bool;
    match op {
        // Integer arithmetic goes through f64 as the scalar semantics defines it (exact below
        // 2^53), then truncates (saturating) to i64.
        BinaryOp::Add if integer => format!("tp_f2i64((double){a} + (double){b})"),
        BinaryOp::Sub if integer => format!("tp_f2i64((double){a} - (double){b})"),
        BinaryOp::Mul if integer => format!("tp_f2i64((double){a} * (double){b})"),
        BinaryOp::Add => format!("({a} + {b})"),
        BinaryOp::Sub => format!("({a} - {b})"),
        BinaryOp::Mul => format!("({a} * {b})"),
        BinaryOp::Div if float || double => format!("({a} / {b})"),
        BinaryOp::Div => format!("tp_idiv({a}, {b})"),
        BinaryOp::Pow if float => format!("powf({a}, {b})"),
        BinaryOp::Pow if double => format!("pow({a}, {b})"),
        BinaryOp::Pow => format!("tp_f2i64(pow((double){a}, (double){b}))"),
        BinaryOp::Maximum => format!("tp_max({a}, {b})"),
        BinaryOp::Minimum => format!("tp_min({a}, {b})"),
        BinaryOp::Eq => format!("({a} == {b})"),
        BinaryOp::Ne => format!("({a} != {b})"),
        BinaryOp::Lt => format!("({a} < {b})"),
        BinaryOp::Le => format!("({a} <= {b})"),
        BinaryOp::Gt => format!("({a} > {b})"),
        BinaryOp::Ge => format!("({a} >= {b})"),
        BinaryOp::And => format!("({a} != 0 && {b} != 0)"),
        BinaryOp::Or => format!("({a} != 0 || {b} != 0)"),
    }
}

/// Converts value `x` of dtype `from` to `to`, as `scalar::cast`.
pub fn cast(x: &str, from: DType, to: DType) -> String {
    let from_float = matches!(compute_type(from), "float" | "double");
    match to {
        DType::Bool => format!("({x} != 0)"),
        DType::F32 | DType::F16 | DType::BF16 => {
            let f = match from {
                DType::F32 | DType::F16 | DType::BF16 => x.to_string(),
                DType::Bool => format!("({x} ? 1.0f : 0.0f)"),
                _ => format!("(float){x}"),
            };
            rounded(f, to)
        }
        DType::F64 => match from {
            DType::Bool => format!("({x} ? 1.0 : 0.0)"),
            _ => format!("(double){x}"),
        },
        DType::I32 if from_float => format!("tp_f2i32((double){x})"),
        DType::I64 if from_float => format!("tp_f2i64((double){x})"),
        DType::U8 if from_float => format!("tp_f2u8((double){x})"),
        DType::I32 => format!("tp_sat_i32((long long){x})"),
        DType::I64 => format!("(long long){x}"),
        DType::U8 => format!("tp_sat_u8((long long){x})"),
    }
}

/// Appends the statements computing `expr` (one `const` local `{prefix}{i}` per value) to `out`
/// at `indent`, and returns the names of its output values.
pub fn render(
    expr: &FusedExpr,
    src: &dyn PointSource,
    prefix: &str,
    indent: &str,
    out: &mut String,
) -> Result<Vec<String>, RenderError> {
    let name = |id: u32| format!("{prefix}{id}");
    for (i, (op, dtype)) in expr.ops.iter().enumerate() {
        let dtype = *dtype;
        let value = match op {
            ExprOp::Load(k) => src.load(*k)?,
            ExprOp::Const(c) => literal(*c, dtype),
            ExprOp::Unary(u, a) => rounded(unary(*u, &name(*a), expr.dtype(*a)), dtype),
            ExprOp::Binary(b, l, r) => {
                let operand = expr.dtype(*l);
                rounded(binary(*b, &name(*l), &name(*r), operand), dtype)
            }
            ExprOp::Select(c, a, b) => format!("({} ? {} : {})", name(*c), name(*a), name(*b)),
            ExprOp::Cast(a) => cast(&name(*a), expr.dtype(*a), dtype),
            ExprOp::Index(axis) => format!("(long long)({})", src.index(*axis)),
            ExprOp::Random { seed, counter } => format!(
                "tp_uniform(tp_step_key({seed}ULL, {}), (unsigned long long)({}))",
                src.load(*counter)?,
                src.flat()
            ),
        };
        let _ = writeln!(
            out,
            "{indent}const {} {} = {value};",
            compute_type(dtype),
            name(i as u32)
        );
    }
    Ok(expr.outputs.iter().map(|&o| name(o)).collect())
}
