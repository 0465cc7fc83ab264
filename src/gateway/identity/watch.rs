//! The identities' sources: the credentials file, re-read when it changes,
//! and the API-key Secrets the config names: one watch per Secret
//! (by name, in its namespace), started when a config names it and stopped
//! when none does. A Secret's keys are replaced on every change and dropped
//! when it is deleted: a revoked or rotated key stops working as soon as
//! the watch delivers the change (about a second).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::{WatchStreamExt, watcher};
use lanes::ApiKeySecret;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::api_key::hash_secret;
use super::credentials::Credentials;
use super::resolve::Identity;

/// Starts and stops one watch per wanted Secret, for as long as the
/// gateway runs.
pub(crate) async fn follow_secrets(
    identity: Arc<Identity>,
    client: kube::Client,
    mut wanted: watch::Receiver<BTreeSet<ApiKeySecret>>,
) {
    let mut running: HashMap<ApiKeySecret, JoinHandle<()>> = HashMap::new();
    loop {
        let now: BTreeSet<ApiKeySecret> = wanted.borrow_and_update().clone();
        running.retain(|s, task| {
            let keep = now.contains(s);
            if !keep {
                task.abort();
                identity.secret_gone(s);
            }
            keep
        });
        for s in now {
            running
                .entry(s.clone())
                .or_insert_with(|| tokio::spawn(watch_secret(identity.clone(), client.clone(), s)));
        }
        if wanted.changed().await.is_err() {
            return;
        }
    }
}

/// One Secret's keys, kept current.
async fn watch_secret(identity: Arc<Identity>, client: kube::Client, s: ApiKeySecret) {
    let api: kube::Api<Secret> = kube::Api::namespaced(client, &s.namespace);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={}", s.secret));
    let mut stream = watcher(api, cfg).default_backoff().boxed();
    let mut listed = false;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Init) => listed = false,
            Ok(watcher::Event::Apply(secret) | watcher::Event::InitApply(secret)) => {
                listed = true;
                put(&identity, &s, &secret);
            }
            Ok(watcher::Event::InitDone) if !listed => {
                tracing::warn!(namespace = %s.namespace, secret = %s.secret,
                    "the API-key Secret a lane names does not exist; no key of it works");
                identity.secret_gone(&s);
            }
            Ok(watcher::Event::Delete(_)) => {
                tracing::warn!(namespace = %s.namespace, secret = %s.secret,
                    "the API-key Secret was deleted; its keys no longer work");
                identity.secret_gone(&s);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(namespace = %s.namespace, secret = %s.secret, error = %e,
                "watching an API-key Secret failed; keeping its last keys, retrying"),
        }
    }
}

fn put(identity: &Identity, s: &ApiKeySecret, secret: &Secret) {
    let data: BTreeMap<String, Vec<u8>> = secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    let (keys, short) = hash_secret(&data);
    for name in short {
        tracing::warn!(namespace = %s.namespace, secret = %s.secret, key = %name,
            "an API-key Secret value shorter than 16 bytes is not taken as a key");
    }
    tracing::info!(namespace = %s.namespace, secret = %s.secret, keys = keys.len(),
        "API keys loaded");
    identity.secret_keys(s.clone(), keys);
}

/// Re-reads the file when its bytes change (every `--reload-millis`).
pub(crate) async fn watch_credentials(identity: Arc<Identity>, path: PathBuf, every: Duration) {
    let source = path.display().to_string();
    let mut last: Option<Vec<u8>> = None;
    let mut reported = false;
    loop {
        // A small file: a blocking read is fine.
        match std::fs::read(&path) {
            Ok(bytes) if last.as_deref() != Some(&bytes[..]) => {
                reported = false;
                match Credentials::parse(&bytes) {
                    // Read between a writer's truncate and its write (an
                    // editor, a shell redirection): never "no callers".
                    // Revoking every key is an explicit empty list.
                    _ if bytes.iter().all(u8::is_ascii_whitespace) => {
                        tracing::error!(
                            source,
                            "credentials file empty; keeping the last good one"
                        );
                    }
                    Ok(c) => {
                        tracing::info!(source, "credentials file loaded");
                        identity.credentials_loaded(c);
                    }
                    Err(e) => tracing::error!(source, error = %e,
                        "credentials file refused; keeping the last good one"),
                }
                last = Some(bytes);
            }
            Ok(_) => {}
            Err(e) if !reported => {
                tracing::error!(source, error = %e,
                    "credentials file unreadable; keeping the last good one");
                reported = true;
            }
            Err(_) => {}
        }
        tokio::time::sleep(every).await;
    }
}
