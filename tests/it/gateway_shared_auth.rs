//! A shared store the gateway cannot log in to is said loudly: a wrong
//! password used to leave every replica on its 1/N share with no log line
//! at all (the connect error was at debug, and a replica that starts on
//! its local share never "fell back"). And a password from the
//! environment loses its trailing line break, as one from a file does.
//! Real `redis-server` with `requirepass`, the real gateway binary.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::fleet_store_redis::{Serve, Server};
use crate::scratch::Scratch;

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The gateway's log after it ran `for_how_long` against the store on
/// `port` with `password` in its environment.
fn gateway_log(scratch: &Scratch, port: u16, password: &str, for_how_long: Duration) -> String {
    let log = scratch.join(format!("gw-{}.log", password.trim()));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lanekeeper"));
    cmd.args([
        "gateway",
        "--listen",
        "127.0.0.1:0",
        "--metrics-addr",
        "127.0.0.1:0",
    ])
    .args(["--config", "examples/inc-47/lanes-420.json"])
    .args(["--shared-state", &format!("redis://127.0.0.1:{port}")])
    .env("LANEKEEPER_GATEWAY_SHARED_STATE_PASSWORD", password)
    .env_remove("RUST_LOG")
    .env("LANEKEEPER_LOG_FORMAT", "text")
    .current_dir(env!("CARGO_MANIFEST_DIR"))
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(&log).unwrap());
    for route in ["agent-large", "extract-small", "batch-medium", "eval-large"] {
        cmd.args(["--route", &format!("{route}=http://127.0.0.1:9")]);
    }
    let gw = Kill(cmd.spawn().expect("runs lanekeeper gateway"));
    std::thread::sleep(for_how_long);
    drop(gw);
    let mut text = String::new();
    std::fs::File::open(&log)
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    text
}

#[test]
fn a_store_that_refuses_the_password_is_logged_and_a_trailing_newline_is_not_the_password() {
    let test =
        "a_store_that_refuses_the_password_is_logged_and_a_trailing_newline_is_not_the_password";
    let how = Serve {
        tls: None,
        password: Some("rightpw".to_owned()),
    };
    let Some(store) = Server::start_with(test, how) else {
        return;
    };
    let scratch = Scratch::new(test);
    let port = store.port();

    let wrong = gateway_log(&scratch, port, "wrongpw", Duration::from_secs(3));
    assert!(
        wrong.contains("shared state: lane budgets are shared through the store")
            && wrong.contains(&format!("127.0.0.1:{port}")),
        "names the store at start: {wrong}"
    );
    let warnings: Vec<&str> = wrong
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("cannot connect to the store"))
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "one warning (a minute apart), not silence: {wrong}"
    );
    assert!(
        !wrong.contains("wrongpw"),
        "the password is never logged: {wrong}"
    );
    assert!(!wrong.contains("the store answers"), "{wrong}");

    let right = gateway_log(&scratch, port, "rightpw\n", Duration::from_secs(3));
    assert!(
        right.contains("the store answers; enforcing the fleet's budgets"),
        "the password without its line break logs in: {right}"
    );
    assert!(!right.contains("cannot connect"), "{right}");
}
