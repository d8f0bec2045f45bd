//! A review the Kubernetes API answers late: the call fails closed at the review timeout, and the
//! answer, when it comes, is cached for the caller's next attempt (docs/security.md, "fail
//! closed"). Against a minimal API server on 127.0.0.1:0 that answers TokenReviews after a delay.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use clb_state_server::auth::{Auth, AuthConfig, Mode, review_client};
use tonic::Code;

/// The API answers each TokenReview after this long ...
const DELAY: Duration = Duration::from_millis(600);
/// ... and the server waits this long for one.
const WAIT: Duration = Duration::from_millis(100);

/// A TokenReview endpoint that authenticates every token as `user`, after [`DELAY`]; returns its
/// URL and the number of answers sent.
async fn slow_api() -> (String, Arc<AtomicUsize>) {
    let answered = Arc::new(AtomicUsize::new(0));
    let counter = answered.clone();
    let app = Router::new().route(
        "/apis/authentication.k8s.io/v1/tokenreviews",
        post(move || {
            let counter = counter.clone();
            async move {
                tokio::time::sleep(DELAY).await;
                counter.fetch_add(1, Ordering::SeqCst);
                (
                    StatusCode::CREATED,
                    [("content-type", "application/json")],
                    r#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview",
                        "metadata":{},"spec":{},
                        "status":{"authenticated":true,"audiences":["clb"],
                                  "user":{"username":"user","uid":"u1"}}}"#,
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, answered)
}

#[tokio::test]
async fn a_late_answer_fails_the_call_closed_and_is_cached_for_the_next_attempt() {
    let (url, answered) = slow_api().await;
    let auth = Auth::new(
        AuthConfig {
            authentication: Mode::Kubernetes,
            review_timeout: WAIT,
            ..AuthConfig::default()
        },
        Some(review_client(kube::Config::new(url.parse().unwrap())).unwrap()),
    )
    .unwrap();
    let mut headers = http::HeaderMap::new();
    headers.insert(http::header::AUTHORIZATION, "Bearer t".parse().unwrap());

    let e = auth
        .authenticate(&headers)
        .await
        .expect_err("no answer yet");
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    assert!(
        e.message().contains("has not answered the TokenReview"),
        "{}",
        e.message()
    );
    assert_eq!(answered.load(Ordering::SeqCst), 0);

    // The review goes on and its answer is cached: the next attempt needs no review.
    let deadline = Instant::now() + Duration::from_secs(30);
    while answered.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the review never finished");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let reviews = || auth.counts().token_reviews.load(Ordering::SeqCst);
    let caller = loop {
        let before = reviews();
        match auth.authenticate(&headers).await {
            Ok(c) => {
                assert_eq!(
                    reviews(),
                    before,
                    "answered from the cache, without a review"
                );
                break c;
            }
            // The answer was sent but not cached yet.
            Err(e) if Instant::now() < deadline => {
                assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("not cached: {}", e.message()),
        }
    };
    assert_eq!(caller.identity().map(|i| i.username.as_str()), Some("user"));
}
