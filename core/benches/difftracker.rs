//! DiffTracker benchmarks on a cluster of 100,000 pods over 2,000 locations, 5,000 inbound services
//! and 200 egresses (see docs/benchmarks.md for the figures and how to read them):
//! (a) desired-state mutations per second, (b) one pod change to its diff, incremental vs the
//! oracle's full recompute, (c) bytes of memory per address, counted by the allocator.

#[path = "../tests/support/oracle.rs"]
mod oracle;

use std::alloc::System;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};

use clb_core::difftracker::{DiffTracker, Endpoint, EndpointIp, Operation, PodIpUpdate, PodUpdate};
use criterion::{BatchSize, Criterion, Throughput, criterion_group};
use oracle::Oracle;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const PODS: usize = 100_000;
const LOCATIONS: usize = 2_000;
const SERVICES: usize = 5_000;
const EGRESSES: usize = 200;

/// splitmix64: a fixed pseudo-random scatter, so every run builds the same cluster.
fn scatter(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The synthetic cluster as strings, as writers send them.
struct Cluster {
    addresses: Vec<String>,
    locations: Vec<String>,
    services: Vec<String>,
    egresses: Vec<String>,
}

impl Cluster {
    fn new() -> Self {
        let ip = |base: u32, i: usize| IpAddr::V4(Ipv4Addr::from(base + i as u32)).to_string();
        Self {
            addresses: (0..PODS).map(|i| ip(0x0a80_0000, i)).collect(),
            locations: (0..LOCATIONS).map(|i| ip(0x0a00_0000, i + 1)).collect(),
            services: (0..SERVICES)
                .map(|i| format!("3f2a9c1e-0000-4000-8000-{i:012}"))
                .collect(),
            egresses: (0..EGRESSES).map(|i| format!("egress-{i}")).collect(),
        }
    }

    /// Pod `i` backs service `i % SERVICES` (20 pods each) and runs at a pseudo-random location
    /// (50 pods per location on average), so a service's pods are scattered over the cluster.
    fn location_of(&self, pod: usize) -> &str {
        &self.locations[scatter(pod as u64) as usize % LOCATIONS]
    }

    /// Pod `i` uses a pseudo-random egress (500 pods each, spread over most locations).
    fn egress_of(pod: usize) -> usize {
        scatter(pod as u64 ^ 0xe6e5) as usize % EGRESSES
    }

    fn pod(&self, i: usize, egress: usize) -> PodUpdate<'_> {
        PodUpdate {
            address: &self.addresses[i],
            location: self.location_of(i),
            outbound_identity: &self.egresses[egress % EGRESSES],
            uid: "",
            ..Default::default()
        }
    }

    fn endpoints(&self, service: usize) -> Vec<Endpoint<'_>> {
        (service..PODS)
            .step_by(SERVICES)
            .map(|i| Endpoint {
                address: &self.addresses[i],
                location: self.location_of(i),
            })
            .collect()
    }

    /// A tracker holding the whole cluster, converged with NRP.
    fn tracker(&self) -> DiffTracker {
        let mut t = DiffTracker::new();
        for s in &self.services {
            t.update_service(Operation::Add, s).unwrap();
        }
        for (i, s) in self.services.iter().enumerate() {
            t.set_endpoints(s, &self.endpoints(i)).unwrap();
        }
        for i in 0..PODS {
            t.update_pod(Operation::Add, &self.pod(i, Self::egress_of(i)))
                .unwrap();
        }
        let diff = t.pending_diff();
        for s in &diff.services {
            t.record_service_applied(s).unwrap();
        }
        for l in &t.pending_diff().locations {
            t.record_location_applied(l).unwrap();
        }
        t.take_dirty();
        assert!(t.pending_diff().is_empty());
        t
    }

    /// A tracker holding the whole cluster with every service created in NRP and no location
    /// programmed yet: every address is pending.
    fn tracker_with_services_only(&self) -> DiffTracker {
        let mut t = DiffTracker::new();
        for s in &self.services {
            t.update_service(Operation::Add, s).unwrap();
        }
        for (i, s) in self.services.iter().enumerate() {
            t.set_endpoints(s, &self.endpoints(i)).unwrap();
        }
        for i in 0..PODS {
            t.update_pod(Operation::Add, &self.pod(i, Self::egress_of(i)))
                .unwrap();
        }
        for s in &t.pending_diff().services {
            t.record_service_applied(s).unwrap();
        }
        t.take_dirty();
        t
    }

    /// The oracle holding the same cluster, converged.
    fn oracle(&self) -> Oracle {
        let mut o = Oracle::default();
        for s in &self.services {
            o.update_service(Operation::Add, s);
        }
        for (i, s) in self.services.iter().enumerate() {
            let eps: Vec<(&str, &str)> = self
                .endpoints(i)
                .iter()
                .map(|e| (e.address, e.location))
                .collect();
            o.set_endpoints(s, &eps);
        }
        for i in 0..PODS {
            let p = self.pod(i, Self::egress_of(i));
            o.update_pod(
                Operation::Add,
                p.address,
                p.location,
                p.outbound_identity,
                p.uid,
            );
        }
        for s in &o.diff().services {
            o.record_service(s);
        }
        for l in &o.diff().locations {
            o.record_location(l);
        }
        assert!(o.diff().is_empty());
        o
    }
}

/// (c) Net bytes the allocator holds for the whole converged tracker, per address.
fn memory_per_address(cluster: &Cluster) {
    let region = Region::new(GLOBAL);
    let tracker = cluster.tracker();
    let stats = region.change();
    // stats_alloc already folds reallocations into bytes_allocated / bytes_deallocated.
    let net = stats.bytes_allocated as i64 - stats.bytes_deallocated as i64;
    let addresses = tracker.counts().desired_addresses;
    println!(
        "memory: {net} bytes net for {addresses} addresses (desired + actual, 2 service refs each) = {:.1} bytes/address",
        net as f64 / addresses as f64
    );
    black_box(tracker);
}

fn mutations(c: &mut Criterion) {
    let cluster = Cluster::new();
    let mut tracker = cluster.tracker();
    let mut group = c.benchmark_group("mutations");
    const BATCH: usize = 10_000;
    group.throughput(Throughput::Elements(BATCH as u64));
    let mut round = 1;
    group.bench_function("pod_egress_change_x10000", |b| {
        b.iter(|| {
            // Every update moves a pod to another egress: a real change each time.
            for i in 0..BATCH {
                tracker
                    .update_pod(Operation::Add, &cluster.pod(i * 7 % PODS, i + round))
                    .unwrap();
            }
            round += 1;
        });
    });
    let mut flip = 0;
    group.throughput(Throughput::Elements(1));
    group.bench_function("endpoints_level_update_one_moved", |b| {
        b.iter(|| {
            // A 20-endpoint service whose first backend alternates between two pods.
            let mut eps = cluster.endpoints(42);
            flip ^= 1;
            eps[0].address = &cluster.addresses[if flip == 0 { 42 } else { 99_999 }];
            eps[0].location = cluster.location_of(if flip == 0 { 42 } else { 99_999 });
            tracker.set_endpoints(&cluster.services[42], &eps).unwrap();
        });
    });
    // 1,000 level updates over 100 services (every 50th, 20 endpoints each), the lists built before
    // the clock: each update re-sends a service's whole set with its first backend alternating
    // between its own pod and another pod of the cluster, so every update moves one backend.
    const LEVEL_SERVICES: usize = 100;
    const LEVEL_UPDATES: usize = 1_000;
    let lists: Vec<[Vec<Endpoint<'_>>; 2]> = (0..LEVEL_SERVICES)
        .map(|s| {
            let service = s * (SERVICES / LEVEL_SERVICES);
            let own = cluster.endpoints(service);
            let mut moved = own.clone();
            let other = PODS - 1 - service;
            moved[0] = Endpoint {
                address: &cluster.addresses[other],
                location: cluster.location_of(other),
            };
            [own, moved]
        })
        .collect();
    let mut flips = [0usize; LEVEL_SERVICES];
    group.throughput(Throughput::Elements(LEVEL_UPDATES as u64));
    group.bench_function("endpoints_level_updates_x1000_over_100_services", |b| {
        b.iter(|| {
            for k in 0..LEVEL_UPDATES {
                let s = k % LEVEL_SERVICES;
                flips[s] ^= 1;
                tracker
                    .set_endpoints(
                        &cluster.services[s * (SERVICES / LEVEL_SERVICES)],
                        &lists[s][flips[s]],
                    )
                    .unwrap();
            }
        });
    });
    // The same three workloads through the `_ip` methods, the IPs parsed before the clock (as the
    // gRPC edge would): what the tracker itself costs.
    let pods_ip: Vec<(IpAddr, IpAddr)> = (0..PODS)
        .map(|i| {
            (
                cluster.addresses[i].parse().unwrap(),
                cluster.location_of(i).parse().unwrap(),
            )
        })
        .collect();
    let endpoints_ip = |service: usize| -> Vec<EndpointIp> {
        (service..PODS)
            .step_by(SERVICES)
            .map(|i| EndpointIp {
                address: pods_ip[i].0,
                location: pods_ip[i].1,
            })
            .collect()
    };
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function("ip/pod_egress_change_x10000", |b| {
        b.iter(|| {
            for i in 0..BATCH {
                let p = i * 7 % PODS;
                let pod = PodIpUpdate {
                    address: pods_ip[p].0,
                    location: pods_ip[p].1,
                    outbound_identity: &cluster.egresses[(i + round) % EGRESSES],
                    uid: "",
                    nat_gateway: "",
                };
                tracker.update_pod_ip(Operation::Add, &pod).unwrap();
            }
            round += 1;
        });
    });
    let one_moved: [Vec<EndpointIp>; 2] = {
        let own = endpoints_ip(42);
        let mut moved = own.clone();
        moved[0] = EndpointIp {
            address: pods_ip[99_999].0,
            location: pods_ip[99_999].1,
        };
        [own, moved]
    };
    group.throughput(Throughput::Elements(1));
    group.bench_function("ip/endpoints_level_update_one_moved", |b| {
        b.iter(|| {
            flip ^= 1;
            tracker
                .set_endpoints_ip(&cluster.services[42], &one_moved[flip])
                .unwrap();
        });
    });
    let lists_ip: Vec<[Vec<EndpointIp>; 2]> = (0..LEVEL_SERVICES)
        .map(|s| {
            let service = s * (SERVICES / LEVEL_SERVICES);
            let own = endpoints_ip(service);
            let mut moved = own.clone();
            let other = PODS - 1 - service;
            moved[0] = EndpointIp {
                address: pods_ip[other].0,
                location: pods_ip[other].1,
            };
            [own, moved]
        })
        .collect();
    group.throughput(Throughput::Elements(LEVEL_UPDATES as u64));
    group.bench_function("ip/endpoints_level_updates_x1000_over_100_services", |b| {
        b.iter(|| {
            for k in 0..LEVEL_UPDATES {
                let s = k % LEVEL_SERVICES;
                flips[s] ^= 1;
                tracker
                    .set_endpoints_ip(
                        &cluster.services[s * (SERVICES / LEVEL_SERVICES)],
                        &lists_ip[s][flips[s]],
                    )
                    .unwrap();
            }
        });
    });
    group.finish();
}

fn one_pod_change_to_diff(c: &mut Criterion) {
    let cluster = Cluster::new();
    let mut tracker = cluster.tracker();
    let mut oracle = cluster.oracle();
    let mut group = c.benchmark_group("one_pod_change_to_diff");
    // Every change moves pod 12,345 to an egress other than the one NRP has for it, so each
    // iteration has exactly one location to send.
    const POD: usize = 12_345;
    let other_egress = |k: usize| Cluster::egress_of(POD) + 1 + k % (EGRESSES - 1);
    let mut k = 1;
    group.bench_function("incremental", |b| {
        b.iter(|| {
            k += 1;
            tracker
                .update_pod(Operation::Add, &cluster.pod(POD, other_egress(k)))
                .unwrap();
            let dirty = tracker.take_dirty();
            let diffs: Vec<_> = dirty
                .locations
                .iter()
                .filter_map(|l| tracker.location_diff(*l))
                .collect();
            assert_eq!(diffs.len(), 1);
            black_box(diffs)
        });
    });
    group.sample_size(10);
    group.bench_function("oracle_full_recompute", |b| {
        b.iter_batched(
            || (),
            |()| {
                k += 1;
                let p = cluster.pod(POD, other_egress(k));
                oracle.update_pod(
                    Operation::Add,
                    p.address,
                    p.location,
                    p.outbound_identity,
                    p.uid,
                );
                let diff = oracle.diff();
                assert_eq!(diff.locations.len(), 1);
                black_box(diff)
            },
            BatchSize::PerIteration,
        );
    });
    group.finish();
}

/// The whole pending diff by a full scan (`pending_diff`), services in NRP and no location yet: a
/// diff of every address of the cluster.
fn whole_cluster_diff(c: &mut Criterion) {
    let cluster = Cluster::new();
    let tracker = cluster.tracker_with_services_only();
    let mut group = c.benchmark_group("whole_cluster_diff");
    group.sample_size(10);
    group.bench_function("services_in_nrp_no_locations", |b| {
        b.iter(|| {
            let diff = tracker.pending_diff();
            assert_eq!(diff.locations.len(), LOCATIONS);
            black_box(diff)
        });
    });
    group.finish();
}

/// The read API's view of every inbound service, one by one (what a WatchServices snapshot reads).
fn service_views(c: &mut Criterion) {
    let cluster = Cluster::new();
    let tracker = cluster.tracker();
    let mut group = c.benchmark_group("read");
    group.bench_function("service_views_inbound_x5000", |b| {
        b.iter(|| {
            let n = cluster
                .services
                .iter()
                .map(|s| tracker.service_view(s).unwrap().locations)
                .sum::<usize>();
            black_box(n)
        });
    });
    group.finish();
}

criterion_group!(
    benches,
    mutations,
    one_pod_change_to_diff,
    whole_cluster_diff,
    service_views
);

fn main() {
    memory_per_address(&Cluster::new());
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
