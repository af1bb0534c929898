//! The state layout: where every variable lives in its device's persistent state arena.
//!
//! It is a pure function of the graph, so every program compiled for a session addresses the
//! same bytes. The order makes optimizer updates fusable across variables: trainable variables
//! first (declaration order), then, for each slot kind (`W/Momentum`, `W/Adam`, ...), the slots
//! in the same order as their variables, then everything else. A variable lives where it is
//! updated: on the one logical device whose `Assign`s write it (a replica of replicated
//! training, or the parameter-server device of shared variables). One never assigned lives on
//! the one device that reads it; one assigned or read on several devices, or on none, on
//! device 0.

use crate::ir::{Graph, Op, VarId};
use std::collections::{BTreeMap, HashMap, HashSet};

/// The arena alignment of every variable (bytes).
pub const STATE_ALIGN: usize = 64;

/// Where one variable lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StateSlot {
    pub device: u16,
    /// Byte offset in the device's state arena.
    pub offset: usize,
    pub bytes: usize,
}

/// The placement of every variable of a graph.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StateLayout {
    /// Indexed by `VarId`.
    pub slots: Vec<StateSlot>,
    /// Bytes of state arena per device.
    pub arena_bytes: Vec<usize>,
}

impl StateLayout {
    /// Computes the layout of `graph`'s variables.
    pub fn new(graph: &Graph) -> StateLayout {
        let vars = graph.variables();
        let mut readers: HashMap<VarId, HashSet<u16>> = HashMap::new();
        let mut writers: HashMap<VarId, HashSet<u16>> = HashMap::new();
        for id in graph.node_ids() {
            let n = graph.node(id);
            let devices = match n.op {
                Op::Variable { var } => readers.entry(var).or_default(),
                Op::Assign { var } => writers.entry(var).or_default(),
                _ => continue,
            };
            devices.insert(n.device.unwrap_or(0));
        }
        let only = |d: &HashSet<u16>| match d.len() {
            1 => d.iter().copied().next().unwrap_or(0),
            _ => 0,
        };
        let device_of =
            |v: VarId| -> u16 { writers.get(&v).or_else(|| readers.get(&v)).map_or(0, only) };
        // Order: trainables, then slot families in trainable order, then the rest.
        let by_name: HashMap<&str, VarId> = graph
            .variable_ids()
            .map(|(id, d)| (d.name.as_str(), id))
            .collect();
        let trainables: Vec<VarId> = graph
            .variable_ids()
            .filter(|(_, d)| d.flags.trainable)
            .map(|(id, _)| id)
            .collect();
        // Slot kinds (`Momentum`, `Adam`, ...) in the order they first appear.
        let mut suffixes: Vec<&str> = Vec::new();
        for (_, d) in graph.variable_ids() {
            if d.flags.trainable {
                continue;
            }
            if let Some((parent, suffix)) = d.name.rsplit_once('/')
                && by_name
                    .get(parent)
                    .is_some_and(|p| graph.variable(*p).flags.trainable)
                && !suffixes.contains(&suffix)
            {
                suffixes.push(suffix);
            }
        }
        let mut order: Vec<VarId> = trainables.clone();
        let mut placed: HashSet<VarId> = order.iter().copied().collect();
        for suffix in &suffixes {
            for &t in &trainables {
                let name = format!("{}/{suffix}", graph.variable(t).name);
                if let Some(&s) = by_name.get(name.as_str())
                    && placed.insert(s)
                {
                    order.push(s);
                }
            }
        }
        for (id, _) in graph.variable_ids() {
            if placed.insert(id) {
                order.push(id);
            }
        }
        let mut slots = vec![
            StateSlot {
                device: 0,
                offset: 0,
                bytes: 0
            };
            vars.len()
        ];
        let mut ends: BTreeMap<u16, usize> = BTreeMap::new();
        for v in order {
            let d = &vars[v.0 as usize];
            let bytes = d.ty.shape.num_elements().unwrap_or(0) * d.ty.dtype.size_bytes();
            let device = device_of(v);
            let end = ends.entry(device).or_default();
            // Tight packing (aligned to the element size only) keeps a family of same-dtype
            // variables one contiguous range, which fused updates rely on.
            let align = d.ty.dtype.size_bytes();
            let offset = end.div_ceil(align) * align;
            *end = offset + bytes;
            slots[v.0 as usize] = StateSlot {
                device,
                offset,
                bytes,
            };
        }
        let devices = ends.keys().copied().max().map_or(0, |d| usize::from(d) + 1);
        let arena_bytes = (0..devices as u16)
            .map(|d| {
                ends.get(&d)
                    .map_or(0, |e| e.div_ceil(STATE_ALIGN) * STATE_ALIGN)
            })
            .collect();
        StateLayout { slots, arena_bytes }
    }

    /// The slot of `var`.
    pub fn slot(&self, var: VarId) -> StateSlot {
        self.slots[var.0 as usize]
    }
}
