//! The registrar against a model of NRP's `updateServices`: the calls it saw, the services it
//! refuses (a call carrying one is refused whole), and a failure it answers every call with.

use std::sync::Mutex;
use std::time::Duration;

use clb_nrp::NrpError;
use clb_nrp::wire::GatewayService;

use super::*;

/// `updateServices` as the registrar sees it.
#[derive(Default)]
struct Model {
    /// The services of each call, in order.
    calls: Mutex<Vec<Vec<String>>>,
    /// Services refused; with `name_them`, the refusal's message names the first one of the call.
    refused: Vec<&'static str>,
    name_them: bool,
    /// Every call fails with this.
    fail: Option<UnitError>,
}

#[async_trait::async_trait]
impl Registry for Model {
    async fn update_services(&self, body: &UpdateServicesRequest) -> Result<(), UnitError> {
        let names: Vec<String> = body
            .service_requests
            .iter()
            .map(|r| r.service.name.clone())
            .collect();
        self.calls.lock().unwrap().push(names.clone());
        if let Some(e) = &self.fail {
            return Err(e.clone());
        }
        match names.iter().find(|n| self.refused.contains(&n.as_str())) {
            Some(bad) => Err(UnitError::Nrp(NrpError::Validation {
                code: "InvalidServiceProperties".into(),
                message: if self.name_them {
                    format!("service '{bad}' has invalid properties")
                } else {
                    "the request has invalid properties".into()
                },
            })),
            None => Ok(()),
        }
    }
}

impl Model {
    fn calls(&self) -> Vec<Vec<String>> {
        self.calls.lock().unwrap().clone()
    }
}

fn request(name: &str) -> ServiceRequest {
    ServiceRequest {
        is_delete: false,
        service: GatewayService::inbound(name, format!("/lb-{name}/backendAddressPools/backend")),
    }
}

/// Runs `sagas` sagas, saga `i` registering `names[i]` (none: it ends without registering) after
/// `i` ms, against `model`; returns each saga's outcome (`None`: it did not register) and what the
/// registrar sent.
async fn run(model: &Model, names: &[Option<&str>]) -> (Vec<Option<Result<(), UnitError>>>, Sent) {
    let registrar = Registrar::new(names.len());
    let sagas = futures::future::join_all(names.iter().enumerate().map(|(i, name)| {
        let seat = registrar.seat();
        async move {
            tokio::time::sleep(Duration::from_millis(i as u64)).await;
            match name {
                Some(name) => Some(seat.register(request(name)).await),
                None => None,
            }
        }
    }));
    futures::join!(sagas, registrar.run(model))
}

#[tokio::test]
async fn the_registrations_of_a_unit_go_in_one_call() {
    let model = Model::default();
    let (results, sent) = run(&model, &[Some("a"), None, Some("b"), Some("c"), None]).await;
    assert_eq!(model.calls(), vec![vec!["a", "b", "c"]]);
    assert_eq!(
        sent,
        Sent {
            requests: 3,
            calls: 1
        }
    );
    assert_eq!(
        results,
        vec![Some(Ok(())), None, Some(Ok(())), Some(Ok(())), None]
    );
}

#[tokio::test]
async fn no_registration_no_call() {
    let model = Model::default();
    let (_, sent) = run(&model, &[None, None]).await;
    assert!(model.calls().is_empty());
    assert_eq!(sent, Sent::default());
    let (_, sent) = run(&model, &[]).await;
    assert_eq!(sent, Sent::default());
}

#[tokio::test]
async fn a_refused_call_is_split_down_to_the_refused_service() {
    // Not named: halving (a b c d ✗ → a b ✓, c d ✗ → c ✗, d ✓).
    let model = Model {
        refused: vec!["c"],
        ..Default::default()
    };
    let names = [Some("a"), Some("b"), Some("c"), Some("d")];
    let (results, sent) = run(&model, &names).await;
    assert_eq!(
        model.calls(),
        vec![
            vec!["a", "b", "c", "d"],
            vec!["a", "b"],
            vec!["c", "d"],
            vec!["c"],
            vec!["d"]
        ]
    );
    assert_eq!(sent.calls, 5);
    assert!(sent.calls <= 1 + refusal_split_bound(4));
    let refused: Vec<bool> = results
        .iter()
        .map(|r| matches!(r, Some(Err(UnitError::Nrp(NrpError::Validation { .. })))))
        .collect();
    assert_eq!(refused, vec![false, false, true, false]);
    assert!(
        results
            .iter()
            .filter(|r| !refused_one(r))
            .all(|r| *r == Some(Ok(())))
    );

    // Named: the named one is left out and the rest goes in one call.
    let model = Model {
        refused: vec!["b"],
        name_them: true,
        ..Default::default()
    };
    let (results, sent) = run(&model, &names).await;
    assert_eq!(
        model.calls(),
        vec![vec!["a", "b", "c", "d"], vec!["a", "c", "d"]]
    );
    assert_eq!(sent.calls, 2);
    assert!(refused_one(&results[1]));
    assert_eq!(results[0], Some(Ok(())));
    assert_eq!(results[3], Some(Ok(())));
}

fn refused_one(r: &Option<Result<(), UnitError>>) -> bool {
    matches!(r, Some(Err(UnitError::Nrp(NrpError::Validation { .. }))))
}

#[tokio::test]
async fn a_retryable_failure_is_every_registrations_answer() {
    let throttled = UnitError::Nrp(NrpError::Throttled {
        code: "TooManyRequests".into(),
        message: "slow down".into(),
        retry_after: Some(Duration::from_secs(1)),
    });
    let model = Model {
        fail: Some(throttled.clone()),
        ..Default::default()
    };
    let (results, sent) = run(&model, &[Some("a"), Some("b"), None]).await;
    // Not split: sent again, it would most likely fail the same way.
    assert_eq!(sent.calls, 1);
    assert_eq!(
        results,
        vec![Some(Err(throttled.clone())), Some(Err(throttled)), None]
    );
}

#[tokio::test]
async fn a_saga_registers_once() {
    let model = Model::default();
    let registrar = Registrar::new(1);
    let seat = registrar.seat();
    let (first, _) = futures::join!(seat.register(request("a")), registrar.run(&model));
    assert_eq!(first, Ok(()));
    let second = seat.register(request("a")).await;
    assert!(
        matches!(second, Err(UnitError::Invalid { .. })),
        "{second:?}"
    );
    assert_eq!(model.calls().len(), 1);
}
