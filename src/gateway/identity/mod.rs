//! Who is calling, and so which lane and tenant a request gets: the step
//! before a request's body is read. Each kind of identity in its own file
//! (`api_key`, `service_account`, `jwt`, `certificate`), the JWT issuers'
//! key sets (`jwks`), the index of who may use which lane (`index`), the
//! `--credentials` file (`credentials`), the state of one gateway's
//! identities and the resolution of a request to its caller (`resolve`),
//! the Secret watches and the credentials file's reloads (`watch`), the
//! refusals and their answers (`refused`) and the flags (`flags`). The
//! matching is pure; the I/O (Secrets, TokenReview, JWKS) is in `watch`,
//! `service_account::Reviewer` and `jwks::KeySets`.
//!
//! A token, when sent (`Authorization: Bearer`, or `--api-key-header`),
//! decides: an API key (its hash in a watched Secret or the credentials
//! file), else a JWT of a listed issuer, else a ServiceAccount token (only
//! when it claims to be a listed ServiceAccount). Without a token, a
//! verified client certificate. The identity's lanes and tenants come from
//! the index; the lane header chooses among them.

mod api_key;
mod certificate;
mod credentials;
mod flags;
mod index;
mod jwks;
mod jwt;
mod refused;
mod resolve;
mod service_account;
mod watch;

pub use flags::IdentityArgs;
pub(crate) use refused::{AuthRefusal, answer};
pub(crate) use resolve::{Identity, IdentityKind};
pub(crate) use watch::{follow_secrets, watch_credentials};

#[cfg(test)]
mod tests;
