//! What the binary writes where. Every command that prints exits quietly
//! when whoever reads its stdout has gone (`lanekeeper crdgen | head -1`):
//! exit 0, no panic, nothing on stderr about the pipe. Logs carry no colour
//! codes when stderr is not a terminal, and `--log-format json` (or
//! `LANEKEEPER_LOG_FORMAT=json`) makes every log line a JSON object.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

use crate::cli::root;

/// Runs lanekeeper with a stdout whose read end is closed before it starts,
/// so its first write fails with EPIPE whatever the output's size.
fn with_closed_stdout(args: &[&str]) -> (std::process::ExitStatus, String) {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_lanekeeper"))
        .args(args)
        .current_dir(root())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("runs lanekeeper");
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_quiet(args: &[&str]) {
    let (status, stderr) = with_closed_stdout(args);
    assert!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
        "{args:?}: {stderr}"
    );
    assert!(!stderr.contains("error:"), "{args:?}: {stderr}");
    assert_eq!(status.code(), Some(0), "{args:?}: {stderr}");
}

#[test]
fn crdgen_into_a_closed_pipe() {
    assert_quiet(&["crdgen"]);
}

#[test]
fn plan_into_a_closed_pipe() {
    assert_quiet(&["plan", "-f", "examples/inc-47/inc-47.yaml"]);
    assert_quiet(&["plan", "-f", "examples/inc-47/inc-47.yaml", "-o", "json"]);
}

#[test]
fn diff_into_a_closed_pipe() {
    assert_quiet(&[
        "diff",
        "--base",
        "examples/inc-47/inc-47.yaml",
        "--head",
        "examples/inc-47/inc-47.yaml",
        "--signals",
        "examples/inc-47/signals.yaml",
    ]);
}

#[test]
fn calibration_hash_into_a_closed_pipe() {
    assert_quiet(&[
        "calibration-hash",
        "-f",
        "examples/calibration/deployment.yaml",
    ]);
}

#[test]
fn help_into_a_closed_pipe() {
    assert_quiet(&["--help"]);
}

/// The check itself sees a failure: a command that fails for another
/// reason still says so with a closed stdout.
#[test]
fn other_errors_are_still_reported() {
    let (status, stderr) = with_closed_stdout(&["plan", "-f", "no/such/file.yaml"]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("error:"), "{stderr}");
}

/// Starts `lanekeeper gateway` on the shipped INC-47 config with stderr
/// piped (not a terminal), waits for its `listening` line on stdout (the
/// `gateway listening` log is written before it), stops it and returns its
/// stderr.
fn gateway_logs(global_args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lanekeeper"));
    cmd.args(global_args)
        .args([
            "gateway",
            "--listen",
            "127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
            "--config",
            "examples/inc-47/lanes-420.json",
        ])
        .env_remove("LANEKEEPER_LOG_FORMAT")
        .env_remove("RUST_LOG")
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for route in ["agent-large", "extract-small", "batch-medium", "eval-large"] {
        cmd.args(["--route", &format!("{route}=http://127.0.0.1:9")]);
    }
    cmd.envs(env.iter().copied());
    let mut child = cmd.spawn().expect("runs lanekeeper gateway");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(
        line.starts_with("listening"),
        "stdout {line:?}, stderr {stderr}"
    );
    assert!(stderr.contains("gateway listening"), "{stderr}");
    stderr
}

#[test]
fn text_logs_into_a_pipe_have_no_colour_codes() {
    let stderr = gateway_logs(&[], &[]);
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
    let stderr = gateway_logs(&["--log-format", "text"], &[]);
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
}

fn assert_json_lines(stderr: &str) {
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
    for line in stderr.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v.get("level").is_some(), "{line}");
    }
}

#[test]
fn log_format_json_is_a_global_flag_and_an_environment_variable() {
    assert_json_lines(&gateway_logs(&["--log-format", "json"], &[]));
    assert_json_lines(&gateway_logs(&[], &[("LANEKEEPER_LOG_FORMAT", "json")]));
}
