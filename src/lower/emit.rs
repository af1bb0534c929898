//! Scheduling and emission: orders the kernels, decides which assigns write their variable in
//! place, gives every materialised value a buffer, plans the arena and builds the [`Program`].
//! The kernels over contiguous ranges (fused updates, bucket all-reduces) are emitted by
//! [`ranges`].

mod ranges;

use self::ranges::ArenaGroups;
use super::LowerError;
use super::arena::{ArenaKernel, ArenaOperand};
use super::collectives::{CollectiveBucket, CollectivePlan};
use super::kernelize::{Draft, Kernelized, Operand};
use super::layout::StateLayout;
use super::memplan::{self, Interval};
use super::passes::StepGraph;
use super::program::{Buffer, BufferId, Kernel, KernelKind, Program, Region, Storage, View};
use crate::ir::{Op, Value, VarId};
use crate::tensor::DType;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};

/// The variable a value reads, if it is a `Variable` node's output.
fn read_of(sg: &StepGraph, v: Value) -> Option<VarId> {
    match sg.graph.node(v.node).op {
        Op::Variable { var } => Some(var),
        _ => None,
    }
}

/// A kernel to schedule: an ordinary draft, a fused arena update or a bucket all-reduce.
enum Item<'a> {
    Draft(&'a Draft),
    Arena(&'a ArenaKernel),
    Collective(&'a CollectiveBucket),
}

impl Item<'_> {
    fn anchor(&self) -> usize {
        match self {
            Item::Draft(d) => d.anchor,
            Item::Arena(a) => a.anchor,
            Item::Collective(c) => c.anchor,
        }
    }

    fn name(&self) -> &str {
        match self {
            Item::Draft(d) => &d.name,
            Item::Arena(a) => &a.name,
            Item::Collective(c) => &c.name,
        }
    }

    /// The materialised values it reads.
    fn bases(&self) -> Vec<Value> {
        match self {
            Item::Draft(d) => d.inputs.iter().map(|o| o.base).collect(),
            Item::Arena(a) => a
                .operands
                .iter()
                .flat_map(|o| match o {
                    ArenaOperand::Arena { values } => values.clone(),
                    ArenaOperand::Shared(op) => vec![op.base],
                    ArenaOperand::State { .. } => Vec::new(),
                })
                .collect(),
            Item::Collective(c) => c.inputs.clone(),
        }
    }

    /// The variables it reads through their state.
    fn state_reads(&self, sg: &StepGraph) -> Vec<VarId> {
        match self {
            Item::Draft(d) => d
                .inputs
                .iter()
                .filter_map(|o| read_of(sg, o.base))
                .collect(),
            Item::Arena(a) => a
                .operands
                .iter()
                .flat_map(|o| match o {
                    ArenaOperand::State { vars } => vars.clone(),
                    _ => Vec::new(),
                })
                .collect(),
            Item::Collective(_) => Vec::new(),
        }
    }
}

struct Deps {
    succ: Vec<Vec<usize>>,
    indeg: Vec<usize>,
}

impl Deps {
    fn add(&mut self, a: usize, b: usize) {
        if a != b && !self.succ[a].contains(&b) {
            self.succ[a].push(b);
            self.indeg[b] += 1;
        }
    }

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

/// Buffers of the program under construction, with the scratch liveness the planner needs.
struct Buffers<'a> {
    sg: &'a StepGraph,
    batch: usize,
    prog: Program,
    of_value: HashMap<Value, BufferId>,
    of_var: HashMap<VarId, BufferId>,
    scratch: Vec<(BufferId, Interval)>,
    scratch_index: HashMap<BufferId, usize>,
    in_place: HashMap<Value, VarId>,
    /// Values stored in bf16 ([`super::half_storage`]).
    half_stored: HashSet<Value>,
}

impl Buffers<'_> {
    fn push(&mut self, b: Buffer) -> BufferId {
        self.prog.buffers.push(b);
        BufferId((self.prog.buffers.len() - 1) as u32)
    }

    fn var(&mut self, var: VarId) -> BufferId {
        if let Some(&b) = self.of_var.get(&var) {
            return b;
        }
        let def = self.sg.graph.variable(var);
        let slot = self.prog.state.slot(var);
        let b = self.push(Buffer {
            name: def.name.clone(),
            dtype: def.ty.dtype,
            shape: def.ty.shape.resolve(self.batch),
            storage: Storage::State {
                device: slot.device,
                offset: slot.offset,
            },
            members: Vec::new(),
        });
        self.of_var.insert(var, b);
        b
    }

    fn value(&mut self, v: Value, def: Option<usize>) -> BufferId {
        if let Some(&b) = self.of_value.get(&v) {
            return b;
        }
        let b = if let Some(var) = read_of(self.sg, v) {
            self.var(var)
        } else if let Some(&var) = self.in_place.get(&v) {
            // The new value, written over the variable's own bytes: a buffer of its own, so
            // the program says which reads see the start value and which the new one.
            let slot = self.prog.state.slot(var);
            let def = self.sg.graph.variable(var);
            self.push(Buffer {
                name: self.sg.graph.value_name(v),
                dtype: def.ty.dtype,
                shape: def.ty.shape.resolve(self.batch),
                storage: Storage::State {
                    device: slot.device,
                    offset: slot.offset,
                },
                members: Vec::new(),
            })
        } else {
            let mut ty = self.sg.graph.value_type(v).clone();
            if self.half_stored.contains(&v) {
                ty.dtype = DType::BF16;
            }
            let shape = ty.shape.resolve(self.batch);
            let node = self.sg.graph.node(v.node);
            let storage = match &node.op {
                Op::Constant { value } => {
                    self.prog.constants.push(value.clone());
                    Storage::Constant((self.prog.constants.len() - 1) as u32)
                }
                _ => Storage::Scratch {
                    device: node.device.unwrap_or(0),
                    offset: 0,
                },
            };
            let b = self.push(Buffer {
                name: self.sg.graph.value_name(v),
                dtype: ty.dtype,
                shape: shape.clone(),
                storage,
                members: Vec::new(),
            });
            if let Storage::Scratch { device, .. } = storage {
                self.scratch_index.insert(b, self.scratch.len());
                self.scratch.push((
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
                self.prog.feeds.push((v.node, b));
            }
            b
        };
        self.of_value.insert(v, b);
        b
    }

    fn read(&mut self, b: BufferId, t: usize) {
        if let Some(&s) = self.scratch_index.get(&b) {
            self.scratch[s].1.last_use = self.scratch[s].1.last_use.max(t);
        }
    }

    fn region(&mut self, o: &Operand) -> Region {
        let b = self.value(o.base, None);
        self.read(b, usize::MAX);
        Region {
            buffer: b,
            offset: o.view.offset,
            shape: o.view.shape.clone(),
        }
    }

    /// A buffer spanning a contiguous family of variables.
    fn state_range(&mut self, vars: &[VarId]) -> BufferId {
        let first = vars[0];
        let def = self.sg.graph.variable(first);
        let slot = self.prog.state.slot(first);
        let n: usize = vars
            .iter()
            .map(|v| {
                self.sg
                    .graph
                    .variable(*v)
                    .ty
                    .shape
                    .num_elements()
                    .unwrap_or(0)
            })
            .sum();
        let last = &self.sg.graph.variable(vars[vars.len() - 1]).name;
        self.push(Buffer {
            name: format!("state[{}..{}]", def.name, last),
            dtype: def.ty.dtype,
            shape: vec![n],
            storage: Storage::State {
                device: slot.device,
                offset: slot.offset,
            },
            members: Vec::new(),
        })
    }
}

/// Builds the program of a kernelized step with its arena kernels and bucket all-reduces
/// (`ranges`); with `in_place_assigns`, assigns are done in place where it is safe.
pub fn emit(
    sg: &StepGraph,
    k: Kernelized,
    batch: usize,
    state: StateLayout,
    ranges: (Vec<ArenaKernel>, Vec<CollectiveBucket>),
    collective_plan: &CollectivePlan,
    in_place_assigns: bool,
) -> Result<Program, LowerError> {
    let (arenas, collectives) = ranges;
    let Kernelized {
        drafts,
        producer,
        fetches,
        assigns,
        half_stored,
    } = k;
    // Values placed in a range (a member of a gradient arena or of a bucket all-reduce's
    // range): they stay in scratch, back to back with the other members.
    let in_ranges: HashSet<Value> = arenas
        .iter()
        .flat_map(|a| &a.operands)
        .filter_map(|o| match o {
            ArenaOperand::Arena { values } => Some(values),
            _ => None,
        })
        .chain(collectives.iter().map(|c| &c.inputs))
        .flatten()
        .copied()
        .collect();
    let alive: Vec<usize> = (0..drafts.len()).filter(|&i| drafts[i].alive).collect();
    let index: HashMap<usize, usize> = alive.iter().enumerate().map(|(a, &d)| (d, a)).collect();
    let mut items: Vec<Item> = alive.iter().map(|&i| Item::Draft(&drafts[i])).collect();
    items.extend(arenas.iter().map(Item::Arena));
    items.extend(collectives.iter().map(Item::Collective));
    let n = items.len();
    let computed_by: HashMap<Value, usize> = producer
        .iter()
        .filter_map(|(v, d)| index.get(d).map(|&a| (*v, a)))
        .collect();
    // A bucket all-reduce produces its members' results (their range's bytes, reduced); it
    // reads what the kernels computed (a member's input, or its copy into the range).
    let mut prod = computed_by.clone();
    for (i, item) in items.iter().enumerate() {
        if let Item::Collective(c) = item {
            prod.extend(c.outputs.iter().map(|&v| (v, i)));
        }
    }
    let mut deps = Deps {
        succ: vec![Vec::new(); n],
        indeg: vec![0; n],
    };
    for (i, item) in items.iter().enumerate() {
        let producers = match item {
            Item::Collective(_) => &computed_by,
            _ => &prod,
        };
        for b in item.bases() {
            if let Some(&j) = producers.get(&b) {
                deps.add(j, i);
            }
        }
    }
    // Collectives run in one order on every participant of a distributed job (a mismatch
    // would pair different buffers across processes): each all-reduce waits for the previous
    // one in the plan's order, which is the whole graph's (not the step's) and topological.
    let collective_order = |item: &Item| match item {
        Item::Draft(d) if matches!(d.kind, KernelKind::AllReduce { .. }) => {
            let order = collective_plan
                .slot(&d.name)
                .map_or(usize::MAX, |s| s.order);
            Some((order, d.anchor))
        }
        Item::Collective(c) => Some((c.order, c.anchor)),
        _ => None,
    };
    let mut collectives: Vec<usize> = (0..n)
        .filter(|&i| collective_order(&items[i]).is_some())
        .collect();
    collectives.sort_by_key(|&i| collective_order(&items[i]));
    for pair in collectives.windows(2) {
        deps.add(pair[0], pair[1]);
    }
    let mut readers: HashMap<VarId, Vec<usize>> = HashMap::new();
    for (i, item) in items.iter().enumerate() {
        for var in item.state_reads(sg) {
            readers.entry(var).or_default().push(i);
        }
    }
    // Arena kernels overwrite their variables: every other reader of them runs first.
    for (i, item) in items.iter().enumerate() {
        let Item::Arena(a) = item else { continue };
        let desc = deps.descendants(i);
        for var in a.outputs.iter().flatten() {
            for &r in readers.get(var).map_or(&[][..], |r| r.as_slice()) {
                if desc.contains(&r) {
                    return Err(LowerError::Unsupported {
                        node: a.name.clone(),
                        op: "arena update".into(),
                        reason: format!(
                            "`{}` is read after its fused update",
                            sg.graph.variable(*var).name
                        ),
                    });
                }
                deps.add(r, i);
            }
        }
    }

    // In-place assigns: the kernel producing the value writes the variable's storage directly,
    // unless the value is in a range: the kernel over the range reads it there, so its assign
    // is a writeback instead.
    let fetched_vars: HashSet<VarId> = fetches.iter().filter_map(|o| read_of(sg, o.base)).collect();
    let mut in_place: HashMap<Value, VarId> = HashMap::new();
    let mut writebacks: Vec<(Operand, VarId)> = Vec::new();
    for (o, var) in assigns {
        let candidate = prod.get(&o.base).and_then(|&kidx| match items[kidx] {
            Item::Draft(d) => Some((kidx, d)),
            Item::Arena(_) | Item::Collective(_) => None,
        });
        let Some((kidx, kd)) = candidate else {
            writebacks.push((o, var));
            continue;
        };
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
        let ok = in_place_assigns
            && whole
            && own_reads_ok
            && !in_ranges.contains(&o.base)
            && !fetched_vars.contains(&var)
            && !in_place.contains_key(&o.base)
            && rs.iter().all(|r| !desc.contains(r));
        if ok {
            for r in rs {
                deps.add(r, kidx);
            }
            in_place.insert(o.base, var);
        } else {
            writebacks.push((o, var));
        }
    }

    // Topological order, ties broken by the graph position of what each kernel computes.
    let mut indeg = deps.indeg.clone();
    let mut heap: BinaryHeap<std::cmp::Reverse<(usize, usize)>> = BinaryHeap::new();
    for (i, item) in items.iter().enumerate() {
        if indeg[i] == 0 {
            heap.push(std::cmp::Reverse((item.anchor(), i)));
        }
    }
    let mut schedule = Vec::with_capacity(n);
    while let Some(std::cmp::Reverse((_, i))) = heap.pop() {
        schedule.push(i);
        for &j in &deps.succ[i] {
            indeg[j] -= 1;
            if indeg[j] == 0 {
                heap.push(std::cmp::Reverse((items[j].anchor(), j)));
            }
        }
    }
    if schedule.len() != n {
        let stuck: Vec<String> = (0..n)
            .filter(|&i| indeg[i] > 0)
            .take(6)
            .map(|i| format!("`{}`", items[i].name()))
            .collect();
        return Err(LowerError::Unsupported {
            node: String::new(),
            op: "schedule".into(),
            reason: format!(
                "kernel dependencies form a cycle (a fusion bug) through {}",
                stuck.join(", ")
            ),
        });
    }

    let mut bufs = Buffers {
        sg,
        batch,
        prog: Program {
            batch,
            state,
            ..Program::default()
        },
        of_value: HashMap::new(),
        of_var: HashMap::new(),
        scratch: Vec::new(),
        scratch_index: HashMap::new(),
        in_place,
        half_stored,
    };
    let mut arenas_planned = ArenaGroups::default();
    let mut kernels = Vec::with_capacity(n);
    for (t, &i) in schedule.iter().enumerate() {
        kernels.push(match items[i] {
            Item::Draft(d) => emit_draft(&mut bufs, d, t),
            Item::Arena(a) => {
                let (kernel, bucket) = arenas_planned.emit_arena(&mut bufs, a, t)?;
                bufs.prog.buckets.push(bucket);
                kernel
            }
            Item::Collective(c) => arenas_planned.emit_collective(&mut bufs, c, t)?,
        });
    }
    arenas_planned.link_buckets(&mut bufs.prog.buckets);
    bufs.prog.fetches = fetches.iter().map(|o| bufs.region(o)).collect();
    bufs.prog.writebacks = writebacks
        .iter()
        .map(|(o, var)| (bufs.region(o), *var))
        .collect();

    // A buffer written but never read (a dead output) dies right away.
    for (_, iv) in &mut bufs.scratch {
        if let Some(def) = iv.def
            && iv.last_use < def
        {
            iv.last_use = def;
        }
    }
    let intervals: Vec<Interval> = bufs.scratch.iter().map(|(_, iv)| iv.clone()).collect();
    let group_members: Vec<Vec<usize>> = arenas_planned
        .groups
        .iter()
        .map(|(m, _)| m.clone())
        .collect();
    let plan = memplan::plan_grouped(&intervals, &group_members, n);
    for ((b, _), off) in bufs.scratch.iter().zip(&plan.offsets) {
        if let Storage::Scratch { offset, .. } = &mut bufs.prog.buffers[b.0 as usize].storage {
            *offset = *off;
        }
    }
    for (arena, first) in arenas_planned.starts() {
        let first = plan.offsets[first];
        if let Storage::Scratch { offset, .. } = &mut bufs.prog.buffers[arena.0 as usize].storage {
            *offset = first;
        }
    }
    let devices = plan
        .arena_bytes
        .keys()
        .copied()
        .max()
        .map_or(0, |d| usize::from(d) + 1);
    let by_dev: BTreeMap<u16, usize> = plan.arena_bytes;
    bufs.prog.arena_bytes = (0..devices as u16)
        .map(|d| by_dev.get(&d).copied().unwrap_or(0))
        .collect();
    bufs.prog.kernels = kernels;
    bufs.prog.waits = super::waits::cross_device_waits(&bufs.prog);
    Ok(bufs.prog)
}

fn emit_draft(bufs: &mut Buffers<'_>, d: &Draft, t: usize) -> Kernel {
    let mut inputs = Vec::with_capacity(d.inputs.len());
    for o in &d.inputs {
        let b = bufs.value(o.base, None);
        bufs.read(b, t);
        inputs.push(View {
            buffer: b,
            offset: o.view.offset,
            strides: o.view.strides.clone(),
        });
    }
    let mut outputs = Vec::with_capacity(d.outputs.len());
    for &v in &d.outputs {
        let b = bufs.value(v, Some(t));
        if let (Some(&s), KernelKind::Elementwise { shape, .. }) =
            (bufs.scratch_index.get(&b), &d.kind)
        {
            let candidates: Vec<usize> = d
                .inputs
                .iter()
                .zip(&inputs)
                .filter(|(o, _)| o.view.is_identity() && &o.view.shape == shape)
                .filter_map(|(_, view)| bufs.scratch_index.get(&view.buffer).copied())
                .collect();
            bufs.scratch[s].1.reuse_candidates = candidates;
        }
        outputs.push(b);
    }
    Kernel {
        name: d.name.clone(),
        device: d.device,
        kind: d.kind.clone(),
        inputs,
        outputs,
    }
}
