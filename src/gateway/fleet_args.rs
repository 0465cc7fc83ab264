//! The flags of the fleet's shared state (`--shared-state` and its
//! password and deadline): without `--shared-state` every replica enforces
//! its 1/N share alone, as before.

use std::path::PathBuf;
use std::time::Duration;

/// Where the fleet's shared lane budgets are kept, if anywhere.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct FleetArgs {
    /// `redis://HOST:PORT` or `rediss://HOST:PORT` (TLS) of a Valkey or
    /// Redis the gateway replicas share: lane tokens in leases and request
    /// ids for retry counting are fleet-wide; while it is down or slow each
    /// replica falls back to its 1/N share.
    #[arg(long, env = "LANEKEEPER_GATEWAY_SHARED_STATE")]
    pub shared_state: Option<String>,
    /// A file holding the shared store's password (a mounted Secret); read
    /// at start. `LANEKEEPER_GATEWAY_SHARED_STATE_PASSWORD` is the other way
    /// to give it.
    #[arg(
        long,
        env = "LANEKEEPER_GATEWAY_SHARED_STATE_PASSWORD_FILE",
        requires = "shared_state"
    )]
    pub shared_state_password_file: Option<PathBuf>,
    /// A PEM CA bundle the `rediss://` store's certificate must chain to
    /// (only these roots; without it the system's); read at start.
    #[arg(
        long,
        env = "LANEKEEPER_GATEWAY_SHARED_STATE_CA",
        requires = "shared_state"
    )]
    pub shared_state_ca: Option<PathBuf>,
    /// Milliseconds each call to the shared store may take; a call that
    /// takes longer puts the replica on its local share (it probes the store
    /// again once a second).
    #[arg(
        long,
        env = "LANEKEEPER_GATEWAY_SHARED_STATE_TIMEOUT_MILLIS",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..=10_000)
    )]
    pub shared_state_timeout_millis: u64,
}

/// The environment variable of the password (never a flag: it would show in
/// the process list).
pub(super) const PASSWORD_ENV: &str = "LANEKEEPER_GATEWAY_SHARED_STATE_PASSWORD";

impl FleetArgs {
    /// The deadline of each call.
    pub(super) fn deadline(&self) -> Duration {
        Duration::from_millis(self.shared_state_timeout_millis)
    }

    /// The password: the file's first line, else the environment variable,
    /// else none (or the one in the URL).
    pub(super) fn password(&self) -> Result<Option<String>, String> {
        if let Some(path) = &self.shared_state_password_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--shared-state-password-file {}: {e}", path.display()))?;
            let pw = text
                .lines()
                .next()
                .unwrap_or_default()
                .trim_end()
                .to_owned();
            if pw.is_empty() {
                return Err(format!(
                    "--shared-state-password-file {}: empty",
                    path.display()
                ));
            }
            return Ok(Some(pw));
        }
        // As from the file: a Secret made from a file often ends in a line
        // break, which is not part of the password.
        Ok(std::env::var(PASSWORD_ENV)
            .ok()
            .map(|p| p.lines().next().unwrap_or_default().trim_end().to_owned())
            .filter(|p| !p.is_empty()))
    }

    /// The CA bundle's bytes, if one is given (it must hold a certificate).
    pub(super) fn ca(&self) -> Result<Option<Vec<u8>>, String> {
        let Some(path) = &self.shared_state_ca else {
            return Ok(None);
        };
        let pem = std::fs::read(path)
            .map_err(|e| format!("--shared-state-ca {}: {e}", path.display()))?;
        if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
            return Err(format!(
                "--shared-state-ca {}: no PEM certificate",
                path.display()
            ));
        }
        Ok(Some(pem))
    }

    /// The URL, checked: `redis://` or `rediss://` only.
    pub(super) fn url(&self) -> Result<Option<&str>, String> {
        match self.shared_state.as_deref() {
            None => Ok(None),
            Some(u) if u.starts_with("redis://") || u.starts_with("rediss://") => Ok(Some(u)),
            Some(u) => Err(format!(
                "--shared-state {:?}: need redis://HOST:PORT or rediss://HOST:PORT",
                u.split('@').next_back().unwrap_or_default()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(url: Option<&str>) -> FleetArgs {
        FleetArgs {
            shared_state: url.map(str::to_owned),
            shared_state_password_file: None,
            shared_state_ca: None,
            shared_state_timeout_millis: 10,
        }
    }

    #[test]
    fn only_redis_urls_are_taken_and_a_refusal_does_not_echo_a_password() {
        assert_eq!(args(None).url(), Ok(None));
        assert_eq!(
            args(Some("redis://h:6379")).url(),
            Ok(Some("redis://h:6379"))
        );
        assert!(args(Some("rediss://h:6380")).url().is_ok());
        let err = args(Some("http://user:secret@h:1")).url().unwrap_err();
        assert!(!err.contains("secret"), "{err}");
        assert!(args(Some("h:6379")).url().is_err());
        assert_eq!(args(None).deadline(), Duration::from_millis(10));
    }

    #[test]
    fn the_password_file_is_read_and_an_empty_or_missing_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "s3cret\n").unwrap();
        let mut a = args(Some("redis://h:1"));
        a.shared_state_password_file = Some(file.clone());
        assert_eq!(a.password(), Ok(Some("s3cret".to_owned())));
        std::fs::write(&file, "\n").unwrap();
        assert!(a.password().is_err());
        a.shared_state_password_file = Some(dir.path().join("absent"));
        assert!(a.password().is_err());
        a.shared_state_ca = Some(file.clone());
        assert!(a.ca().is_err(), "no certificate in it");
        std::fs::write(&file, "-----BEGIN CERTIFICATE-----\n").unwrap();
        assert!(a.ca().unwrap().is_some());
    }
}
