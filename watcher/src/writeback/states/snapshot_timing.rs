//! A timing print, not a test (issue 35): the write-back's time to handle a reconnect snapshot of
//! `CLB_BENCH_SERVICES` (default 5,000) Services it already knows, every one settled (its ingress
//! and condition written as the pushed state wants: no Kubernetes call follows).
//!
//! ```sh
//! cargo test -p clb-watcher --lib snapshot_timing -- --ignored --nocapture
//! ```
//!
//! The write-back is built as `writeback::run` builds it, its records fed by `Msg::Seen` and its
//! gateway's first snapshot, then handled until none is due. The gateway's stream then goes down
//! and comes back with a snapshot of the same states; timed (wall, and the CPU time of the one
//! thread that runs it, from `/proc/thread-self/schedstat`) from the snapshot's fold
//! (`States::fold`) through what `run` does on the push (`poke` per pushed id, the waiting records
//! woken, `egress_events`) and every batch of due records (`act`), until none is due.

use std::time::Instant;

use clb_proto::v1::{ProgrammingReason, ServiceCondition, ServiceStates};

use super::super::*;
use crate::config::Mode;
use crate::ingress::IngressEntry;

/// Nanoseconds this thread has run.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn uid(i: usize) -> String {
    format!("00000000-0000-4000-8000-{i:012}")
}

fn ip(i: usize) -> String {
    format!("20.{}.{}.{}", i / 65_536, (i / 256) % 256, i % 256)
}

fn state(i: usize) -> ServiceState {
    ServiceState {
        service_id: uid(i),
        desired: true,
        actual: true,
        frontend_ip: ip(i),
        actual_addresses: 10,
        condition: Some(ServiceCondition {
            reason: ProgrammingReason::Programmed as i32,
            message: "programmed".into(),
            ..ServiceCondition::default()
        }),
        ..ServiceState::default()
    }
}

fn snapshot(n: usize) -> ServiceStates {
    ServiceStates {
        snapshot: true,
        nrp_observed: true,
        services: (0..n).map(state).collect(),
        ..ServiceStates::default()
    }
}

/// The facts of Service `i` as the watch shows it once the write-back wrote what `state(i)` wants.
fn settled_facts(i: usize, finalizer: &str) -> ServiceFacts {
    let mut facts = ServiceFacts {
        key: ObjKey {
            namespace: "default".into(),
            name: format!("svc-{i}"),
        },
        uid: uid(i),
        ids: vec![(uid(i), IpFamily::Unspecified)],
        resource_version: "1".into(),
        ours: true,
        deleting: false,
        has_finalizer: true,
        finalizers: vec![finalizer.to_owned()],
        ingress: vec![IngressEntry::vip(&ip(i))],
        generation: Some(1),
        conditions: Vec::new(),
        gateways: vec![String::new()],
        selection_error: None,
        refusal: None,
        ignored: None,
    };
    facts.conditions = super::super::wanted::Wanted::of(Some(&state(i)), &[])
        .condition(&facts)
        .expect("a condition to write");
    facts
}

/// What `run` does with the due records until none is due; returns how many were handled.
async fn drain(wb: &mut WriteBack) -> usize {
    let mut handled = 0;
    while !wb.timers.is_empty() {
        let Some(first) = wb.timers.next().await else {
            break;
        };
        let mut due = vec![first.into_inner()];
        while due.len() < BATCH {
            match wb.timers.next().now_or_never() {
                Some(Some(e)) => due.push(e.into_inner()),
                _ => break,
            }
        }
        handled += due.len();
        wb.act(due).await;
    }
    handled
}

#[test]
#[ignore = "a timing print, not a test"]
fn snapshot_timing() {
    let n: usize = std::env::var("CLB_BENCH_SERVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let watcher = WatcherConfig::new(
            ConnectOptions::new("http://127.0.0.1:1"),
            Mode::Cluster { pods: false },
        );
        let config = Config::from(&watcher);
        // Never called: every record is settled (checked below: no record failed).
        let kube = kube::Client::try_from(kube::Config::new(
            "http://127.0.0.1:1".parse().expect("a URL"),
        ))
        .expect("a client");
        let reporter = Reporter {
            controller: REPORTING_CONTROLLER.to_owned(),
            instance: Some(FIELD_MANAGER.to_owned()),
        };
        let (_acked_tx, acked) = watch::channel(0u64);
        let states = States::default();
        let mut wb = WriteBack {
            states: states.clone(),
            events: Mutex::new(EventLog {
                recorder: Recorder::new(kube.clone(), reporter.clone()),
                notes: HashMap::new(),
            }),
            reporter,
            kube,
            records: HashMap::new(),
            by_uid: HashMap::new(),
            timers: DelayQueue::new(),
            awaiting_ack: BTreeMap::new(),
            awaiting_states: HashSet::new(),
            acked,
            pools: PoolIndex::default(),
            pool_patched: Mutex::new(HashMap::new()),
            pool_warned: HashMap::new(),
            pool_warnings: Vec::new(),
            egress_reported: HashMap::new(),
            ip_mode_kept: AtomicBool::new(true),
            pool_ip_mode_kept: AtomicBool::new(true),
            config,
        };
        states.fold("", snapshot(n));
        for i in 0..n {
            wb.fold(Msg::Seen {
                facts: settled_facts(i, &watcher.finalizer),
                seq: 0,
            });
        }
        let first = drain(&mut wb).await;
        assert_eq!(first, n, "every Service handled once when seen");

        // The stream breaks and comes back: its first message is a snapshot of the same states.
        states.down("");
        let msg = snapshot(n);
        let (cpu0, t0) = (thread_cpu_ns(), Instant::now());
        let pushed = states.fold("", msg);
        for id in &pushed.ids {
            wb.poke(None, Some(crate::families::service_uid(id)));
        }
        if pushed.fresh {
            for key in std::mem::take(&mut wb.awaiting_states) {
                wb.due_now(&key);
            }
        }
        wb.egress_events(&pushed.ids).await;
        let handled = drain(&mut wb).await;
        let (wall, cpu) = (t0.elapsed(), thread_cpu_ns() - cpu0);
        assert!(
            wb.records.values().all(|r| r.retry.is_none()),
            "a Kubernetes call was made"
        );
        println!(
            "write-back, reconnect snapshot of {n} known Services: {handled} handled, wall {:.1} ms, \
             CPU {:.1} ms, Kubernetes calls 0",
            wall.as_secs_f64() * 1e3,
            cpu as f64 / 1e6
        );
    });
}
