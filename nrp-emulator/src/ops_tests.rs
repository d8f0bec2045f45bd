//! Tests of `ops.rs`: routing of ARM paths and methods to operations.

use super::*;

#[test]
fn routes() {
    let p = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/serviceGateways/sg";
    let r = route(&Method::PUT, p).unwrap();
    assert_eq!(r.operation, "ServiceGateways_CreateOrUpdate");
    let r = route(&Method::POST, &format!("{p}/updateAddressLocations")).unwrap();
    assert!(matches!(
        r.target,
        Target::Gateway(_, GatewayAction::UpdateAddressLocations)
    ));
    assert!(matches!(
        route(&Method::GET, &format!("{p}/updateServices")),
        Err(EmulatorError::MethodNotAllowed { .. })
    ));
    assert!(matches!(
        route(&Method::GET, "/foo"),
        Err(EmulatorError::NoRoute { .. })
    ));
    assert!(matches!(
        route(&Method::GET, &p.replace("/sg", "/s_g")),
        Err(EmulatorError::BadRequest { .. })
    ));
    // ARM names start with a letter or digit and end with a letter, a digit or '_'.
    let pip = |name: &str| {
        route(
            &Method::PUT,
            &format!(
                "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/publicIPAddresses/{name}"
            ),
        )
    };
    assert!(pip("pip-web_").is_ok());
    for bad in ["pip-web-", "pip-web.", "-pip"] {
        assert!(
            matches!(
                pip(bad),
                Err(EmulatorError::BadRequest {
                    code: "InvalidResourceName",
                    ..
                })
            ),
            "{bad}"
        );
    }
    let lower = p.to_ascii_lowercase();
    assert!(route(&Method::GET, &lower).is_ok());
    let pips = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/publicIPAddresses";
    let r = route(&Method::GET, pips).unwrap();
    assert_eq!(r.operation, "PublicIPAddresses_List");
    assert_eq!(r.target, Target::PublicIps("s".into(), "rg".into()));
    assert!(matches!(
        route(&Method::PUT, pips),
        Err(EmulatorError::MethodNotAllowed { .. })
    ));
    let lbs = pips.replace("publicIPAddresses", "LOADBALANCERS");
    let r = route(&Method::GET, &lbs).unwrap();
    assert_eq!(r.operation, "LoadBalancers_List");
    assert_eq!(r.target, Target::LoadBalancers("s".into(), "rg".into()));
    assert!(matches!(
        route(&Method::DELETE, &lbs),
        Err(EmulatorError::MethodNotAllowed { .. })
    ));
    assert!(matches!(
        route(
            &Method::GET,
            &pips.replace("publicIPAddresses", "natGateways")
        ),
        Err(EmulatorError::NoRoute { .. })
    ));
    let r = route(&Method::PATCH, p).unwrap();
    assert_eq!(r.operation, "ServiceGateways_UpdateTags");
    let r = route(&Method::GET, &p.replace("/sg", "")).unwrap();
    assert_eq!(r.operation, "ServiceGateways_List");
    assert_eq!(r.target, Target::Gateways("s".into(), Some("rg".into())));
    let all = "/subscriptions/s/providers/Microsoft.Network/serviceGateways";
    let r = route(&Method::GET, all).unwrap();
    assert_eq!(r.operation, "ServiceGateways_ListAll");
    assert_eq!(r.target, Target::Gateways("s".into(), None));
    assert!(matches!(
        route(
            &Method::PATCH,
            &pips.replace("publicIPAddresses", "natGateways/n")
        ),
        Err(EmulatorError::MethodNotAllowed { .. })
    ));
    let op = "/subscriptions/s/providers/Microsoft.Network/locations/l/operations/x";
    assert_eq!(
        route(&Method::GET, op).unwrap().target,
        Target::OperationStatus("x".into())
    );
}

#[test]
fn query_and_api_version() {
    let q = parse_query(Some("api-version=2025-05-01&$skipToken=10.0.0.1"));
    assert_eq!(check_api_version(&q).unwrap(), ApiVersion::V2025_05_01);
    assert_eq!(q.skip_token.as_deref(), Some("10.0.0.1"));
    let q = parse_query(Some("api-version=2026-03-01"));
    assert_eq!(check_api_version(&q).unwrap(), ApiVersion::V2026_03_01);
    assert_eq!(
        check_api_version(&parse_query(None)),
        Err(EmulatorError::MissingApiVersion)
    );
    assert!(matches!(
        check_api_version(&parse_query(Some("api-version=2020-01-01"))),
        Err(EmulatorError::InvalidApiVersion(_))
    ));
}
