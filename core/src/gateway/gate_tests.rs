//! The restart gate's rules: restarts, then handovers of pods between writers.

mod tests {
    use super::super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn cluster_view() -> Scope {
        Scope {
            services: true,
            endpoints: true,
            ..Scope::default()
        }
    }

    fn pods_at(l: &str) -> Scope {
        Scope {
            pods: true,
            location: Some(ip(l)),
            ..Scope::default()
        }
    }

    fn topology() -> Topology {
        let node = |name: &str, l: &[&str]| NodeDecl {
            name: name.into(),
            locations: l.iter().map(|s| ip(s)).collect(),
            pods_writer: format!("node-agent/{name}"),
        };
        Topology {
            nodes: vec![
                node("a", &["10.0.0.1", "fd00::1"]),
                node("b", &["10.0.0.2"]),
            ],
        }
    }

    fn only(list: &[&str]) -> WithheldLocations {
        WithheldLocations::Only(list.iter().map(|s| ip(s)).collect())
    }

    #[test]
    fn removals_wait_for_the_read_back_the_cluster_view_and_each_location_s_pod_writer() {
        let t0 = Instant::now();
        let mut g = RestartGate::new(Vec::new(), Duration::from_secs(60));
        assert_eq!(g.poll(t0), Some(Withheld::everything()));
        assert_eq!(g.poll(t0), None, "nothing changed");
        // A node agent first: nothing opens before the cluster view.
        g.resync_completed(
            "node-agent/b",
            &pods_at("10.0.0.2"),
            None,
            &DiffTracker::new(),
            t0,
        );
        assert_eq!(g.poll(t0), Some(Withheld::everything()));
        g.observed(t0, false);
        g.resync_completed(
            "watcher",
            &cluster_view(),
            Some(&topology()),
            &DiffTracker::new(),
            t0,
        );
        let w = g.poll(t0).unwrap();
        assert_eq!(w.locations, only(&["10.0.0.1", "fd00::1"]));
        assert!(!w.inbound_deletions && w.outbound_deletions);
        assert_eq!(g.pending_writers(), ["node-agent/a"]);
        // Agent a resyncs one of its two locations, then the other.
        g.resync_completed(
            "node-agent/a",
            &pods_at("10.0.0.1"),
            None,
            &DiffTracker::new(),
            t0,
        );
        assert_eq!(g.poll(t0).unwrap().locations, only(&["fd00::1"]));
        g.resync_completed(
            "node-agent/a",
            &pods_at("fd00::1"),
            None,
            &DiffTracker::new(),
            t0,
        );
        assert_eq!(g.poll(t0), Some(Withheld::nothing()));
        assert!(g.is_open());
        // Open for good.
        g.resync_completed(
            "watcher",
            &cluster_view(),
            Some(&Topology::default()),
            &DiffTracker::new(),
            t0,
        );
        assert_eq!(g.poll(t0 + Duration::from_secs(3600)), None);
    }

    #[test]
    fn a_writer_that_never_comes_holds_back_only_its_locations_and_only_for_the_bound() {
        let t0 = Instant::now();
        let bound = Duration::from_secs(60);
        let mut g = RestartGate::new(Vec::new(), bound);
        g.resync_completed(
            "watcher",
            &cluster_view(),
            Some(&topology()),
            &DiffTracker::new(),
            t0,
        );
        let later = t0 + Duration::from_secs(10);
        g.observed(later, false);
        g.resync_completed(
            "node-agent/a",
            &pods_at("10.0.0.1"),
            None,
            &DiffTracker::new(),
            later,
        );
        g.resync_completed(
            "node-agent/a",
            &pods_at("fd00::1"),
            None,
            &DiffTracker::new(),
            later,
        );
        assert_eq!(g.poll(later).unwrap().locations, only(&["10.0.0.2"]));
        // The bound counts from when both the read-back and the cluster view are there.
        assert_eq!(g.poll(t0 + bound), None);
        assert_eq!(g.poll(later + bound), Some(Withheld::nothing()));
        assert!(g.is_open());
    }

    #[test]
    fn without_a_topology_the_cluster_view_and_the_expected_writers_gate_everything() {
        let t0 = Instant::now();
        let bound = Duration::from_secs(60);
        let mut g = RestartGate::new(vec!["watcher".into(), "extra".into()], bound);
        g.observed(t0, false);
        assert_eq!(g.poll(t0), Some(Withheld::everything()));
        assert_eq!(
            g.pending_writers(),
            ["watcher", "extra"],
            "expected writers are listed before the cluster view"
        );
        g.resync_completed("watcher", &cluster_view(), None, &DiffTracker::new(), t0);
        assert_eq!(g.poll(t0), Some(Withheld::everything()));
        assert_eq!(g.pending_writers(), ["extra"]);
        assert_eq!(g.holds()[0].deadline, Some(t0 + bound));
        g.resync_completed("extra", &pods_at("10.0.0.9"), None, &DiffTracker::new(), t0);
        assert_eq!(g.poll(t0), Some(Withheld::nothing()));
    }

    #[test]
    fn the_cluster_view_is_waited_for_without_bound_and_an_empty_read_back_opens_the_gate() {
        let t0 = Instant::now();
        let mut g = RestartGate::new(Vec::new(), Duration::from_secs(1));
        g.observed(t0, false);
        g.poll(t0);
        assert_eq!(g.poll(t0 + Duration::from_secs(86_400)), None);
        assert_eq!(g.withheld(), Withheld::everything());

        let mut g = RestartGate::new(Vec::new(), Duration::from_secs(1));
        g.observed(t0, true);
        assert_eq!(g.poll(t0), Some(Withheld::nothing()));
        assert!(g.is_open());
        // Expected writers still hold removals back.
        let mut g = RestartGate::new(vec!["watcher".into()], Duration::from_secs(1));
        g.observed(t0, true);
        assert_eq!(g.poll(t0), Some(Withheld::everything()));
        assert_eq!(g.pending_writers(), ["watcher"]);
        g.resync_completed(
            "watcher",
            &pods_at("10.0.0.1"),
            None,
            &DiffTracker::new(),
            t0,
        );
        assert_eq!(g.poll(t0), Some(Withheld::nothing()));
    }

    #[test]
    fn a_watcher_that_reports_pods_itself_releases_its_nodes_with_its_own_resync() {
        let t0 = Instant::now();
        let mut g = RestartGate::new(Vec::new(), Duration::from_secs(60));
        g.observed(t0, false);
        let mut topo = topology();
        for n in &mut topo.nodes {
            n.pods_writer = "watcher".into();
        }
        let all = Scope {
            services: true,
            endpoints: true,
            pods: true,
            ..Scope::default()
        };
        g.resync_completed("watcher", &all, Some(&topo), &DiffTracker::new(), t0);
        assert_eq!(g.poll(t0), Some(Withheld::nothing()));
    }
}

mod handover_tests {
    use super::super::*;
    use clb_core::difftracker::{Operation, PodUpdate};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn scope(services: bool, pods: bool, location: Option<&str>) -> Scope {
        Scope {
            services,
            endpoints: services,
            pods,
            location: location.map(ip),
            ..Scope::default()
        }
    }

    /// Nodes a (10.0.0.1, fd00::1), b (10.0.0.2) and c (10.0.0.3); `agents`: whose pods the node
    /// agents report (the watcher reports the others).
    fn topology(agents: &[&str]) -> Topology {
        let node = |name: &str, l: &[&str]| NodeDecl {
            name: name.into(),
            locations: l.iter().map(|s| ip(s)).collect(),
            pods_writer: if agents.contains(&name) {
                format!("node-agent/{name}")
            } else {
                "watcher".into()
            },
        };
        Topology {
            nodes: vec![
                node("a", &["10.0.0.1", "fd00::1"]),
                node("b", &["10.0.0.2"]),
                node("c", &["10.0.0.3"]),
            ],
        }
    }

    /// One pod at each of 10.0.0.1, 10.0.0.2 and 10.0.0.3.
    fn tracker() -> DiffTracker {
        let mut t = DiffTracker::new();
        for (i, l) in ["10.0.0.1", "10.0.0.2", "10.0.0.3"].iter().enumerate() {
            let address = format!("10.1.0.{}", i + 1);
            let pod = PodUpdate {
                address: &address,
                location: l,
                outbound_identity: "eg",
                uid: "",
                ..Default::default()
            };
            t.update_pod(Operation::Add, &pod).unwrap();
        }
        t
    }

    fn only(list: &[&str]) -> WithheldLocations {
        WithheldLocations::Only(list.iter().map(|s| ip(s)).collect())
    }

    /// An open gate after the cluster view (with `topology`, if any; reporting the pods itself
    /// unless the topology gives some to node agents) and the resyncs of those node agents.
    fn open_gate(t: &DiffTracker, topology: Option<&Topology>, t0: Instant) -> RestartGate {
        let mut g = RestartGate::new(Vec::new(), Duration::from_secs(60));
        g.observed(t0, false);
        let agents: Vec<(String, IpAddr)> = topology
            .iter()
            .flat_map(|t| &t.nodes)
            .filter(|n| n.pods_writer != "watcher")
            .flat_map(|n| n.locations.iter().map(|l| (n.pods_writer.clone(), *l)))
            .collect();
        let pods = agents.is_empty();
        let h = g.resync_completed("watcher", &scope(true, pods, None), topology, t, t0);
        assert_eq!(h, Handover::default());
        for (agent, l) in agents {
            let at = Scope {
                pods: true,
                location: Some(l),
                ..Scope::default()
            };
            assert_eq!(
                g.resync_completed(&agent, &at, None, t, t0),
                Handover::default()
            );
        }
        assert_eq!(g.poll(t0), Some(Withheld::nothing()));
        assert!(g.is_open());
        g
    }

    #[test]
    fn pods_handed_to_node_agents_wait_for_each_agent_s_resync_then_for_the_bound_only() {
        let t0 = Instant::now();
        let t = tracker();
        let mut g = open_gate(&t, Some(&topology(&[])), t0);
        // Agent b resynced before the handover: that view does not speak for after it.
        g.resync_completed(
            "node-agent/b",
            &scope(false, true, Some("10.0.0.2")),
            None,
            &t,
            t0,
        );
        assert_eq!(g.poll(t0), None);

        // The watcher stops reporting pods; the agents own their nodes' pods from now on.
        let t1 = t0 + Duration::from_secs(5);
        let h = g.resync_completed(
            "watcher",
            &scope(true, false, None),
            Some(&topology(&["a", "b", "c"])),
            &t,
            t1,
        );
        assert_eq!(
            h.drop_pods_at,
            vec![ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3")]
        );
        assert_eq!(
            h.resync_asked,
            ["node-agent/a", "node-agent/b", "node-agent/c"]
        );
        let w = g.poll(t1).unwrap();
        assert_eq!(w.locations, only(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]));
        assert!(w.outbound_deletions && !w.inbound_deletions);
        assert_eq!(
            g.pending_writers(),
            ["node-agent/a", "node-agent/b", "node-agent/c"]
        );
        assert!(g.holds().iter().all(|h| h.reason.label() == "pod_writer"
            && h.deadline == Some(t1 + Duration::from_secs(60))));
        // A relist of the watcher changes nothing more.
        let h = g.resync_completed(
            "watcher",
            &scope(true, false, None),
            Some(&topology(&["a", "b", "c"])),
            &t,
            t1,
        );
        assert_eq!(h, Handover::default());
        assert_eq!(
            g.poll(t1).unwrap().locations,
            only(&["10.0.0.1", "10.0.0.2", "10.0.0.3"])
        );
        // Agents b and c resync: their locations are released; agent a never comes.
        g.resync_completed(
            "node-agent/c",
            &scope(false, true, Some("10.0.0.3")),
            None,
            &t,
            t1,
        );
        g.resync_completed(
            "node-agent/b",
            &scope(false, true, Some("10.0.0.2")),
            None,
            &t,
            t1,
        );
        assert_eq!(g.poll(t1).unwrap().locations, only(&["10.0.0.1"]));
        assert_eq!(
            g.poll(t0 + Duration::from_secs(60)),
            None,
            "not before the bound"
        );
        assert_eq!(
            g.poll(t1 + Duration::from_secs(60)),
            Some(Withheld::nothing()),
            "given up at the bound"
        );
        assert!(g.holds().is_empty());
    }

    #[test]
    fn the_watcher_taking_the_pods_back_hands_nothing_over_its_resync_covers_every_location() {
        let t0 = Instant::now();
        let t = tracker();
        let mut g = open_gate(&t, Some(&topology(&["a", "b", "c"])), t0);
        let h = g.resync_completed(
            "watcher",
            &scope(true, true, None),
            Some(&topology(&[])),
            &t,
            t0,
        );
        assert_eq!(h, Handover::default());
        assert_eq!(g.poll(t0), None);
        // ...and giving them to the agents again waits for their resync again, although they
        // resynced before they lost them.
        for (agent, l) in [("node-agent/a", "10.0.0.1"), ("node-agent/c", "10.0.0.3")] {
            g.resync_completed(agent, &scope(false, true, Some(l)), None, &t, t0);
        }
        let h = g.resync_completed(
            "watcher",
            &scope(true, false, None),
            Some(&topology(&["a", "b", "c"])),
            &t,
            t0,
        );
        assert_eq!(h.drop_pods_at.len(), 3);
    }

    #[test]
    fn a_handover_in_the_middle_of_a_pending_one_goes_to_the_latest_owner() {
        let t0 = Instant::now();
        let t = tracker();
        let mut g = open_gate(&t, Some(&topology(&[])), t0);
        let h = g.resync_completed(
            "watcher",
            &scope(true, false, None),
            Some(&topology(&["c"])),
            &t,
            t0,
        );
        // The watcher declares itself the owner of a and b but does not report pods any more.
        assert_eq!(h.resync_asked, ["watcher", "node-agent/c"]);
        // It reports them again: a and b are released with that resync; c still waits for c.
        let h = g.resync_completed(
            "watcher",
            &scope(true, true, None),
            Some(&topology(&["c"])),
            &t,
            t0,
        );
        assert_eq!(h, Handover::default());
        assert_eq!(g.poll(t0).unwrap().locations, only(&["10.0.0.3"]));
        // Then c goes back to the watcher: released by the same resync.
        let h = g.resync_completed(
            "watcher",
            &scope(true, true, None),
            Some(&topology(&[])),
            &t,
            t0,
        );
        assert_eq!(h, Handover::default());
        assert_eq!(g.poll(t0), Some(Withheld::nothing()));
    }

    #[test]
    fn a_node_that_leaves_the_topology_takes_its_agent_s_pods_at_once() {
        let t0 = Instant::now();
        let t = tracker();
        let mut g = open_gate(&t, Some(&topology(&["a", "b", "c"])), t0);
        let mut without_c = topology(&["a", "b", "c"]);
        without_c.nodes.pop();
        let h = g.resync_completed(
            "watcher",
            &scope(true, false, None),
            Some(&without_c),
            &t,
            t0,
        );
        // c's node is gone with its pods: nothing waits; the other nodes keep their owners.
        assert_eq!(h.drop_pods_at, [ip("10.0.0.3")]);
        assert!(h.resync_asked.is_empty());
        assert_eq!(g.poll(t0), None);
        assert!(g.holds().is_empty());
    }

    #[test]
    fn without_a_topology_pods_nobody_reports_any_more_wait_for_any_writer_of_their_location() {
        let t0 = Instant::now();
        let t = tracker();
        let mut g = open_gate(&t, None, t0);
        let h = g.resync_completed("watcher", &scope(true, false, None), None, &t, t0);
        assert_eq!(h.drop_pods_at.len(), 3);
        assert!(h.resync_asked.is_empty());
        assert_eq!(
            g.poll(t0).unwrap().locations,
            only(&["10.0.0.1", "10.0.0.2", "10.0.0.3"])
        );
        assert!(
            g.holds()
                .iter()
                .all(|h| h.reason == HoldReason::NoPodWriter)
        );
        assert!(g.pending_writers().is_empty());
        g.resync_completed(
            "agent-x",
            &scope(false, true, Some("10.0.0.2")),
            None,
            &t,
            t0,
        );
        assert_eq!(
            g.poll(t0).unwrap().locations,
            only(&["10.0.0.1", "10.0.0.3"])
        );
        assert_eq!(
            g.poll(t0 + Duration::from_secs(60)),
            Some(Withheld::nothing())
        );
    }
}
