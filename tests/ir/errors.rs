//! Positioned errors: every lexical, syntactic and semantic error names `file:line:col` of the
//! token at fault and shows the source line with a caret under it.

use towerpack::ir::text::parse;

const X: &str = "%x = input() {name=\"x\"} : f32[N,4]\n";

/// `(source, marker, message part)`: the error must point at the first occurrence of `marker`
/// in the last line of `source` (or at the end, for an empty marker).
const CASES: &[(&str, &str, &str)] = &[
    // lexical
    (
        "%y = input() {name=\"y\"} : f32[N,4] ;",
        ";",
        "unexpected character ';'",
    ),
    ("%y = input() {name=\"y", "\"y", "unterminated string"),
    (
        "%y = input() {name=\"a\\qb\"} : f32[]",
        "\\q",
        "unknown escape",
    ),
    (
        "%y = input() {name=\"\\u{d800}\"} : f32[]",
        "\\u",
        "not a Unicode scalar value",
    ),
    ("% = relu(%x)", "%", "must be followed by a name"),
    // syntax
    ("relu(%x)", "relu", "expected a statement"),
    (
        "%y = relu(%x",
        "",
        "expected `)`, found the end of the input",
    ),
    ("%y = relu(%x) {axis 1}", "1", "expected `=`"),
    ("%y = relu(%x) : f32[N,4", "", "expected `]`"),
    ("%y = relu(,)", ",", "expected an operand"),
    (
        "%y = relu(%x) {a=[[[[[[[[[[1]]]]]]]]]]}",
        "[[1",
        "nested too deeply",
    ),
    // names and references
    ("%y = relu(%z) : f32[N,4]", "%z", "unknown value `%z`"),
    ("%y = relu(%y) : f32[N,4]", "%y)", "unknown value `%y`"),
    (
        "%x = relu(%x) : f32[N,4]",
        "%x =",
        "`x` is already defined at 1:1",
    ),
    ("%a//b = relu(%x)", "%a//b", "not a valid name"),
    ("%y:1 = relu(%x)", "%y:1", "names a node, not a port"),
    ("%y = relu(%x:1)", "%x:1", "has no port 1"),
    ("%y = relu(%x:99999999)", "%x:", "out of range"),
    ("%y = variable(@w) : f32[3]", "@w", "unknown variable `@w`"),
    (
        "var @w : f32[2] = zeros\nvar @w : f32[2] = ones",
        "@w",
        "`w` is already defined at 2:5",
    ),
    (
        "var @w : f32[2] = zeros\n%y = relu(@w)",
        "@w",
        "takes no variable operand",
    ),
    ("%y = relu(^%x)", "^", "only `group` takes control inputs"),
    (
        "%y = variable() : f32[3]",
        "variable",
        "needs a variable operand",
    ),
    (
        "collection \"a\" = [%x]\ncollection \"a\" = [%x]",
        "\"a\"",
        "already declared at 2:1",
    ),
    // ops and attributes
    ("%y = relux(%x)", "relux", "unknown op `relux`"),
    ("%y = relu(%x) {foo=1}", "foo", "unknown attribute `foo`"),
    (
        "%y = reduce_sum(%x) {axes=[1]}",
        "reduce_sum",
        "needs attribute `keep_dims`",
    ),
    (
        "%y = reduce_sum(%x) {axes=[1], keep_dims=maybe}",
        "maybe",
        "expected `true` or `false`",
    ),
    (
        "%y = reduce_sum(%x) {axes=[1], axes=[1], keep_dims=true}",
        "axes=[1], k",
        "given twice",
    ),
    ("%y = cast(%x) {to=f31}", "f31", "unknown dtype `f31`"),
    ("%y = concat(%x) {axis=-1}", "-1", "out of range"),
    (
        "%y = conv2d(%x, %x) {strides=[1,1], padding=sideways, dilations=[1,1], groups=1}",
        "sideways",
        "`same`, `valid`",
    ),
    (
        "%y = conv2d(%x, %x) {strides=[1], padding=same, dilations=[1,1], groups=1}",
        "[1]",
        "a list of 2 items",
    ),
    (
        "%y = conv2d(%x, %x) {strides=[1,1], padding=same, dilations=[1,1], groups=1}",
        "conv2d",
        "input must be NHWC",
    ),
    (
        "%y = slice(%x) {axis=1, start=3, end=9}",
        "slice",
        "out of range for size 4",
    ),
    ("%y = relu(%x) on gpu1", "gpu1", "expected a device"),
    (
        "%y = random_uniform(%x, %x) {seed=18446744073709551616}",
        "1844",
        "out of range",
    ),
    ("%y = input() : f32[N]", "input", "needs attribute `name`"),
    (
        "%y = input() {name=\"y\"}",
        "input",
        "exactly one output type",
    ),
    (
        "%y = input() {name=\"y\"} : f32[2,N]",
        "input",
        "N may only lead",
    ),
    // types and literals
    (
        "%y = relu(%x) : f32[N,5]",
        "f32[N,5]",
        "differs from the inferred type f32[N,4]",
    ),
    (
        "%y = relu(%x) : (f32[N,4], f32[N,4])",
        "(f32",
        "2 output type(s) declared",
    ),
    (
        "%y = moments(%x) {axes=[0], keep_dims=false} : (f32[4], f64[4])",
        "f64",
        "declared type f64[4]",
    ),
    ("%y = relu(%x) : f33[N,4]", "f33", "unknown dtype `f33`"),
    ("%y = relu(%x) : f32[N,M]", "M", "expected a dimension"),
    (
        "%c = constant() {value=f32[2] [1.0]}",
        "f32[2] [",
        "needs 2 elements, found 1",
    ),
    (
        "%c = constant() {value=i32[1] [1.5]}",
        "1.5",
        "not a i32 element",
    ),
    (
        "%c = constant() {value=u8[1] [256]}",
        "256",
        "out of range for u8",
    ),
    (
        "%c = constant() {value=bool[1] [1]}",
        "1]}",
        "not a bool element",
    ),
    (
        "%c = constant() {value=f32[1] [nan(0x3f800000)]}",
        "nan(",
        "not the bit pattern of an f32 NaN",
    ),
    (
        "%c = constant() {value=f32[N] [1.0]}",
        "f32[N]",
        "static shape",
    ),
    (
        "%y = reshape(%x) {shape=[N,1099511627777]}",
        "1099",
        "out of range (0 to 1099511627776)",
    ),
    (
        "%y = reshape(%x) {shape=[N,1048576,1048576,1048576,1048576]}",
        "[N,",
        "more than 2^62 elements",
    ),
    // variables
    (
        "var @w : f32[N] = zeros",
        "f32[N]",
        "must have a static shape",
    ),
    (
        "var @w : f32[2] trainable trainable = zeros",
        "trainable =",
        "given twice",
    ),
    (
        "var @w : f32[2] frozen = zeros",
        "frozen",
        "unknown variable flag",
    ),
    (
        "var @w : f32[2] = he_normal",
        "he_normal",
        "unknown initializer",
    ),
    (
        "var @w : f32[2] = normal(mean=0.0)",
        "normal",
        "needs attribute `stddev`",
    ),
    (
        "var @w : f32[2] = value(tensor=f32[3] [1.0, 2.0, 3.0])",
        "value",
        "initial value of variable `w`",
    ),
    (
        "var @w : f32[2] = zeros\n%a = assign(@w, %x)",
        "assign",
        "cannot be assigned to variable w",
    ),
];

#[test]
fn errors_point_at_the_token_at_fault() {
    let failures: Vec<String> = CASES
        .iter()
        .filter_map(|c| {
            std::panic::catch_unwind(|| check(*c))
                .err()
                .map(|_| c.0.to_string())
        })
        .collect();
    assert!(
        failures.is_empty(),
        "failed cases:\n{}",
        failures.join("\n")
    );
}

fn check((case, marker, message): (&str, &str, &str)) {
    {
        let source = format!("{X}{case}");
        let err = match parse(&source, "case.tp") {
            Ok(_) => panic!("parsed without error:\n{source}"),
            Err(e) => e,
        };
        let last = source.lines().count();
        let last_line = source.lines().last().unwrap_or("");
        let col = if marker.is_empty() {
            last_line.chars().count() + 1
        } else {
            let byte = last_line
                .find(marker)
                .unwrap_or_else(|| panic!("marker {marker:?} not in {last_line:?}"));
            last_line[..byte].chars().count() + 1
        };
        assert!(
            err.message.contains(message),
            "{case}\nwanted {message:?}, got:\n{err}"
        );
        assert_eq!((err.line, err.col), (last, col), "{case}\n{err}");
        let shown = err.to_string();
        let expected_head = format!("case.tp:{last}:{col}: ");
        assert!(shown.starts_with(&expected_head), "{shown}");
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(lines.len(), 3, "{shown}");
        assert_eq!(lines[1], last_line);
        assert_eq!(lines[2], format!("{}^", " ".repeat(col - 1)));
    }
}

#[test]
fn the_display_form_matches_the_documented_layout() {
    let err = parse(
        "%a = input() {name=\"a\"} : f32[2]\n%b = exp(%a) : f64[2]\n",
        "model.tp",
    )
    .expect_err("type mismatch");
    assert_eq!(
        err.to_string(),
        "model.tp:2:16: declared type f64[2] differs from the inferred type f32[2]\n\
         %b = exp(%a) : f64[2]\n               ^"
    );
}
