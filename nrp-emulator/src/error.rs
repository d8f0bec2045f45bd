//! The emulator's typed errors, each rendered as an ARM error response (`{"error":{"code","message"}}`).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use clb_nrp::wire::ArmErrorBody;

/// The supported api-versions as ARM lists them in `InvalidApiVersionParameter`: comma-separated.
fn supported_versions() -> String {
    clb_nrp::wire::SUPPORTED_API_VERSIONS.join(",")
}

/// An error answered by the emulator. Every variant maps to an HTTP status and an ARM error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmulatorError {
    /// No `api-version` query parameter.
    #[error("The api-version query parameter (?api-version=) is required for all requests.")]
    MissingApiVersion,
    /// An `api-version` other than the supported ones (ARM's `InvalidApiVersionParameter`).
    #[error(
        "The api-version '{0}' is invalid. The supported versions are '{supported}'.",
        supported = supported_versions()
    )]
    InvalidApiVersion(String),
    /// No such route.
    #[error("no route for {method} {path}")]
    NoRoute {
        /// Method.
        method: String,
        /// Path.
        path: String,
    },
    /// The route exists but not for this method.
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed {
        /// Method.
        method: String,
        /// Path.
        path: String,
    },
    /// A resource that does not exist.
    #[error(
        "The Resource '{kind}/{name}' under resource group '{resource_group}' was not found. For more \
         details please go to https://aka.ms/ARMResourceNotFoundFix"
    )]
    ResourceNotFound {
        /// ARM type, e.g. `Microsoft.Network/serviceGateways`.
        kind: String,
        /// Resource name.
        name: String,
        /// Resource group.
        resource_group: String,
    },
    /// Unknown long-running operation id.
    #[error("operation '{0}' was not found")]
    OperationNotFound(String),
    /// The body is not valid JSON of the expected shape.
    #[error("the request body is malformed: {0}")]
    MalformedBody(String),
    /// The body exceeds the configured limit.
    #[error("the request body exceeds {0} bytes")]
    BodyTooLarge(usize),
    /// A request that breaks a rule (400), with its ARM code.
    #[error("{message}")]
    BadRequest {
        /// ARM error code, e.g. `DuplicateLocationsInRequest`.
        code: &'static str,
        /// Precise message.
        message: String,
    },
    /// A request refused (400) with a code of the configuration's (`refused_addresses`).
    #[error("{message}")]
    Refused {
        /// ARM error code.
        code: String,
        /// Message.
        message: String,
    },
    /// Too many concurrent mutating calls on a gateway, or an injected 429.
    #[error("too many requests on '{scope}'; retry after {retry_after_secs} s")]
    TooManyRequests {
        /// The throttled scope (gateway name, or `injected`).
        scope: String,
        /// Seconds to wait.
        retry_after_secs: u64,
    },
    /// The subscription's write budget is spent (ARM's `SubscriptionRequestsThrottled`, 429).
    #[error(
        "Number of write requests for subscription '{subscription}' exceeded the limit of its \
         {budget}. Please try again after '{retry_after_secs}' seconds."
    )]
    SubscriptionRequestsThrottled {
        /// The subscription id.
        subscription: String,
        /// Which budget is spent: `token bucket` or `writes per window`.
        budget: &'static str,
        /// Seconds until a write is available.
        retry_after_secs: u64,
    },
    /// Another mutating operation is in progress on the gateway (409).
    #[error(
        "another operation is in progress on service gateway '{gateway}'; retry after {retry_after_secs} s"
    )]
    AnotherOperationInProgress {
        /// Gateway name.
        gateway: String,
        /// Seconds to wait.
        retry_after_secs: u64,
    },
    /// An injected server error (500 or 503).
    #[error("injected server error {status}")]
    InjectedServerError {
        /// 500 or 503.
        status: u16,
        /// Seconds to wait (sent with 503).
        retry_after_secs: u64,
    },
    /// An injected timeout (504).
    #[error("the operation timed out (injected)")]
    InjectedTimeout,
    /// The server is shutting down.
    #[error("the emulator is shutting down")]
    ShuttingDown,
    /// An internal error (a bug: the emulator never panics on input).
    #[error("internal error: {0}")]
    Internal(String),
}

impl EmulatorError {
    /// A 400 with `code` and `message`.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::BadRequest {
            code,
            message: message.into(),
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::MissingApiVersion
            | Self::InvalidApiVersion(_)
            | Self::MalformedBody(_)
            | Self::BadRequest { .. }
            | Self::Refused { .. } => StatusCode::BAD_REQUEST,
            Self::NoRoute { .. } | Self::ResourceNotFound { .. } | Self::OperationNotFound(_) => {
                StatusCode::NOT_FOUND
            }
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::TooManyRequests { .. } | Self::SubscriptionRequestsThrottled { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            Self::AnotherOperationInProgress { .. } => StatusCode::CONFLICT,
            Self::InjectedServerError { status, .. } => {
                StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
            }
            Self::InjectedTimeout => StatusCode::GATEWAY_TIMEOUT,
            Self::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The ARM error code.
    pub fn code(&self) -> &str {
        match self {
            Self::MissingApiVersion => "MissingApiVersionParameter",
            Self::InvalidApiVersion(_) => "InvalidApiVersionParameter",
            Self::NoRoute { .. } => "NotFound",
            Self::MethodNotAllowed { .. } => "MethodNotAllowed",
            Self::ResourceNotFound { .. } => "ResourceNotFound",
            Self::OperationNotFound(_) => "OperationNotFound",
            Self::MalformedBody(_) => "InvalidRequestFormat",
            Self::BodyTooLarge(_) => "RequestBodyTooLarge",
            Self::BadRequest { code, .. } => code,
            Self::Refused { code, .. } => code,
            Self::TooManyRequests { .. } => "TooManyRequests",
            Self::SubscriptionRequestsThrottled { .. } => "SubscriptionRequestsThrottled",
            Self::AnotherOperationInProgress { .. } => "AnotherOperationInProgress",
            Self::InjectedServerError { status: 503, .. } => "ServiceUnavailable",
            Self::InjectedServerError { .. } => "InternalServerError",
            Self::InjectedTimeout => "GatewayTimeout",
            Self::ShuttingDown => "ServiceUnavailable",
            Self::Internal(_) => "InternalServerError",
        }
    }

    /// The `Retry-After` seconds sent with this error, if any.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Self::TooManyRequests {
                retry_after_secs, ..
            }
            | Self::SubscriptionRequestsThrottled {
                retry_after_secs, ..
            }
            | Self::AnotherOperationInProgress {
                retry_after_secs, ..
            } => Some(*retry_after_secs),
            Self::InjectedServerError {
                status: 503,
                retry_after_secs,
            } => Some(*retry_after_secs),
            _ => None,
        }
    }

    /// The ARM error body.
    pub fn body(&self) -> ArmErrorBody {
        ArmErrorBody::new(self.code(), self.to_string())
    }
}

impl IntoResponse for EmulatorError {
    fn into_response(self) -> Response {
        let mut resp = (self.status(), axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after_secs() {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_statuses() {
        let e = EmulatorError::bad_request("DuplicateLocationsInRequest", "x");
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert_eq!(e.body().error.code, "DuplicateLocationsInRequest");
        let t = EmulatorError::TooManyRequests {
            scope: "g".into(),
            retry_after_secs: 3,
        };
        let r = t.into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "3");
    }

    #[test]
    fn an_unknown_api_version_gets_arms_error() {
        let e = EmulatorError::InvalidApiVersion("2020-01-01".into());
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert_eq!(e.code(), "InvalidApiVersionParameter");
        assert_eq!(
            e.to_string(),
            "The api-version '2020-01-01' is invalid. The supported versions are \
             '2025-05-01,2026-03-01'."
        );
    }
}
