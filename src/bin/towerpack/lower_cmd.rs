//! `towerpack lower FILE`: the step to lower (from `--fetch`/`--target`, or the graph's sinks),
//! the backend's lowering options, and the passes' printouts and times.

use std::process::ExitCode;

#[cfg(feature = "cuda")]
use towerpack::backend::cuda::CudaOptions;
use towerpack::ir::{Graph, NodeId, Op, Step, Value};
use towerpack::lower::{Dump, LowerOptions, Pipeline};

/// The options of `lower`.
#[derive(Debug, Default)]
pub struct LowerArgs {
    batch: Option<usize>,
    fetches: Vec<String>,
    targets: Vec<String>,
    cuda: bool,
    dump: Dump,
    time_passes: bool,
    verify_each: bool,
}

impl LowerArgs {
    /// Parses the options after FILE; an error names the option at fault.
    pub fn parse(args: &[&str]) -> Result<LowerArgs, String> {
        let mut out = LowerArgs::default();
        let mut after: Vec<String> = Vec::new();
        let mut it = args.iter();
        while let Some(&arg) = it.next() {
            let mut value = |name: &str| {
                it.next()
                    .map(|v| v.to_string())
                    .ok_or_else(|| format!("`{name}` needs a value"))
            };
            match arg {
                "--batch" => {
                    let v = value(arg)?;
                    out.batch = Some(
                        v.parse()
                            .map_err(|_| format!("`--batch` takes a number, got `{v}`"))?,
                    );
                }
                "--fetch" => out.fetches.push(value(arg)?),
                "--target" => out.targets.push(value(arg)?),
                "--device" => match value(arg)?.as_str() {
                    "cpu" => out.cuda = false,
                    "cuda" => out.cuda = true,
                    other => return Err(format!("`--device` is cpu or cuda, got `{other}`")),
                },
                "--print-after-all" => out.dump = Dump::AfterAll,
                "--print-after" => after.push(value(arg)?),
                "--time-passes" => out.time_passes = true,
                "--verify-each" => out.verify_each = true,
                other => return Err(format!("unknown option `{other}` of `lower`")),
            }
        }
        if !after.is_empty() && out.dump != Dump::AfterAll {
            out.dump = Dump::After(after);
        }
        Ok(out)
    }
}

/// The step of `args`: the named fetches and targets, or every sink of the graph.
fn step_of(g: &Graph, args: &LowerArgs) -> Result<Step, String> {
    if args.fetches.is_empty() && args.targets.is_empty() {
        let mut fetches = Vec::new();
        let mut targets = Vec::new();
        for id in g.node_ids() {
            if !g.successors(id).is_empty() {
                continue;
            }
            match g.node(id).op {
                Op::Assign { .. } | Op::Group => targets.push(id),
                _ if !g.node(id).outputs.is_empty() => fetches.push(Value::first(id)),
                _ => {}
            }
        }
        return Ok(Step::new(fetches, targets));
    }
    let fetches = args
        .fetches
        .iter()
        .map(|n| {
            g.find_value(n)
                .ok_or_else(|| format!("no value named `{n}` to fetch"))
        })
        .collect::<Result<Vec<Value>, String>>()?;
    let targets = args
        .targets
        .iter()
        .map(|n| {
            g.find(n)
                .ok_or_else(|| format!("no node named `{n}` to run as a target"))
        })
        .collect::<Result<Vec<NodeId>, String>>()?;
    Ok(Step::new(fetches, targets))
}

/// Lowers the step of `args` and prints what was asked for.
pub fn run(g: &Graph, args: &LowerArgs) -> ExitCode {
    let step = match step_of(g, args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("towerpack: {e}");
            return ExitCode::from(1);
        }
    };
    let options = if args.cuda {
        #[cfg(feature = "cuda")]
        {
            CudaOptions::default().lower
        }
        #[cfg(not(feature = "cuda"))]
        {
            eprintln!("towerpack: `--device cuda` needs the `cuda` feature (on by default)");
            return ExitCode::from(1);
        }
    } else {
        LowerOptions::default()
    };
    let batch = args.batch.unwrap_or(32);
    let mut pipeline = Pipeline::standard(&options);
    pipeline.dump = args.dump.clone();
    pipeline.verify_each |= args.verify_each;
    match pipeline.run(g, &step, batch, &options) {
        Ok((program, report)) => {
            for p in &report.passes {
                if let Some(dump) = &p.dump {
                    println!("// ----- IR after `{}` -----\n{dump}\n", p.name);
                }
            }
            if args.time_passes {
                eprintln!("{report}");
            }
            println!("{program}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("towerpack: cannot lower the step: {e}");
            ExitCode::from(1)
        }
    }
}
