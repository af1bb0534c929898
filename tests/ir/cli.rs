//! The `towerpack` binary: `check` and `fmt` on valid and malformed files, usage errors.

use std::path::Path;
use std::process::{Command, Output};
use towerpack::ir::text::{parse, print};

const VALID: &str = "\
# hand-written, not canonical: spacing, a port 0 and a trailing comma
%x = input() {name=\"x\"}:f32[N,3]
%m = moments(%x) {axes=[0], keep_dims=false,} : (f32[3], f32[3])
%y = add(%m:0,   %m:1)
";

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_towerpack"))
        .args(args)
        .output()
        .expect("the towerpack binary runs")
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("temp file");
    path.to_string_lossy().into_owned()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn check_and_fmt_accept_a_valid_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(dir.path(), "ok.tp", VALID);
    let out = run(&["check", &path]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(out.stderr.is_empty());
    assert_eq!(text(&out.stdout).lines().count(), 1);
    assert!(text(&out.stdout).contains("OK"));

    let out = run(&["fmt", &path]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let canonical = print(&parse(VALID, "ok.tp").expect("valid"));
    assert_eq!(text(&out.stdout), canonical);
    assert!(text(&out.stdout).contains("%y = add(%m, %m:1) : f32[3]"));
}

#[test]
fn check_and_fmt_reject_a_malformed_file_with_its_position() {
    let dir = tempfile::tempdir().expect("temp dir");
    let bad = VALID.replace("%m:1)", "%m:2)");
    let path = write(dir.path(), "bad.tp", &bad);
    for cmd in ["check", "fmt"] {
        let out = run(&[cmd, &path]);
        assert_eq!(out.status.code(), Some(1), "{cmd}");
        assert!(out.stdout.is_empty(), "{cmd}: {}", text(&out.stdout));
        let err = text(&out.stderr);
        assert!(err.starts_with(&format!("{path}:4:")), "{cmd}: {err}");
        assert!(err.contains("has no port 2"), "{err}");
        assert!(
            err.lines().nth(1) == Some("%y = add(%m:0,   %m:2)"),
            "{err}"
        );
    }
}

#[test]
fn usage_errors_exit_with_2_and_help_with_0() {
    for args in [
        &[][..],
        &["frobnicate", "x"],
        &["check"],
        &["fmt", "a", "b"],
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(text(&out.stderr).contains("usage: towerpack"), "{args:?}");
    }
    let out = run(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("check FILE"));
    let out = run(&["check", "/nonexistent/model.tp"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("cannot read /nonexistent/model.tp"));
}
