//! Scheduling and emission: orders the kernel drafts, decides which assigns write their
//! variable in place, gives every materialised value a buffer, plans the arena and builds the
//! [`Program`].

use super::LowerError;
use super::kernelize::{Draft, Kernelized, Operand};
use super::layout::StateLayout;
use super::memplan::{self, Interval};
use super::passes::StepGraph;
use super::program::{Buffer, BufferId, Kernel, KernelKind, Program, Region, Storage, View};
use crate::ir::{Op, Value, VarId};
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};

/// The variable a value reads, if it is a `Variable` node's output.
fn read_of(sg: &StepGraph, v: Value) -> Option<VarId> {
    match sg.graph.node(v.node).op {
        Op::Variable { var } => Some(var),
        _ => None,
    }
}

struct Deps {
    succ: Vec<Vec<usize>>,
}

impl Deps {
    fn descendants(&self, from: usize) -> HashSet<usize> {
        let mut seen = HashSet::new();
        let mut stack = vec![from];
        while let Some(i) = stack.pop() {
            for &j in &self.succ[i] {
                if seen.insert(j) {
                    stack.push(j);
                }
            }
        }
        seen
    }
}

/// Builds the program of a kernelized step.
pub fn emit(
    sg: &StepGraph,
    k: Kernelized,
    batch: usize,
    state: StateLayout,
) -> Result<Program, LowerError> {
    let Kernelized {
        drafts,
        producer,
        fetches,
        assigns,
    } = k;
    let alive: Vec<usize> = (0..drafts.len()).filter(|&i| drafts[i].alive).collect();
    let index: HashMap<usize, usize> = alive.iter().enumerate().map(|(a, &d)| (d, a)).collect();
    let ds: Vec<&Draft> = alive.iter().map(|&i| &drafts[i]).collect();
    let n = ds.len();
    let prod: HashMap<Value, usize> = producer
        .iter()
        .filter_map(|(v, d)| index.get(d).map(|&a| (*v, a)))
        .collect();
    let mut deps = Deps {
        succ: vec![Vec::new(); n],
    };
    let mut indeg = vec![0usize; n];
    let add_edge = |deps: &mut Deps, indeg: &mut Vec<usize>, a: usize, b: usize| {
        if a != b && !deps.succ[a].contains(&b) {
            deps.succ[a].push(b);
            indeg[b] += 1;
        }
    };
    for (i, d) in ds.iter().enumerate() {
        for o in &d.inputs {
            if let Some(&j) = prod.get(&o.base) {
                add_edge(&mut deps, &mut indeg, j, i);
            }
        }
    }

    // In-place assigns: the kernel producing the value writes the variable's storage directly.
    let mut readers: HashMap<VarId, Vec<usize>> = HashMap::new();
    for (i, d) in ds.iter().enumerate() {
        for o in &d.inputs {
            if let Some(var) = read_of(sg, o.base) {
                readers.entry(var).or_default().push(i);
            }
        }
    }
    let fetched_vars: HashSet<VarId> = fetches.iter().filter_map(|o| read_of(sg, o.base)).collect();
    let mut in_place: HashMap<Value, VarId> = HashMap::new();
    let mut writebacks: Vec<(Operand, VarId)> = Vec::new();
    for (o, var) in assigns {
        let Some(&kidx) = prod.get(&o.base) else {
            writebacks.push((o, var));
            continue;
        };
        let kd = ds[kidx];
        let shape = sg.graph.variable(var).ty.shape.resolve(batch);
        let whole = o.view.offset == 0 && o.view.shape == shape && o.view.is_identity();
        let own_reads_ok = kd.inputs.iter().all(|i| {
            read_of(sg, i.base) != Some(var)
                || (matches!(kd.kind, KernelKind::Elementwise { .. })
                    && i.view.is_identity()
                    && i.view.shape == shape)
        });
        let rs: Vec<usize> = readers
            .get(&var)
            .map(|r| r.iter().copied().filter(|&r| r != kidx).collect())
            .unwrap_or_default();
        let desc = deps.descendants(kidx);
        let ok = whole
            && own_reads_ok
            && !fetched_vars.contains(&var)
            && !in_place.contains_key(&o.base)
            && rs.iter().all(|r| !desc.contains(r));
        if ok {
            for r in rs {
                add_edge(&mut deps, &mut indeg, r, kidx);
            }
            in_place.insert(o.base, var);
        } else {
            writebacks.push((o, var));
        }
    }

    // Topological order, ties broken by the graph position of what each kernel computes.
    let mut heap: BinaryHeap<std::cmp::Reverse<(usize, usize)>> = BinaryHeap::new();
    for (i, d) in ds.iter().enumerate() {
        if indeg[i] == 0 {
            heap.push(std::cmp::Reverse((d.anchor, i)));
        }
    }
    let mut schedule = Vec::with_capacity(n);
    while let Some(std::cmp::Reverse((_, i))) = heap.pop() {
        schedule.push(i);
        for &j in &deps.succ[i] {
            indeg[j] -= 1;
            if indeg[j] == 0 {
                heap.push(std::cmp::Reverse((ds[j].anchor, j)));
            }
        }
    }
    if schedule.len() != n {
        return Err(LowerError::Unsupported {
            node: ds.iter().map(|d| d.name.clone()).next().unwrap_or_default(),
            op: "schedule".into(),
            reason: "kernel dependencies form a cycle (a fusion bug)".into(),
        });
    }

    // Buffers.
    let mut prog = Program {
        batch,
        state,
        ..Program::default()
    };
    let mut buf_of: HashMap<Value, BufferId> = HashMap::new();
    let mut var_buf: HashMap<VarId, BufferId> = HashMap::new();
    let mut scratch: Vec<(BufferId, Interval)> = Vec::new();
    let mut scratch_index: HashMap<BufferId, usize> = HashMap::new();
    let name_of = |v: Value| sg.graph.value_name(v);

    let mut buffer_for = |prog: &mut Program,
                          scratch: &mut Vec<(BufferId, Interval)>,
                          scratch_index: &mut HashMap<BufferId, usize>,
                          v: Value,
                          def: Option<usize>|
     -> BufferId {
        if let Some(&b) = buf_of.get(&v) {
            return b;
        }
        let ty = sg.graph.value_type(v);
        let shape = ty.shape.resolve(batch);
        let node = sg.graph.node(v.node);
        let var = read_of(sg, v).or_else(|| in_place.get(&v).copied());
        let b = if let Some(var) = var {
            *var_buf.entry(var).or_insert_with(|| {
                let slot = prog.state.slot(var);
                prog.buffers.push(Buffer {
                    name: sg.graph.variable(var).name.clone(),
                    dtype: ty.dtype,
                    shape: shape.clone(),
                    storage: Storage::State {
                        device: slot.device,
                        offset: slot.offset,
                    },
                });
                BufferId((prog.buffers.len() - 1) as u32)
            })
        } else {
            let storage = match &node.op {
                Op::Constant { value } => {
                    prog.constants.push(value.clone());
                    Storage::Constant((prog.constants.len() - 1) as u32)
                }
                _ => Storage::Scratch {
                    device: node.device.unwrap_or(0),
                    offset: 0,
                },
            };
            prog.buffers.push(Buffer {
                name: name_of(v),
                dtype: ty.dtype,
                shape: shape.clone(),
                storage,
            });
            let b = BufferId((prog.buffers.len() - 1) as u32);
            if let Storage::Scratch { device, .. } = storage {
                scratch_index.insert(b, scratch.len());
                scratch.push((
                    b,
                    Interval {
                        device,
                        bytes: shape.iter().product::<usize>() * ty.dtype.size_bytes(),
                        def,
                        last_use: 0,
                        reuse_candidates: Vec::new(),
                    },
                ));
            }
            if matches!(node.op, Op::Input { .. }) {
                prog.feeds.push((v.node, b));
            }
            b
        };
        buf_of.insert(v, b);
        b
    };

    let mut kernels = Vec::with_capacity(n);
    for (t, &i) in schedule.iter().enumerate() {
        let d = ds[i];
        let mut inputs = Vec::with_capacity(d.inputs.len());
        for o in &d.inputs {
            let b = buffer_for(&mut prog, &mut scratch, &mut scratch_index, o.base, None);
            if let Some(&s) = scratch_index.get(&b) {
                scratch[s].1.last_use = scratch[s].1.last_use.max(t);
            }
            inputs.push(View {
                buffer: b,
                offset: o.view.offset,
                strides: o.view.strides.clone(),
            });
        }
        let mut outputs = Vec::with_capacity(d.outputs.len());
        for &v in &d.outputs {
            let b = buffer_for(&mut prog, &mut scratch, &mut scratch_index, v, Some(t));
            if let (Some(&s), KernelKind::Elementwise { shape, .. }) =
                (scratch_index.get(&b), &d.kind)
            {
                let candidates: Vec<usize> = d
                    .inputs
                    .iter()
                    .zip(&inputs)
                    .filter(|(o, _)| o.view.is_identity() && &o.view.shape == shape)
                    .filter_map(|(_, view)| scratch_index.get(&view.buffer).copied())
                    .collect();
                scratch[s].1.reuse_candidates = candidates;
            }
            outputs.push(b);
        }
        kernels.push(Kernel {
            name: d.name.clone(),
            device: d.device,
            kind: d.kind.clone(),
            inputs,
            outputs,
        });
    }
    let mut region = |prog: &mut Program,
                      scratch: &mut Vec<(BufferId, Interval)>,
                      scratch_index: &mut HashMap<BufferId, usize>,
                      o: &Operand|
     -> Region {
        let b = buffer_for(prog, scratch, scratch_index, o.base, None);
        if let Some(&s) = scratch_index.get(&b) {
            scratch[s].1.last_use = usize::MAX;
        }
        Region {
            buffer: b,
            offset: o.view.offset,
            shape: o.view.shape.clone(),
        }
    };
    prog.fetches = fetches
        .iter()
        .map(|o| region(&mut prog, &mut scratch, &mut scratch_index, o))
        .collect();
    prog.writebacks = writebacks
        .iter()
        .map(|(o, var)| (region(&mut prog, &mut scratch, &mut scratch_index, o), *var))
        .collect();

    // A buffer written by a kernel but never read (a dead output) dies right away.
    for (_, iv) in &mut scratch {
        if let Some(def) = iv.def
            && iv.last_use < def
        {
            iv.last_use = def;
        }
    }
    let intervals: Vec<Interval> = scratch.iter().map(|(_, iv)| iv.clone()).collect();
    let plan = memplan::plan(&intervals, n);
    for ((b, _), off) in scratch.iter().zip(&plan.offsets) {
        if let Storage::Scratch { offset, .. } = &mut prog.buffers[b.0 as usize].storage {
            *offset = *off;
        }
    }
    let devices = plan
        .arena_bytes
        .keys()
        .copied()
        .max()
        .map_or(0, |d| usize::from(d) + 1);
    let by_dev: BTreeMap<u16, usize> = plan.arena_bytes;
    prog.arena_bytes = (0..devices as u16)
        .map(|d| by_dev.get(&d).copied().unwrap_or(0))
        .collect();
    prog.kernels = kernels;
    Ok(prog)
}
