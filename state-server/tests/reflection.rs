//! gRPC server reflection over real loopback: `grpc.reflection.v1` and the older `v1alpha` both
//! list the clb services and describe them (`serve` is `serve_tls` without TLS, so both share it).

mod support;

use clb_state_server::state::ServerConfig;
use support::worker::TestServer;
use tonic::transport::Channel;
use tonic_reflection::pb::{v1, v1alpha};

const CLB_SERVICES: [&str; 3] = ["clb.v1.Admin", "clb.v1.Worker", "clb.v1.Writer"];

async fn channel(server: &TestServer) -> Channel {
    tonic::transport::Endpoint::from_shared(server.url())
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Asks v1alpha reflection one question and returns its answer.
async fn ask_v1alpha(
    channel: Channel,
    request: v1alpha::server_reflection_request::MessageRequest,
) -> v1alpha::server_reflection_response::MessageResponse {
    let mut client = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("v1alpha reflection is served")
        .into_inner();
    answers
        .message()
        .await
        .unwrap()
        .expect("one answer")
        .message_response
        .expect("an answer with a response")
}

/// Asks v1 reflection one question and returns its answer.
async fn ask_v1(
    channel: Channel,
    request: v1::server_reflection_request::MessageRequest,
) -> v1::server_reflection_response::MessageResponse {
    let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel);
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("v1 reflection is served")
        .into_inner();
    answers
        .message()
        .await
        .unwrap()
        .expect("one answer")
        .message_response
        .expect("an answer with a response")
}

#[tokio::test]
async fn reflection_v1alpha_lists_and_describes_the_clb_services() {
    use v1alpha::server_reflection_request::MessageRequest;
    use v1alpha::server_reflection_response::MessageResponse;
    let server = TestServer::start(ServerConfig::default()).await;
    let answer = ask_v1alpha(
        channel(&server).await,
        MessageRequest::ListServices(String::new()),
    )
    .await;
    let MessageResponse::ListServicesResponse(list) = answer else {
        panic!("not a service list: {answer:?}")
    };
    let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
    for name in CLB_SERVICES {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    let answer = ask_v1alpha(
        channel(&server).await,
        MessageRequest::FileContainingSymbol("clb.v1.Writer".into()),
    )
    .await;
    let MessageResponse::FileDescriptorResponse(files) = answer else {
        panic!("not a file descriptor: {answer:?}")
    };
    assert!(!files.file_descriptor_proto.is_empty());
    server.stop().await;
}

#[tokio::test]
async fn reflection_v1_still_lists_the_clb_services() {
    use v1::server_reflection_request::MessageRequest;
    use v1::server_reflection_response::MessageResponse;
    let server = TestServer::start(ServerConfig::default()).await;
    let answer = ask_v1(
        channel(&server).await,
        MessageRequest::ListServices(String::new()),
    )
    .await;
    let MessageResponse::ListServicesResponse(list) = answer else {
        panic!("not a service list: {answer:?}")
    };
    let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
    for name in CLB_SERVICES {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    server.stop().await;
}
