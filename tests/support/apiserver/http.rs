//! HTTP routing: discovery, resource verbs, watch streams, fault injection and request recording.

use super::select::Selector;
use super::store::{ApiError, PatchType, ResourceDef, StoredEvent, Sub};
use super::{FaultAction, Inner, RecordedRequest};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;

const MAX_BODY: usize = 8 * 1024 * 1024;

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn parse_query(q: Option<&str>) -> BTreeMap<String, String> {
    q.unwrap_or_default()
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(kv), String::new()),
        })
        .collect()
}

fn json_response(code: u16, body: &Value) -> Response {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap_or_default()))
        .expect("response")
}

fn error_response(e: &ApiError) -> Response {
    json_response(e.code, &e.to_status())
}

fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

pub async fn handle(State(inner): State<Arc<Inner>>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = parse_query(req.uri().query());
    let headers = req.headers().clone();
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = match axum::body::to_bytes(req.into_body(), MAX_BODY).await {
        Ok(b) => b,
        Err(_) => {
            let e = ApiError::new(
                413,
                "RequestEntityTooLarge",
                "the request body is too large",
            );
            return error_response(&e);
        }
    };
    let is_watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    let mut record = RecordedRequest {
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
        content_type: content_type.clone(),
        field_manager: query.get("fieldManager").cloned(),
        status: 0,
        seq: 0,
        time: SystemTime::now(),
        watch: is_watch,
        body: if body.is_empty() {
            None
        } else {
            serde_json::from_slice(&body)
                .ok()
                .or_else(|| serde_yaml::from_slice(&body).ok())
        },
        fault: None,
    };

    // Fault injection.
    let mut drop_after = None;
    let mut terminal = None;
    let mut delays = Duration::ZERO;
    for action in inner.take_faults(method.as_str(), &path, is_watch) {
        match action {
            FaultAction::Delay(d) => delays += d,
            FaultAction::DropWatch { after_events } => drop_after = Some(after_events),
            other => {
                if terminal.is_none() {
                    terminal = Some(other);
                }
            }
        }
    }
    if !delays.is_zero() {
        record.fault = Some(format!("delay {delays:?}"));
        tokio::time::sleep(delays).await;
    }
    if let Some(action) = terminal {
        let e = match action {
            FaultAction::Status(code) => {
                ApiError::new(code, reason_for(code), format!("injected fault: {code}"))
            }
            _ => ApiError::new(
                409,
                "Conflict",
                "Operation cannot be fulfilled: the object has been modified; please apply your changes to the latest version and try again (injected fault)",
            ),
        };
        record.status = e.code;
        record.fault = Some(format!("{action:?}"));
        let _ = inner.record(record);
        return error_response(&e);
    }
    if drop_after.is_some() {
        record.fault = Some(format!("drop watch after {drop_after:?} events"));
    }

    // Logged before it is answered: what it changes is never seen first.
    let seq = inner.record(record);
    let resp = route(
        &inner,
        &method,
        &path,
        &query,
        &headers,
        content_type.as_deref(),
        &body,
        is_watch,
        drop_after,
    )
    .await;
    inner.answered(seq, resp.status().as_u16());
    resp
}

struct Target {
    rd: ResourceDef,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

#[allow(clippy::too_many_arguments)]
async fn route(
    inner: &Arc<Inner>,
    method: &Method,
    path: &str,
    query: &BTreeMap<String, String>,
    headers: &HeaderMap,
    content_type: Option<&str>,
    body: &[u8],
    is_watch: bool,
    drop_after: Option<usize>,
) -> Response {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let not_found = || {
        error_response(&ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ))
    };
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["version"] => {
            return json_response(
                200,
                &json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-lanekeeper-double", "platform": "linux/amd64"}),
            );
        }
        ["api"] => {
            return json_response(
                200,
                &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": inner.addr.to_string()}]}),
            );
        }
        ["openid", "v1", "jwks"] if *method == Method::GET => {
            return json_response(200, &inner.signer.jwks());
        }
        ["apis", "authentication.k8s.io", "v1", "tokenreviews"] if *method == Method::POST => {
            return match serde_json::from_slice::<Value>(body) {
                Ok(review) => json_response(201, &inner.signer.review(&review)),
                Err(e) => error_response(&ApiError::bad_request(format!("not a TokenReview: {e}"))),
            };
        }
        ["apis"] => return json_response(200, &inner.api_groups()),
        ["apis", g] => {
            let groups = inner.api_groups();
            return match groups["groups"]
                .as_array()
                .and_then(|a| a.iter().find(|x| x["name"] == *g))
            {
                Some(gr) => {
                    let mut gr = gr.clone();
                    gr["kind"] = json!("APIGroup");
                    gr["apiVersion"] = json!("v1");
                    json_response(200, &gr)
                }
                None => not_found(),
            };
        }
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return not_found(),
    };
    if rest.is_empty() {
        return match inner.resource_list(group, version) {
            Some(list) => json_response(200, &list),
            None => not_found(),
        };
    }
    let lookup = |plural: &str| inner.state().find(group, version, plural);
    let target = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if !(group.is_empty()
                && ["status", "finalize"].contains(plural)
                && tail.is_empty()) =>
        {
            let Some(rd) = lookup(plural) else {
                return not_found();
            };
            if !rd.namespaced {
                return not_found();
            }
            match tail {
                [] => Target {
                    rd,
                    ns: Some(ns.to_string()),
                    name: None,
                    sub: None,
                },
                [name] => Target {
                    rd,
                    ns: Some(ns.to_string()),
                    name: Some(name.to_string()),
                    sub: None,
                },
                [name, sub] => Target {
                    rd,
                    ns: Some(ns.to_string()),
                    name: Some(name.to_string()),
                    sub: Some(sub.to_string()),
                },
                _ => return not_found(),
            }
        }
        [plural, tail @ ..] => {
            let Some(rd) = lookup(plural) else {
                return not_found();
            };
            match tail {
                [] => Target {
                    rd,
                    ns: None,
                    name: None,
                    sub: None,
                },
                [name] if !rd.namespaced => Target {
                    rd,
                    ns: None,
                    name: Some(name.to_string()),
                    sub: None,
                },
                [name, sub] if !rd.namespaced => Target {
                    rd,
                    ns: None,
                    name: Some(name.to_string()),
                    sub: Some(sub.to_string()),
                },
                _ => return not_found(),
            }
        }
        _ => return not_found(),
    };
    let sub = match target.sub.as_deref() {
        None => Sub::Main,
        Some("status") if target.rd.status => Sub::Status,
        Some("scale") if target.rd.scale.is_some() => Sub::Scale,
        Some(_) => return not_found(),
    };
    let rd = target.rd.clone();
    let ns = target.ns.clone().unwrap_or_default();
    // Without a fieldManager, a real server names the manager after the user agent.
    let agent = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|ua| ua.split('/').next())
        .filter(|s| !s.is_empty())
        .unwrap_or("unknown")
        .to_string();
    let manager = match content_type.map(|c| c.starts_with("application/apply-patch")) {
        Some(true) => query.get("fieldManager").map(String::as_str),
        _ => Some(
            query
                .get("fieldManager")
                .map(String::as_str)
                .unwrap_or(agent.as_str()),
        ),
    };
    let parse_body = |yaml: bool| -> Result<Value, ApiError> {
        let v: Result<Value, String> = if yaml {
            serde_yaml::from_slice(body).map_err(|e| e.to_string())
        } else {
            serde_json::from_slice(body).map_err(|e| e.to_string())
        };
        v.map_err(|e| {
            ApiError::bad_request(format!(
                "the body of the request was in an unknown format: {e}"
            ))
        })
    };
    let result: Result<(u16, Value), ApiError> = match (method, target.name.as_deref()) {
        (&Method::GET, None) if is_watch => {
            return watch(inner, &rd, target.ns.as_deref(), query, headers, drop_after);
        }
        (&Method::GET, None) => list(inner, &rd, target.ns.as_deref(), query, headers),
        (&Method::GET, Some(name)) => {
            let st = inner.state();
            match st.get(&rd, &ns, name) {
                Some(obj) if sub == Sub::Scale => Ok((200, st.scale_view(&rd, &obj))),
                Some(obj) => Ok((200, metadata_only(headers, obj))),
                None => Err(ApiError::not_found(&rd, name)),
            }
        }
        (&Method::POST, None) => parse_body(false).and_then(|b| {
            let out = inner.state().create(&rd, &ns, b, manager, false)?;
            Ok((201, out))
        }),
        (&Method::PUT, Some(name)) => parse_body(false).and_then(|b| {
            let out = inner
                .state()
                .replace(&rd, &ns, name, sub, b, manager, false)?;
            Ok((200, out))
        }),
        (&Method::PATCH, Some(name)) => {
            let ct = content_type
                .unwrap_or_default()
                .split(';')
                .next()
                .unwrap_or_default()
                .trim();
            match ct {
                "application/apply-patch+yaml" => parse_body(true).and_then(|b| {
                    let force =
                        matches!(query.get("force").map(String::as_str), Some("true" | "1"));
                    let (out, created) = inner
                        .state()
                        .apply(&rd, &ns, name, sub, &b, manager, force)?;
                    Ok((if created { 201 } else { 200 }, out))
                }),
                "application/merge-patch+json"
                | "application/json-patch+json"
                | "application/strategic-merge-patch+json" => {
                    let ptype = match ct {
                        "application/merge-patch+json" => PatchType::Merge,
                        "application/json-patch+json" => PatchType::Json,
                        _ => PatchType::Strategic,
                    };
                    let is_builtin = super::store::builtin_resources()
                        .iter()
                        .any(|b| b.group == rd.group && b.plural == rd.plural);
                    if ptype == PatchType::Strategic && !is_builtin {
                        Err(ApiError::new(
                            415,
                            "UnsupportedMediaType",
                            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml".to_string(),
                        ))
                    } else {
                        parse_body(false).and_then(|b| {
                            let out = inner
                                .state()
                                .patch(&rd, &ns, name, sub, ptype, &b, manager)?;
                            Ok((200, out))
                        })
                    }
                }
                other => Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!(
                        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {other:?})"
                    ),
                )),
            }
        }
        (&Method::DELETE, Some(name)) if sub == Sub::Main => {
            let opts = if body.is_empty() {
                Ok(json!({}))
            } else {
                parse_body(false)
            };
            opts.and_then(|o| {
                let mut o = o;
                if let Some(p) = query.get("propagationPolicy") {
                    o["propagationPolicy"] = json!(p);
                }
                let out = inner.state().delete(&rd, &ns, name, &o)?;
                Ok((200, out))
            })
        }
        (&Method::DELETE, None) => {
            let labels = Selector::parse_labels(
                query
                    .get("labelSelector")
                    .map(String::as_str)
                    .unwrap_or_default(),
            )
            .map_err(ApiError::bad_request);
            let fields_sel = Selector::parse_fields(
                query
                    .get("fieldSelector")
                    .map(String::as_str)
                    .unwrap_or_default(),
            )
            .map_err(ApiError::bad_request);
            match (labels, fields_sel) {
                (Ok(l), Ok(f)) => {
                    let mut st = inner.state();
                    match st.list_page(&rd, target.ns.as_deref(), &l, &f, None, None) {
                        Ok((items, rv, _, _)) => {
                            let mut deleted = Vec::new();
                            for it in items {
                                let n = it["metadata"]["name"]
                                    .as_str()
                                    .unwrap_or_default()
                                    .to_string();
                                let ins = it["metadata"]["namespace"]
                                    .as_str()
                                    .unwrap_or_default()
                                    .to_string();
                                if let Ok(d) = st.delete(&rd, &ins, &n, &json!({})) {
                                    deleted.push(d);
                                }
                            }
                            Ok((
                                200,
                                json!({"kind": format!("{}List", rd.kind), "apiVersion": rd.api_version(), "metadata": {"resourceVersion": rv.to_string()}, "items": deleted}),
                            ))
                        }
                        Err(e) => Err(e),
                    }
                }
                (Err(e), _) | (_, Err(e)) => Err(e),
            }
        }
        _ => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            format!(
                "the server does not allow this method on the requested resource ({method} {path})"
            ),
        )),
    };
    if result.is_ok() {
        inner.notify();
    }
    match result {
        Ok((code, v)) => json_response(code, &v),
        Err(e) => error_response(&e),
    }
}

fn wants_metadata(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=PartialObjectMetadata"))
}

fn metadata_only(headers: &HeaderMap, obj: Value) -> Value {
    if wants_metadata(headers) {
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": obj["metadata"]})
    } else {
        obj
    }
}

fn selectors(query: &BTreeMap<String, String>) -> Result<(Selector, Selector), ApiError> {
    let l = Selector::parse_labels(
        query
            .get("labelSelector")
            .map(String::as_str)
            .unwrap_or_default(),
    )
    .map_err(ApiError::bad_request)?;
    let f = Selector::parse_fields(
        query
            .get("fieldSelector")
            .map(String::as_str)
            .unwrap_or_default(),
    )
    .map_err(ApiError::bad_request)?;
    Ok((l, f))
}

fn list(
    inner: &Arc<Inner>,
    rd: &ResourceDef,
    ns: Option<&str>,
    query: &BTreeMap<String, String>,
    headers: &HeaderMap,
) -> Result<(u16, Value), ApiError> {
    let (l, f) = selectors(query)?;
    let limit = match query.get("limit") {
        Some(s) if !s.is_empty() => Some(
            s.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("invalid limit {s:?}")))?,
        ),
        _ => None,
    };
    let st = inner.state();
    let (items, rv, next, remaining) = st.list_page(
        rd,
        ns,
        &l,
        &f,
        limit,
        query.get("continue").map(String::as_str),
    )?;
    let meta_only = wants_metadata(headers);
    let items: Vec<Value> = items
        .into_iter()
        .map(|o| metadata_only(headers, o))
        .collect();
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(n) = next {
        meta["continue"] = json!(n);
        meta["remainingItemCount"] = json!(remaining);
    }
    let (api_version, kind) = if meta_only {
        (
            "meta.k8s.io/v1".to_string(),
            "PartialObjectMetadataList".to_string(),
        )
    } else {
        (rd.api_version(), format!("{}List", rd.kind))
    };
    Ok((
        200,
        json!({"kind": kind, "apiVersion": api_version, "metadata": meta, "items": items}),
    ))
}

fn event_line(kind: &str, obj: &Value) -> axum::body::Bytes {
    let mut v = serde_json::to_vec(&json!({"type": kind, "object": obj})).unwrap_or_default();
    v.push(b'\n');
    axum::body::Bytes::from(v)
}

fn watch(
    inner: &Arc<Inner>,
    rd: &ResourceDef,
    ns: Option<&str>,
    query: &BTreeMap<String, String>,
    headers: &HeaderMap,
    drop_after: Option<usize>,
) -> Response {
    let (labels, fields_sel) = match selectors(query) {
        Ok(s) => s,
        Err(e) => return error_response(&e),
    };
    let rv_param = query.get("resourceVersion").cloned().unwrap_or_default();
    let start_rv: Option<u64> = match rv_param.as_str() {
        "" | "0" => None,
        s => match s.parse() {
            Ok(n) => Some(n),
            Err(_) => {
                return error_response(&ApiError::bad_request(format!(
                    "invalid resource version {s:?}"
                )));
            }
        },
    };
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1800));
    let bookmarks = matches!(
        query.get("allowWatchBookmarks").map(String::as_str),
        Some("true" | "1")
    );
    let send_initial = matches!(
        query.get("sendInitialEvents").map(String::as_str),
        Some("true" | "1")
    );
    let meta_only = wants_metadata(headers);
    let (tx, rx) = mpsc::channel::<axum::body::Bytes>(256);
    let inner2 = inner.clone();
    let rd = rd.clone();
    let ns = ns.map(str::to_string);
    let mut shutdown = inner.shutdown.subscribe();
    let mut changes = inner.changes.subscribe();
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut sent = 0usize;
        let shape = |o: &Value| -> Value {
            let mut o = o.clone();
            o["apiVersion"] = json!(rd.api_version());
            if meta_only {
                json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": o["metadata"]})
            } else {
                o
            }
        };
        let in_scope = |e: &StoredEvent| {
            e.group == rd.group
                && e.plural == rd.plural
                && ns
                    .as_deref()
                    .is_none_or(|n| !rd.namespaced || e.namespace == n)
        };
        let matches = |o: &Value| labels.matches_labels(o) && fields_sel.matches_fields(o);
        // Initial state and the cursor.
        let start: Result<(u64, Vec<Value>), ApiError> = {
            let st = inner2.state();
            match start_rv {
                Some(n) if n + 1 < st.oldest_watchable => Err(ApiError::new(
                    410,
                    "Expired",
                    format!("too old resource version: {n} ({})", st.oldest_watchable),
                )),
                Some(n) => Ok((n, Vec::new())),
                None => Ok((
                    st.rv,
                    st.list(&rd, ns.as_deref())
                        .into_iter()
                        .filter(|o| matches(o))
                        .collect(),
                )),
            }
        };
        let (mut cursor, initial) = match start {
            Ok(s) => s,
            Err(err) => {
                let _ = tx.send(event_line("ERROR", &err.to_status())).await;
                return;
            }
        };
        for o in &initial {
            if tx.send(event_line("ADDED", &shape(o))).await.is_err() {
                return;
            }
            sent += 1;
            if drop_after.is_some_and(|k| sent >= k) {
                return;
            }
        }
        if send_initial && bookmarks {
            let bm = json!({"kind": rd.kind, "apiVersion": rd.api_version(), "metadata": {"resourceVersion": cursor.to_string(), "annotations": {"k8s.io/initial-events-end": "true"}}});
            if tx.send(event_line("BOOKMARK", &bm)).await.is_err() {
                return;
            }
        }
        let bookmark_every = inner2.bookmark_interval;
        let mut next_bookmark = tokio::time::Instant::now() + bookmark_every;
        loop {
            let batch: Result<Vec<(&'static str, Value)>, ApiError> = {
                let st = inner2.state();
                if cursor + 1 < st.oldest_watchable
                    && st.events.front().is_none_or(|e| e.rv > cursor + 1)
                {
                    Err(ApiError::new(
                        410,
                        "Expired",
                        format!(
                            "too old resource version: {cursor} ({})",
                            st.oldest_watchable
                        ),
                    ))
                } else {
                    let from = st.events.partition_point(|e| e.rv <= cursor);
                    let mut out = Vec::new();
                    for e in st.events.range(from..) {
                        cursor = e.rv;
                        if !in_scope(e) {
                            continue;
                        }
                        let now_m = matches(&e.object);
                        let was_m = e.old.as_ref().is_some_and(|o| matches(o));
                        let kind = match (e.kind, was_m, now_m) {
                            ("DELETED", _, true) => "DELETED",
                            ("ADDED", _, true) => "ADDED",
                            ("MODIFIED", true, true) => "MODIFIED",
                            ("MODIFIED", false, true) => "ADDED",
                            ("MODIFIED", true, false) => "DELETED",
                            _ => continue,
                        };
                        out.push((kind, shape(&e.object)));
                    }
                    cursor = cursor.max(st.rv);
                    Ok(out)
                }
            };
            let batch = match batch {
                Ok(b) => b,
                Err(err) => {
                    let _ = tx.send(event_line("ERROR", &err.to_status())).await;
                    return;
                }
            };
            for (kind, obj) in batch {
                if tx.send(event_line(kind, &obj)).await.is_err() {
                    return;
                }
                sent += 1;
                if drop_after.is_some_and(|k| sent >= k) {
                    return;
                }
            }
            tokio::select! {
                r = changes.changed() => { if r.is_err() { return; } }
                _ = tokio::time::sleep_until(deadline) => { return; }
                _ = tokio::time::sleep_until(next_bookmark) => {
                    next_bookmark = tokio::time::Instant::now() + bookmark_every;
                    if bookmarks {
                        let bm = json!({"kind": rd.kind, "apiVersion": rd.api_version(), "metadata": {"resourceVersion": cursor.to_string()}});
                        if tx.send(event_line("BOOKMARK", &bm)).await.is_err() { return; }
                    }
                }
                _ = shutdown.changed() => { return; }
                _ = tx.closed() => { return; }
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .expect("response")
}
