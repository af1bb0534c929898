//! What the trainer's trait objects share: `Any` access (to get a concrete callback or monitor
//! back from a training report) and their short type names (`ModelSaver` for
//! `towerpack::train::callbacks::ModelSaver`), the default names of callbacks and monitors.

use std::any::Any;

/// `Any` access for trait objects, implemented for every `'static` type: lets a caller get a
/// concrete callback or monitor back from the training report.
pub trait AsAny: Any {
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<T: Any> AsAny for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// The last path segment of a type name, generics dropped: `ModelSaver` for
/// `towerpack::train::callbacks::ModelSaver`.
pub fn short_type_name(full: &str) -> String {
    let head = full.split('<').next().unwrap_or(full);
    head.rsplit("::").next().unwrap_or(head).to_string()
}
