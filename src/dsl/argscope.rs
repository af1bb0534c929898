//! Per-layer default arguments in the spirit of tensorpack's `argscope`: an RAII guard pushes
//! typed defaults for one layer; a layer call fills every argument it was not given from the
//! innermost argscope that sets it. Explicit arguments always win.

use std::any::Any;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::rc::Rc;

/// A layer's argument set that can serve as argscope defaults.
pub trait LayerDefaults: Any + Clone {
    /// Fills every argument not set in `self` from `defaults`.
    fn fill_from(&mut self, defaults: &Self);
}

thread_local! {
    static STACK: RefCell<Vec<Rc<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// Pops the defaults pushed by [`argscope`] when dropped.
#[must_use = "the defaults apply only while this guard lives"]
pub struct ArgScopeGuard {
    depth: usize,
    _not_send: PhantomData<Rc<()>>,
}

impl Drop for ArgScopeGuard {
    fn drop(&mut self) {
        STACK.with(|s| {
            if let Ok(mut stack) = s.try_borrow_mut() {
                stack.truncate(self.depth);
            }
        });
    }
}

/// Makes `defaults` (e.g. `Conv2D::defaults().kernel_size(3).use_bias(false)`) the default
/// arguments of that layer until the guard drops. Guards nest; inner ones win.
pub fn argscope<L: LayerDefaults>(defaults: L) -> ArgScopeGuard {
    let depth = STACK.with(|s| {
        let mut stack = s.borrow_mut();
        stack.push(Rc::new(defaults));
        stack.len() - 1
    });
    ArgScopeGuard {
        depth,
        _not_send: PhantomData,
    }
}

/// Fills the unset arguments of `layer` from the active argscopes, innermost first.
pub(crate) fn apply_argscope<L: LayerDefaults>(layer: &mut L) {
    let entries: Vec<Rc<dyn Any>> = STACK.with(|s| s.borrow().clone());
    for entry in entries.iter().rev() {
        if let Some(defaults) = entry.downcast_ref::<L>() {
            layer.fill_from(defaults);
        }
    }
}
