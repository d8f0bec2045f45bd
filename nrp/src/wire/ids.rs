//! ARM resource ids: `/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Network/{kind}/{name}`.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{API_VERSION, PROVIDER};

/// The top-level resource types this project touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ResourceKind {
    /// `serviceGateways`.
    ServiceGateway,
    /// `publicIPAddresses`.
    PublicIpAddress,
    /// `loadBalancers`.
    LoadBalancer,
    /// `natGateways`.
    NatGateway,
}

impl ResourceKind {
    /// All kinds.
    pub const ALL: [ResourceKind; 4] = [
        Self::ServiceGateway,
        Self::PublicIpAddress,
        Self::LoadBalancer,
        Self::NatGateway,
    ];

    /// The path segment after `providers/Microsoft.Network/`, e.g. `loadBalancers`.
    pub fn segment(self) -> &'static str {
        match self {
            Self::ServiceGateway => "serviceGateways",
            Self::PublicIpAddress => "publicIPAddresses",
            Self::LoadBalancer => "loadBalancers",
            Self::NatGateway => "natGateways",
        }
    }

    /// The ARM `type`, e.g. `Microsoft.Network/loadBalancers`.
    pub fn arm_type(self) -> String {
        format!("{PROVIDER}/{}", self.segment())
    }

    /// The kind whose segment is `segment` (case-insensitive, as ARM).
    pub fn from_segment(segment: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|k| k.segment().eq_ignore_ascii_case(segment))
    }
}

/// A malformed ARM resource id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed resource id {id:?}: {reason}")]
pub struct ResourceIdError {
    /// The id as given.
    pub id: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// An ARM id `/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Network/{kind}/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceId {
    /// Subscription id.
    pub subscription: String,
    /// Resource group name.
    pub resource_group: String,
    /// Resource type.
    pub kind: ResourceKind,
    /// Resource name.
    pub name: String,
}

impl ResourceId {
    /// A resource id.
    pub fn new(
        subscription: impl Into<String>,
        resource_group: impl Into<String>,
        kind: ResourceKind,
        name: impl Into<String>,
    ) -> Self {
        Self {
            subscription: subscription.into(),
            resource_group: resource_group.into(),
            kind,
            name: name.into(),
        }
    }

    /// Parses a top-level id (segment names compared case-insensitively, as ARM).
    pub fn parse(id: &str) -> Result<Self, ResourceIdError> {
        let (rid, child) = Self::parse_with_child(id)?;
        match child {
            None => Ok(rid),
            Some(_) => Err(ResourceIdError {
                id: id.into(),
                reason: "expected a top-level resource, found a child resource",
            }),
        }
    }

    /// Parses an id that may name one child resource (`…/{kind}/{name}/{childType}/{childName}`),
    /// returning the parent and `(childType, childName)`.
    pub fn parse_with_child(id: &str) -> Result<(Self, Option<(String, String)>), ResourceIdError> {
        let err = |reason| ResourceIdError {
            id: id.into(),
            reason,
        };
        let rest = id
            .strip_prefix('/')
            .ok_or_else(|| err("must start with '/'"))?;
        let parts: Vec<&str> = rest.split('/').collect();
        if parts.len() != 8 && parts.len() != 10 {
            return Err(err("wrong number of path segments"));
        }
        if parts.iter().any(|p| p.is_empty()) {
            return Err(err("empty path segment"));
        }
        if !parts[0].eq_ignore_ascii_case("subscriptions")
            || !parts[2].eq_ignore_ascii_case("resourceGroups")
            || !parts[4].eq_ignore_ascii_case("providers")
            || !parts[5].eq_ignore_ascii_case(PROVIDER)
        {
            return Err(err(
                "expected /subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Network/…",
            ));
        }
        let kind =
            ResourceKind::from_segment(parts[6]).ok_or_else(|| err("unknown resource type"))?;
        let rid = Self::new(parts[1], parts[3], kind, parts[7]);
        let child = (parts.len() == 10).then(|| (parts[8].to_string(), parts[9].to_string()));
        Ok((rid, child))
    }

    /// The id as a path (no host, no query).
    pub fn path(&self) -> String {
        self.to_string()
    }

    /// The id of a child resource, e.g. `child("backendAddressPools", "pool")`.
    pub fn child(&self, child_type: &str, child_name: &str) -> String {
        format!("{self}/{child_type}/{child_name}")
    }

    /// Id of the backend pool `pool` of this load balancer.
    pub fn backend_pool_id(&self, pool: &str) -> String {
        self.child("backendAddressPools", pool)
    }

    /// Id of the frontend IP configuration `frontend` of this load balancer.
    pub fn frontend_ip_configuration_id(&self, frontend: &str) -> String {
        self.child("frontendIPConfigurations", frontend)
    }

    /// Full URL of this resource (optionally with a sub-path such as `updateServices`) under the ARM
    /// endpoint `base` (e.g. `https://management.azure.com` or the emulator's address), with the
    /// default api-version ([`API_VERSION`]) as query parameter.
    pub fn url(&self, base: &str, sub_path: Option<&str>) -> String {
        self.url_at(base, sub_path, API_VERSION)
    }

    /// [`ResourceId::url`] with the given api-version.
    pub fn url_at(&self, base: &str, sub_path: Option<&str>, api_version: &str) -> String {
        let base = base.trim_end_matches('/');
        match sub_path {
            Some(sub) => format!("{base}{self}/{sub}?api-version={api_version}"),
            None => format!("{base}{self}?api-version={api_version}"),
        }
    }
}

impl fmt::Display for ResourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "/subscriptions/{}/resourceGroups/{}/providers/{PROVIDER}/{}/{}",
            self.subscription,
            self.resource_group,
            self.kind.segment(),
            self.name
        )
    }
}

impl std::str::FromStr for ResourceId {
    type Err = ResourceIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_id_roundtrip() {
        let id = ResourceId::new("sub", "rg", ResourceKind::LoadBalancer, "lb1");
        let s = id.to_string();
        assert_eq!(
            s,
            "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.Network/loadBalancers/lb1"
        );
        assert_eq!(ResourceId::parse(&s).unwrap(), id);
        let pool = id.backend_pool_id("be");
        let (parent, child) = ResourceId::parse_with_child(&pool).unwrap();
        assert_eq!(parent, id);
        assert_eq!(child, Some(("backendAddressPools".into(), "be".into())));
        assert!(ResourceId::parse(&pool).is_err());
        assert!(ResourceId::parse("/subscriptions/s/resourceGroups/r/providers/X/y/z").is_err());
        assert!(ResourceId::parse("").is_err());
        let lower = s.to_ascii_lowercase();
        assert_eq!(
            ResourceId::parse(&lower).unwrap().kind,
            ResourceKind::LoadBalancer
        );
        assert_eq!(
            id.url("http://h:1/", Some("x")),
            format!("http://h:1{s}/x?api-version={API_VERSION}")
        );
    }
}
