//! The textual form of the IR: a deterministic printer, a logos lexer and a recursive-descent
//! parser. The grammar is `grammar/towerpack-ir.ebnf`.
