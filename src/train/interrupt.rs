//! Graceful interruption: while a run trains, SIGINT (Ctrl-C) and SIGTERM only raise a flag;
//! the loop sees it at the next step boundary, saves a checkpoint of the partial epoch, runs
//! every callback's `after_train` and returns
//! [`TrainError::Interrupted`](super::TrainError::Interrupted). A second signal while the run
//! still winds down exits at once (status 128 + the signal number, as a shell reports a death
//! by that signal).
//!
//! The handlers are installed once per process through `signal-hook` (which chains with
//! handlers the application installed before) and stay installed: while no run trains, a
//! signal whose disposition was the default still terminates the process as it would have
//! (`emulate_default_handler`); a signal the process ignored when the first run started (a
//! background job's SIGINT) is left alone. Everything the handler does is async-signal-safe:
//! atomics, `write(2)` and `_exit(2)`.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

/// Runs training now (guards alive).
static ACTIVE: AtomicUsize = AtomicUsize::new(0);
/// The signal that asked the running loops to stop (0: none).
static REQUESTED: AtomicI32 = AtomicI32::new(0);
/// Whether the handlers are installed (once per process).
static INSTALLED: OnceLock<()> = OnceLock::new();

/// The signals a run stops on.
#[cfg(unix)]
const SIGNALS: [i32; 2] = [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM];

/// The name of `signal` (`SIGINT`, `SIGTERM`, ...).
pub fn signal_name(signal: i32) -> String {
    #[cfg(unix)]
    if let Some(name) = signal_hook::low_level::signal_name(signal) {
        return name.to_string();
    }
    format!("signal {signal}")
}

/// Whether `signal`'s disposition is the default one (`Some(false)`: ignored or handled).
#[cfg(unix)]
fn default_disposition(signal: i32) -> Option<bool> {
    // SAFETY: a query only (no new action); `old` is a valid, zeroed `sigaction` to fill.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(signal, std::ptr::null(), &mut old) != 0 {
            return None;
        }
        Some(old.sa_sigaction == libc::SIG_DFL)
    }
}

/// Whether `signal` is ignored by the process (`SIG_IGN`).
#[cfg(unix)]
fn ignored(signal: i32) -> bool {
    // SAFETY: as in `default_disposition`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    }
}

/// Writes `message` to stderr from a signal handler (`write(2)` is async-signal-safe).
#[cfg(unix)]
fn write_stderr(message: &[u8]) {
    // SAFETY: `message` is a valid buffer of its length; a short or failed write loses text only.
    unsafe {
        libc::write(2, message.as_ptr().cast(), message.len());
    }
}

/// The handler of `signal`: a flag while a run trains, the second time an immediate exit;
/// the default action while none trains (if it was the default before).
#[cfg(unix)]
fn on_signal(signal: i32, was_default: bool) {
    if ACTIVE.load(Ordering::SeqCst) == 0 {
        if was_default {
            // Ends the process as the default action would; nothing to do if it fails.
            let _ = signal_hook::low_level::emulate_default_handler(signal);
        }
        return;
    }
    if REQUESTED
        .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        write_stderr(b"\nsecond interrupt: exiting at once\n");
        signal_hook::low_level::exit(128 + signal);
    }
    write_stderr(
        b"\ninterrupt: stopping at the next step boundary and saving a checkpoint \
          (interrupt again to exit at once)\n",
    );
}

/// Installs the handlers (once per process). Errors are logged: training then simply cannot
/// be interrupted gracefully.
fn install() {
    INSTALLED.get_or_init(|| {
        #[cfg(unix)]
        for signal in SIGNALS {
            if ignored(signal) {
                continue;
            }
            let was_default = default_disposition(signal).unwrap_or(true);
            // SAFETY: the action only touches atomics, write(2), _exit(2) and signal-hook's
            // default emulation, all async-signal-safe.
            let registered = unsafe {
                signal_hook::low_level::register(signal, move || on_signal(signal, was_default))
            };
            if let Err(e) = registered {
                log::warn!(
                    target: "towerpack",
                    "cannot handle {}: {e}; an interrupt will end training without a checkpoint",
                    signal_name(signal)
                );
            }
        }
    });
}

/// Marks a training run for its lifetime: while any guard lives, SIGINT/SIGTERM ask the loops
/// to stop instead of ending the process.
pub struct InterruptGuard {
    _private: (),
}

impl InterruptGuard {
    /// Installs the handlers if needed and clears a request left by an earlier run.
    pub fn new() -> InterruptGuard {
        install();
        if ACTIVE.fetch_add(1, Ordering::SeqCst) == 0 {
            REQUESTED.store(0, Ordering::SeqCst);
        }
        InterruptGuard { _private: () }
    }
}

impl Default for InterruptGuard {
    fn default() -> Self {
        InterruptGuard::new()
    }
}

impl Drop for InterruptGuard {
    fn drop(&mut self) {
        ACTIVE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The signal that asked training to stop, if one did since the runs began.
pub fn requested() -> Option<i32> {
    match REQUESTED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Asks the running loops to stop as a signal would (for tests and embedding applications
/// with their own signal handling): the next step boundary saves and ends the run.
pub fn request_stop(signal: i32) {
    let _ = REQUESTED.compare_exchange(0, signal.max(1), Ordering::SeqCst, Ordering::SeqCst);
}
