//! The example programs embedded in `grammar/towerpack-ir.ebnf`: each parses, is already in
//! canonical form (apart from comments and blank lines), and together they show every op family.

use std::collections::BTreeSet;
use towerpack::ir::text::{parse, print};

const GRAMMAR: &str = include_str!("../../grammar/towerpack-ir.ebnf");
const BEGIN: &str = "/* ==== example: ";
const END: &str = "==== end example ==== */";

/// `(name, program)` of every example block.
pub fn examples() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current: Option<(String, Vec<&str>)> = None;
    for line in GRAMMAR.lines() {
        if let Some(rest) = line.strip_prefix(BEGIN) {
            assert!(current.is_none(), "example inside an example: {line}");
            let name = rest.trim_end_matches(" ====").trim().to_string();
            current = Some((name, Vec::new()));
        } else if line.trim() == END {
            let (name, lines) = current.take().expect("end without a beginning");
            out.push((name, lines.join("\n") + "\n"));
        } else if let Some((_, lines)) = current.as_mut() {
            lines.push(line);
        }
    }
    assert!(current.is_none(), "unterminated example");
    out
}

fn statements(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

#[test]
fn every_grammar_example_parses_and_is_canonical() {
    let examples = examples();
    assert!(examples.len() >= 3, "found {} examples", examples.len());
    let mut kinds = BTreeSet::new();
    for (name, program) in &examples {
        let file = format!("{name}.tp");
        let g = parse(program, &file).unwrap_or_else(|e| panic!("example {name}:\n{e}"));
        let printed = print(&g);
        assert_eq!(
            statements(&printed),
            statements(program),
            "example {name} is not canonical"
        );
        let again = parse(&printed, &file).unwrap_or_else(|e| panic!("reprint of {name}:\n{e}"));
        assert_eq!(print(&again), printed, "example {name}");
        kinds.extend(g.node_ids().map(|id| g.node(id).op.kind_name()));
    }
    for family in [
        "input",
        "constant",
        "variable",
        "assign",
        "group",
        "identity",
        "select",
        "cast",
        "reshape",
        "transpose",
        "broadcast",
        "slice",
        "concat",
        "pad",
        "reduce_mean",
        "argmax",
        "moments",
        "matmul",
        "conv2d",
        "conv2d_backprop_input",
        "conv2d_backprop_filter",
        "max_pool",
        "avg_pool",
        "max_pool_grad",
        "avg_pool_grad",
        "softmax",
        "log_softmax",
        "sparse_softmax_cross_entropy",
        "one_hot",
        "in_top_k",
        "random_uniform",
        "relu",
        "add",
    ] {
        assert!(kinds.contains(family), "no example shows `{family}`");
    }
}
