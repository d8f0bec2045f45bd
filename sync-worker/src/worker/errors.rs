//! What the worker does with each error it can meet: the one place where failures are classified
//! (docs/errors.md is this table in prose, and a test keeps the two in step).
//!
//! Every failure of a unit is one of three [`Handling`]s:
//!
//! - [`Handling::Retry`]: the failure says nothing about what NRP holds (throttling, a server
//!   error, a conflicting operation): the server sends the work again after a backoff.
//! - [`Handling::Repair`]: the failure proves the server's actual state wrong (NRP refers to, lacks
//!   or still uses something the server believes otherwise), or hides what NRP did (a timeout, a
//!   broken connection: the call may or may not have been applied). The server reads NRP back
//!   (an observe) before it sends the work again, so the retry is cut from what NRP holds.
//! - [`Handling::Park`]: the request is invalid whatever NRP holds (a malformed request, a bug):
//!   sending it again fails again, so the server parks the work until its desired state changes.
//!
//! Known codes are listed in [`ERRORS`]; a code that is not listed gets the default of its kind of
//! error ([`default_for`]): an unknown 4xx is repaired, never parked, so that an error the worker
//! does not know cannot park the cluster.

use clb_nrp::NrpError;

/// What the server should do with work that failed with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Handling {
    /// Send the same work again after a backoff (`Retry-After` when NRP sent one).
    Retry,
    /// Read NRP back first (the actual state is wrong or unknown), then send the work again.
    Repair,
    /// Park the work until its desired state changes: it is invalid whatever NRP holds.
    Park,
}

impl Handling {
    /// The word docs/errors.md uses for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Handling::Retry => "retry",
            Handling::Repair => "repair",
            Handling::Park => "park",
        }
    }
}

/// One row of the error table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorRow {
    /// The ARM error code (or the worker's own code, or a `(…)` label for a default row).
    pub code: &'static str,
    /// The HTTP status NRP answers it with (`None`: no HTTP answer, or several).
    pub status: Option<u16>,
    /// What the worker reports, and so what the server does.
    pub handling: Handling,
    /// Why.
    pub why: &'static str,
}

const fn row(code: &'static str, status: u16, handling: Handling, why: &'static str) -> ErrorRow {
    ErrorRow {
        code,
        status: Some(status),
        handling,
        why,
    }
}

const fn local(code: &'static str, handling: Handling, why: &'static str) -> ErrorRow {
    ErrorRow {
        code,
        status: None,
        handling,
        why,
    }
}

use Handling::{Park, Repair, Retry};

/// Every error the worker can meet, with its handling. Rows whose code is in parentheses are the
/// defaults of a kind of error for codes not listed.
#[rustfmt::skip]
pub const ERRORS: &[ErrorRow] = &[
    // Throttling, server errors and conflicting operations: nothing learnt about NRP's state.
    row("TooManyRequests", 429, Retry, "throttled: after Retry-After; the gateway's concurrency limit is halved"),
    row("SubscriptionRequestsThrottled", 429, Retry, "the subscription's ARM write budget is spent: after Retry-After; the gateway's concurrency limit is halved"),
    row("(other 429)", 429, Retry, "throttled, whatever the code"),
    row("AnotherOperationInProgress", 409, Retry, "another operation holds the resource: after Retry-After; counts as throttling"),
    row("InternalServerError", 500, Retry, "a server-side failure; NRP applied nothing"),
    row("ServiceUnavailable", 503, Retry, "NRP is unavailable for a while (Retry-After)"),
    row("(other 5xx)", 500, Retry, "a server-side failure (502, …) or a malformed success (MissingResourceId, InvalidResponseBody, InvalidNextLink, TooManyPages)"),
    row("PublicIPCountLimitReached", 400, Retry, "no public address left; frees up as services are deleted"),
    row("DnsRecordInUse", 400, Retry, "another public IP of the region has the DNS label clb's own public IP is to get: frees up when that one drops it"),
    row("InvalidResourceReference", 400, Retry, "the request names a load balancer, pool or NAT gateway NRP lacks (deleted meanwhile): the saga creates its resources again from its first step"),
    row("AuthorizationFailed", 403, Retry, "the worker's identity lacks a permission: an operator fixes it, the work goes on by itself"),
    row("(other 401/403)", 401, Retry, "the token is refused (InvalidAuthenticationToken, …): an operator fixes it"),
    local("CredentialUnavailable", Retry, "no token could be acquired; nothing was sent"),
    local("WorkerCancelled", Retry, "the worker is shutting down or lost its stream; no new call was sent"),
    local("Aborted", Retry, "not started because another part of the unit failed"),
    // The server's actual state is wrong, or unknown: read NRP back, then retry.
    row("ServiceNotRegistered", 400, Repair, "an address refers to a service NRP does not have: the server believed it registered"),
    row("ServiceWithOverlayMappingsCannotBeDeleted", 400, Repair, "NRP addresses still refer to the service: the server believed it drained"),
    row("InUseBackendAddressPoolCannotBeDeleted", 400, Repair, "a registered service still uses the pool: the server believed it unregistered"),
    row("InUseLoadBalancerCannotBeDeleted", 400, Repair, "a registered service still uses the load balancer: the server believed it unregistered"),
    row("InUseNatGatewayCannotBeDeleted", 400, Repair, "a registered service still uses the NAT gateway: the server believed it unregistered"),
    row("InUsePublicIpAddressCannotBeDeleted", 400, Repair, "a load balancer or NAT gateway still uses the public IP"),
    row("PublicIPAddressInUse", 400, Repair, "the public IP is used by another resource than the one being written"),
    row("ResourceNotFound", 404, Repair, "something the server believes exists does not (a DELETE of a missing resource succeeds and a missing gateway is created, so these are not errors)"),
    row("(other 404)", 404, Repair, "NotFound, OperationNotFound, …: as ResourceNotFound"),
    row("(other 409)", 409, Repair, "a conflict with what NRP holds"),
    row("GatewayTimeout", 504, Repair, "NRP timed out: the change may or may not have been applied"),
    local("Timeout", Repair, "no answer within the request timeout: the change may or may not have been applied"),
    local("Transport", Repair, "the connection failed or broke: the change may or may not have been applied"),
    local("LeaseExpired", Repair, "the lease ended before or during a call: a call cut off may or may not have been applied"),
    local("OperationUnconfirmed", Repair, "a long-running operation was accepted, but a poll was answered with an error: it may or may not complete"),
    local("(failed operation)", Repair, "a long-running operation ended Failed or Canceled: handled as its error code when listed here, otherwise repaired (it may have applied part of the change)"),
    row("(other 4xx)", 400, Repair, "a rule the worker does not know may depend on NRP's state: never parked on a guess; repaired once (read back, sent again), then, refused again with the same code, held on the refusal schedule"),
    // Invalid whatever NRP holds: park until the desired state changes.
    row("DuplicateLocationsInRequest", 400, Park, "a location twice in one call: a worker bug"),
    row("DuplicateAddressesInRequest", 400, Park, "an address twice in one location: a server bug"),
    row("DuplicateServicesInRequest", 400, Park, "a service twice in one call: a worker bug"),
    row("DuplicateResourceName", 400, Park, "two sub-resources with one name: a worker bug"),
    row("InvalidAddress", 400, Park, "an address that is not an IP"),
    row("InvalidAddressLocation", 400, Park, "a location that is not an IP"),
    row("AddressFamilyMismatch", 400, Park, "an IPv6 address at an IPv4 location (or the reverse)"),
    row("InvalidServiceName", 400, Park, "a service name NRP does not accept"),
    row("MissingServiceType", 400, Park, "a service registered without a type: a worker bug"),
    row("MissingLoadBalancerBackendPool", 400, Park, "an inbound service without a pool: a worker bug"),
    row("MissingPublicNatGatewayId", 400, Park, "an outbound service without a NAT gateway: a worker bug"),
    row("InvalidLoadBalancingRule", 400, Park, "a rule NRP refuses"),
    row("RulesUseSameFrontendIpAndPort", 400, Park, "two rules on one frontend port and protocol"),
    row("LoadBalancingRuleIdleTimeoutOutOfRange", 400, Park, "a rule's idle timeout outside 4 to 30 minutes (the worker refuses one before any call)"),
    row("InvalidLoadDistribution", 400, Park, "a rule's loadDistribution NRP does not know: a worker bug"),
    row("InvalidDomainNameLabel", 400, Park, "a DNS label Azure refuses (the worker refuses one before any call)"),
    row("InvalidPublicIPAddressVersion", 400, Park, "a public IP of an unknown IP version: a worker bug"),
    row("InvalidResourceName", 400, Park, "a resource name ARM refuses (a service name that makes an invalid lb-/natgw-/pip- name)"),
    row("LocationRequired", 400, Park, "a resource without a region: a configuration error"),
    row("InvalidResourceLocation", 400, Park, "the gateway exists in another region than configured"),
    row("InvalidRequestFormat", 400, Park, "a body NRP cannot parse: a worker bug"),
    row("MissingApiVersionParameter", 400, Park, "no api-version: a client bug"),
    row("InvalidApiVersionParameter", 400, Park, "an api-version NRP does not serve"),
    row("MethodNotAllowed", 405, Park, "a client bug"),
    row("RequestBodyTooLarge", 413, Park, "a call larger than NRP accepts: the limits are misconfigured"),
    row("(501)", 501, Park, "NRP does not implement the operation"),
    local("InvalidWorkUnit", Park, "the unit carries no work: a server bug"),
    local("InvalidServiceChange", Park, "a service change without a name, kind or action, a port no rule can have, or settings no load balancer can have (an idle timeout outside 4 to 30, an invalid DNS label, a brought public IP named wrongly or with a DNS label)"),
    local("InvalidLocationChange", Park, "a location change without a location or action, or a location twice in a unit"),
    local("InvalidResourceId", Park, "NRP returned a resource id that does not parse"),
    local("NatGatewayResourceGroupNotConfigured", Park, "an egress brings a NAT gateway, but its gateway has no NAT gateway resource group: bringing one is off"),
    local("NatGatewayNotFound", Park, "the NAT gateway an egress brings does not exist (deleted out of band, or misnamed): it is not created"),
    local("NatGatewayNotStandardV2", Park, "the NAT gateway an egress brings is not StandardV2: it cannot be linked to a Service Gateway"),
    local("NatGatewayLinkedElsewhere", Park, "the NAT gateway an egress brings is linked to another Service Gateway: clb does not take it over"),
    local("NatGatewayNameReserved", Park, "the NAT gateway an egress brings has the name of the one clb would create for it, in the gateway's resource group"),
    local("PublicIpNotFound", Park, "the public IP a service brings does not exist (by name, or no public IP of the gateway's resource group holds its address): it is not created"),
    local("PublicIpNotStandardV2", Park, "the public IP a service brings is not StandardV2, the SKU of a Container Load Balancer's frontend"),
    local("PublicIpNotStatic", Park, "the public IP a service brings is not static"),
    local("PublicIpFamilyMismatch", Park, "the public IP a service brings is of the other IP family than the service"),
    local("PublicIpInUse", Park, "the public IP a service brings is used by another frontend (or a NAT gateway) than the service's load balancer's"),
    local("PublicIpNameReserved", Park, "the public IP a service brings is the pip-{name} clb creates (and deletes) for it in the gateway's resource group"),
];

/// The row of `code`, if it is listed.
pub fn row_of(code: &str) -> Option<&'static ErrorRow> {
    ERRORS
        .iter()
        .find(|r| !r.code.starts_with('(') && r.code.eq_ignore_ascii_case(code))
}

/// The default handling of an error whose code is not listed: by its kind.
pub fn default_for(e: &NrpError) -> Handling {
    match e {
        NrpError::Throttled { .. } | NrpError::Auth { .. } => Retry,
        NrpError::Conflict { .. } | NrpError::NotFound { .. } | NrpError::Validation { .. } => {
            Repair
        }
        NrpError::Server { status: 501, .. } => Park,
        NrpError::Server { status: 504, .. } => Repair,
        NrpError::Server { .. } => Retry,
        NrpError::Transport { .. } | NrpError::DeadlineExceeded | NrpError::Unconfirmed { .. } => {
            Repair
        }
        NrpError::OperationFailed { .. } => Repair,
    }
}

/// How the worker handles `e`: its code's row when listed, the default of its kind otherwise.
pub fn classify(e: &NrpError) -> Handling {
    let listed = match e {
        // The kind decides for these whatever the code (a 429 is never parked, a timeout's code is
        // a label).
        NrpError::Throttled { .. }
        | NrpError::Transport { .. }
        | NrpError::DeadlineExceeded
        | NrpError::Unconfirmed { .. }
        | NrpError::Auth { .. } => None,
        NrpError::Server {
            status: 501 | 504, ..
        } => None,
        _ => row_of(e.code()),
    };
    listed.map_or_else(|| default_for(e), |r| r.handling)
}

/// Whether `e` is a refusal the table does not list: a 4xx other than throttling, a conflict, a
/// not-found or an authorization failure, whose code has no row (the "(other 4xx)" default). Its
/// repair is reported `refused`, so that a repeat after the read-back is held on the server's
/// refusal schedule.
pub fn unknown_refusal(e: &NrpError) -> bool {
    matches!(e, NrpError::Validation { .. }) && row_of(e.code()).is_none()
}

/// Whether `e` is a **deterministic refusal** of a call: an NRP 4xx that is not throttling (429), a
/// conflict (409), a 404 or an authentication error, and whose code is parked by the table or not
/// listed at all (the `(other 4xx)` default) — not one of the listed codes that depend on the
/// server's view of NRP (`ServiceNotRegistered`, the `InUse…` codes, …) nor one that frees up by
/// itself (`PublicIPCountLimitReached`, …). Sent again, the same call is refused again; sent
/// without the location that causes it, the rest may go through (docs/errors.md, "A refused call
/// is split").
pub fn is_refusal(e: &NrpError) -> bool {
    match e {
        NrpError::Validation { code, .. } => row_of(code).is_none_or(|r| r.handling == Park),
        _ => false,
    }
}

/// The IP addresses an NRP error message names, canonical (an IPv4-mapped IPv6 address is its IPv4
/// address), each once, in order: the IP literals of the text, quoted or not (`'10.1.2.3'`,
/// `"fd00::1"`, `10.1.2.3.` at the end of a sentence, `[fd00::1]:443`, `10.1.2.3:80`). A literal
/// glued to a word (`v10.1.2.3`) is not one.
pub fn addresses_named(message: &str) -> Vec<std::net::IpAddr> {
    fn literal(run: &str) -> Option<std::net::IpAddr> {
        let trimmed = run.trim_end_matches(['.', ':']);
        let without_port = run
            .rsplit_once(':')
            .filter(|(host, _)| host.contains('.') && !host.contains(':'))
            .map(|(host, _)| host);
        [Some(run), Some(trimmed), without_port]
            .into_iter()
            .flatten()
            .find_map(|c| c.parse::<std::net::IpAddr>().ok())
            .map(|ip| ip.to_canonical())
    }
    let in_run = |c: char| c.is_ascii_hexdigit() || c == '.' || c == ':';
    let in_word = |c: char| c.is_alphanumeric() || c == '_';
    let mut found = Vec::new();
    let mut rest = message;
    let mut before: Option<char> = None;
    while let Some(start) = rest.find(in_run) {
        let prev = rest[..start].chars().next_back().or(before);
        let tail = &rest[start..];
        let end = tail.find(|c: char| !in_run(c)).unwrap_or(tail.len());
        let (run, after) = (&tail[..end], &tail[end..]);
        let glued = prev.is_some_and(in_word) || after.chars().next().is_some_and(in_word);
        if !glued
            && let Some(ip) = literal(run)
            && !found.contains(&ip)
        {
            found.push(ip);
        }
        before = run.chars().next_back();
        rest = after;
    }
    found
}

/// Whether a call that failed with `e` may have been applied by NRP all the same: no answer (a
/// timeout, a broken connection, a deadline that cut the call off, a 504), or a long-running
/// operation that was accepted and then not followed to its end or failed part-way.
pub fn outcome_unknown(e: &NrpError) -> bool {
    matches!(
        e,
        NrpError::Transport { .. }
            | NrpError::DeadlineExceeded
            | NrpError::Unconfirmed { .. }
            | NrpError::OperationFailed { .. }
            | NrpError::Server { status: 504, .. }
    )
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::time::Duration;

    use super::*;

    /// The error the ARM client makes of an answer with `status` and ARM `code` (as
    /// `clb_nrp::azure`'s mapping of a non-success response).
    pub(super) fn from_status(status: u16, code: &str) -> NrpError {
        let (code, message) = (code.to_string(), format!("{code} (test)"));
        let retry_after = Some(Duration::from_secs(1));
        match status {
            429 => NrpError::Throttled {
                code,
                message,
                retry_after,
            },
            409 => NrpError::Conflict {
                code,
                message,
                retry_after,
            },
            404 => NrpError::NotFound { code, message },
            401 | 403 => NrpError::Auth { code, message },
            400..=499 => NrpError::Validation { code, message },
            s => NrpError::Server {
                status: s,
                code,
                message,
                retry_after,
            },
        }
    }

    #[test]
    fn codes_are_listed_once() {
        let mut seen = HashSet::new();
        for r in ERRORS {
            assert!(seen.insert(r.code.to_ascii_lowercase()), "{} twice", r.code);
            assert!(!r.why.is_empty());
        }
    }

    #[test]
    fn a_listed_code_is_handled_as_listed_in_any_case() {
        let e = from_status(400, "servicenotregistered");
        assert_eq!(classify(&e), Repair);
        // The kind decides for a throttling answer, whatever code it carries.
        assert_eq!(
            classify(&from_status(429, "DuplicateLocationsInRequest")),
            Retry
        );
    }

    #[test]
    fn refusals_are_the_parked_and_unlisted_4xx_only() {
        for (status, code) in [
            (400, "AddressRefusedByPolicy"),
            (400, "BackendPoolAddressesMustHaveSameIpVersion"),
            (400, "InvalidAddress"),
            (400, "addressfamilymismatch"),
            (413, "RequestBodyTooLarge"),
        ] {
            assert!(is_refusal(&from_status(status, code)), "{status} {code}");
        }
        for (status, code) in [
            (429, "TooManyRequests"),
            (409, "Conflict"),
            (409, "AnotherOperationInProgress"),
            (404, "ResourceNotFound"),
            (403, "AuthorizationFailed"),
            (400, "ServiceNotRegistered"),
            (400, "ServiceWithOverlayMappingsCannotBeDeleted"),
            (400, "InUseBackendAddressPoolCannotBeDeleted"),
            (400, "PublicIPAddressInUse"),
            (400, "PublicIPCountLimitReached"),
            (500, "InternalServerError"),
            (503, "ServiceUnavailable"),
            (501, "NotImplemented"),
        ] {
            assert!(!is_refusal(&from_status(status, code)), "{status} {code}");
        }
        assert!(!is_refusal(&NrpError::OperationFailed {
            status: "Failed".into(),
            code: "InvalidAddress".into(),
            message: String::new(),
        }));
    }

    fn ips(list: &[&str]) -> Vec<std::net::IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn addresses_are_read_from_azure_shaped_messages() {
        // Quoted, as Azure names an address (and its location).
        assert_eq!(
            addresses_named(
                "Address '10.1.2.3' at location '10.0.0.1' of service gateway 'sg' is refused by a \
                 policy of the subscription."
            ),
            ips(&["10.1.2.3", "10.0.0.1"])
        );
        // Unquoted, at the end of a sentence, double-quoted, with a port.
        assert_eq!(
            addresses_named("The address 10.1.2.3. Also \"10.1.2.4\" and 10.1.2.5:8080, 10.1.2.6:"),
            ips(&["10.1.2.3", "10.1.2.4", "10.1.2.5", "10.1.2.6"])
        );
        // IPv6: compressed, written differently, bracketed with a port, mapped IPv4.
        assert_eq!(
            addresses_named(
                "address 'fd01:0:0::0001' at location 'fd00::1' is IPv6; [2001:db8::7]:443; \
                 ::ffff:10.9.9.9 and ::1"
            ),
            ips(&["fd01::1", "fd00::1", "2001:db8::7", "10.9.9.9", "::1"])
        );
        // BackendPoolAddressesMustHaveSameIpVersion as the emulator words it: two addresses.
        assert_eq!(
            addresses_named(
                "address 'fd01::1' at location 'fd00::1' is IPv6 and refers to service 'svc-a', \
                 whose backend pool would also hold IPv4 address '10.1.0.2' of this request"
            ),
            ips(&["fd01::1", "fd00::1", "10.1.0.2"])
        );
        // No address: words of hex letters, versions, numbers, an IP glued to a word, each once.
        assert!(
            addresses_named(
                "A deadbeef cafe: the policy 'add-face' at api-version 2026-03-01 refused 12 of \
                 the request's addresses (v10.1.2.3, ab::cd::ef, 1.2.3, 300.1.1.1)."
            )
            .is_empty()
        );
        assert_eq!(
            addresses_named("'10.1.2.3' and '10.1.2.3' again"),
            ips(&["10.1.2.3"])
        );
    }

    #[test]
    fn only_calls_without_a_clear_answer_have_an_unknown_outcome() {
        assert!(outcome_unknown(&NrpError::Transport {
            message: "reset".into(),
            timeout: false
        }));
        assert!(outcome_unknown(&from_status(504, "GatewayTimeout")));
        assert!(outcome_unknown(&NrpError::DeadlineExceeded));
        assert!(outcome_unknown(&NrpError::Unconfirmed {
            code: "InternalServerError".into(),
            message: String::new(),
        }));
        assert!(!outcome_unknown(&from_status(500, "InternalServerError")));
        assert!(!outcome_unknown(&from_status(400, "ServiceNotRegistered")));
        assert!(!outcome_unknown(&from_status(429, "TooManyRequests")));
    }
}

/// docs/errors.md is the table in prose: the same rows, in the same order.
#[cfg(test)]
mod docs {
    use super::*;

    #[test]
    fn every_row_is_documented() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/errors.md");
        let text = std::fs::read_to_string(path).expect("docs/errors.md");
        let documented: Vec<(String, String, String)> = text
            .lines()
            .filter(|l| l.starts_with("| `"))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                (
                    cells[1].trim_matches('`').to_string(),
                    cells[2].to_string(),
                    cells[3].to_string(),
                )
            })
            .collect();
        let coded: Vec<(String, String, String)> = ERRORS
            .iter()
            .map(|r| {
                (
                    r.code.to_string(),
                    r.status.map_or("—".to_string(), |s| s.to_string()),
                    r.handling.as_str().to_string(),
                )
            })
            .collect();
        assert_eq!(documented, coded, "docs/errors.md and ERRORS differ");
    }
}

/// One test per row of [`ERRORS`]: the error the worker meets is classified as the row says, and
/// becomes the report outcome that makes the server retry, repair or park.
#[cfg(test)]
mod rows {
    use clb_proto::v1::report;

    use super::super::ctx::UnitError;
    use super::*;

    fn http(status: u16, code: &str) -> UnitError {
        UnitError::from(super::tests::from_status(status, code))
    }

    fn invalid(code: &'static str) -> UnitError {
        UnitError::Invalid {
            code,
            message: "invalid (test)".into(),
        }
    }

    /// Checks that `error`, met by a unit, is handled as the row of `code` says.
    fn check(code: &str, error: UnitError) {
        let row = ERRORS
            .iter()
            .find(|r| r.code == code)
            .unwrap_or_else(|| panic!("no row {code}"));
        assert_eq!(error.handling(), row.handling, "{code}: {error:?}");
        let outcome = error.outcome();
        let reported = match (&outcome, row.handling) {
            (report::Outcome::Retryable(r), Handling::Retry) => &r.code,
            (report::Outcome::Repair(r), Handling::Repair) => &r.code,
            (report::Outcome::Terminal(t), Handling::Park) => &t.code,
            (other, h) => panic!("{code}: {h:?} reported as {other:?}"),
        };
        assert_eq!(reported, error.code());
        if !row.code.starts_with('(') {
            assert_eq!(reported, row.code, "the report carries the row's code");
        }
        if let (report::Outcome::Retryable(r), UnitError::Nrp(e)) = (&outcome, &error)
            && e.retry_after().is_some()
        {
            assert_eq!(r.retry_after_ms, 1_000, "Retry-After is passed on");
        }
    }

    macro_rules! rows {
        ($($test:ident: $code:literal => $error:expr;)*) => {
            $(
                #[test]
                fn $test() {
                    check($code, $error);
                }
            )*

            /// The codes the tests above cover.
            const TESTED: &[&str] = &[$($code),*];
        };
    }

    rows! {
        too_many_requests: "TooManyRequests" => http(429, "TooManyRequests");
        subscription_requests_throttled: "SubscriptionRequestsThrottled" => http(429, "SubscriptionRequestsThrottled");
        other_429: "(other 429)" => http(429, "RetryableErrorDueToAnotherOperation");
        another_operation_in_progress: "AnotherOperationInProgress" => http(409, "AnotherOperationInProgress");
        internal_server_error: "InternalServerError" => http(500, "InternalServerError");
        service_unavailable: "ServiceUnavailable" => http(503, "ServiceUnavailable");
        other_5xx: "(other 5xx)" => http(502, "");
        public_ip_count_limit_reached: "PublicIPCountLimitReached" => http(400, "PublicIPCountLimitReached");
        dns_record_in_use: "DnsRecordInUse" => http(400, "DnsRecordInUse");
        invalid_resource_reference: "InvalidResourceReference" => http(400, "InvalidResourceReference");
        authorization_failed: "AuthorizationFailed" => http(403, "AuthorizationFailed");
        other_401_403: "(other 401/403)" => http(401, "InvalidAuthenticationToken");
        credential_unavailable: "CredentialUnavailable" => UnitError::Nrp(NrpError::Auth {
            code: "CredentialUnavailable".into(),
            message: "no token".into(),
        });
        worker_cancelled: "WorkerCancelled" => UnitError::Cancelled;
        aborted: "Aborted" => UnitError::Aborted;
        service_not_registered: "ServiceNotRegistered" => http(400, "ServiceNotRegistered");
        overlay_mappings: "ServiceWithOverlayMappingsCannotBeDeleted" => http(400, "ServiceWithOverlayMappingsCannotBeDeleted");
        in_use_pool: "InUseBackendAddressPoolCannotBeDeleted" => http(400, "InUseBackendAddressPoolCannotBeDeleted");
        in_use_load_balancer: "InUseLoadBalancerCannotBeDeleted" => http(400, "InUseLoadBalancerCannotBeDeleted");
        in_use_nat_gateway: "InUseNatGatewayCannotBeDeleted" => http(400, "InUseNatGatewayCannotBeDeleted");
        in_use_public_ip: "InUsePublicIpAddressCannotBeDeleted" => http(400, "InUsePublicIpAddressCannotBeDeleted");
        public_ip_in_use: "PublicIPAddressInUse" => http(400, "PublicIPAddressInUse");
        resource_not_found: "ResourceNotFound" => http(404, "ResourceNotFound");
        other_404: "(other 404)" => http(404, "NotFound");
        other_409: "(other 409)" => http(409, "Conflict");
        gateway_timeout: "GatewayTimeout" => http(504, "GatewayTimeout");
        timeout: "Timeout" => UnitError::from(NrpError::Transport {
            message: "timed out".into(),
            timeout: true,
        });
        transport: "Transport" => UnitError::from(NrpError::Transport {
            message: "connection reset".into(),
            timeout: false,
        });
        lease_expired: "LeaseExpired" => UnitError::from(NrpError::DeadlineExceeded);
        operation_unconfirmed: "OperationUnconfirmed" => UnitError::from(NrpError::Unconfirmed {
            code: "InternalServerError".into(),
            message: "a poll failed".into(),
        });
        failed_operation: "(failed operation)" => UnitError::from(NrpError::OperationFailed {
            status: "Failed".into(),
            code: "SomethingWentWrong".into(),
            message: "failed".into(),
        });
        other_4xx: "(other 4xx)" => http(400, "ARuleNobodyKnows");
        duplicate_locations: "DuplicateLocationsInRequest" => http(400, "DuplicateLocationsInRequest");
        duplicate_addresses: "DuplicateAddressesInRequest" => http(400, "DuplicateAddressesInRequest");
        duplicate_services: "DuplicateServicesInRequest" => http(400, "DuplicateServicesInRequest");
        duplicate_resource_name: "DuplicateResourceName" => http(400, "DuplicateResourceName");
        invalid_address: "InvalidAddress" => http(400, "InvalidAddress");
        invalid_address_location: "InvalidAddressLocation" => http(400, "InvalidAddressLocation");
        address_family_mismatch: "AddressFamilyMismatch" => http(400, "AddressFamilyMismatch");
        invalid_service_name: "InvalidServiceName" => http(400, "InvalidServiceName");
        missing_service_type: "MissingServiceType" => http(400, "MissingServiceType");
        missing_backend_pool: "MissingLoadBalancerBackendPool" => http(400, "MissingLoadBalancerBackendPool");
        missing_nat_gateway_id: "MissingPublicNatGatewayId" => http(400, "MissingPublicNatGatewayId");
        invalid_load_balancing_rule: "InvalidLoadBalancingRule" => http(400, "InvalidLoadBalancingRule");
        rules_use_same_frontend: "RulesUseSameFrontendIpAndPort" => http(400, "RulesUseSameFrontendIpAndPort");
        idle_timeout_out_of_range: "LoadBalancingRuleIdleTimeoutOutOfRange" => http(400, "LoadBalancingRuleIdleTimeoutOutOfRange");
        invalid_load_distribution: "InvalidLoadDistribution" => http(400, "InvalidLoadDistribution");
        invalid_domain_name_label: "InvalidDomainNameLabel" => http(400, "InvalidDomainNameLabel");
        invalid_public_ip_version: "InvalidPublicIPAddressVersion" => http(400, "InvalidPublicIPAddressVersion");
        invalid_resource_name: "InvalidResourceName" => http(400, "InvalidResourceName");
        location_required: "LocationRequired" => http(400, "LocationRequired");
        invalid_resource_location: "InvalidResourceLocation" => http(400, "InvalidResourceLocation");
        invalid_request_format: "InvalidRequestFormat" => http(400, "InvalidRequestFormat");
        missing_api_version: "MissingApiVersionParameter" => http(400, "MissingApiVersionParameter");
        invalid_api_version: "InvalidApiVersionParameter" => http(400, "InvalidApiVersionParameter");
        method_not_allowed: "MethodNotAllowed" => http(405, "MethodNotAllowed");
        request_body_too_large: "RequestBodyTooLarge" => http(413, "RequestBodyTooLarge");
        not_implemented: "(501)" => http(501, "NotImplemented");
        invalid_work_unit: "InvalidWorkUnit" => invalid("InvalidWorkUnit");
        invalid_service_change: "InvalidServiceChange" => invalid("InvalidServiceChange");
        invalid_location_change: "InvalidLocationChange" => invalid("InvalidLocationChange");
        invalid_resource_id: "InvalidResourceId" => invalid("InvalidResourceId");
        nat_rg_not_configured: "NatGatewayResourceGroupNotConfigured" => invalid("NatGatewayResourceGroupNotConfigured");
        nat_not_found: "NatGatewayNotFound" => invalid("NatGatewayNotFound");
        nat_not_standard_v2: "NatGatewayNotStandardV2" => invalid("NatGatewayNotStandardV2");
        nat_linked_elsewhere: "NatGatewayLinkedElsewhere" => invalid("NatGatewayLinkedElsewhere");
        nat_name_reserved: "NatGatewayNameReserved" => invalid("NatGatewayNameReserved");
        pip_not_found: "PublicIpNotFound" => invalid("PublicIpNotFound");
        pip_not_standard_v2: "PublicIpNotStandardV2" => invalid("PublicIpNotStandardV2");
        pip_not_static: "PublicIpNotStatic" => invalid("PublicIpNotStatic");
        pip_family_mismatch: "PublicIpFamilyMismatch" => invalid("PublicIpFamilyMismatch");
        pip_in_use: "PublicIpInUse" => invalid("PublicIpInUse");
        pip_name_reserved: "PublicIpNameReserved" => invalid("PublicIpNameReserved");
    }

    #[test]
    fn every_row_has_its_test() {
        let rows: Vec<&str> = ERRORS.iter().map(|r| r.code).collect();
        assert_eq!(TESTED, rows.as_slice());
    }

    #[test]
    fn a_failed_operation_with_a_listed_code_is_handled_as_that_code() {
        let e = UnitError::from(NrpError::OperationFailed {
            status: "Failed".into(),
            code: "ServiceWithOverlayMappingsCannotBeDeleted".into(),
            message: String::new(),
        });
        assert_eq!(e.handling(), Handling::Repair);
        let e = UnitError::from(NrpError::OperationFailed {
            status: "Failed".into(),
            code: "InvalidAddress".into(),
            message: String::new(),
        });
        assert_eq!(e.handling(), Handling::Park);
    }
}
