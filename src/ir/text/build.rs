//! Gives the parsed statements their meaning: resolves names (values only after their
//! definition), builds ops, adds them to a [`Graph`] (which infers the types), checks declared
//! types against inferred ones, and finally runs the verifier. Every error points at the token
//! at fault.

use super::attrs::{AttrMap, as_string};
use super::error::{At, ParseError, at, line_col};
use super::lexer::tokenize;
use super::literal::{shape_too_large, unescape};
use super::ops::{build_initializer, build_op};
use super::syntax::{CollectionStmt, NodeStmt, Operand, Parser, Stmt, ValueRef, VarStmt};
use crate::ir::{Graph, IrError, Op, Value, VarFlags, VarId, VariableDef, is_valid_name, verify};
use std::collections::HashMap;

/// Parses `source` (named `file` in errors) into a verified graph.
pub(crate) fn parse_graph(source: &str, file: &str) -> Result<Graph, ParseError> {
    let render = |e: At| ParseError::at(file, source, e.offset, e.message);
    let mut parser = Parser::new(source, tokenize(source, file)?);
    let mut builder = Builder {
        source,
        graph: Graph::new(),
        nodes: HashMap::new(),
        variables: HashMap::new(),
        collections: HashMap::new(),
    };
    while let Some(stmt) = parser.statement().map_err(render)? {
        match stmt {
            Stmt::Var(v) => builder.variable(v),
            Stmt::Node(n) => builder.node(n),
            Stmt::Collection(c) => builder.collection(c),
        }
        .map_err(render)?;
    }
    // Every statement was checked as it was added, so this only fails on a bug of the parser.
    verify(&builder.graph)
        .map_err(|e| render(at(0, format!("the parsed graph fails verification: {e}"))))?;
    Ok(builder.graph)
}

struct Builder<'s> {
    source: &'s str,
    graph: Graph,
    /// Where each node and variable was defined, for "already defined at" messages.
    nodes: HashMap<String, usize>,
    variables: HashMap<String, usize>,
    collections: HashMap<String, usize>,
}

impl Builder<'_> {
    fn check_name(
        &self,
        name: &str,
        offset: usize,
        seen: &HashMap<String, usize>,
    ) -> Result<(), At> {
        if !is_valid_name(name) {
            return Err(at(
                offset,
                format!(
                    "`{name}` is not a valid name: use `/`-separated segments of [A-Za-z0-9_.-]"
                ),
            ));
        }
        if let Some(&first) = seen.get(name) {
            return Err(at(
                offset,
                format!(
                    "`{name}` is already defined at {}",
                    line_col(self.source, first)
                ),
            ));
        }
        Ok(())
    }

    fn variable(&mut self, v: VarStmt<'_>) -> Result<(), At> {
        let offset = v.name.span.start;
        self.check_name(v.name.text, offset, &self.variables)?;
        let mut flags = VarFlags::default();
        for f in &v.flags {
            let slot = match f.text {
                "trainable" => &mut flags.trainable,
                "model" => &mut flags.model,
                "local" => &mut flags.local,
                other => {
                    return Err(at(
                        f.span.start,
                        format!("unknown variable flag `{other}` (trainable, model or local)"),
                    ));
                }
            };
            if std::mem::replace(slot, true) {
                return Err(at(
                    f.span.start,
                    format!("flag `{}` is given twice", f.text),
                ));
            }
        }
        let mut args = AttrMap::new(v.init.text, v.init.span.start, v.args)?;
        let init = build_initializer(v.init.text, v.init.span.start, &mut args)?;
        args.finish()?;
        let def = VariableDef {
            name: v.name.text.to_string(),
            ty: v.ty.ty,
            init,
            flags,
        };
        self.graph.declare_variable(def).map_err(|e| match e {
            IrError::SymbolicVariable { .. } => at(v.ty.span.start, e.to_string()),
            IrError::InitializerMismatch { .. } => at(v.init.span.start, e.to_string()),
            _ => at(offset, e.to_string()),
        })?;
        self.variables.insert(v.name.text.to_string(), offset);
        Ok(())
    }

    /// The value `r` names: an existing node, and a port it has.
    fn value(&self, r: &ValueRef<'_>, allow_no_output: bool) -> Result<Value, At> {
        let Some(id) = self.graph.find(r.name) else {
            return Err(at(
                r.span.start,
                format!(
                    "unknown value `%{}` (a value must be defined above its first use)",
                    r.name
                ),
            ));
        };
        let port = match r.port {
            None => 0,
            Some(p) => p.parse::<u16>().map_err(|_| {
                at(
                    r.span.start,
                    format!("port `{p}` of `%{}` is out of range", r.name),
                )
            })?,
        };
        let node = self.graph.node(id);
        let outputs = node.outputs.len();
        let exists = usize::from(port) < outputs || (port == 0 && allow_no_output);
        if !exists {
            let message = match outputs {
                0 => format!(
                    "`%{}` ({}) has no outputs to use",
                    r.name,
                    node.op.kind_name()
                ),
                n => format!(
                    "`%{}` ({}) has no port {port}: it has {n} output(s)",
                    r.name,
                    node.op.kind_name()
                ),
            };
            return Err(at(r.span.start, message));
        }
        Ok(Value::new(id, port))
    }

    fn node(&mut self, n: NodeStmt<'_>) -> Result<(), At> {
        let offset = n.name.span.start;
        if n.name.port.is_some() {
            return Err(at(
                offset,
                "a node definition names a node, not a port `:k`",
            ));
        }
        self.check_name(n.name.name, offset, &self.nodes)?;
        let kind = n.kind.text;
        let kind_at = n.kind.span.start;
        let mut inputs = Vec::new();
        let mut var: Option<(VarId, usize)> = None;
        let mut controls = Vec::new();
        for operand in &n.operands {
            match operand {
                Operand::Value(r) => inputs.push((self.value(r, false)?, r.span.start)),
                Operand::Var(w) => {
                    let id = self.graph.find_variable(w.text).ok_or_else(|| {
                        at(w.span.start, format!("unknown variable `@{}`", w.text))
                    })?;
                    if !matches!(kind, "variable" | "assign") {
                        return Err(at(
                            w.span.start,
                            format!("`{kind}` takes no variable operand"),
                        ));
                    }
                    if var.replace((id, w.span.start)).is_some() {
                        return Err(at(
                            w.span.start,
                            format!("`{kind}` takes one variable operand"),
                        ));
                    }
                }
                Operand::Control { caret, node } => {
                    if kind != "group" {
                        return Err(at(
                            *caret,
                            format!(
                                "only `group` takes control inputs `^%node` (`{kind}` does not)"
                            ),
                        ));
                    }
                    if node.port.is_some() {
                        return Err(at(
                            node.span.start,
                            "a control input names a node, not a port",
                        ));
                    }
                    controls.push(self.value(node, true)?.node);
                }
            }
        }
        if inputs.len() > usize::from(u16::MAX) {
            return Err(at(kind_at, "a node takes at most 65535 inputs"));
        }
        let mut attrs = AttrMap::new(kind, kind_at, n.attrs)?;
        let op = match kind {
            "input" => {
                let name = as_string(attrs.get("name")?)?;
                let ty = match &n.types {
                    Some((_, types)) if types.len() == 1 => types[0].ty.clone(),
                    _ => {
                        return Err(at(
                            kind_at,
                            "`input` needs exactly one output type, e.g. `: f32[N,28,28,1]`",
                        ));
                    }
                };
                Op::Input { name, ty }
            }
            "variable" | "assign" => {
                let Some((var, _)) = var else {
                    return Err(at(
                        kind_at,
                        format!("`{kind}` needs a variable operand `@name`"),
                    ));
                };
                if kind == "variable" {
                    Op::Variable { var }
                } else {
                    Op::Assign { var }
                }
            }
            _ => build_op(kind, &mut attrs)?
                .ok_or_else(|| at(kind_at, format!("unknown op `{kind}`")))?,
        };
        attrs.finish()?;
        let device = match &n.device {
            None => None,
            Some(d) => Some(
                d.text
                    .strip_prefix("dev")
                    .filter(|k| k.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|k| k.parse::<u16>().ok())
                    .ok_or_else(|| {
                        at(
                            d.span.start,
                            format!("expected a device `dev0` to `dev65535`, found `{}`", d.text),
                        )
                    })?,
            ),
        };
        let values: Vec<Value> = inputs.iter().map(|(v, _)| *v).collect();
        let id = self
            .graph
            .add_node_on(n.name.name, op, &values, device)
            .map_err(|e| match e {
                IrError::UnknownValue { slot, .. } => {
                    at(inputs.get(slot).map_or(kind_at, |i| i.1), e.to_string())
                }
                IrError::DuplicateNode { .. } | IrError::InvalidName { .. } => {
                    at(offset, e.to_string())
                }
                _ => at(kind_at, e.to_string()),
            })?;
        self.nodes.insert(n.name.name.to_string(), offset);
        for c in controls {
            self.graph
                .add_control_edge(c, id)
                .map_err(|e| at(kind_at, e.to_string()))?;
        }
        let outputs = self.graph.node(id).outputs.clone();
        for t in &outputs {
            if let Some(message) = shape_too_large(&t.shape) {
                return Err(at(kind_at, format!("output type {t}: {message}")));
            }
        }
        if let Some((span, declared)) = &n.types {
            if declared.len() != outputs.len() {
                return Err(at(
                    span.start,
                    format!(
                        "{} output type(s) declared, but `{kind}` has {} output(s): inferred ({})",
                        declared.len(),
                        outputs.len(),
                        outputs
                            .iter()
                            .map(|t| t.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
            for (d, t) in declared.iter().zip(&outputs) {
                if d.ty != *t {
                    return Err(at(
                        d.span.start,
                        format!("declared type {} differs from the inferred type {t}", d.ty),
                    ));
                }
            }
        }
        Ok(())
    }

    fn collection(&mut self, c: CollectionStmt<'_>) -> Result<(), At> {
        let offset = c.name.span.start;
        let name = unescape(c.name.text).map_err(|(off, m)| at(offset + off, m))?;
        if let Some(&first) = self.collections.get(&name) {
            return Err(at(
                offset,
                format!(
                    "collection {:?} is already declared at {}",
                    name,
                    line_col(self.source, first)
                ),
            ));
        }
        let members = c
            .members
            .iter()
            .map(|m| self.value(m, true))
            .collect::<Result<Vec<_>, At>>()?;
        for m in members {
            self.graph.add_to_collection(&name, m);
        }
        self.collections.insert(name, offset);
        Ok(())
    }
}
