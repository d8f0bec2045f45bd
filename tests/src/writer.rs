//! A writer of desired state over the Writer gRPC API, as the kube watcher uses it: a resync of its
//! whole view (services, egresses, endpoints, pods) on connect, then batches.

use clb_proto::v1::writer_client::WriterClient;
use clb_proto::v1::{
    ApplyRequest, ApplyResponse, ResyncChunk, ResyncHeader, ResyncRequest, ResyncResponse,
    ResyncScope, Update, resync_request::Part,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// Source name of the cluster-wide watcher.
pub const WATCHER: &str = "watcher";

/// Updates per resync chunk and per `Apply` batch (below the server's default batch limit).
pub const CHUNK: usize = 2_000;

/// A writer connected to one state server.
#[derive(Debug, Clone)]
pub struct Watcher {
    client: WriterClient<Channel>,
    source: String,
    next_batch: u64,
}

impl Watcher {
    /// Connects to the state server at `url` as `source`.
    pub async fn connect(url: &str, source: &str) -> Result<Self, tonic::transport::Error> {
        Ok(Self {
            client: WriterClient::connect(url.to_owned()).await?,
            source: source.to_owned(),
            next_batch: 1,
        })
    }

    /// Sends `view` as this writer's complete view of services, egresses, endpoints and pods, in
    /// chunks of [`CHUNK`]. Panics if the server rejects the call or any item.
    pub async fn resync(&mut self, view: Vec<Update>) -> ResyncResponse {
        let (tx, rx) = mpsc::channel(4);
        let header = ResyncRequest {
            part: Some(Part::Header(ResyncHeader {
                gateway: String::new(),
                source: self.source.clone(),
                scope: Some(ResyncScope {
                    services: true,
                    egresses: true,
                    endpoints: true,
                    pods: true,
                    location: String::new(),
                }),
            })),
        };
        let send = async move {
            tx.send(header).await.expect("resync stream open");
            let mut view = view;
            while !view.is_empty() {
                let rest = view.split_off(view.len().min(CHUNK));
                let chunk = ResyncRequest {
                    part: Some(Part::Chunk(ResyncChunk { updates: view })),
                };
                tx.send(chunk).await.expect("resync stream open");
                view = rest;
            }
        };
        let mut client = self.client.clone();
        let call = async move { client.resync(ReceiverStream::new(rx)).await };
        let ((), response) = tokio::join!(send, call);
        let response = response.expect("resync accepted").into_inner();
        assert!(
            response.rejected.is_empty(),
            "resync items rejected: {:?}",
            response.rejected
        );
        response
    }

    /// Applies `updates` in one or more `Apply` batches of at most [`CHUNK`]. Panics if the server
    /// rejects the call or any item; returns the last response.
    pub async fn apply(&mut self, updates: Vec<Update>) -> ApplyResponse {
        let mut updates = updates;
        loop {
            let rest = updates.split_off(updates.len().min(CHUNK));
            let batch_id = self.next_batch;
            self.next_batch += 1;
            let request = ApplyRequest {
                gateway: String::new(),
                source: self.source.clone(),
                batch_id,
                updates,
            };
            let response = self
                .client
                .apply(request)
                .await
                .expect("batch accepted")
                .into_inner();
            assert!(
                response.rejected.is_empty(),
                "batch {batch_id}: items rejected: {:?}",
                response.rejected
            );
            if rest.is_empty() {
                return response;
            }
            updates = rest;
        }
    }

    /// Applies each batch in order ([`Watcher::apply`]).
    pub async fn apply_all(&mut self, batches: Vec<Vec<Update>>) {
        for b in batches {
            self.apply(b).await;
        }
    }
}
