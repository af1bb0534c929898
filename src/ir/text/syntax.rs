//! The recursive-descent parser of the textual IR's syntax: tokens in, one statement at a time
//! out (`var`, node definition, `collection`), with every name and value still as written and
//! spanned. Meaning (names, types, ops) is given by `build`.

use super::attrs::{Attr, AttrValue, Spanned, as_shape};
use super::error::{At, at};
use super::lexer::{Tok, Token};
use crate::ir::TensorType;
use crate::tensor::DType;
use std::ops::Range;

/// How deeply attribute lists may nest (the deepest real one, explicit padding, needs 2).
const MAX_NESTING: usize = 8;

/// A token's text with its span.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Word<'a> {
    pub text: &'a str,
    pub span: Range<usize>,
}

/// `%name` or `%name:port`, split.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ValueRef<'a> {
    pub name: &'a str,
    pub port: Option<&'a str>,
    pub span: Range<usize>,
}

/// A tensor type as written, already read.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TypeLit {
    pub ty: TensorType,
    pub span: Range<usize>,
}

/// One operand of a node: a data input, a variable, or a control input `^%name`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Operand<'a> {
    Value(ValueRef<'a>),
    Var(Word<'a>),
    Control { caret: usize, node: ValueRef<'a> },
}

/// `var @name : type flags = initializer`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct VarStmt<'a> {
    pub name: Word<'a>,
    pub ty: TypeLit,
    pub flags: Vec<Word<'a>>,
    pub init: Word<'a>,
    pub args: Vec<Attr<'a>>,
}

/// `%name = kind(operands) {attrs} on devK : types`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct NodeStmt<'a> {
    pub name: ValueRef<'a>,
    pub kind: Word<'a>,
    pub operands: Vec<Operand<'a>>,
    pub attrs: Vec<Attr<'a>>,
    pub device: Option<Word<'a>>,
    /// The declared output types and the span of the whole annotation.
    pub types: Option<(Range<usize>, Vec<TypeLit>)>,
}

/// `collection "name" = [members]`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CollectionStmt<'a> {
    /// The string token, quotes included.
    pub name: Word<'a>,
    pub members: Vec<ValueRef<'a>>,
}

/// One statement.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Stmt<'a> {
    Var(VarStmt<'a>),
    Node(NodeStmt<'a>),
    Collection(CollectionStmt<'a>),
}

/// A cursor over the tokens of one source.
pub(crate) struct Parser<'a> {
    src: &'a str,
    toks: Vec<Tok>,
    pos: usize,
}

impl<'a> Parser<'a> {
    pub fn new(src: &'a str, toks: Vec<Tok>) -> Parser<'a> {
        Parser { src, toks, pos: 0 }
    }

    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    fn peek_is(&self, kind: Token) -> bool {
        self.peek().is_some_and(|t| t.kind == kind)
    }

    fn peek_word(&self, word: &str) -> bool {
        self.peek()
            .is_some_and(|t| t.kind == Token::Ident && &self.src[t.span.clone()] == word)
    }

    fn word(&self, t: &Tok) -> Word<'a> {
        Word {
            text: &self.src[t.span.clone()],
            span: t.span.clone(),
        }
    }

    /// An error at the current token ("expected X, found Y"), or after the last one at the end.
    fn unexpected(&self, what: &str) -> At {
        match self.peek() {
            Some(t) => {
                let text = &self.src[t.span.clone()];
                let shown: String = text.chars().take(40).collect();
                let more = if shown.len() < text.len() { "..." } else { "" };
                at(
                    t.span.start,
                    format!("expected {what}, found `{shown}{more}`"),
                )
            }
            None => {
                let end = self.toks.last().map_or(0, |t| t.span.end);
                at(end, format!("expected {what}, found the end of the input"))
            }
        }
    }

    fn expect(&mut self, kind: Token) -> Result<Word<'a>, At> {
        match self.peek() {
            Some(t) if t.kind == kind => {
                let w = self.word(t);
                self.pos += 1;
                Ok(w)
            }
            _ => Err(self.unexpected(kind.describe())),
        }
    }

    fn eat(&mut self, kind: Token) -> bool {
        let hit = self.peek_is(kind);
        if hit {
            self.pos += 1;
        }
        hit
    }

    fn value_ref(&mut self) -> Result<ValueRef<'a>, At> {
        let w = self.expect(Token::ValueRef)?;
        let body = &w.text[1..];
        let (name, port) = match body.split_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (body, None),
        };
        Ok(ValueRef {
            name,
            port,
            span: w.span,
        })
    }

    /// A comma-separated list up to `close`, a trailing comma allowed.
    fn list<T>(
        &mut self,
        close: Token,
        mut item: impl FnMut(&mut Self) -> Result<T, At>,
    ) -> Result<Vec<T>, At> {
        let mut out = Vec::new();
        while !self.eat(close) {
            out.push(item(self)?);
            if !self.eat(Token::Comma) {
                self.expect(close)?;
                break;
            }
        }
        Ok(out)
    }

    /// The next statement, `None` at the end of the input.
    pub fn statement(&mut self) -> Result<Option<Stmt<'a>>, At> {
        if self.peek().is_none() {
            return Ok(None);
        }
        let stmt = if self.peek_word("var") {
            Stmt::Var(self.var_stmt()?)
        } else if self.peek_word("collection") {
            Stmt::Collection(self.collection_stmt()?)
        } else if self.peek_is(Token::ValueRef) {
            Stmt::Node(self.node_stmt()?)
        } else {
            return Err(self.unexpected("a statement (`var @name`, `%name = ...` or `collection`)"));
        };
        Ok(Some(stmt))
    }

    fn var_stmt(&mut self) -> Result<VarStmt<'a>, At> {
        self.pos += 1; // `var`
        let mut name = self.expect(Token::VarRef)?;
        name.text = &name.text[1..];
        self.expect(Token::Colon)?;
        let ty = self.tensor_type()?;
        let mut flags = Vec::new();
        while self.peek_is(Token::Ident) {
            let t = self.toks[self.pos].clone();
            flags.push(self.word(&t));
            self.pos += 1;
        }
        self.expect(Token::Equals)?;
        let init = self.expect(Token::Ident)?;
        let args = if self.eat(Token::LParen) {
            self.list(Token::RParen, Self::attr)?
        } else {
            Vec::new()
        };
        Ok(VarStmt {
            name,
            ty,
            flags,
            init,
            args,
        })
    }

    fn collection_stmt(&mut self) -> Result<CollectionStmt<'a>, At> {
        self.pos += 1; // `collection`
        let name = self.expect(Token::Str)?;
        self.expect(Token::Equals)?;
        self.expect(Token::LBracket)?;
        let members = self.list(Token::RBracket, Self::value_ref)?;
        Ok(CollectionStmt { name, members })
    }

    fn node_stmt(&mut self) -> Result<NodeStmt<'a>, At> {
        let name = self.value_ref()?;
        self.expect(Token::Equals)?;
        let kind = self.expect(Token::Ident)?;
        self.expect(Token::LParen)?;
        let operands = self.list(Token::RParen, Self::operand)?;
        let attrs = if self.eat(Token::LBrace) {
            self.list(Token::RBrace, Self::attr)?
        } else {
            Vec::new()
        };
        let device = if self.peek_word("on") {
            self.pos += 1;
            Some(self.expect(Token::Ident)?)
        } else {
            None
        };
        let types = if self.eat(Token::Colon) {
            let start = self.peek().map_or(self.src.len(), |t| t.span.start);
            let types = if self.eat(Token::LParen) {
                self.list(Token::RParen, Self::tensor_type)?
            } else {
                vec![self.tensor_type()?]
            };
            let end = self.toks[self.pos - 1].span.end;
            Some((start..end, types))
        } else {
            None
        };
        Ok(NodeStmt {
            name,
            kind,
            operands,
            attrs,
            device,
            types,
        })
    }

    fn operand(&mut self) -> Result<Operand<'a>, At> {
        match self.peek().map(|t| t.kind) {
            Some(Token::ValueRef) => Ok(Operand::Value(self.value_ref()?)),
            Some(Token::VarRef) => {
                let mut w = self.expect(Token::VarRef)?;
                w.text = &w.text[1..];
                Ok(Operand::Var(w))
            }
            Some(Token::Caret) => {
                let caret = self.expect(Token::Caret)?.span.start;
                let node = self.value_ref()?;
                Ok(Operand::Control { caret, node })
            }
            _ => Err(self.unexpected("an operand (`%value`, `@variable` or `^%node`)")),
        }
    }

    /// `dtype[dims]`.
    fn tensor_type(&mut self) -> Result<TypeLit, At> {
        let dtype_word = self.expect(Token::Ident)?;
        let dtype = DType::from_name(dtype_word.text).ok_or_else(|| {
            at(
                dtype_word.span.start,
                format!(
                    "unknown dtype `{}` (f32, f64, f16, bf16, i32, i64, u8 or bool)",
                    dtype_word.text
                ),
            )
        })?;
        self.expect(Token::LBracket)?;
        let dims = self.list(Token::RBracket, |p| p.attr_value(0))?;
        let span = dtype_word.span.start..self.toks[self.pos - 1].span.end;
        let shape = as_shape(&dims, &span)?;
        Ok(TypeLit {
            ty: TensorType::new(dtype, shape),
            span,
        })
    }

    fn attr(&mut self) -> Result<Attr<'a>, At> {
        let key = self.expect(Token::Ident)?;
        self.expect(Token::Equals)?;
        let value = self.attr_value(MAX_NESTING)?;
        Ok(Attr {
            key: key.text,
            key_span: key.span,
            value,
        })
    }

    /// An attribute value; `depth` bounds the nesting of lists and tensor literals (0: a plain
    /// number or word only), so no input can exhaust the stack.
    fn attr_value(&mut self, depth: usize) -> Result<Spanned<'a>, At> {
        let Some(t) = self.peek().cloned() else {
            return Err(self.unexpected("a value"));
        };
        let text = &self.src[t.span.clone()];
        let value = match t.kind {
            Token::Int => AttrValue::Int(text),
            Token::Float => AttrValue::Float(text),
            Token::Str => AttrValue::Str(text),
            Token::Ident => {
                self.pos += 1;
                if depth == 0 || !self.peek_is(Token::LBracket) {
                    return Ok(Spanned {
                        value: AttrValue::Word(text),
                        span: t.span,
                    });
                }
                // `dtype[dims] [elements]`: a tensor literal.
                self.pos += 1;
                let dims = self.list(Token::RBracket, |p| p.attr_value(0))?;
                self.expect(Token::LBracket)?;
                let elems = self.list(Token::RBracket, |p| p.attr_value(0))?;
                let end = self.toks[self.pos - 1].span.end;
                return Ok(Spanned {
                    value: AttrValue::Tensor {
                        dtype: text,
                        dims,
                        elems,
                    },
                    span: t.span.start..end,
                });
            }
            Token::LBracket if depth > 0 => {
                self.pos += 1;
                let items = self.list(Token::RBracket, |p| p.attr_value(depth - 1))?;
                let end = self.toks[self.pos - 1].span.end;
                return Ok(Spanned {
                    value: AttrValue::List(items),
                    span: t.span.start..end,
                });
            }
            Token::LBracket => {
                return Err(at(
                    t.span.start,
                    "a list is not allowed here (or nested too deeply)",
                ));
            }
            _ => return Err(self.unexpected("a value")),
        };
        self.pos += 1;
        Ok(Spanned {
            value,
            span: t.span,
        })
    }
}
