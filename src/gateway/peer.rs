//! What the listener learned about the client's connection, handed to the
//! request path as a request extension: the names of a verified client
//! certificate (mTLS). The TLS listener inserts it; identity reads it. A
//! plain-HTTP connection carries none.

/// The names a verified client certificate proves: its subject's common
/// name and its DNS and URI subject alternative names, as written in the
/// certificate. Only present when the certificate chained to the configured
/// client CA.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PeerCertificate {
    /// Common name, then SAN DNS names, then SAN URIs.
    pub(crate) names: Vec<String>,
}
