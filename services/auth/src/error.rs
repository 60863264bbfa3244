//! Why a caller was not let in, and the one map to a gRPC status.

/// A refused credential or caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No credential at all.
    #[error("no credential: send `authorization: Bearer <token>`")]
    Missing,
    /// A credential that is malformed, unknown, badly signed or expired.
    #[error("invalid credential: {0}")]
    Invalid(String),
    /// A known caller that may not do this.
    #[error("permission denied: {0}")]
    Denied(String),
    /// The identity provider's keys could not be fetched (the token may be fine).
    #[error("cannot verify the token now: {0}")]
    Unavailable(String),
}

impl AuthError {
    /// The gRPC status: UNAUTHENTICATED, PERMISSION_DENIED or UNAVAILABLE.
    pub fn status(&self) -> tonic::Status {
        match self {
            Self::Missing | Self::Invalid(_) => tonic::Status::unauthenticated(self.to_string()),
            Self::Denied(_) => tonic::Status::permission_denied(self.to_string()),
            Self::Unavailable(_) => tonic::Status::unavailable(self.to_string()),
        }
    }
}

impl From<AuthError> for tonic::Status {
    fn from(e: AuthError) -> Self {
        e.status()
    }
}
