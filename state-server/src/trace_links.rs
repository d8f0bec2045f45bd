//! Links from a work unit's span to the writer requests whose changes it carries.
//!
//! A unit mixes the changes of many writers (and one writer's change may go out in several units),
//! so a unit's span cannot be their child: it gets OpenTelemetry span *links* to the Apply/Resync
//! spans that changed what it carries. One can then go from a Kubernetes change (the writer's span,
//! sent as `traceparent`) to the NRP call that programmed it. Best effort and bounded: a few links per
//! key, taken when a unit carrying the key is cut; nothing is kept when tracing is off.

use std::collections::HashMap;
use std::net::IpAddr;

use clb_core::difftracker::identity::normalize_identity;
use clb_core::difftracker::ip::parse_ip;
use clb_core::dispatch::UnitWork;
use clb_proto::v1::{Update, endpoints_update::Change, update::Kind};
use clb_telemetry::SpanLink;

/// Most links kept per key (the newest win).
const PER_KEY: usize = 4;
/// Most keys with links; beyond it the oldest links are dropped wholesale (links are best effort).
const MAX_KEYS: usize = 100_000;
/// Most links put on one unit's span.
const PER_UNIT: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Location(IpAddr),
    Service(String),
}

/// The writer spans that changed each location and service since a unit last carried it.
#[derive(Debug, Default)]
pub struct TraceLinks {
    by_key: HashMap<Key, Vec<SpanLink>>,
}

impl TraceLinks {
    /// Notes that the writer span `link` applied `update` (an update the tracker accepted).
    pub fn note(&mut self, link: &SpanLink, update: &Update) {
        if self.by_key.len() >= MAX_KEYS {
            self.by_key.clear();
        }
        for key in keys_of(update) {
            let links = self.by_key.entry(key).or_default();
            if links.last() != Some(link) {
                if links.len() == PER_KEY {
                    links.remove(0);
                }
                links.push(link.clone());
            }
        }
    }

    /// Takes the links of what `work` carries (at most a few dozen, without repeats).
    pub fn take(&mut self, work: &UnitWork) -> Vec<SpanLink> {
        if self.by_key.is_empty() {
            return Vec::new();
        }
        let keys: Vec<Key> = match work {
            UnitWork::Observe => Vec::new(),
            UnitWork::Services(changes) => changes
                .iter()
                .map(|c| Key::Service(c.name.clone()))
                .collect(),
            UnitWork::Locations(diffs) => diffs.iter().map(|d| Key::Location(d.location)).collect(),
        };
        let mut out: Vec<SpanLink> = Vec::new();
        for key in keys {
            for link in self.by_key.remove(&key).unwrap_or_default() {
                if out.len() < PER_UNIT && !out.contains(&link) {
                    out.push(link);
                }
            }
        }
        out
    }
}

/// The locations and services whose units may carry `update`'s change.
fn keys_of(update: &Update) -> Vec<Key> {
    let service = |id: &str| {
        normalize_identity("id", id)
            .ok()
            .map(|n| Key::Service(n.into_owned()))
    };
    let location = |l: &str| parse_ip("location", l).ok().map(Key::Location);
    match &update.kind {
        Some(Kind::Service(s)) => service(&s.service_id).into_iter().collect(),
        Some(Kind::Egress(e)) => service(&e.egress_id).into_iter().collect(),
        Some(Kind::Endpoints(e)) => {
            let endpoints: Vec<&clb_proto::v1::Endpoint> = match &e.change {
                Some(Change::Level(set)) => set.endpoints.iter().collect(),
                Some(Change::Edge(edge)) => edge
                    .old_endpoints
                    .iter()
                    .chain(edge.new_endpoints.iter())
                    .collect(),
                None => Vec::new(),
            };
            let mut locations: Vec<IpAddr> = endpoints
                .iter()
                .filter_map(|ep| parse_ip("location", &ep.location).ok())
                .collect();
            locations.sort();
            locations.dedup();
            locations.into_iter().map(Key::Location).collect()
        }
        Some(Kind::Pod(p)) => location(&p.location)
            .into_iter()
            .chain(
                (!p.egress_id.is_empty())
                    .then(|| service(&p.egress_id))
                    .flatten(),
            )
            .collect(),
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_each_kind_of_update() {
        use clb_proto::v1::{EndpointSet, EndpointsUpdate, PodUpdate, ServiceUpdate};
        let svc = Update {
            kind: Some(Kind::Service(ServiceUpdate {
                service_id: "SVC-A".into(),
                ..Default::default()
            })),
        };
        assert_eq!(keys_of(&svc), vec![Key::Service("svc-a".into())]);
        let eps = Update {
            kind: Some(Kind::Endpoints(EndpointsUpdate {
                service_id: "svc-a".into(),
                change: Some(Change::Level(EndpointSet {
                    endpoints: vec![
                        clb_proto::v1::Endpoint {
                            address: "10.1.0.1".into(),
                            location: "10.0.0.2".into(),
                        },
                        clb_proto::v1::Endpoint {
                            address: "10.1.0.2".into(),
                            location: "10.0.0.2".into(),
                        },
                    ],
                })),
            })),
        };
        assert_eq!(
            keys_of(&eps),
            vec![Key::Location("10.0.0.2".parse().unwrap())]
        );
        let pod = Update {
            kind: Some(Kind::Pod(PodUpdate {
                location: "10.0.0.3".into(),
                egress_id: "egress-a".into(),
                ..Default::default()
            })),
        };
        assert_eq!(
            keys_of(&pod),
            vec![
                Key::Location("10.0.0.3".parse().unwrap()),
                Key::Service("egress-a".into())
            ]
        );
    }
}
