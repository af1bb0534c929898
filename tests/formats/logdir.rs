//! The logger dir: every action on an existing dir, the prompt (only on a terminal; a clear error
//! otherwise, also in a real child process with stdin not a TTY), and `log.log`.

use std::io::Cursor;
use std::path::Path;
use std::process::{Command, Stdio};

use towerpack::train::logdir::{
    LOG_FILE_NAME, LogDirAction, LogDirError, TerminalPrompt, logger_dir, prepare_logger_dir_with,
    set_logger_dir,
};

fn prompt(interactive: bool, answers: &str) -> TerminalPrompt<Cursor<Vec<u8>>, Vec<u8>> {
    TerminalPrompt {
        interactive,
        input: Cursor::new(answers.as_bytes().to_vec()),
        output: Vec::new(),
    }
}

/// A used logdir: one file with known content.
fn used_dir(parent: &Path) -> std::path::PathBuf {
    let dir = parent.join("run");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("stats.json"), "[1]").expect("write");
    dir
}

fn siblings(parent: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(parent)
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn is_timestamped(name: &str) -> bool {
    // run.MMDD-HHMMSS
    name.strip_prefix("run.").is_some_and(|s| {
        s.len() == 11
            && s.as_bytes()[4] == b'-'
            && s.bytes().filter(u8::is_ascii_digit).count() == 10
    })
}

#[test]
fn each_action_on_an_existing_dir() {
    let root = tempfile::tempdir().expect("temp dir");
    let mut never = prompt(false, "");

    let keep = root.path().join("keep");
    let dir = used_dir(&keep);
    assert_eq!(
        prepare_logger_dir_with(&dir, LogDirAction::Keep, &mut never).expect("keep"),
        dir
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("stats.json")).expect("kept"),
        "[1]"
    );

    let del = root.path().join("delete");
    let dir = used_dir(&del);
    assert_eq!(
        prepare_logger_dir_with(&dir, LogDirAction::Delete, &mut never).expect("delete"),
        dir
    );
    assert_eq!(siblings(&dir), Vec::<String>::new());

    let backup = root.path().join("backup");
    let dir = used_dir(&backup);
    assert_eq!(
        prepare_logger_dir_with(&dir, LogDirAction::Backup, &mut never).expect("backup"),
        dir
    );
    assert_eq!(siblings(&dir), Vec::<String>::new());
    let names = siblings(&backup);
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(is_timestamped(&names[1]), "{names:?}");
    assert_eq!(
        std::fs::read_to_string(backup.join(&names[1]).join("stats.json")).expect("moved"),
        "[1]"
    );

    let new = root.path().join("new");
    let dir = used_dir(&new);
    let chosen = prepare_logger_dir_with(&dir, LogDirAction::New, &mut never).expect("new");
    assert_ne!(chosen, dir);
    assert!(chosen.is_dir());
    assert!(is_timestamped(
        &chosen.file_name().expect("name").to_string_lossy()
    ));
    assert_eq!(
        std::fs::read_to_string(dir.join("stats.json")).expect("untouched"),
        "[1]"
    );

    // An absent dir, or one with hidden files only, needs no action: Ask does not ask.
    let fresh = root.path().join("fresh/run");
    assert_eq!(
        prepare_logger_dir_with(&fresh, LogDirAction::Ask, &mut never).expect("fresh"),
        fresh
    );
    std::fs::write(fresh.join(".hidden"), "x").expect("write");
    assert_eq!(
        prepare_logger_dir_with(&fresh, LogDirAction::Ask, &mut never).expect("hidden"),
        fresh
    );

    let file = root.path().join("a_file");
    std::fs::write(&file, "x").expect("write");
    let err = prepare_logger_dir_with(&file, LogDirAction::Keep, &mut never).unwrap_err();
    assert!(matches!(err, LogDirError::NotADirectory { .. }), "{err}");
}

#[test]
fn ask_prompts_only_when_interactive() {
    let root = tempfile::tempdir().expect("temp dir");
    let dir = used_dir(root.path());
    let err =
        prepare_logger_dir_with(&dir, LogDirAction::Ask, &mut prompt(false, "k\n")).unwrap_err();
    assert!(matches!(err, LogDirError::NeedsAction { .. }));
    assert!(err.to_string().contains("pass an action"), "{err}");

    // A bad answer asks again; `b` backs up.
    let mut p = prompt(true, "maybe\nb\n");
    assert_eq!(
        prepare_logger_dir_with(&dir, LogDirAction::Ask, &mut p).expect("backup"),
        dir
    );
    let shown = String::from_utf8(p.output).expect("utf-8");
    assert_eq!(shown.matches("Select action").count(), 2, "{shown}");
    assert_eq!(siblings(root.path()).len(), 2);

    let dir = used_dir(root.path());
    let err =
        prepare_logger_dir_with(&dir, LogDirAction::Ask, &mut prompt(true, "q\n")).unwrap_err();
    assert!(matches!(err, LogDirError::Quit { .. }), "{err}");
    let err = prepare_logger_dir_with(&dir, LogDirAction::Ask, &mut prompt(true, "")).unwrap_err();
    assert!(
        matches!(err, LogDirError::NeedsAction { .. }),
        "end of input: {err}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("stats.json")).expect("untouched"),
        "[1]"
    );
}

const CHILD_ENV: &str = "TOWERPACK_TEST_LOGDIR_CHILD";

/// Not a test of its own: the body of the child process of `ask_without_a_tty_errors_in_a_real_process`.
#[test]
fn child_process_asking_about_a_logdir() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    match set_logger_dir(Path::new(&dir), LogDirAction::Ask) {
        Ok(d) => println!("CHILD-OK {}", d.display()),
        Err(e) => println!("CHILD-ERR {e}"),
    }
}

#[test]
fn ask_without_a_tty_errors_in_a_real_process() {
    let root = tempfile::tempdir().expect("temp dir");
    let dir = used_dir(root.path());
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            &test_name("child_process_asking_about_a_logdir"),
            "--nocapture",
        ])
        .env(CHILD_ENV, &dir)
        .stdin(Stdio::null())
        .output()
        .expect("run child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("CHILD-ERR") && stdout.contains("pass an action"),
        "child output: {stdout}"
    );
    assert_eq!(siblings(root.path()), ["run"], "nothing moved");
}

#[test]
fn log_lines_go_to_log_log_and_a_kept_dir_continues_it() {
    let root = tempfile::tempdir().expect("temp dir");
    let dir = root.path().join("run");
    assert_eq!(set_logger_dir(&dir, LogDirAction::Keep).expect("set"), dir);
    assert_eq!(logger_dir(), Some(dir.clone()));
    log::info!("first run line");
    log::warn!("a warning");
    // The same dir again (a resume): log.log is appended to, not replaced.
    set_logger_dir(&dir, LogDirAction::Keep).expect("set again");
    log::info!("second run line");
    log::logger().flush();
    let text = std::fs::read_to_string(dir.join(LOG_FILE_NAME)).expect("log file");
    let lines: Vec<&str> = text.lines().collect();
    let find = |needle: &str| lines.iter().position(|l| l.ends_with(needle));
    let first = find("] first run line").expect("first line");
    let warn = find("] WRN a warning").expect("warning line");
    let second = find("] second run line").expect("second line");
    assert!(first < warn && warn < second, "{text}");
    assert!(
        lines[first].starts_with('[') && lines[first].contains(" @"),
        "{text}"
    );
}

/// The libtest name of this module's test `name`: in a stage's test binary a test's name is
/// its module path without the crate (`stage::module::test`, listed as `module::test`).
fn test_name(name: &str) -> String {
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    format!("{module}::{name}")
}
