//! The closed API surface: the OpenAI-compatible inference paths, with
//! their methods, and those an operator adds with `--allow-path`. Anything
//! else is answered by the gateway (404 or 405) and never forwarded.
//! Paths match exactly, as the client sent them: no normalisation, so
//! `/v1/chat/completions/../../admin` or `/v1/chat%2Fcompletions` is simply
//! not on the surface.

use axum::http::Method;

/// One allowed path with its method.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowedPath {
    /// The method.
    pub method: Method,
    /// The exact path (no query).
    pub path: String,
}

/// Parses `--allow-path`: `PATH` (POST) or `METHOD PATH`.
pub(super) fn parse_allowed(s: &str) -> Result<AllowedPath, String> {
    let (method, path) = match s.trim().split_once(' ') {
        Some((m, p)) => (m.trim(), p.trim()),
        None => ("POST", s.trim()),
    };
    let method = match method {
        "GET" => Method::GET,
        "POST" => Method::POST,
        other => {
            return Err(format!(
                "--allow-path {s:?}: method {other:?} is not GET or POST"
            ));
        }
    };
    let plain = path.starts_with('/')
        && path
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/-_.".contains(&b))
        && !path.split('/').any(|seg| seg == "." || seg == "..");
    if !plain {
        return Err(format!(
            "--allow-path {s:?}: the path must start with / and hold only letters, digits, '/', '-', '_' and '.' (no . or .. segment)"
        ));
    }
    Ok(AllowedPath {
        method,
        path: path.to_owned(),
    })
}

/// The built-in inference surface.
const INFERENCE: [(&str, Method); 4] = [
    ("/v1/chat/completions", Method::POST),
    ("/v1/completions", Method::POST),
    ("/v1/embeddings", Method::POST),
    ("/v1/models", Method::GET),
];

/// Whether a request is on the surface.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum OnSurface {
    /// Forward it (after admission).
    Yes,
    /// No such path: 404.
    NoPath,
    /// The path exists with other methods: 405 with `Allow`.
    WrongMethod(Vec<Method>),
}

/// The paths a gateway forwards.
#[derive(Clone, Debug)]
pub(super) struct Surface {
    paths: Vec<(String, Method)>,
}

impl Surface {
    /// The inference surface plus `extra`.
    pub(super) fn new(extra: &[AllowedPath]) -> Surface {
        let mut paths: Vec<(String, Method)> = INFERENCE
            .iter()
            .map(|(p, m)| ((*p).to_owned(), m.clone()))
            .collect();
        for a in extra {
            paths.push((a.path.clone(), a.method.clone()));
        }
        Surface { paths }
    }

    /// Whether `method path` is on the surface. `GET /v1/models/{id}` (one
    /// more segment) is, with `GET /v1/models`.
    pub(super) fn check(&self, method: &Method, path: &str) -> OnSurface {
        let methods: Vec<Method> = self
            .paths
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, m)| m.clone())
            .chain(model_id(path).then_some(Method::GET))
            .collect();
        if methods.is_empty() {
            OnSurface::NoPath
        } else if methods.contains(method) {
            OnSurface::Yes
        } else {
            OnSurface::WrongMethod(methods)
        }
    }
}

/// `/v1/models/{id}`: one plain segment after `/v1/models/`.
fn model_id(path: &str) -> bool {
    path.strip_prefix("/v1/models/").is_some_and(|id| {
        !id.is_empty()
            && id != "."
            && id != ".."
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_inference_paths_with_their_methods_are_on_the_surface() {
        let s = Surface::new(&[]);
        assert_eq!(
            s.check(&Method::POST, "/v1/chat/completions"),
            OnSurface::Yes
        );
        assert_eq!(s.check(&Method::GET, "/v1/models"), OnSurface::Yes);
        assert_eq!(
            s.check(&Method::GET, "/v1/models/llama-3.1:8b"),
            OnSurface::Yes
        );
        for path in [
            "/control",
            "/",
            "/v1/chat/completions/",
            "/v1/chat/completions/../../control",
            "/v1/chat%2Fcompletions",
            "/V1/chat/completions",
            "/v1/models/..",
            "/v1/models/a/b",
            "/metrics",
        ] {
            assert_eq!(s.check(&Method::POST, path), OnSurface::NoPath, "{path}");
        }
        assert_eq!(
            s.check(&Method::PUT, "/v1/chat/completions"),
            OnSurface::WrongMethod(vec![Method::POST])
        );
        assert_eq!(
            s.check(&Method::DELETE, "/v1/models/x"),
            OnSurface::WrongMethod(vec![Method::GET])
        );
    }

    #[test]
    fn allow_path_adds_exact_paths_and_refuses_odd_ones() {
        let extra = [
            parse_allowed("/v1/rerank").unwrap(),
            parse_allowed("GET /v1/health").unwrap(),
        ];
        assert_eq!(extra[0].method, Method::POST);
        let s = Surface::new(&extra);
        assert_eq!(s.check(&Method::POST, "/v1/rerank"), OnSurface::Yes);
        assert_eq!(s.check(&Method::GET, "/v1/health"), OnSurface::Yes);
        assert_eq!(s.check(&Method::POST, "/v1/rerank/x"), OnSurface::NoPath);
        for bad in [
            "v1/x",
            "PUT /v1/x",
            "/v1/../admin",
            "/v1/x?y=1",
            "/v1/%2e%2e",
            "/v1/ x",
        ] {
            assert!(parse_allowed(bad).is_err(), "{bad}");
        }
    }
}
