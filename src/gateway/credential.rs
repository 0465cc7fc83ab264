//! Each route's own upstream credential (`--route-credential NAME=FILE`): a
//! bearer token in a file (a mounted Secret), sent as `Authorization:
//! Bearer …` to that route only, and read again when the file changes. The
//! token is never logged and never shown by `Debug`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, header};

use super::args::GatewayError;

/// One route's credential file and the header made of it.
struct Credential {
    file: PathBuf,
    /// The file's bytes as last read, and the header in force.
    current: RwLock<(Vec<u8>, Option<HeaderValue>)>,
    /// Whether an unreadable file was reported (once until readable again).
    unreadable: AtomicBool,
}

/// The routes' credentials, by route name.
#[derive(Default)]
pub(super) struct RouteCredentials {
    by_route: HashMap<String, Arc<Credential>>,
}

/// `Authorization: Bearer <token>` from a file's bytes (the token trimmed),
/// marked sensitive; or why not, without the token.
fn bearer(bytes: &[u8]) -> Result<HeaderValue, &'static str> {
    let token = std::str::from_utf8(bytes)
        .map_err(|_| "the file is not UTF-8")?
        .trim();
    if token.is_empty() {
        return Err("the file is empty");
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("the token has spaces or non-printable characters");
    }
    let mut v = HeaderValue::try_from(format!("Bearer {token}"))
        .map_err(|_| "the token is not a valid header value")?;
    v.set_sensitive(true);
    Ok(v)
}

fn load(file: &Path) -> Result<(Vec<u8>, HeaderValue), String> {
    let bytes = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let value = bearer(&bytes).map_err(|e| format!("{}: {e}", file.display()))?;
    Ok((bytes, value))
}

impl RouteCredentials {
    /// Each credential read once; one that names no route or does not load
    /// stops the gateway starting.
    pub(super) fn new(
        list: &[(String, PathBuf)],
        routes: &[(String, String)],
    ) -> Result<RouteCredentials, GatewayError> {
        let mut by_route = HashMap::new();
        for (route, file) in list {
            if !routes.iter().any(|(r, _)| r == route) {
                return Err(GatewayError::Credential(format!(
                    "{route:?} is not the name of a --route"
                )));
            }
            let (bytes, value) = load(file).map_err(GatewayError::Credential)?;
            let c = Credential {
                file: file.clone(),
                current: RwLock::new((bytes, Some(value))),
                unreadable: AtomicBool::new(false),
            };
            by_route.insert(route.clone(), Arc::new(c));
        }
        Ok(RouteCredentials { by_route })
    }

    /// Sets the route's `Authorization`, when it has a credential.
    pub(super) fn apply(&self, route: &str, headers: &mut HeaderMap) {
        if let Some(c) = self.by_route.get(route) {
            let current = c.current.read().unwrap_or_else(|e| e.into_inner());
            if let Some(v) = &current.1 {
                headers.insert(header::AUTHORIZATION, v.clone());
            }
        }
    }

    /// Reads every file again; a changed one replaces its header, one that
    /// no longer loads keeps the last good (and says so, once per change).
    fn refresh(&self) {
        for (route, c) in &self.by_route {
            let bytes = match std::fs::read(&c.file) {
                Ok(b) => b,
                Err(e) => {
                    if !c.unreadable.swap(true, Ordering::Relaxed) {
                        tracing::warn!(route, file = %c.file.display(), error = %e,
                            "the route's credential file is unreadable; keeping the last good");
                    }
                    continue;
                }
            };
            c.unreadable.store(false, Ordering::Relaxed);
            let mut current = c.current.write().unwrap_or_else(|e| e.into_inner());
            if current.0 == bytes {
                continue;
            }
            match bearer(&bytes) {
                Ok(v) => {
                    current.1 = Some(v);
                    tracing::info!(route, "the route's upstream credential changed");
                }
                Err(why) => tracing::error!(
                    route,
                    file = %c.file.display(),
                    why,
                    "the route's new credential does not load; keeping the last good"
                ),
            }
            current.0 = bytes;
        }
    }

    /// Re-reads the files every `every`.
    pub(super) async fn watch(self: Arc<Self>, every: Duration) {
        if self.by_route.is_empty() {
            return;
        }
        loop {
            tokio::time::sleep(every).await;
            self.refresh();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_becomes_a_sensitive_bearer_header() {
        let v = bearer(b"  sk-abc.123\n").unwrap();
        assert_eq!(v, "Bearer sk-abc.123");
        assert!(v.is_sensitive());
        for bad in [&b""[..], b" \n", b"two words", b"tab\there", b"\xff\xfe"] {
            let e = bearer(bad).unwrap_err();
            let token = String::from_utf8_lossy(bad);
            assert!(token.trim().is_empty() || !e.contains(token.trim()), "{e}");
        }
    }

    #[test]
    fn a_credential_must_name_a_route_and_load() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "secret-token\n").unwrap();
        let routes = vec![("pool".to_owned(), "http://x".to_owned())];
        let creds = RouteCredentials::new(&[("pool".to_owned(), file.clone())], &routes).unwrap();
        let mut h = HeaderMap::new();
        creds.apply("other", &mut h);
        assert!(h.is_empty(), "another route gets no credential");
        creds.apply("pool", &mut h);
        assert_eq!(h[header::AUTHORIZATION], "Bearer secret-token");

        std::fs::write(&file, "rotated\n").unwrap();
        creds.refresh();
        creds.apply("pool", &mut h);
        assert_eq!(h[header::AUTHORIZATION], "Bearer rotated");
        std::fs::write(&file, "\n").unwrap();
        creds.refresh();
        creds.apply("pool", &mut h);
        assert_eq!(
            h[header::AUTHORIZATION],
            "Bearer rotated",
            "an empty file keeps the last good"
        );

        let unknown = RouteCredentials::new(&[("nope".to_owned(), file.clone())], &routes);
        assert!(matches!(unknown, Err(GatewayError::Credential(_))));
        let missing =
            RouteCredentials::new(&[("pool".to_owned(), dir.path().join("absent"))], &routes);
        assert!(matches!(missing, Err(GatewayError::Credential(_))));
    }
}
