//! A mutation fuzzer: thousands of damaged programs (byte deletions, insertions, swaps,
//! truncations, duplicated slices, long runs of one token) and random token soup. `parse` must
//! never panic; an error must be well positioned; a program that still parses must round-trip.

use super::grammar::examples;
use super::random_graph::{KINDS, build};
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::panic::{AssertUnwindSafe, catch_unwind};
use towerpack::ir::text::{parse, print};

const VOCABULARY: &[&str] = &[
    "%a",
    "%x:1",
    "%y",
    "%a/b.c-d",
    "@w",
    "@a/b",
    "^",
    "=",
    "(",
    ")",
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "var",
    "collection",
    "on",
    "dev1",
    "dev70000",
    "N",
    "f32",
    "i64",
    "bool",
    "f16",
    "f32[N,4]",
    "i32[]",
    "input",
    "relu",
    "conv2d",
    "moments",
    "group",
    "assign",
    "variable",
    "constant",
    "reshape",
    "pad",
    "value",
    "strides",
    "padding",
    "same",
    "valid",
    "name",
    "axes",
    "keep_dims",
    "true",
    "false",
    "0",
    "1",
    "-1",
    "65536",
    "18446744073709551616",
    "99999999999999999999999",
    "1.5e308",
    "1e999",
    "-0.0",
    "nan",
    "inf",
    "-inf",
    "nan(0xffffffffffffffffff)",
    "nan(0x7fc00001)",
    "\"s\"",
    "\"\\u{110000}\"",
    "\"\\",
    "\"",
    "#",
    "\n",
    " ",
    "é",
    "\u{0}",
    "%",
    "@",
    "1099511627776",
    "trainable",
    "zeros",
];

const MUTANTS: usize = 6_000;
const SOUPS: usize = 1_500;

fn mutate(rng: &mut ChaCha8Rng, seed: &str) -> String {
    let mut b: Vec<u8> = seed.as_bytes().to_vec();
    for _ in 0..rng.random_range(1..=4) {
        let len = b.len();
        let at = rng.random_range(0..=len);
        match rng.random_range(0..8) {
            0 if len > 0 => {
                let n = rng.random_range(1..=8.min(len - at.min(len - 1)));
                let at = at.min(len - 1);
                b.drain(at..(at + n).min(len));
            }
            1 => b.insert(at, rng.random()),
            2 => {
                let tok = VOCABULARY.choose(rng).expect("non-empty");
                b.splice(at..at, tok.bytes());
            }
            3 if len > 1 => {
                let other = rng.random_range(0..len);
                b.swap(at.min(len - 1), other);
            }
            4 => b.truncate(at),
            5 if len > 0 => {
                let start = rng.random_range(0..len);
                let end = rng.random_range(start..=len.min(start + 200));
                let piece = b[start..end].to_vec();
                b.splice(at..at, piece);
            }
            6 => {
                let tok = VOCABULARY.choose(rng).expect("non-empty");
                let run = tok.repeat(rng.random_range(10..3_000));
                b.splice(at..at, run.bytes());
            }
            _ => {
                // Replace a digit run with a huge number.
                if let Some(p) = b.iter().skip(at).position(|c| c.is_ascii_digit()) {
                    let p = at + p;
                    b.splice(p..p, "9999999999999999999".bytes());
                }
            }
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

fn soup(rng: &mut ChaCha8Rng) -> String {
    let n = rng.random_range(1..200);
    (0..n)
        .map(|_| *VOCABULARY.choose(rng).expect("non-empty"))
        .collect::<Vec<_>>()
        .join(if rng.random() { " " } else { "" })
}

/// Parses `input` and checks the outcome; `Err` describes a failure.
fn check(input: &str) -> Result<(), String> {
    let outcome = catch_unwind(AssertUnwindSafe(|| parse(input, "fuzz.tp")));
    match outcome {
        Err(_) => Err("parse panicked".into()),
        Ok(Err(e)) => {
            let lines = input.split('\n').count();
            let shown = e.to_string();
            let head = format!("fuzz.tp:{}:{}: ", e.line, e.col);
            if e.line == 0 || e.col == 0 || e.line > lines || !shown.starts_with(&head) {
                return Err(format!("badly positioned error:\n{shown}"));
            }
            if e.message.is_empty() || shown.lines().count() < 3 {
                return Err(format!("incomplete error:\n{shown}"));
            }
            Ok(())
        }
        Ok(Ok(g)) => {
            let text = print(&g);
            let again = catch_unwind(AssertUnwindSafe(|| parse(&text, "reprint.tp")))
                .map_err(|_| "reparsing the printed form panicked".to_string())?
                .map_err(|e| format!("the printed form does not parse:\n{e}\n{text}"))?;
            if print(&again) == text {
                Ok(())
            } else {
                Err(format!("unstable print:\n{text}"))
            }
        }
    }
}

#[test]
fn thousands_of_damaged_programs_never_panic() {
    let mut seeds: Vec<String> = examples().into_iter().map(|(_, p)| p).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(0xF022);
    for _ in 0..4 {
        let steps: Vec<(u8, u64)> = (0..25)
            .map(|_| (rng.random_range(0..KINDS), rng.random()))
            .collect();
        seeds.push(print(&build(&steps)));
    }
    let (mut parsed, mut failed) = (0, 0);
    for i in 0..MUTANTS + SOUPS {
        let input = if i < MUTANTS {
            mutate(&mut rng, &seeds[i % seeds.len()])
        } else {
            soup(&mut rng)
        };
        if let Err(why) = check(&input) {
            panic!("{why}\n--- input ({} bytes) ---\n{input}", input.len());
        }
        if parse(&input, "fuzz.tp").is_ok() {
            parsed += 1;
        } else {
            failed += 1;
        }
    }
    eprintln!("{parsed} parsed, {failed} failed");
    assert_eq!(parsed + failed, MUTANTS + SOUPS);
    // Both outcomes must be exercised, or the mutations are too weak or too strong.
    assert!(
        parsed > 50 && failed > 3_000,
        "{parsed} parsed, {failed} failed"
    );
}
