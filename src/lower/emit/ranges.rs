//! Emission of the kernels over contiguous ranges of memory: fused updates (one kernel over a
//! bucket of variables and its gradient arenas, see [`crate::lower::arena`]) and bucket
//! all-reduces (one in-place `AllReduce` over a range of gradients, see
//! [`crate::lower::collectives`]). Both ask the memory planner for a *group*: member buffers
//! placed back to back, spanned by one buffer the kernel reads or writes.

use super::Buffers;
use crate::ir::Value;
use crate::lower::LowerError;
use crate::lower::arena::{ArenaKernel, ArenaOperand};
use crate::lower::collectives::CollectiveBucket;
use crate::lower::program::{Bucket, Buffer, BufferId, Kernel, KernelKind, Storage, View};
use smallvec::smallvec;
use std::collections::HashMap;

/// The ranges planned so far: each a group of scratch buffers placed back to back, and the
/// buffer spanning it. Kernels reading the same values share the range; a bucket all-reduce
/// registers its range under its members' results too, so the fused update reading those
/// results reads the very bytes the all-reduce reduced. A fused update whose arena is a
/// contiguous part of a bucket's range (its members are consecutive members of the bucket)
/// reads a buffer over that part: no group of its own, it starts where its first member lies.
#[derive(Default)]
pub(super) struct ArenaGroups {
    pub(super) groups: Vec<(Vec<usize>, BufferId)>,
    by_values: HashMap<Vec<Value>, BufferId>,
    /// Every bucket all-reduce emitted: the results of its members, in range order.
    reduced: Vec<(Vec<Value>, u32)>,
    /// The all-reduce kernel reducing each range, or the part of one, it spans.
    reduced_by: HashMap<BufferId, u32>,
    /// Buffers over a part of a group, with the scratch index of their first member.
    parts: Vec<(BufferId, usize)>,
}

/// A scratch buffer of `len` elements on `device` spanning `values` (placed back to back, in
/// the buffers `members`), named after the first and last of them; the memory plan sets its
/// offset.
fn span_buffer(
    bufs: &mut Buffers<'_>,
    values: &[Value],
    members: Vec<BufferId>,
    len: usize,
    device: u16,
) -> BufferId {
    let first = bufs.sg.graph.value_name(values[0]);
    let last = bufs.sg.graph.value_name(values[values.len() - 1]);
    let dtype = bufs.sg.graph.value_type(values[0]).dtype;
    bufs.push(Buffer {
        name: format!("arena[{first}..{last}]"),
        dtype,
        shape: vec![len],
        storage: Storage::Scratch { device, offset: 0 },
        members,
    })
}

impl ArenaGroups {
    /// The buffer spanning `values` (scratch buffers placed back to back, `len` elements),
    /// planned on first use. `t` is the schedule position of the kernel reading them.
    fn range(
        &mut self,
        bufs: &mut Buffers<'_>,
        values: &[Value],
        len: usize,
        t: usize,
    ) -> Result<BufferId, LowerError> {
        let mut members = Vec::with_capacity(values.len());
        let mut member_buffers = Vec::with_capacity(values.len());
        let mut device = 0;
        for &v in values {
            let b = bufs.value(v, None);
            bufs.read(b, t);
            // Every member must be a scratch buffer the planner can place in the range: one
            // living elsewhere (a variable's storage) would leave a hole the range's kernel
            // reads unwritten.
            let Some(&s) = bufs.scratch_index.get(&b) else {
                return Err(LowerError::Unsupported {
                    node: bufs.sg.graph.value_name(v),
                    op: "range member".into(),
                    reason: format!(
                        "it is stored in `{}` ({:?}), not in scratch, so it cannot be placed in \
                         the range `{}..{}` (a lowering bug)",
                        bufs.prog.buffers[b.0 as usize].name,
                        bufs.prog.buffers[b.0 as usize].storage,
                        bufs.sg.graph.value_name(values[0]),
                        bufs.sg.graph.value_name(values[values.len() - 1]),
                    ),
                });
            };
            members.push(s);
            member_buffers.push(b);
            device = bufs.scratch[s].1.device;
        }
        if let Some(&b) = self.by_values.get(values) {
            return Ok(b);
        }
        let b = span_buffer(bufs, values, member_buffers, len, device);
        self.groups.push((members, b));
        self.by_values.insert(values.to_vec(), b);
        Ok(b)
    }

    /// Each range or part of one with the scratch index of its first member: the buffer's
    /// offset is that member's.
    pub(super) fn starts(&self) -> impl Iterator<Item = (BufferId, usize)> + '_ {
        self.groups
            .iter()
            .filter_map(|(members, b)| Some((*b, *members.first()?)))
            .chain(self.parts.iter().copied())
    }

    /// The arena of a fused update over `values` (`len` elements) at schedule position `t`:
    /// the range of a bucket all-reduce, or a part of it when `values` are consecutive
    /// members of that bucket's results, else a range of its own.
    fn arena(
        &mut self,
        bufs: &mut Buffers<'_>,
        values: &[Value],
        len: usize,
        t: usize,
    ) -> Result<BufferId, LowerError> {
        if !self.by_values.contains_key(values)
            && let Some(kernel) = self
                .reduced
                .iter()
                .find(|(outputs, _)| outputs.windows(values.len()).any(|w| w == values))
                .map(|&(_, k)| k)
        {
            let first = bufs.value(values[0], None);
            if let Some(&s) = bufs.scratch_index.get(&first) {
                let device = bufs.scratch[s].1.device;
                let members = values.iter().map(|&v| bufs.value(v, None)).collect();
                let b = span_buffer(bufs, values, members, len, device);
                self.parts.push((b, s));
                self.reduced_by.insert(b, kernel);
                self.by_values.insert(values.to_vec(), b);
            }
        }
        self.range(bufs, values, len, t)
    }

    /// The fused update kernel `a` at schedule position `t`, and its bucket.
    pub(super) fn emit_arena(
        &mut self,
        bufs: &mut Buffers<'_>,
        a: &ArenaKernel,
        t: usize,
    ) -> Result<(Kernel, Bucket), LowerError> {
        let n = a.len();
        let mut inputs = Vec::with_capacity(a.operands.len());
        let mut arena_buffers = Vec::new();
        for o in &a.operands {
            inputs.push(match o {
                ArenaOperand::State { vars } => View {
                    buffer: bufs.state_range(vars),
                    offset: 0,
                    strides: smallvec![1],
                },
                ArenaOperand::Arena { values } => {
                    let arena = self.arena(bufs, values, n, t)?;
                    arena_buffers.push(arena);
                    View {
                        buffer: arena,
                        offset: 0,
                        strides: smallvec![1],
                    }
                }
                ArenaOperand::Shared(op) => {
                    let b = bufs.value(op.base, None);
                    bufs.read(b, t);
                    View {
                        buffer: b,
                        offset: op.view.offset,
                        strides: smallvec![0],
                    }
                }
            });
        }
        let outputs = a
            .outputs
            .iter()
            .map(|vars| bufs.state_range(vars))
            .collect();
        let kernel = Kernel {
            name: a.name.clone(),
            device: a.device,
            kind: KernelKind::Elementwise {
                shape: vec![n],
                expr: a.expr.clone(),
            },
            inputs,
            outputs,
        };
        let bucket = Bucket {
            kernel: t as u32,
            arenas: arena_buffers,
            all_reduces: Vec::new(),
            outputs: a.outputs.clone(),
            offsets: offsets(&a.sizes),
            len: n,
        };
        Ok((kernel, bucket))
    }

    /// The bucket all-reduce `c` at schedule position `t`: one `AllReduce` kernel whose input
    /// and output are the range of its members (each member's input, reduced in place, or the
    /// copy its all-reduce became). Each member's result is given its range member's buffer.
    pub(super) fn emit_collective(
        &mut self,
        bufs: &mut Buffers<'_>,
        c: &CollectiveBucket,
        t: usize,
    ) -> Result<Kernel, LowerError> {
        let range = if let [single] = c.inputs[..] {
            let b = bufs.value(single, None);
            bufs.read(b, t);
            b
        } else {
            let b = self.range(bufs, &c.inputs, c.len(), t)?;
            self.by_values.insert(c.outputs.clone(), b);
            b
        };
        for (&input, &output) in c.inputs.iter().zip(&c.outputs) {
            let b = bufs.value(input, None);
            bufs.of_value.insert(output, b);
        }
        self.reduced.push((c.outputs.clone(), t as u32));
        self.reduced_by.insert(range, t as u32);
        Ok(Kernel {
            name: c.name.clone(),
            device: c.device,
            kind: KernelKind::AllReduce {
                op: c.op,
                len: c.len(),
            },
            inputs: vec![View {
                buffer: range,
                offset: 0,
                strides: smallvec![1],
            }],
            outputs: vec![range],
        })
    }

    /// Tells every bucket which all-reduce kernels reduce its arenas (the range each arena is,
    /// or is a part of).
    pub(super) fn link_buckets(&self, buckets: &mut [Bucket]) {
        for b in buckets {
            b.all_reduces = b
                .arenas
                .iter()
                .filter_map(|a| self.reduced_by.get(a).copied())
                .collect();
        }
    }
}

/// Element offset of each member of a range of `sizes`.
fn offsets(sizes: &[usize]) -> Vec<usize> {
    sizes
        .iter()
        .scan(0, |at, &size| {
            let offset = *at;
            *at += size;
            Some(offset)
        })
        .collect()
}
