//! Errors of the controller.

/// Errors of the controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("{context}: {source}")]
    Kube {
        /// What was being done.
        context: &'static str,
        /// The error.
        #[source]
        source: kube::Error,
    },
    /// The scale target can't be read or written.
    #[error("scale target: {0}")]
    ScaleTarget(String),
    /// The lanekeeper CRDs are not installed.
    #[error("{0}")]
    CrdsMissing(String),
    /// Leader election failed.
    #[error("leader election: {0}")]
    Lease(String),
    /// An invalid object (reported in its status and events).
    #[error("invalid object: {0}")]
    Invalid(String),
    /// The lane or policy index has not synced yet.
    #[error("the lane and policy index has not synced yet")]
    IndexNotSynced,
}

impl Error {
    /// Wraps a kube error with context.
    pub fn kube(context: &'static str, source: kube::Error) -> Self {
        Error::Kube { context, source }
    }

    /// A short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube {
                source: kube::Error::Api(s),
                ..
            } if s.code == 409 => "conflict",
            Error::Kube {
                source: kube::Error::Api(s),
                ..
            } if s.code == 404 => "not_found",
            Error::Kube {
                source: kube::Error::Api(s),
                ..
            } if s.code >= 500 => "server_error",
            Error::Kube {
                source: kube::Error::Api(_),
                ..
            } => "api_error",
            Error::Kube { .. } => "transport",
            Error::ScaleTarget(_) => "scale_target",
            Error::CrdsMissing(_) => "crds_missing",
            Error::Lease(_) => "lease",
            Error::Invalid(_) => "invalid_object",
            Error::IndexNotSynced => "index_not_synced",
        }
    }
}

/// Whether an API error is worth retrying.
pub fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code >= 500 || s.code == 429,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}
