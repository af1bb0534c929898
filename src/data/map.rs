//! `MapData` and `MapDataComponent`: apply a function to every datapoint (or one component).
//!
//! The function receives the datapoint's [`DatapointContext`] (pass, index of the input within
//! the pass) so its randomness can be keyed by position. A one-to-one map lets the flow skip
//! without calling the function; a filtering map (which may drop datapoints) must evaluate it.

use super::DataError;
use super::flow::{DataFlow, Datapoint, DatapointContext, FlowState, Skipped, forward_data_flow};
use crate::tensor::HostTensor;
use std::sync::Arc;

const NAME: &str = "MapData";

type OneToOne = dyn Fn(Datapoint, DatapointContext) -> Result<Datapoint, DataError> + Send + Sync;
type Filtering =
    dyn Fn(Datapoint, DatapointContext) -> Result<Option<Datapoint>, DataError> + Send + Sync;

#[derive(Clone)]
enum MapFn {
    OneToOne(Arc<OneToOne>),
    Filtering(Arc<Filtering>),
}

/// Maps every datapoint of its input through a function.
///
/// Built with [`MapData::new`] the function maps one to one (lengths stay exact, skipping is
/// free); with [`MapData::filter_map`] it may return `None` to drop a datapoint, which makes
/// `len()` an upper bound (tensorpack's "may be inaccurate"). Errors of the function are wrapped
/// with the pass and index of the datapoint.
pub struct MapData {
    inner: Box<dyn DataFlow>,
    func: MapFn,
    pass: u64,
    index: u64,
}

impl MapData {
    /// A one-to-one map.
    pub fn new<F>(inner: impl DataFlow + 'static, func: F) -> MapData
    where
        F: Fn(Datapoint, DatapointContext) -> Result<Datapoint, DataError> + Send + Sync + 'static,
    {
        MapData::build(Box::new(inner), MapFn::OneToOne(Arc::new(func)))
    }

    /// A map that may drop datapoints by returning `Ok(None)`.
    pub fn filter_map<F>(inner: impl DataFlow + 'static, func: F) -> MapData
    where
        F: Fn(Datapoint, DatapointContext) -> Result<Option<Datapoint>, DataError>
            + Send
            + Sync
            + 'static,
    {
        MapData::build(Box::new(inner), MapFn::Filtering(Arc::new(func)))
    }

    fn build(inner: Box<dyn DataFlow>, func: MapFn) -> MapData {
        MapData {
            inner,
            func,
            pass: 0,
            index: 0,
        }
    }

    fn finish_pass(&mut self) {
        self.pass += 1;
        self.index = 0;
    }

    fn apply(&self, dp: Datapoint, ctx: DatapointContext) -> Result<Option<Datapoint>, DataError> {
        let out = match &self.func {
            MapFn::OneToOne(f) => f(dp, ctx).map(Some),
            MapFn::Filtering(f) => f(dp, ctx),
        };
        out.map_err(|e| DataError::Datapoint {
            flow: NAME,
            pass: ctx.pass,
            index: ctx.index,
            source: Box::new(e),
        })
    }
}

impl DataFlow for MapData {
    fn name(&self) -> &'static str {
        NAME
    }

    fn reset_state(&mut self) -> Result<(), DataError> {
        self.inner.reset_state()
    }

    fn len(&self) -> Option<usize> {
        self.inner.len()
    }

    fn next_datapoint(&mut self) -> Result<Option<Datapoint>, DataError> {
        loop {
            let Some(dp) = self.inner.next_datapoint()? else {
                self.finish_pass();
                return Ok(None);
            };
            let ctx = DatapointContext {
                pass: self.pass,
                index: self.index,
            };
            self.index += 1;
            if let Some(out) = self.apply(dp, ctx)? {
                return Ok(Some(out));
            }
        }
    }

    fn skip(&mut self, n: usize) -> Result<Skipped, DataError> {
        if matches!(self.func, MapFn::Filtering(_)) {
            // Whether a datapoint survives is only known by evaluating the function.
            let mut count = 0;
            while count < n {
                if self.next_datapoint()?.is_none() {
                    return Ok(Skipped {
                        count,
                        pass_ended: true,
                    });
                }
                count += 1;
            }
            return Ok(Skipped {
                count,
                pass_ended: false,
            });
        }
        let skipped = self.inner.skip(n)?;
        self.index += skipped.count as u64;
        if skipped.pass_ended {
            self.finish_pass();
        }
        Ok(skipped)
    }

    fn end_pass(&mut self) -> Result<(), DataError> {
        self.inner.end_pass()?;
        self.finish_pass();
        Ok(())
    }

    /// Counters: `[pass, index of the next input datapoint]`.
    fn state(&self) -> FlowState {
        FlowState::new(NAME, vec![self.pass, self.index], vec![self.inner.state()])
    }

    fn restore(&mut self, state: &FlowState) -> Result<(), DataError> {
        state.check(NAME, 2, 1)?;
        self.inner.restore(&state.inner[0])?;
        self.pass = state.counters[0];
        self.index = state.counters[1];
        Ok(())
    }

    fn fork(&self) -> Result<Box<dyn DataFlow>, DataError> {
        Ok(Box::new(MapData {
            inner: self.inner.fork()?,
            func: self.func.clone(),
            pass: self.pass,
            index: self.index,
        }))
    }
}

/// Maps one component of every datapoint (tensorpack's `MapDataComponent`): a [`MapData`] whose
/// function replaces component `component` and leaves the others untouched. Its state is that
/// of the `MapData` inside.
pub struct MapDataComponent(MapData);

forward_data_flow!(MapDataComponent);

impl MapDataComponent {
    /// A one-to-one map of component `component`.
    pub fn new<F>(inner: impl DataFlow + 'static, component: usize, func: F) -> MapDataComponent
    where
        F: Fn(HostTensor, DatapointContext) -> Result<HostTensor, DataError>
            + Send
            + Sync
            + 'static,
    {
        MapDataComponent(MapData::new(inner, move |mut dp, ctx| {
            let slot = component_mut(&mut dp, component)?;
            let value = std::mem::replace(slot, HostTensor::scalar_f32(0.0));
            *slot = func(value, ctx)?;
            Ok(dp)
        }))
    }

    /// A map of component `component` that drops the datapoint when `func` returns `Ok(None)`.
    pub fn filter_map<F>(
        inner: impl DataFlow + 'static,
        component: usize,
        func: F,
    ) -> MapDataComponent
    where
        F: Fn(HostTensor, DatapointContext) -> Result<Option<HostTensor>, DataError>
            + Send
            + Sync
            + 'static,
    {
        MapDataComponent(MapData::filter_map(inner, move |mut dp, ctx| {
            let slot = component_mut(&mut dp, component)?;
            let value = std::mem::replace(slot, HostTensor::scalar_f32(0.0));
            Ok(func(value, ctx)?.map(|out| {
                dp[component] = out;
                dp
            }))
        }))
    }
}

fn component_mut(dp: &mut Datapoint, index: usize) -> Result<&mut HostTensor, DataError> {
    let count = dp.len();
    dp.get_mut(index).ok_or(DataError::ComponentIndex {
        flow: "MapDataComponent",
        index,
        count,
    })
}
