//! The reference executor: runs any verified graph op by op on the CPU. It is the oracle.
