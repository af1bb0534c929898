//! The logger directory: choosing what happens to an existing one (keep to resume, delete, back
//! up, start a new one, or ask — only on a terminal), and the run's log, which goes to stderr and
//! is appended to `<logdir>/log.log`.
//!
//! Logging goes through the `log` crate facade, so every stage can `log::info!` without knowing
//! about trainers. A training run installs [`TeeLogger`] (stderr) unless the application
//! installed a logger of its own, and appends to `<logdir>/log.log` while it runs when its
//! config names a logdir ([`attach_run_log`]); [`set_logger_dir`] (tensorpack's
//! `logger.set_logger_dir`) points it at a dir for the rest of the process.
//! Timestamps in names (`MMDD-HHMMSS`) and log lines are UTC: local time needs a time-zone
//! database, which std does not read.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

/// The log file inside the logger dir.
pub const LOG_FILE_NAME: &str = "log.log";

/// Errors of logger-dir preparation. Each names the directory at fault.
#[derive(Debug, thiserror::Error)]
pub enum LogDirError {
    #[error(
        "logdir {dir} exists and is not empty, and stdin is not a terminal to ask on; pass an \
         action (Keep to resume, Delete, Backup or New)"
    )]
    NeedsAction { dir: PathBuf },
    #[error("logdir {dir} exists; quitting as asked")]
    Quit { dir: PathBuf },
    #[error("{path} exists and is not a directory")]
    NotADirectory { path: PathBuf },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> LogDirError + '_ {
    move |source| LogDirError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What to do when the logger dir already exists and holds non-hidden entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogDirAction {
    /// Use it as it is (needed to resume: checkpoints, stats.json and log.log continue).
    Keep,
    /// Delete it and start empty.
    Delete,
    /// Rename it to `<dir>.<MMDD-HHMMSS>` and start empty.
    Backup,
    /// Leave it alone and use a new `<dir>.<MMDD-HHMMSS>` instead.
    New,
    /// Ask on the terminal; an error when stdin is not a terminal.
    Ask,
}

/// Civil date and time (UTC) of `t`: (month, day, hour, minute, second).
fn utc_parts(t: SystemTime) -> (u32, u32, u32, u32, u32) {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Howard Hinnant's days-to-civil algorithm, for days since 1970-01-01 (non-negative here).
    let z = days + 719_468;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (
        month as u32,
        day as u32,
        (rem / 3600) as u32,
        (rem % 3600 / 60) as u32,
        (rem % 60) as u32,
    )
}

/// `MMDD-HHMMSS` (UTC) of `t`, the suffix tensorpack uses for backups.
pub fn timestamp_suffix(t: SystemTime) -> String {
    let (mo, d, h, mi, s) = utc_parts(t);
    format!("{mo:02}{d:02}-{h:02}{mi:02}{s:02}")
}

/// `<path>.<MMDD-HHMMSS>`, or `<path>.<MMDD-HHMMSS>-<k>` for the first `k` that does not exist
/// yet (two backups within one second must not overwrite each other).
pub fn timestamped_sibling(path: &Path, t: SystemTime) -> PathBuf {
    let base = format!("{}.{}", path.display(), timestamp_suffix(t));
    let mut candidate = PathBuf::from(&base);
    let mut k = 1u32;
    while candidate.symlink_metadata().is_ok() {
        candidate = PathBuf::from(format!("{base}-{k}"));
        k += 1;
    }
    candidate
}

/// True if `dir` exists and holds an entry whose name does not start with `.`.
fn is_nonempty_dir(dir: &Path) -> Result<bool, LogDirError> {
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_error(dir)(e)),
        Ok(m) if !m.is_dir() => {
            return Err(LogDirError::NotADirectory {
                path: dir.to_path_buf(),
            });
        }
        Ok(_) => {}
    }
    for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
        let entry = entry.map_err(io_error(dir))?;
        if !entry.file_name().to_string_lossy().starts_with('.') {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Chooses an action for an existing logger dir when the caller passed [`LogDirAction::Ask`].
pub trait ActionPrompt {
    /// The action for `dir`; never [`LogDirAction::Ask`].
    fn choose(&mut self, dir: &Path) -> Result<LogDirAction, LogDirError>;
}

/// Asks on a terminal: `k` keep, `d` delete, `b` backup, `n` new, `q` quit. When not
/// `interactive`, it never reads and returns [`LogDirError::NeedsAction`].
pub struct TerminalPrompt<R, W> {
    pub interactive: bool,
    pub input: R,
    pub output: W,
}

impl<R: BufRead, W: Write> ActionPrompt for TerminalPrompt<R, W> {
    fn choose(&mut self, dir: &Path) -> Result<LogDirAction, LogDirError> {
        let needs_action = || LogDirError::NeedsAction {
            dir: dir.to_path_buf(),
        };
        if !self.interactive {
            return Err(needs_action());
        }
        loop {
            // A failed prompt write only loses the prompt text; reading still decides.
            let _ = write!(
                self.output,
                "Log directory {} exists. Select action: k (keep) / d (delete) / b (backup) / \
                 n (new) / q (quit): ",
                dir.display()
            );
            let _ = self.output.flush();
            let mut line = String::new();
            let read = self.input.read_line(&mut line).map_err(io_error(dir))?;
            if read == 0 {
                return Err(needs_action()); // end of input: nobody to answer
            }
            match line.trim().to_lowercase().as_str() {
                "k" => return Ok(LogDirAction::Keep),
                "d" => return Ok(LogDirAction::Delete),
                "b" => return Ok(LogDirAction::Backup),
                "n" => return Ok(LogDirAction::New),
                "q" => {
                    return Err(LogDirError::Quit {
                        dir: dir.to_path_buf(),
                    });
                }
                _ => continue,
            }
        }
    }
}

/// Prepares `dir` for a run and returns the directory to use (a new one for
/// [`LogDirAction::New`]). An absent or empty dir (hidden files aside) is simply created, whatever
/// the action. `Ask` prompts on stdin only when stdin is a terminal.
pub fn prepare_logger_dir(dir: &Path, action: LogDirAction) -> Result<PathBuf, LogDirError> {
    let stdin = std::io::stdin();
    let mut prompt = TerminalPrompt {
        interactive: stdin.is_terminal(),
        input: stdin.lock(),
        output: std::io::stderr(),
    };
    prepare_logger_dir_with(dir, action, &mut prompt)
}

/// [`prepare_logger_dir`] with the prompt used for [`LogDirAction::Ask`] given explicitly.
pub fn prepare_logger_dir_with(
    dir: &Path,
    action: LogDirAction,
    prompt: &mut dyn ActionPrompt,
) -> Result<PathBuf, LogDirError> {
    let mut target = dir.to_path_buf();
    if is_nonempty_dir(dir)? {
        let action = match action {
            LogDirAction::Ask => prompt.choose(dir)?,
            other => other,
        };
        match action {
            LogDirAction::Keep => {}
            // A prompt that cannot decide leaves the caller to pass an action.
            LogDirAction::Ask => {
                return Err(LogDirError::NeedsAction {
                    dir: dir.to_path_buf(),
                });
            }
            LogDirAction::Delete => std::fs::remove_dir_all(dir).map_err(io_error(dir))?,
            LogDirAction::Backup => {
                let backup = timestamped_sibling(dir, SystemTime::now());
                std::fs::rename(dir, &backup).map_err(io_error(dir))?;
            }
            LogDirAction::New => target = timestamped_sibling(dir, SystemTime::now()),
        }
    }
    std::fs::create_dir_all(&target).map_err(io_error(&target))?;
    Ok(target)
}

/// One log line: `[MMDD HH:MM:SS @target] LEVEL message` (level shown for warnings and errors
/// only, like tensorpack's `WRN`/`ERR`).
pub fn format_log_line(t: SystemTime, level: log::Level, target: &str, message: &str) -> String {
    let (mo, d, h, mi, s) = utc_parts(t);
    let tag = match level {
        log::Level::Error => "ERR ",
        log::Level::Warn => "WRN ",
        _ => "",
    };
    format!("[{mo:02}{d:02} {h:02}:{mi:02}:{s:02} @{target}] {tag}{message}")
}

/// The process-wide logger: every record at or above the `log` max level goes to stderr and, once
/// [`set_logger_dir`] ran, is appended to `<logdir>/log.log`.
pub struct TeeLogger {
    state: Mutex<TeeState>,
}

struct TeeState {
    /// The process-wide log file ([`set_logger_dir`]).
    file: Option<File>,
    dir: Option<PathBuf>,
    /// The log files of runs in progress ([`attach_run_log`]), with their ids.
    runs: Vec<(u64, PathBuf, File)>,
    next_run: u64,
}

static LOGGER: TeeLogger = TeeLogger {
    state: Mutex::new(TeeState {
        file: None,
        dir: None,
        runs: Vec::new(),
        next_run: 0,
    }),
};

impl log::Log for TeeLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = format_log_line(
            SystemTime::now(),
            record.level(),
            record.target(),
            &record.args().to_string(),
        );
        eprintln!("{line}");
        // A poisoned lock only means another thread panicked mid-write; the file is still usable.
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let state = &mut *state;
        let files = state
            .file
            .iter_mut()
            .chain(state.runs.iter_mut().map(|r| &mut r.2));
        for file in files {
            // Logging must never fail the caller; a lost line is reported on stderr.
            if let Err(e) = writeln!(file, "{line}") {
                eprintln!("(could not append to {LOG_FILE_NAME}: {e})");
            }
        }
    }

    fn flush(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let state = &mut *state;
        for file in state
            .file
            .iter_mut()
            .chain(state.runs.iter_mut().map(|r| &mut r.2))
        {
            let _ = file.flush();
        }
    }
}

/// Installs [`TeeLogger`] as the `log` logger (max level Info) if no logger is installed yet.
/// Returns false when another logger was installed first: its output then does not reach
/// `log.log`.
pub fn install_logger() -> bool {
    match log::set_logger(&LOGGER) {
        Ok(()) => {
            log::set_max_level(log::LevelFilter::Info);
            true
        }
        // `set_logger` fails when any logger is set; it is ours if we set it before.
        Err(_) => {
            let current = (log::logger() as *const dyn log::Log).cast::<()>();
            std::ptr::eq(current, (&LOGGER as *const TeeLogger).cast::<()>())
        }
    }
}

/// Prepares the logger dir ([`prepare_logger_dir`]), installs the logger, and appends all further
/// log lines to `<dir>/log.log` (a kept dir's log continues). Returns the dir in use.
pub fn set_logger_dir(dir: &Path, action: LogDirAction) -> Result<PathBuf, LogDirError> {
    let target = prepare_logger_dir(dir, action)?;
    attach_log_file(&target)?;
    Ok(target)
}

/// Opens `<dir>/log.log` for appending (creating `dir`).
fn open_log_file(dir: &Path) -> Result<(File, PathBuf), LogDirError> {
    std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    let path = dir.join(LOG_FILE_NAME);
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(io_error(&path))?;
    Ok((file, path))
}

/// Installs the logger and appends further log lines to `<dir>/log.log` (creating `dir`).
pub fn attach_log_file(dir: &Path) -> Result<(), LogDirError> {
    let (file, path) = open_log_file(dir)?;
    let installed = install_logger();
    {
        let mut state = LOGGER.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.file = Some(file);
        state.dir = Some(dir.to_path_buf());
    }
    announce_log_file(installed, &path);
    Ok(())
}

/// Says where the log lines go now: a log line when the logger is ours, else on stderr that
/// the application's own logger keeps them from `path`.
fn announce_log_file(installed: bool, path: &Path) {
    if installed {
        log::info!(target: "towerpack", "Logging to {}", path.display());
    } else {
        eprintln!(
            "another `log` logger is installed; log lines will not reach {}",
            path.display()
        );
    }
}

/// While alive, the log lines of the process are also appended to a run's `log.log`; dropping it
/// (the run ended) closes the file. Returned by [`attach_run_log`].
#[must_use = "the run's log file is closed when the guard is dropped"]
pub struct RunLog {
    /// `None` when the dir is the process-wide logger dir (its file already gets every line).
    id: Option<u64>,
}

impl Drop for RunLog {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            let mut state = LOGGER.state.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(at) = state.runs.iter().position(|r| r.0 == id) {
                let (_, _, mut file) = state.runs.remove(at);
                let _ = file.flush();
            }
        }
    }
}

/// Installs the logger (stderr) if the application installed none, and appends every log line
/// to `<dir>/log.log` until the returned guard is dropped. What a training run does with its
/// config's logdir. A dir already set by [`set_logger_dir`] is not opened twice. The `log`
/// facade is process-wide: runs that overlap in one process (tests) see each other's lines.
pub fn attach_run_log(dir: &Path) -> Result<RunLog, LogDirError> {
    let installed = install_logger();
    let already = LOGGER
        .state
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .dir
        .as_deref()
        == Some(dir);
    if already {
        return Ok(RunLog { id: None });
    }
    let (file, path) = open_log_file(dir)?;
    let id = {
        let mut state = LOGGER.state.lock().unwrap_or_else(PoisonError::into_inner);
        let id = state.next_run;
        state.next_run += 1;
        state.runs.push((id, dir.to_path_buf(), file));
        id
    };
    announce_log_file(installed, &path);
    Ok(RunLog { id: Some(id) })
}

/// The logger dir set by [`set_logger_dir`], if any (AutoResume looks for checkpoints there).
pub fn logger_dir() -> Option<PathBuf> {
    LOGGER
        .state
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .dir
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn utc_timestamps() {
        assert_eq!(timestamp_suffix(UNIX_EPOCH), "0101-000000");
        // 1700000000 is 2023-11-14 22:13:20 UTC; 951782400 is 2000-02-29 00:00:00 (leap day).
        let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(timestamp_suffix(t), "1114-221320");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(timestamp_suffix(leap), "0229-000000");
        assert_eq!(
            format_log_line(t, log::Level::Warn, "x", "hi"),
            "[1114 22:13:20 @x] WRN hi"
        );
    }
}
