//! IP families of LoadBalancer Services: one inbound identity per family.
//!
//! Azure serves a dual-stack Service as one unit per IP family (its own public IP, load balancer,
//! backend pool and Service Gateway service), as cloud-provider-azure does. The **primary** family
//! is `spec.ipFamilies[0]` (immutable in Kubernetes): its identity is the Service UID, as before
//! families. The secondary family of a dual-stack Service (`spec.ipFamilyPolicy`
//! `PreferDualStack` or `RequireDualStack` with two `ipFamilies`) is a second identity,
//! `{uid}-v6` or `{uid}-v4`. Each identity is sent with its family and the endpoints of its
//! family only (IPv4 EndpointSlices to the IPv4 identity, IPv6 ones to the IPv6 identity).
//!
//! A Service whose `spec.ipFamilies` is absent (an API server from before dual stack; every API
//! server since Kubernetes 1.20 fills it in) is served as before families: one identity, its UID,
//! with no stated family (an IPv4 frontend) and the endpoints of both families.

use clb_proto::v1::IpFamily;
use k8s_openapi::api::core::v1::Service;

use crate::decode::ObjKey;

/// The suffix of the identity of a secondary IPv4 family.
pub const V4_SUFFIX: &str = "-v4";
/// The suffix of the identity of a secondary IPv6 family.
pub const V6_SUFFIX: &str = "-v6";

/// The families a Service asks for, primary first (at most two, distinct); empty when
/// `spec.ipFamilies` states none. `SingleStack` (or no policy) keeps the first; an unknown family
/// or policy is logged and skipped (the API server refuses both; a family this watcher does not
/// know cannot be served).
pub fn of_service(key: &ObjKey, svc: &Service) -> Vec<IpFamily> {
    let Some(spec) = &svc.spec else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, f) in spec.ip_families.iter().flatten().enumerate() {
        let family = match f.as_str() {
            "IPv4" => IpFamily::Ipv4,
            "IPv6" => IpFamily::Ipv6,
            other => {
                tracing::warn!(service = %key, field = %format!("spec.ipFamilies[{i}]"), value = %other, "IP family skipped: not IPv4 or IPv6");
                continue;
            }
        };
        if !out.contains(&family) {
            out.push(family);
        }
    }
    let dual = match spec.ip_family_policy.as_deref() {
        None | Some("SingleStack") => false,
        Some("PreferDualStack" | "RequireDualStack") => true,
        Some(other) => {
            tracing::warn!(service = %key, field = "spec.ipFamilyPolicy", value = %other, "unknown IP family policy: served as SingleStack");
            false
        }
    };
    out.truncate(if dual { 2 } else { 1 });
    out
}

/// The inbound identity of `family` for a Service of UID `uid` whose primary family is `primary`.
pub fn identity(uid: &str, family: IpFamily, primary: IpFamily) -> String {
    if family == primary {
        return uid.to_owned();
    }
    match family {
        IpFamily::Ipv6 => format!("{uid}{V6_SUFFIX}"),
        _ => format!("{uid}{V4_SUFFIX}"),
    }
}

/// Every identity of a Service of UID `uid` with `families` (of [`of_service`]), primary first,
/// each with the family it is sent with; one of no stated family when `families` is empty.
pub fn identities(uid: &str, families: &[IpFamily]) -> Vec<(String, IpFamily)> {
    match families.first() {
        None => vec![(uid.to_owned(), IpFamily::Unspecified)],
        Some(&primary) => families
            .iter()
            .map(|&f| (identity(uid, f, primary), f))
            .collect(),
    }
}

/// Every identity a Service of UID `uid` may have had, whatever its families were: its UID and
/// both secondary identities (what its cleanup waits for).
pub fn every_identity(uid: &str) -> [String; 3] {
    [
        uid.to_owned(),
        format!("{uid}{V4_SUFFIX}"),
        format!("{uid}{V6_SUFFIX}"),
    ]
}

/// The Service UID of an inbound identity: the identity without its family suffix. A UID never
/// ends with one (Kubernetes UIDs are UUIDs: the last group is hexadecimal).
pub fn service_uid(id: &str) -> &str {
    id.strip_suffix(V6_SUFFIX)
        .or_else(|| id.strip_suffix(V4_SUFFIX))
        .unwrap_or(id)
}

/// Whether an address of family `is_v4` belongs to an identity of `family` (one of no stated
/// family takes both).
pub fn takes(family: IpFamily, is_v4: bool) -> bool {
    match family {
        IpFamily::Unspecified => true,
        IpFamily::Ipv4 => is_v4,
        IpFamily::Ipv6 => !is_v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ServiceSpec;

    fn svc(families: &[&str], policy: Option<&str>) -> Service {
        Service {
            spec: Some(ServiceSpec {
                ip_families: Some(families.iter().map(|s| s.to_string()).collect()),
                ip_family_policy: policy.map(str::to_owned),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn families_follow_the_policy_primary_first() {
        let k = ObjKey::new("ns", "s");
        use IpFamily::{Ipv4, Ipv6};
        assert_eq!(of_service(&k, &Service::default()), vec![]);
        assert_eq!(of_service(&k, &svc(&["IPv6"], None)), vec![Ipv6]);
        assert_eq!(
            of_service(&k, &svc(&["IPv6", "IPv4"], Some("SingleStack"))),
            vec![Ipv6]
        );
        assert_eq!(
            of_service(&k, &svc(&["IPv6", "IPv4"], Some("PreferDualStack"))),
            vec![Ipv6, Ipv4]
        );
        assert_eq!(
            of_service(
                &k,
                &svc(&["IPv4", "IPvX", "IPv4", "IPv6"], Some("RequireDualStack"))
            ),
            vec![Ipv4, Ipv6]
        );
        assert_eq!(
            of_service(&k, &svc(&["IPv4", "IPv6"], Some("Bogus"))),
            vec![Ipv4]
        );
    }

    #[test]
    fn identities_name_the_secondary_family() {
        use IpFamily::{Ipv4, Ipv6, Unspecified};
        assert_eq!(identities("u", &[]), vec![("u".to_owned(), Unspecified)]);
        assert_eq!(
            identities("u", &[Ipv4, Ipv6]),
            vec![("u".to_owned(), Ipv4), ("u-v6".to_owned(), Ipv6)]
        );
        assert_eq!(
            identities("u", &[Ipv6, Ipv4]),
            vec![("u".to_owned(), Ipv6), ("u-v4".to_owned(), Ipv4)]
        );
        assert_eq!(service_uid("u-v6"), "u");
        assert_eq!(service_uid("u-v4"), "u");
        assert_eq!(service_uid("u"), "u");
    }
}
