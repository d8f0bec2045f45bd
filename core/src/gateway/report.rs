//! What a worker's report changes beside the DiffTracker (`GatewayCore::take_report`): the
//! frontends and the port book of inbound services, and the brought NAT gateways an observe found
//! deleted out of band.
//!
//! **A brought NAT gateway deleted out of band.** An observe GETs the NAT gateway each outbound
//! registration that brings one names (`NrpSnapshot.missing_nat_gateways`); the egresses whose
//! NAT gateway is gone are kept here, replaced by each completed observe, for as long as NRP still
//! has the egress. Nothing is created: clb never creates a brought NAT gateway, and the egress is
//! not programmed again while its NAT gateway is missing (its registration is left as it is; its
//! deletion unregisters it and finds nothing to unlink). Each egress that becomes missing is
//! counted ([`GatewayCore::nat_gateways_lost_total`]). When a later observe finds it again (its
//! owner re-created it), the egress is created again, so that the saga links the new NAT gateway
//! (the link went with the old one).

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use super::{GatewayCore, LbSpec, ObservedExtras, ReportExtras};
use crate::difftracker::{ServiceAction, ServiceChange, ServiceKind};
use crate::dispatch::{Outcome, Report};

/// The egresses whose brought NAT gateway the last completed observe found missing.
#[derive(Debug, Default)]
pub(super) struct MissingNat {
    /// Canonical egress names.
    names: BTreeSet<String>,
    /// How many times an egress became missing.
    lost_total: u64,
}

impl MissingNat {
    /// Replaces the set with `observed` (restricted to `live`: egresses NRP has that bring a NAT
    /// gateway); returns the egresses found again (missing before, not now, still live).
    pub(super) fn observed(
        &mut self,
        observed: BTreeSet<String>,
        live: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        let now: BTreeSet<String> = observed
            .into_iter()
            .map(|n| n.to_ascii_lowercase())
            .filter(|n| live(n))
            .collect();
        self.lost_total += now.difference(&self.names).count() as u64;
        let found: Vec<String> = self
            .names
            .difference(&now)
            .filter(|n| live(n))
            .cloned()
            .collect();
        self.names = now;
        found
    }
}

/// What became of a worker's report ([`GatewayCore::fold_report`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Folded {
    /// The unit was leased to the worker: its report changed the gateway.
    Taken,
    /// Late: the unit's lease had ended (or it was never leased); counted and ignored.
    Late,
}

impl GatewayCore {
    /// Folds worker `worker`'s report of a unit: taken ([`GatewayCore::take_report`], with the
    /// subscription's `remaining_writes` the worker saw) while the unit is still leased, otherwise
    /// late: counted ([`GatewayCore::count_late_report`]) and ignored, so that a unit that went
    /// back to the queue is never answered twice.
    pub fn fold_report(
        &mut self,
        worker: u64,
        report: Report,
        extras: ReportExtras,
        remaining_writes: Option<u32>,
        now: Instant,
    ) -> Folded {
        if !self.holds(report.work_id) {
            self.count_late_report();
            return Folded::Late;
        }
        if let Some(remaining) = remaining_writes {
            self.note_remaining_writes_of(remaining, report.work_id);
        }
        self.take_report(worker, report, extras, now);
        Folded::Taken
    }

    /// Folds a worker's report: the dispatcher records it in the tracker, then what is kept beside
    /// the tracker follows. When an observe completes, each desired inbound service that NRP has
    /// and whose rules were read back with other ports than the desired ones is created again.
    /// Returns false when the report was ignored (not a unit leased to `worker`).
    pub fn take_report(
        &mut self,
        worker: u64,
        report: Report,
        extras: ReportExtras,
        now: Instant,
    ) -> bool {
        let work_id = report.work_id;
        let observe_part = match &report.outcome {
            Outcome::Observed { last, .. } => Some(*last),
            _ => None,
        };
        let Some(folded) = self
            .dispatch
            .on_report(&mut self.tracker, worker, report, now)
        else {
            return false;
        };
        match observe_part {
            Some(last) => {
                // Only the union of the parts is complete: replace the frontends at the end.
                let parts = match &mut self.observing {
                    Some((id, parts)) if *id == work_id => parts,
                    slot => &mut slot.insert((work_id, ObservedExtras::default())).1,
                };
                parts.frontends.extend(extras.frontends);
                parts.rules.extend(extras.rules);
                parts
                    .missing_nat_gateways
                    .extend(extras.missing_nat_gateways);
                if last
                    && let Some((_, observed)) = self.observing.take()
                    && folded.observed
                {
                    // Creations confirmed while the observe was in flight keep the frontend
                    // their reports gave, if its snapshot was read before them.
                    let confirmed: Vec<(String, String)> = folded
                        .services
                        .iter()
                        .filter(|c| c.action == ServiceAction::Create)
                        .filter_map(|c| {
                            let ip = self.frontends.get(&c.name)?;
                            Some((c.name.clone(), ip.clone()))
                        })
                        .collect();
                    self.frontends = observed.frontends;
                    for (name, ip) in confirmed {
                        self.frontends.entry(name).or_insert(ip);
                    }
                    let tracker = &self.tracker;
                    self.programmed
                        .retain(|name, _| tracker.service_view(name).is_some_and(|v| v.actual));
                    self.rules_observed(observed.rules);
                    self.missing_nat_observed(observed.missing_nat_gateways);
                }
            }
            None => {
                let mut reported: HashMap<String, String> = extras.frontends.into_iter().collect();
                for change in folded.services {
                    self.service_recorded(&change, &mut reported);
                }
            }
        }
        self.update_gates(now);
        true
    }

    fn rules_observed(&mut self, rules: HashMap<String, LbSpec>) {
        for (name, read) in rules {
            let in_nrp = self
                .tracker
                .service_view(&name)
                .is_some_and(|v| v.kind == ServiceKind::Inbound && v.actual);
            if !in_nrp {
                continue;
            }
            // The ports of a creation that ended without a report of it tell nothing: what NRP
            // has is what was read.
            if self.dispatch.service_creation_in_flight(&name) {
                continue;
            }
            self.in_flight.remove(&name);
            self.programmed.insert(name.clone(), read);
            // Ports no worker can program would fail the creation again after every observe.
            if let Some(desired) = self.service_specs.get(&name).cloned()
                && desired.programmable()
            {
                self.reprogram_if_changed(&name, &desired);
            }
        }
    }

    fn service_recorded(&mut self, change: &ServiceChange, reported: &mut HashMap<String, String>) {
        if change.kind != ServiceKind::Inbound {
            return;
        }
        let name = &change.name;
        match change.action {
            ServiceAction::Create => {
                if let Some(ip) = reported.remove(name) {
                    self.frontends.insert(name.clone(), ip);
                }
                if let Some(sent) = self.in_flight.remove(name) {
                    self.programmed.insert(name.clone(), sent);
                    // Changed while the creation was under way: send the new load balancer too.
                    if let Some(desired) = self.service_specs.get(name).cloned() {
                        self.reprogram_if_changed(name, &desired);
                    }
                }
            }
            ServiceAction::Delete => {
                self.frontends.remove(name);
                self.programmed.remove(name);
                self.in_flight.remove(name);
            }
        }
    }

    fn missing_nat_observed(&mut self, observed: BTreeSet<String>) {
        let tracker = &self.tracker;
        let live = |name: &str| {
            tracker
                .service_view(name)
                .is_some_and(|v| v.kind == ServiceKind::Outbound && v.actual)
                && tracker.egress_nat_gateway(name).is_some()
        };
        for name in self.missing_nat.observed(observed, live) {
            self.tracker.reprogram_egress(&name);
        }
    }

    /// Whether the brought NAT gateway of egress `name` (canonical) was missing at the last
    /// completed observe while NRP has the egress.
    pub fn nat_gateway_missing(&self, name: &str) -> bool {
        self.missing_nat.names.contains(name)
            && self.tracker.service_view(name).is_some_and(|v| v.actual)
    }

    /// How many egresses' brought NAT gateway was missing at the last completed observe.
    pub fn missing_nat_gateways(&self) -> usize {
        self.missing_nat.names.len()
    }

    /// How many times an egress's brought NAT gateway was found missing (since the start).
    pub fn nat_gateways_lost_total(&self) -> u64 {
        self.missing_nat.lost_total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn missing_egresses_are_counted_once_and_found_again_only_while_live() {
        let mut m = MissingNat::default();
        let all = |_: &str| true;
        assert!(m.observed(set(&["EG", "gone"]), |n| n != "gone").is_empty());
        assert_eq!(m.names, set(&["eg"]), "canonical, live only");
        assert_eq!(m.lost_total, 1);
        // Still missing: not counted again.
        assert!(m.observed(set(&["eg"]), all).is_empty());
        assert_eq!(m.lost_total, 1);
        // Found again (re-created by its owner): reported, so that it is linked again.
        assert_eq!(m.observed(set(&[]), all), vec!["eg".to_owned()]);
        assert_eq!(m.lost_total, 1);
        // Lost a second time: counted again.
        m.observed(set(&["eg"]), all);
        assert_eq!(m.lost_total, 2);
        // Gone from NRP (deleted): dropped without being "found".
        assert!(m.observed(set(&[]), |_| false).is_empty());
        assert!(m.names.is_empty());
    }
}
