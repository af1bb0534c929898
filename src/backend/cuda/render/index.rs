//! Index arithmetic for generated kernels: the element a strided view reads at a point,
//! simplified per view so that common cases cost nothing.
//!
//! A point is a row-major position `var` in an iteration space; along axis `d` its coordinate is
//! `(var / inner_d) % extent_d`. A view reads `Σ coordinate_d · stride_d`. Per view, axes of
//! extent 1 and axes the view does not move along disappear, and neighbouring axes the view
//! traverses as one merge, so a contiguous view reads `var`, a per-channel vector `var % C`, a
//! per-row scalar `var / C`.

/// One axis of an iteration space as a view sees it: `(extent, stride)`.
pub type Axis = (usize, usize);

/// The C expression `Σ ((var / inner_d) % extent_d) · stride_d` over `axes` (row-major), with
/// `var` below the product of the extents.
pub fn linear(var: &str, axes: &[Axis]) -> String {
    // Drop unit axes, then merge neighbours the view walks as one.
    let mut merged: Vec<Axis> = Vec::new();
    for &(n, s) in axes.iter().filter(|(n, _)| *n != 1) {
        match merged.last_mut() {
            Some(last) if last.1 == s * n => *last = (last.0 * n, s),
            _ => merged.push((n, s)),
        }
    }
    let mut terms = Vec::new();
    let mut inner = 1usize;
    for (i, &(n, s)) in merged.iter().enumerate().rev() {
        if s != 0 {
            let mut c = var.to_string();
            if inner != 1 {
                c = format!("{c} / {inner}");
            }
            // The outermost coordinate needs no modulo: `var` is in range.
            if i != 0 {
                c = if inner == 1 {
                    format!("{c} % {n}")
                } else {
                    format!("({c}) % {n}")
                };
            }
            terms.push(match (s, c.contains(' ')) {
                (1, _) => c,
                (_, true) => format!("({c}) * {s}"),
                (_, false) => format!("{c} * {s}"),
            });
        }
        inner *= n;
    }
    if terms.is_empty() {
        return "0".into();
    }
    terms.reverse();
    terms.join(" + ")
}

/// The coordinate along `axis` of a point `var` of `shape` (as an index expression).
pub fn coordinate(var: &str, shape: &[usize], axis: usize) -> String {
    let axes: Vec<Axis> = shape
        .iter()
        .enumerate()
        .map(|(d, &n)| (n, usize::from(d == axis)))
        .collect();
    linear(var, &axes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(var: usize, axes: &[Axis]) -> usize {
        let mut inner = 1;
        let mut sum = 0;
        for &(n, s) in axes.iter().rev() {
            sum += (var / inner) % n * s;
            inner *= n;
        }
        sum
    }

    /// A tiny evaluator of the expressions `linear` produces (integers, + * / %, parentheses).
    fn run(expr: &str, var: usize) -> usize {
        let toks: Vec<String> = expr
            .replace('(', " ( ")
            .replace(')', " ) ")
            .split_whitespace()
            .map(String::from)
            .collect();
        fn sum(t: &[String], i: &mut usize, v: usize) -> usize {
            let mut acc = prod(t, i, v);
            while *i < t.len() && t[*i] == "+" {
                *i += 1;
                acc += prod(t, i, v);
            }
            acc
        }
        fn prod(t: &[String], i: &mut usize, v: usize) -> usize {
            let mut acc = atom(t, i, v);
            while *i < t.len() && ["*", "/", "%"].contains(&t[*i].as_str()) {
                let op = t[*i].clone();
                *i += 1;
                let r = atom(t, i, v);
                acc = match op.as_str() {
                    "*" => acc * r,
                    "/" => acc / r,
                    _ => acc % r,
                };
            }
            acc
        }
        fn atom(t: &[String], i: &mut usize, v: usize) -> usize {
            let tok = t[*i].clone();
            *i += 1;
            if tok == "(" {
                let x = sum(t, i, v);
                *i += 1; // ')'
                x
            } else if tok == "i" {
                v
            } else {
                tok.parse().expect("number")
            }
        }
        let mut i = 0;
        sum(&toks, &mut i, var)
    }

    #[test]
    fn simplified_indices_agree_with_the_definition() {
        let cases: Vec<Vec<Axis>> = vec![
            vec![(2, 48), (4, 12), (3, 4), (4, 1)], // contiguous
            vec![(2, 0), (4, 0), (3, 0), (4, 1)],   // per-channel
            vec![(2, 12), (4, 3), (3, 1), (4, 0)],  // broadcast along the last axis
            vec![(3, 1), (5, 3)],                   // transpose
            vec![(2, 0), (1, 7), (3, 0)],           // scalar
            vec![(2, 16), (3, 4), (2, 1), (5, 0)],  // slice-like strides
            vec![(4, 10), (10, 1)],                 // contiguous with an offset-free slice
        ];
        for axes in cases {
            let e = linear("i", &axes);
            let total: usize = axes.iter().map(|a| a.0).product();
            for v in 0..total {
                assert_eq!(run(&e, v), eval(v, &axes), "{e} at {v} for {axes:?}");
            }
        }
        assert_eq!(linear("i", &[(2, 48), (4, 12), (3, 4), (4, 1)]), "i");
        assert_eq!(linear("i", &[(2, 0), (4, 0), (3, 0), (4, 1)]), "i % 4");
        assert_eq!(linear("i", &[(2, 0), (5, 0)]), "0");
        assert_eq!(coordinate("i", &[4, 10], 1), "i % 10");
        assert_eq!(coordinate("i", &[4, 10], 0), "i / 10");
    }
}
