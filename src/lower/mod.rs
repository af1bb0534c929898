//! Lowering: passes over the op graph and scheduling into a backend-neutral kernel `Program`.
