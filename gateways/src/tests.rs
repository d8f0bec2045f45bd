use super::*;

const TWO: &str = "
defaultGateway: west
gateways:
  - name: east
    labels: {region: eastus}
    nodes: {pool: pool-east}
    azure:
      subscription: sub-1
      resourceGroup: rg-east
      region: eastus
      serviceGateway: sgw-east
      apiVersion: '2026-03-01'
      endpoint: http://127.0.0.1:1
  - name: west
    labels: {region: westus}
    azure: {subscription: sub-2, resourceGroup: rg-west, region: westus}
";

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn a_file_of_two_gateways_routes_nodes_by_pool() {
    let g = Gateways::parse(TWO).expect("valid");
    assert_eq!(g.names(), ["west", "east"], "the default first");
    assert_eq!(g.default_gateway().name, "west");
    let east = g.get("EAST").expect("case-insensitive");
    assert_eq!(east.resource_name(), "sgw-east");
    assert_eq!(east.pool(), "pool-east");
    assert_eq!(east.azure.api_version.as_deref(), Some("2026-03-01"));
    assert_eq!(g.get("west").expect("west").resource_name(), "west");
    assert_eq!(g.get("").expect("default").name, "west");
    let node_east = labels(&[(DEFAULT_NODE_POOL_LABEL, "pool-east")]);
    assert_eq!(g.gateway_of_node(&node_east).expect("east").name, "east");
    // Any other node goes to the gateway without `nodes`.
    let other = labels(&[(DEFAULT_NODE_POOL_LABEL, "pool-x")]);
    assert_eq!(g.gateway_of_node(&other).expect("west").name, "west");
    assert_eq!(g.by_pool("west").expect("west").name, "west");
    let selected = g.with_labels(&labels(&[("region", "eastus")]));
    assert_eq!(selected.len(), 1);
    assert_eq!(selected[0].name, "east");
    assert_eq!(g.with_labels(&Labels::new()).len(), 2);
}

#[test]
fn without_a_catch_all_an_unmatched_node_has_no_gateway() {
    let g = Gateways::parse(
        "nodePoolLabel: pool
gateways:
  - name: a
    nodes: {matchLabels: {zone: '1'}}
    azure: {subscription: s, resourceGroup: r, region: x}
  - name: b
    nodes: {pool: b, matchLabels: {zone: '2'}}
    azure: {subscription: s, resourceGroup: r, region: x}
",
    )
    .expect("valid");
    assert_eq!(g.default_gateway().name, "a", "the first by default");
    assert_eq!(
        g.gateway_of_node(&labels(&[("zone", "1")]))
            .map(|g| &g.name[..]),
        Some("a")
    );
    // Both pool and labels must match.
    assert!(g.gateway_of_node(&labels(&[("zone", "2")])).is_none());
    assert_eq!(
        g.gateway_of_node(&labels(&[("zone", "2"), ("pool", "b")]))
            .map(|g| &g.name[..]),
        Some("b")
    );
}

#[test]
fn the_single_gateway_of_the_flags_serves_every_node() {
    let g = Gateways::single("default", "sub", "rg", "eastus");
    assert_eq!(g.names(), ["default"]);
    assert_eq!(
        g.gateway_of_node(&Labels::new()).map(|g| &g.name[..]),
        Some("default")
    );
}

#[test]
fn bad_files_get_precise_errors() {
    let azure = "azure: {subscription: s, resourceGroup: r, region: x}";
    let cases: Vec<(String, &str)> = vec![
        ("gateways: []".into(), "gateways = \"\": lists no gateway"),
        (
            format!("gateways:\n  - {{name: a, {azure}}}\n  - {{name: A, {azure}}}"),
            "gateways[1].name = \"A\": gateways[0] has the same name",
        ),
        (
            format!("gateways:\n  - {{name: a, {azure}}}\n  - {{name: b, {azure}}}"),
            "gateways[1].nodes = \"\": is missing, and gateway \"a\" already serves every node",
        ),
        (
            format!("gateways:\n  - {{name: 'a b', {azure}}}"),
            "gateways[0].name = \"a b\": may hold only letters",
        ),
        (
            format!("gateways:\n  - {{name: a, nodes: {{}}, {azure}}}"),
            "gateways[0].nodes = \"{}\": selects nothing",
        ),
        (
            format!(
                "gateways:\n  - {{name: a, nodes: {{pool: p}}, {azure}}}\n  - {{name: b, nodes: \
                 {{pool: p}}, {azure}}}"
            ),
            "gateways[1].nodes.pool = \"p\": gateways[0] stands for the same node pool",
        ),
        (
            format!("defaultGateway: c\ngateways:\n  - {{name: a, {azure}}}"),
            "defaultGateway = \"c\": is not the name of a listed gateway",
        ),
        (
            "gateways:\n  - {name: a, azure: {subscription: '', resourceGroup: r, region: x}}"
                .into(),
            "gateways[0].azure.subscription = \"\": is empty",
        ),
        (
            format!("gateways:\n  - {{name: a, zone: 1, {azure}}}"),
            "unknown field `zone`",
        ),
        ("gateways:\n  - {name: a}".into(), "missing field `azure`"),
        (
            format!("gateways:\n  - {{name: '{}', {azure}}}", "x".repeat(300)),
            "is longer than 80 characters",
        ),
    ];
    for (text, want) in cases {
        let err = Gateways::parse(&text).expect_err(&text).to_string();
        assert!(err.contains(want), "{text}\n=> {err}\nwanted {want:?}");
        assert!(err.len() < 400, "the error quotes at most 100 chars: {err}");
    }
}

#[test]
fn a_missing_file_names_its_path() {
    let err = Gateways::load(Path::new("/no/such/gateways.yaml")).expect_err("missing");
    assert!(
        err.to_string()
            .starts_with("cannot read the gateways file /no/such/gateways.yaml"),
        "{err}"
    );
}

#[test]
fn a_nat_gateway_resource_group_is_optional_per_gateway_and_checked() {
    let g = Gateways::parse(
        "gateways:
  - name: a
    nodes: {pool: a}
    azure: {subscription: s, resourceGroup: r, region: x, natGatewayResourceGroup: rg-vnet}
  - name: b
    azure: {subscription: s, resourceGroup: r2, region: x}
",
    )
    .expect("valid");
    assert_eq!(
        g.get("a")
            .unwrap()
            .azure
            .nat_gateway_resource_group
            .as_deref(),
        Some("rg-vnet")
    );
    assert_eq!(g.get("b").unwrap().azure.nat_gateway_resource_group, None);
    for (value, why) in [
        ("''", "is empty"),
        ("'rg.'", "must not end with '.'"),
        ("'rg vnet'", "may hold only"),
    ] {
        let text = format!(
            "gateways:
  - name: a
    azure: {{subscription: s, resourceGroup: r, region: x, natGatewayResourceGroup: {value}}}
"
        );
        let e = Gateways::parse(&text).unwrap_err();
        let GatewaysError::Invalid { field, reason, .. } = &e else {
            panic!("{value}: {e}");
        };
        assert_eq!(field, "gateways[0].azure.natGatewayResourceGroup", "{e}");
        assert!(reason.contains(why), "{value}: {e}");
    }
    let long = "r".repeat(500);
    let e = Gateways::parse(&format!(
        "gateways:
  - name: a
    azure: {{subscription: s, resourceGroup: r, region: x, natGatewayResourceGroup: {long}}}
"
    ))
    .unwrap_err();
    assert!(
        e.to_string().contains("longer than 90") && e.to_string().len() < 300,
        "{e}"
    );
}
