//! The `towerpack` command: `check FILE` verifies a textual IR file and `fmt FILE` prints its
//! canonical form. Exit codes: 0 success, 1 a bad file, 2 a usage error.

use std::io::Read as _;
use std::process::ExitCode;

const USAGE: &str = "\
usage: towerpack <command> FILE

Tools for the textual op-graph IR (grammar: grammar/towerpack-ir.ebnf).

commands:
  check FILE   parse, infer types and verify FILE; print one OK line, or the error
  fmt FILE     print FILE in canonical form on stdout

FILE may be `-` for standard input.

options:
  -h, --help     print this help
  -V, --version  print the version

exit status: 0 success, 1 FILE is invalid or unreadable, 2 usage error";

fn usage_error(message: &str) -> ExitCode {
    eprintln!("towerpack: {message}\nusage: towerpack check|fmt FILE (see `towerpack --help`)");
    ExitCode::from(2)
}

/// Reads FILE (or stdin for `-`) and parses it; on failure prints the error and gives exit 1.
fn load(path: &str) -> Result<towerpack::ir::Graph, ExitCode> {
    let (source, name) = if path == "-" {
        let mut s = String::new();
        match std::io::stdin().read_to_string(&mut s) {
            Ok(_) => (s, "<stdin>"),
            Err(e) => {
                eprintln!("towerpack: cannot read standard input: {e}");
                return Err(ExitCode::from(1));
            }
        }
    } else {
        match std::fs::read_to_string(path) {
            Ok(s) => (s, path),
            Err(e) => {
                eprintln!("towerpack: cannot read {path}: {e}");
                return Err(ExitCode::from(1));
            }
        }
    };
    towerpack::ir::text::parse(&source, name).map_err(|e| {
        eprintln!("{e}");
        ExitCode::from(1)
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        [] => usage_error("missing command"),
        ["-h" | "--help" | "help", ..] => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        ["-V" | "--version"] => {
            println!("towerpack {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        ["check" | "fmt", rest @ ..] if rest.contains(&"-h") || rest.contains(&"--help") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        ["check", path] => match load(path) {
            Ok(g) => {
                println!(
                    "{path}: OK ({} nodes, {} variables)",
                    g.node_count(),
                    g.variables().len()
                );
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
        ["fmt", path] => match load(path) {
            Ok(g) => {
                print!("{}", towerpack::ir::text::print(&g));
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
        [cmd @ ("check" | "fmt")] => usage_error(&format!("`{cmd}` needs a FILE")),
        [cmd @ ("check" | "fmt"), _, extra, ..] => {
            usage_error(&format!("`{cmd}` takes one FILE; unexpected `{extra}`"))
        }
        [other, ..] => usage_error(&format!("unknown command `{other}`")),
    }
}
