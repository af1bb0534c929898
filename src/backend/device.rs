//! Devices: the hardware a logical device of a lowered program runs on.
//!
//! Lowering numbers devices logically (`Node::device`, `Kernel::device`: training tower `i` is
//! logical device `i`); a [`Placement`] maps each logical device to a [`Device`] of the backend
//! that runs the program. Trainers choose the placement; backends check it can be run.

use std::fmt;
use std::str::FromStr;

/// A device a backend runs one logical device of a program on.
///
/// Across processes (MPI ranks), each process has its own devices: a rank's towers are placed
/// on its local devices (`Cuda(local_rank)`, ...) and the ranks meet in a
/// [`Collective`](super::Collective), not here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Device {
    /// Worker `i` of the CPU backend: a thread of its own with an equal share of the cores.
    Cpu(u16),
    /// CUDA device `i` (the CUDA backend).
    Cuda(u16),
    /// Emulated CUDA device `i` (the CUDA backend on a machine without a GPU).
    CudaEmu(u16),
    /// The host's memory and cores as seen from the devices: where a parameter server keeps
    /// its variables when told to (tensorpack's `ps_device='cpu'`). On the CPU backend, a worker
    /// of its own.
    Host,
}

impl Device {
    /// True for devices the CPU backend runs ([`Device::Cpu`] and [`Device::Host`]).
    pub fn is_cpu(self) -> bool {
        matches!(self, Device::Cpu(_) | Device::Host)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu(i) => write!(f, "cpu:{i}"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
            Device::CudaEmu(i) => write!(f, "cuda-emu:{i}"),
            Device::Host => f.write_str("host"),
        }
    }
}

/// A device name that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown device `{0}` (expected cpu:N, cuda:N, cuda-emu:N or host)")]
pub struct ParseDeviceError(pub String);

impl FromStr for Device {
    type Err = ParseDeviceError;

    /// Parses `cpu:0`, `cuda:1`, `cuda-emu:0` or `host` (`cpu`, `cuda` mean index 0).
    fn from_str(s: &str) -> Result<Device, ParseDeviceError> {
        let bad = || ParseDeviceError(s.to_string());
        if s == "host" {
            return Ok(Device::Host);
        }
        let (kind, index) = s.split_once(':').unwrap_or((s, "0"));
        let index: u16 = index.parse().map_err(|_| bad())?;
        match kind {
            "cpu" => Ok(Device::Cpu(index)),
            "cuda" => Ok(Device::Cuda(index)),
            "cuda-emu" => Ok(Device::CudaEmu(index)),
            _ => Err(bad()),
        }
    }
}

/// Where each logical device of a program runs: `devices[i]` runs logical device `i`; a
/// logical device without an entry (or with `None`) runs on the backend's `i`-th device
/// (`Cpu(i)` on the CPU backend). `Placement::default()` places every logical device so.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    pub devices: Vec<Option<Device>>,
}

impl Placement {
    /// Logical device `i` on `devices[i]`.
    pub fn on(devices: &[Device]) -> Placement {
        Placement {
            devices: devices.iter().copied().map(Some).collect(),
        }
    }

    /// The device of logical device `logical`, given the backend's device of an index.
    pub fn device(&self, logical: usize, default: impl Fn(u16) -> Device) -> Device {
        self.devices
            .get(logical)
            .copied()
            .flatten()
            .unwrap_or_else(|| default(u16::try_from(logical).unwrap_or(u16::MAX)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_print_and_parse_back() {
        for d in [
            Device::Cpu(0),
            Device::Cpu(3),
            Device::Cuda(1),
            Device::CudaEmu(0),
            Device::Host,
        ] {
            assert_eq!(d.to_string().parse::<Device>(), Ok(d));
        }
        assert_eq!("cuda".parse::<Device>(), Ok(Device::Cuda(0)));
        let err = "tpu:0".parse::<Device>().unwrap_err();
        assert!(err.to_string().contains("`tpu:0`"), "{err}");
        assert!("cpu:x".parse::<Device>().is_err());
    }

    #[test]
    fn unplaced_logical_devices_take_the_backend_default() {
        let p = Placement {
            devices: vec![Some(Device::Cpu(1)), None, Some(Device::Host)],
        };
        let cpu = |i| Device::Cpu(i);
        assert_eq!(p.device(0, cpu), Device::Cpu(1));
        assert_eq!(p.device(1, cpu), Device::Cpu(1));
        assert_eq!(p.device(2, cpu), Device::Host);
        assert_eq!(p.device(5, cpu), Device::Cpu(5));
    }
}
