//! The dispatcher's side of the workers' answers: reports folded into the actual state (applied,
//! retried, repaired by a read-back, parked), observes merged, units taken back when their lease
//! expires or their worker goes away, and the errors kept for status.

use super::*;

impl Dispatcher {
    /// Keeps the error just recorded as the last failure of the parts of `work` that did not go
    /// through (`applied`: the indexes that did).
    fn note_failing(&mut self, work: &UnitWork, applied: &[u32]) {
        let Some(record) = self.errors.back().cloned() else {
            return;
        };
        for (i, key) in work.keys().into_iter().enumerate() {
            if !applied.contains(&(i as u32)) {
                self.failing.insert(key, record.clone());
            }
        }
    }

    fn error(
        &mut self,
        (work_id, worker): (u64, u64),
        work: &UnitWork,
        code: &str,
        message: &str,
        terminal: bool,
        now: Instant,
    ) {
        if self.errors.len() == MAX_ERRORS {
            self.errors.pop_front();
        }
        self.errors.push_back(ErrorRecord {
            at_unix_ms: self.wall.unix_ms(now),
            work_id,
            worker,
            unit: work.summary(),
            code: code.to_owned(),
            message: message.to_owned(),
            terminal,
        });
    }

    /// Folds a worker's report into the actual state and returns what it recorded. A report for a
    /// unit that is not (or no longer) leased to `worker` is ignored and counted (`None`): NRP may
    /// or may not have applied it, and the re-cut unit carries the same change again, which NRP
    /// applies idempotently.
    pub fn on_report(
        &mut self,
        tracker: &mut DiffTracker,
        worker: u64,
        report: Report,
        now: Instant,
    ) -> Option<Folded> {
        match self.in_flight.get(&report.work_id) {
            Some(u) if u.worker == worker => {}
            _ => {
                self.count_late_report();
                return None;
            }
        }
        self.reports += 1;
        if let Outcome::Observed { snapshot, last } = report.outcome {
            let observed =
                self.merge_observed(tracker, (report.work_id, worker), snapshot, last, now);
            // The changes confirmed since the observe was cut, recorded again after its snapshot.
            let services = if observed {
                std::mem::take(&mut self.observe.since_cut)
            } else {
                Vec::new()
            };
            return Some(Folded { services, observed });
        }
        let unit = self.finish(report.work_id, now).expect("checked in flight");
        if let UnitWork::Locations(_) = unit.work {
            self.stagger
                .finished(now.saturating_duration_since(unit.started));
        }
        let ids = (report.work_id, worker);
        let kind = unit.work.kind().as_str();
        // What went through when the unit did not as a whole.
        let went = Went {
            which: &report.applied,
            progress: &report.progress,
            refused: &report.refused,
        };
        let services = match report.outcome {
            Outcome::Applied => {
                self.count(kind, "applied", "");
                let all: Vec<u32> = (0..unit.work.len() as u32).collect();
                let went = Went {
                    which: &all,
                    progress: &[],
                    refused: &report.refused,
                };
                self.record(tracker, ids, &unit.work, went, now)
            }
            Outcome::Retryable {
                retry_after,
                code,
                message,
            } => {
                self.count(kind, "retryable", &code);
                self.error(ids, &unit.work, &code, &message, false, now);
                self.note_failing(&unit.work, &report.applied);
                let recorded = self.record(tracker, ids, &unit.work, went, now);
                self.requeue(&unit.work, &report.applied, Some((retry_after, now)));
                recorded
            }
            Outcome::Repair {
                retry_after,
                code,
                message,
                refused,
            } => {
                self.count(kind, "repair", &code);
                *self.stats.repairs.entry(code.clone()).or_default() += 1;
                // Refused again with the same unknown code after the read-back that followed the
                // first refusal: held on the refusal schedule, not repaired again and again.
                let again: Vec<Key> = if refused {
                    unit.work
                        .keys()
                        .into_iter()
                        .enumerate()
                        .filter(|(i, _)| !report.applied.contains(&(*i as u32)))
                        .map(|(_, k)| k)
                        .filter(|k| {
                            self.failing.get(k).is_some_and(|r| r.code == code)
                                || self.parked.get(k).is_some_and(|r| r.code == code)
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                self.error(ids, &unit.work, &code, &message, !again.is_empty(), now);
                self.note_failing(&unit.work, &report.applied);
                let recorded = self.record(tracker, ids, &unit.work, went, now);
                let mut skip = report.applied.clone();
                if !again.is_empty() {
                    let record = self.errors.back().cloned().expect("just pushed");
                    for (i, key) in unit.work.keys().into_iter().enumerate() {
                        if again.contains(&key) {
                            skip.push(i as u32);
                            self.failing.remove(&key);
                            self.dispatches.remove(&key);
                            *self.stats.parked.entry(code.clone()).or_default() += 1;
                            self.hold_refused(key, record.clone(), now);
                        }
                    }
                }
                self.requeue(&unit.work, &skip, Some((retry_after, now)));
                // What failed is cut again only from what NRP holds: read it back first.
                for (i, key) in unit.work.keys().into_iter().enumerate() {
                    if !skip.contains(&(i as u32)) {
                        self.awaiting_read_back.insert(key, self.reports);
                    }
                }
                if skip.len() < unit.work.len() {
                    self.observe_after_report();
                }
                recorded
            }
            Outcome::Terminal {
                code,
                message,
                changes,
            } => {
                self.count(kind, "terminal", &code);
                self.error(ids, &unit.work, &code, &message, true, now);
                let recorded = self.record(tracker, ids, &unit.work, went, now);
                if let UnitWork::Observe = unit.work {
                    self.requeue(&unit.work, &[], Some((self.config.retry_max, now)));
                }
                let record = self.errors.back().cloned().expect("just pushed");
                for (i, key) in unit.work.keys().into_iter().enumerate() {
                    if !report.applied.contains(&(i as u32)) {
                        // A change refused for a reason of its own is parked with it.
                        let record = match changes.iter().find(|c| c.index == i as u32) {
                            Some(own) => ErrorRecord {
                                code: own.code.clone(),
                                message: own.message.clone(),
                                ..record.clone()
                            },
                            None => record.clone(),
                        };
                        self.dispatches.remove(&key);
                        self.failing.remove(&key);
                        *self.stats.parked.entry(record.code.clone()).or_default() += 1;
                        self.hold_refused(key, record, now);
                    }
                }
                recorded
            }
            Outcome::Observed { .. } => unreachable!("handled above"),
        };
        if let Some(first) = report.refused.first() {
            let message = format!(
                "{} address(es) refused on their own and held, the first {}: {}",
                report.refused.len(),
                first.address,
                first.message
            );
            self.error(ids, &unit.work, &first.code, &message, true, now);
        }
        let wrong = self.hold_refused_addresses(tracker, ids, &unit.work, &report.refused, now);
        for w in wrong {
            self.error(ids, &unit.work, "InconsistentReport", &w, false, now);
        }
        Some(Folded {
            services,
            observed: false,
        })
    }

    /// Merges one part of an observe; on the last one, folds the whole snapshot into the actual
    /// state and returns whether it was.
    fn merge_observed(
        &mut self,
        tracker: &mut DiffTracker,
        ids: (u64, u64),
        part: ActualSnapshot,
        last: bool,
        now: Instant,
    ) -> bool {
        let parts = &mut self.observe.parts;
        parts.load_balancers.extend(part.load_balancers);
        parts.nat_gateways.extend(part.nat_gateways);
        parts.locations.extend(part.locations);
        if !last {
            return false;
        }
        self.finish(ids.0, now);
        let snapshot = std::mem::take(&mut self.observe.parts);
        match tracker.observe(&snapshot) {
            Ok(_) => {
                self.count("observe", "observed", "");
                // NRP confirmed these after the observe was cut: they are newer than what its
                // snapshot may show (a creation read before it was made is not gone).
                let again: Vec<String> = self
                    .observe
                    .since_cut
                    .iter()
                    .filter_map(|c| tracker.record_service_applied(c).err())
                    .map(|e| e.to_string())
                    .collect();
                for e in again {
                    self.error(
                        ids,
                        &UnitWork::Observe,
                        "InconsistentReport",
                        &e,
                        false,
                        now,
                    );
                }
                // Every wish made before the observe was cut is met; one made later stays.
                let (cut, seen) = self.observe.cut_at.unwrap_or((now, self.reports));
                self.observe.asap = false;
                self.observe.after_report = self.observe.after_report.filter(|n| *n > seen);
                self.observe.deferred = self.observe.deferred.filter(|t| *t > cut);
                self.observe.observed_once = true;
                self.observe.last_at = Some(now);
                self.observe.not_before = None;
                self.observe_dispatches = 0;
                // The actual state is NRP's again: what waited for it may go.
                self.awaiting_read_back.retain(|_, n| *n > seen);
                true
            }
            Err(e) => {
                self.count("observe", "terminal", "InconsistentSnapshot");
                self.error(
                    ids,
                    &UnitWork::Observe,
                    "InconsistentSnapshot",
                    &e.to_string(),
                    false,
                    now,
                );
                self.requeue(&UnitWork::Observe, &[], Some((self.config.retry_base, now)));
                false
            }
        }
    }

    /// Records the listed parts of a unit as applied in the actual state, and the steps that
    /// service changes which did not go through reached (`progress`); returns the service changes
    /// that were recorded (with a deletion that removed the registration).
    fn record(
        &mut self,
        tracker: &mut DiffTracker,
        ids: (u64, u64),
        work: &UnitWork,
        Went {
            which,
            progress,
            refused,
        }: Went<'_>,
        now: Instant,
    ) -> Vec<ServiceChange> {
        let mut failures = Vec::new();
        let mut recorded = Vec::new();
        match work {
            UnitWork::Observe => {}
            UnitWork::Services(changes) => {
                for i in which {
                    if let Some(c) = changes.get(*i as usize) {
                        let key = Key::Service(c.name.clone());
                        self.backoff.remove(&key);
                        self.parked.remove(&key);
                        self.refusals.remove(&key);
                        self.observe_programmed("services", &key, now);
                        self.failing.remove(&key);
                        self.dispatches.remove(&key);
                        match tracker.record_service_applied(c) {
                            Ok(()) => {
                                if self.observe.in_flight.is_some() {
                                    self.observe.since_cut.push(c.clone());
                                }
                                recorded.push(c.clone());
                            }
                            Err(e) => failures.push(e.to_string()),
                        }
                    }
                }
                for p in progress.iter().filter(|p| !which.contains(&p.index)) {
                    let Some(c) = changes.get(p.index as usize) else {
                        failures.push(format!("progress of change {}: no such change", p.index));
                        continue;
                    };
                    if p.step == ServiceStep::Unregistered && c.action != ServiceAction::Delete {
                        failures.push(format!(
                            "service {}: a creation cannot have unregistered it",
                            c.name
                        ));
                        continue;
                    }
                    match tracker.record_service_progress(c, p.step) {
                        Ok(()) if p.step == ServiceStep::Unregistered => recorded.push(c.clone()),
                        Ok(()) => {}
                        Err(e) => failures.push(e.to_string()),
                    }
                }
            }
            UnitWork::Locations(diffs) => {
                for i in which {
                    if let Some(d) = diffs.get(*i as usize) {
                        let key = Key::Location(d.location);
                        self.backoff.remove(&key);
                        self.parked.remove(&key);
                        self.refusals.remove(&key);
                        self.observe_programmed("locations", &key, now);
                        self.failing.remove(&key);
                        self.dispatches.remove(&key);
                        // What NRP refused of it did not go through: the rest did.
                        let trimmed;
                        let d = if refused.iter().any(|r| r.index == *i) {
                            let mut t = d.clone();
                            t.addresses.retain(|a| {
                                !refused
                                    .iter()
                                    .any(|r| r.index == *i && r.address == a.address)
                            });
                            if t.addresses.is_empty() && !d.addresses.is_empty() {
                                // Nothing of it was sent.
                                continue;
                            }
                            trimmed = t;
                            &trimmed
                        } else {
                            d
                        };
                        if let Err(e) = tracker.record_location_applied(d) {
                            failures.push(e.to_string());
                        }
                    }
                }
            }
        }
        for f in failures {
            // A report NRP could not have accepted: keep the tracker as it is and read NRP back.
            self.error(ids, work, "InconsistentReport", &f, false, now);
            self.observe_after_report();
        }
        recorded
    }

    /// `key` is no longer pending because NRP accepted its change: tells the observer how long it
    /// was pending.
    fn observe_programmed(&mut self, kind: &'static str, key: &Key, now: Instant) {
        if let Some(since) = self.pending_since.remove(key) {
            self.observer
                .programmed(kind, now.saturating_duration_since(since));
        }
    }

    pub(super) fn count(&mut self, kind: &'static str, result: &'static str, code: &str) {
        self.observer.unit_outcome(kind, result, code);
        *self
            .stats
            .outcomes
            .entry((kind, result, code.to_owned()))
            .or_default() += 1;
    }

    /// After units were taken back from a worker, a call of theirs may still be under way in NRP and
    /// land after newer changes. Once no such call can be (one lease later: a worker sends no call
    /// after its lease and bounds each call's timeout by it), NRP is read back so that anything the
    /// late call undid is seen and sent again.
    /// Wants NRP read back by an observe cut after the report being folded.
    fn observe_after_report(&mut self) {
        let n = self.reports;
        self.observe.after_report = Some(self.observe.after_report.map_or(n, |m| m.max(n)));
    }

    fn observe_after_uncertainty(&mut self, now: Instant) {
        let at = now + self.config.lease;
        self.observe.deferred = Some(self.observe.deferred.map_or(at, |t| t.max(at)));
    }

    /// Releases every unit of a worker that disconnected, at once.
    pub fn release_worker(&mut self, worker: u64, now: Instant) -> usize {
        let ids: Vec<u64> = self
            .in_flight
            .iter()
            .filter(|(_, u)| u.worker == worker)
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            if let Some(unit) = self.finish(*id, now) {
                if !matches!(unit.work, UnitWork::Observe) {
                    self.observe_after_uncertainty(now);
                }
                self.requeue(&unit.work, &[], None);
            }
        }
        ids.len()
    }

    /// Takes back every unit whose lease has expired (at `now`) and keeps an error record of each;
    /// returns them, with the worker each was leased to.
    pub fn expire(&mut self, now: Instant) -> Vec<Expired> {
        let ids: Vec<u64> = self
            .in_flight
            .iter()
            .filter(|(_, u)| u.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        let mut expired = Vec::with_capacity(ids.len());
        for id in &ids {
            if let Some(unit) = self.finish(*id, now) {
                let kind = unit.work.kind().as_str();
                self.count(kind, "lease_expired", "LeaseExpired");
                let message = format!(
                    "the worker did not report within the lease ({} ms): the unit goes back to \
                     the queue",
                    self.config.lease.as_millis()
                );
                self.error(
                    (*id, unit.worker),
                    &unit.work,
                    "LeaseExpired",
                    &message,
                    false,
                    now,
                );
                expired.push(Expired {
                    work_id: *id,
                    worker: unit.worker,
                });
                // The worker hung, not NRP: no backoff.
                if !matches!(unit.work, UnitWork::Observe) {
                    self.observe_after_uncertainty(now);
                }
                self.requeue(&unit.work, &[], None);
            }
        }
        self.stats.lease_expiries += ids.len() as u64;
        self.observer.lease_expired(ids.len() as u64);
        expired
    }

    /// Whether `work_id` is leased out by this dispatcher.
    pub fn holds(&self, work_id: u64) -> bool {
        self.in_flight.contains_key(&work_id)
    }

    /// Counts a report nobody holds (late or unknown).
    pub fn count_late_report(&mut self) {
        self.stats.late_reports += 1;
        self.observer.late_report();
    }
}

/// What of a unit went through, as its report says: the changes applied (`which`), how far the
/// others got (`progress`), and the addresses NRP refused on their own (`refused`).
#[derive(Clone, Copy)]
struct Went<'a> {
    which: &'a [u32],
    progress: &'a [ServiceProgress],
    refused: &'a [AddressRefusal],
}
