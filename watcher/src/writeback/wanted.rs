//! The condition (and Event) a Service is to show for what the server reports ([`Wanted`]).

use clb_proto::v1::{ProgrammingReason, ServiceState};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::runtime::events::EventType;

use super::{CONDITION_TYPE, ServiceFacts};

/// Our condition among `conditions`.
pub(super) fn ours(conditions: &[Condition]) -> Option<&Condition> {
    conditions.iter().find(|c| c.type_ == CONDITION_TYPE)
}

/// `s` cut to at most `max` bytes (on a character boundary).
pub(super) fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max.saturating_sub(3);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

/// The condition (and Event) a Service is to show for what the server reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wanted {
    /// `"True"` or `"False"`.
    pub status: &'static str,
    /// CamelCase: `Programmed`, `Pending`, `RejectedByAzure`, `Throttled`, `Retrying`,
    /// `HeldBack`, `PortNameConflict`.
    pub reason: &'static str,
    pub message: String,
    /// The ARM error code, for the reasons that have one.
    pub error_code: String,
    /// The Event to publish when the condition changes to this one (`None`: no Event).
    pub event: Option<EventType>,
}

impl Wanted {
    /// From `GetService` (`None`: the server does not know the service yet) and the translator's
    /// port-name conflicts of the Service.
    pub(crate) fn of(state: Option<&ServiceState>, port_conflicts: &[String]) -> Self {
        let pending = |message: &str| Self {
            status: "False",
            reason: "Pending",
            message: message.to_owned(),
            error_code: String::new(),
            event: None,
        };
        let mut w = match state {
            None => pending("waiting for the state server to take the Service"),
            Some(s) => {
                let c = s.condition.clone().unwrap_or_default();
                let reason =
                    ProgrammingReason::try_from(c.reason).unwrap_or(ProgrammingReason::Unspecified);
                let failure = |reason: &'static str, text: &str| Self {
                    status: "False",
                    reason,
                    message: format!("{text}: {}: {}", c.error_code, c.error_message),
                    error_code: c.error_code.clone(),
                    event: Some(EventType::Warning),
                };
                match reason {
                    ProgrammingReason::Programmed if !s.frontend_ip.is_empty() => Self {
                        status: "True",
                        reason: "Programmed",
                        message: format!(
                            "programmed in Azure: frontend IP {}, {} backends",
                            s.frontend_ip, s.actual_addresses
                        ),
                        error_code: String::new(),
                        event: Some(EventType::Normal),
                    },
                    ProgrammingReason::Rejected => {
                        let what = match (c.address.as_str(), c.location.as_str()) {
                            ("", "") => "Azure rejected the load balancer".to_owned(),
                            ("", l) => format!("Azure refused the backends at location {l}"),
                            (a, l) => format!("Azure refused backend address {a} at location {l}"),
                        };
                        failure(
                            "RejectedByAzure",
                            &format!(
                                "{what}; it is held and sent again on the refusal schedule, or at \
                                 once when the Service changes"
                            ),
                        )
                    }
                    ProgrammingReason::Throttled => {
                        failure("Throttled", "Azure throttles the requests; retrying")
                    }
                    ProgrammingReason::Retrying => {
                        failure("Retrying", "programming failed; retrying")
                    }
                    ProgrammingReason::HeldBack => Self {
                        status: "False",
                        reason: "HeldBack",
                        message: c.message.clone(),
                        error_code: String::new(),
                        event: Some(EventType::Normal),
                    },
                    _ => pending("waiting for Azure to program the load balancer and its backends"),
                }
            }
        };
        if !port_conflicts.is_empty() {
            let conflicts = port_conflicts.join("; ");
            if matches!(w.reason, "Programmed" | "Pending") {
                w.reason = "PortNameConflict";
                w.event = None; // published per conflict (PortNameConflict Events)
            }
            w.message = format!("{}; port name conflict: {conflicts}", w.message);
        }
        w
    }

    /// For a Service clb refuses (`crate::settings`): the reason names the setting, with a
    /// Warning Event.
    pub(crate) fn refused(r: &crate::settings::Refusal) -> Self {
        Self {
            status: "False",
            reason: r.reason,
            message: r.message(),
            error_code: String::new(),
            event: Some(EventType::Warning),
        }
    }

    /// The whole `status.conditions` list with ours replaced, when ours differs from the one the
    /// Service shows (`None`: nothing to patch). `lastTransitionTime` changes only with the status.
    pub(crate) fn condition(&self, facts: &ServiceFacts) -> Option<Vec<Condition>> {
        let message = truncate(self.message.clone(), 32 * 1024);
        let current = ours(&facts.conditions);
        if let Some(c) = current
            && c.status == self.status
            && c.reason == self.reason
            && c.message == message
            && c.observed_generation == facts.generation
        {
            return None;
        }
        let last_transition_time = match current {
            Some(c) if c.status == self.status => c.last_transition_time.clone(),
            _ => Time(now_seconds()),
        };
        let mine = Condition {
            type_: CONDITION_TYPE.to_owned(),
            status: self.status.to_owned(),
            reason: self.reason.to_owned(),
            message,
            last_transition_time,
            observed_generation: facts.generation,
        };
        let mut list: Vec<Condition> = facts
            .conditions
            .iter()
            .filter(|c| c.type_ != CONDITION_TYPE)
            .cloned()
            .collect();
        list.push(mine);
        Some(list)
    }
}

/// Now, to the second (`metav1.Time` is serialized in RFC 3339 seconds).
pub(super) fn now_seconds() -> k8s_openapi::jiff::Timestamp {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now)
}
