//! Running the `lanekeeper` binary as a user would: from the repository's
//! root, with the arguments as given. One place for what the command-line
//! tests share: the run, and the stdout of a run that must succeed (its
//! stderr in the failure message).

use std::ffi::OsStr;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// The repository's root (where the examples are).
pub(crate) fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `lanekeeper ARGS` from the repository's root, whatever it exits with.
pub(crate) fn lanekeeper<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Command::new(env!("CARGO_BIN_EXE_lanekeeper"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("runs lanekeeper")
}

/// `lanekeeper ARGS` with `stdin` written to its standard input.
pub(crate) fn lanekeeper_with_stdin(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lanekeeper"))
        .args(args)
        .current_dir(root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs lanekeeper");
    {
        let mut input = child.stdin.take().expect("a piped stdin");
        input.write_all(stdin.as_bytes()).expect("stdin written");
    }
    child.wait_with_output().expect("lanekeeper ends")
}

/// The stdout of a run that must have succeeded.
pub(crate) fn stdout_of(out: &Output) -> String {
    assert!(
        out.status.success(),
        "lanekeeper exited with {}; stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("stdout is UTF-8")
}

/// `lanekeeper ARGS`, which must succeed: its stdout.
pub(crate) fn lanekeeper_ok<I, S>(args: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    stdout_of(&lanekeeper(args))
}
