//! The `towerpack` command: `check FILE` verifies a textual IR file, `fmt FILE` prints its
//! canonical form, and `lower FILE` compiles a step of it through lowering's passes and prints
//! the program (and, on request, the IR after every pass and the passes' times). Exit codes:
//! 0 success, 1 a bad file (or a step that does not lower), 2 a usage error.

mod lower_cmd;

use std::io::Read as _;
use std::process::ExitCode;

const USAGE: &str = "\
usage: towerpack <command> FILE [options]

Tools for the textual op-graph IR (grammar: grammar/towerpack-ir.ebnf).

commands:
  check FILE   parse, infer types and verify FILE; print one OK line, or the error
  fmt FILE     print FILE in canonical form on stdout
  lower FILE   lower one step of FILE through the passes and print the program on stdout

FILE may be `-` for standard input.

options of `lower`:
  --batch N            the batch size N binds to (default 32)
  --fetch NAME         a value the step returns (repeatable)
  --target NAME        an assign or group node the step runs (repeatable); without --fetch
                       and --target, the step runs every sink of the graph: assign and group
                       sinks as targets, other sinks' first outputs as fetches
  --device cpu|cuda    lower with that backend's options (default cpu)
  --print-after-all    print the IR after every pass (on stdout, before the program)
  --print-after PASS   print the IR after PASS (repeatable)
  --time-passes        print each pass's time and rewrite count
  --verify-each        check the IR after every pass

options:
  -h, --help     print this help
  -V, --version  print the version

exit status: 0 success, 1 FILE is invalid or unreadable (or its step does not lower),
2 usage error";

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
        ["lower", rest @ ..] if rest.contains(&"-h") || rest.contains(&"--help") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        ["lower", path, options @ ..] if !path.starts_with("--") => {
            let options = match lower_cmd::LowerArgs::parse(options) {
                Ok(o) => o,
                Err(e) => return usage_error(&e),
            };
            match load(path) {
                Ok(g) => lower_cmd::run(&g, &options),
                Err(code) => code,
            }
        }
        [cmd @ ("check" | "fmt" | "lower"), ..] if args.len() == 1 => {
            usage_error(&format!("`{cmd}` needs a FILE"))
        }
        ["lower", ..] => usage_error("`lower` needs a FILE before its options"),
        [cmd @ ("check" | "fmt"), _, extra, ..] => {
            usage_error(&format!("`{cmd}` takes one FILE; unexpected `{extra}`"))
        }
        [other, ..] => usage_error(&format!("unknown command `{other}`")),
    }
}
