//! Why a call of the client failed ([`ClientError`]).

/// Why a call failed. Rejected items are not errors: they are in the outcome of the call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The endpoint is not a valid URI, or its TLS settings are invalid.
    #[error("invalid endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why it is invalid.
        reason: String,
    },
    /// No connection could be made within the retry budget.
    #[error("cannot connect to {endpoint} after {attempts} attempt(s): {source}")]
    Connect {
        /// The endpoint.
        endpoint: String,
        /// How many attempts were made.
        attempts: u32,
        /// The last transport error.
        #[source]
        source: tonic::transport::Error,
    },
    /// The server answered with an error status.
    #[error("{rpc}: {code:?}: {message}", code = .status.code(), message = .status.message())]
    Rpc {
        /// The RPC, e.g. `Writer.Apply`.
        rpc: &'static str,
        /// The status.
        status: tonic::Status,
    },
    /// A stream ended before its answer.
    #[error("{rpc}: the server closed the stream before answering batch {batch_id}")]
    StreamClosed {
        /// The RPC.
        rpc: &'static str,
        /// The batch that got no answer.
        batch_id: u64,
    },
}

impl ClientError {
    /// The gRPC status of an `Rpc` error.
    pub fn status(&self) -> Option<&tonic::Status> {
        match self {
            ClientError::Rpc { status, .. } => Some(status),
            _ => None,
        }
    }

    pub(super) fn rpc(rpc: &'static str) -> impl FnOnce(tonic::Status) -> ClientError {
        move |status| ClientError::Rpc { rpc, status }
    }
}
