//! The gRPC contract of clb (package `clb.v1`) and its generated Rust code.
//!
//! Three services, each with a generated client and server:
//!
//! - [`v1::writer_server::Writer`] / [`v1::writer_client::WriterClient`]: watchers and node agents
//!   change the desired state (batches, streams of batches, resyncs).
//! - [`v1::worker_server::Worker`] / [`v1::worker_client::WorkerClient`]: sync workers receive
//!   leased work units and report their outcome on one bidirectional stream.
//! - [`v1::admin_server::Admin`] / [`v1::admin_client::AdminClient`]: read-only status and state
//!   for operators and tests.
//!
//! The code is generated at build time with a vendored `protoc`; users need no protobuf tooling.
//! See `docs/protocol.md` for the message flow.

/// Messages, enums, clients and servers of package `clb.v1`, generated from `proto/clb/v1/*.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/clb.v1.rs"));
}

/// The encoded `FileDescriptorSet` of package `clb.v1`, for registering gRPC server reflection
/// (`tonic_reflection::server::Builder::register_encoded_file_descriptor_set`).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/clb_v1_descriptor.bin"));

/// Milliseconds since the Unix epoch of `t` (0 before it): the unit of every `*_unix_ms` field.
pub fn unix_ms(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// [`unix_ms`] of now.
pub fn now_unix_ms() -> i64 {
    unix_ms(std::time::SystemTime::now())
}

/// The URL to dial for the state server at `url`: with `tls`, an `http://` URL (scheme matched
/// case-insensitively) becomes `https://`, since tonic speaks TLS only to `https://` URLs and would
/// otherwise fall back to plaintext; anything else is returned unchanged. Used by every client of
/// the state server (the typed client, the sync worker), so that asking for TLS never ends in
/// plaintext.
pub fn endpoint_url(url: &str, tls: bool) -> String {
    const HTTP: &str = "http://";
    match url.get(..HTTP.len()) {
        Some(scheme) if tls && scheme.eq_ignore_ascii_case(HTTP) => {
            format!("https://{}", &url[HTTP.len()..])
        }
        _ => url.to_owned(),
    }
}

pub mod azure_names;
pub mod codec;

/// The fully qualified gRPC names of the three services, as they appear on the wire and in
/// reflection.
pub mod service_names {
    /// The `Writer` service.
    pub const WRITER: &str = "clb.v1.Writer";
    /// The `Worker` service.
    pub const WORKER: &str = "clb.v1.Worker";
    /// The `Admin` service.
    pub const ADMIN: &str = "clb.v1.Admin";
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use prost::Message;
    use prost_types::{DescriptorProto, FileDescriptorSet};

    use super::v1::{
        AddressChange, AddressUpdateAction, LocationChange, LocationWork, Report, Retryable,
        ServiceFrontend, WorkUnit, report, work_unit,
    };
    use super::{FILE_DESCRIPTOR_SET, service_names};

    #[test]
    fn endpoint_url_upgrades_http_to_https_only_with_tls() {
        use super::endpoint_url;
        // Plaintext: every URL as given.
        assert_eq!(endpoint_url("http://a:1", false), "http://a:1");
        assert_eq!(endpoint_url("https://a:1", false), "https://a:1");
        // TLS: http:// becomes https://, whatever the scheme's case; the rest is kept verbatim.
        assert_eq!(endpoint_url("http://a:1", true), "https://a:1");
        assert_eq!(endpoint_url("HTTP://a:1/x?y", true), "https://a:1/x?y");
        assert_eq!(
            endpoint_url("http://[::1]:50051", true),
            "https://[::1]:50051"
        );
        // Already https, another scheme, no scheme, or too short: unchanged.
        assert_eq!(endpoint_url("https://a:1", true), "https://a:1");
        assert_eq!(endpoint_url("HTTPS://a:1", true), "HTTPS://a:1");
        assert_eq!(
            endpoint_url("unix:///run/clb.sock", true),
            "unix:///run/clb.sock"
        );
        assert_eq!(endpoint_url("a:1", true), "a:1");
        assert_eq!(endpoint_url("http:/", true), "http:/");
        assert_eq!(endpoint_url("", true), "");
        // A multi-byte character where the scheme would end is not a panic.
        assert_eq!(endpoint_url("http:/é", true), "http:/é");
    }

    fn descriptor_set() -> FileDescriptorSet {
        FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).expect("FILE_DESCRIPTOR_SET decodes")
    }

    #[test]
    fn work_unit_survives_an_encode_decode_round_trip() {
        let unit = WorkUnit {
            work_id: 42,
            gateway: "gw-westeurope".into(),
            revision: 7,
            lease_deadline_unix_ms: 1_700_000_000_000,
            lease_duration_ms: 30_000,
            attempt: 2,
            trace_context: [(
                "traceparent".to_owned(),
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
            )]
            .into(),
            work: Some(work_unit::Work::Locations(LocationWork {
                locations: vec![LocationChange {
                    location: "10.0.0.4".into(),
                    action: AddressUpdateAction::PartialUpdate as i32,
                    addresses: vec![
                        AddressChange {
                            address: "10.244.1.7".into(),
                            service_ids: vec!["uid-a".into(), "egress-b".into()],
                        },
                        AddressChange {
                            address: "10.244.1.9".into(),
                            service_ids: vec![],
                        },
                    ],
                }],
            })),
        };
        let decoded = WorkUnit::decode(unit.encode_to_vec().as_slice()).expect("decodes");
        assert_eq!(decoded, unit);
    }

    #[test]
    fn report_with_partial_success_survives_a_round_trip() {
        let report = Report {
            work_id: 9,
            applied_indices: vec![0, 2],
            frontends: vec![ServiceFrontend {
                service_id: "uid-a".into(),
                ip: "20.0.0.7".into(),
            }],
            service_progress: vec![super::v1::ServiceProgress {
                index: 1,
                step: super::v1::ServiceStep::Unregistered as i32,
            }],
            remaining_subscription_writes: Some(0),
            refused_addresses: Vec::new(),
            outcome: Some(report::Outcome::Retryable(Retryable {
                retry_after_ms: 1500,
                code: "AnotherOperationInProgress".into(),
                message: "retry later".into(),
            })),
        };
        let decoded = Report::decode(report.encode_to_vec().as_slice()).expect("decodes");
        assert_eq!(decoded, report);
    }

    #[test]
    fn unknown_enum_values_are_kept_and_rejected_by_try_from() {
        let update = super::v1::ServiceUpdate {
            operation: 99,
            service_id: "uid".into(),
            ports: vec![],
            ..Default::default()
        };
        let decoded =
            super::v1::ServiceUpdate::decode(update.encode_to_vec().as_slice()).expect("decodes");
        assert_eq!(decoded.operation, 99);
        assert!(super::v1::Operation::try_from(decoded.operation).is_err());
    }

    #[test]
    fn file_descriptor_set_names_the_three_services() {
        let set = descriptor_set();
        let mut services: Vec<String> = set
            .file
            .iter()
            .flat_map(|file| {
                file.service
                    .iter()
                    .map(move |s| format!("{}.{}", file.package(), s.name()))
            })
            .collect();
        services.sort();
        assert_eq!(
            services,
            vec![
                service_names::ADMIN.to_string(),
                service_names::WORKER.to_string(),
                service_names::WRITER.to_string(),
            ]
        );
        assert!(set.file.iter().all(|f| f.package() == "clb.v1"));
    }

    #[test]
    fn worker_sync_is_one_bidirectional_stream() {
        let set = descriptor_set();
        let worker = set
            .file
            .iter()
            .flat_map(|f| &f.service)
            .find(|s| s.name() == "Worker")
            .expect("Worker service");
        assert_eq!(worker.method.len(), 1);
        let sync = &worker.method[0];
        assert_eq!(sync.name(), "Sync");
        assert!(sync.client_streaming() && sync.server_streaming());
    }

    /// Source-info paths (field numbers of `descriptor.proto`) of every element that must carry
    /// a comment: messages, fields, oneofs, enums, enum values, services and rpcs (not the synthetic
    /// entry messages of map fields).
    fn documented_paths(set: &FileDescriptorSet) -> Vec<(String, Vec<i32>, String)> {
        fn message(
            file: &str,
            prefix: Vec<i32>,
            m: &DescriptorProto,
            out: &mut Vec<(String, Vec<i32>, String)>,
        ) {
            let name = m.name().to_string();
            out.push((file.into(), prefix.clone(), name.clone()));
            for (i, f) in m.field.iter().enumerate() {
                let mut p = prefix.clone();
                p.extend([2, i as i32]);
                out.push((file.into(), p, format!("{name}.{}", f.name())));
            }
            for (i, o) in m.oneof_decl.iter().enumerate() {
                // The synthetic oneof of a proto3 `optional` field has no source of its own (the
                // field is documented).
                let synthetic = m
                    .field
                    .iter()
                    .any(|f| f.proto3_optional() && f.oneof_index == Some(i as i32));
                if synthetic {
                    continue;
                }
                let mut p = prefix.clone();
                p.extend([8, i as i32]);
                out.push((file.into(), p, format!("{name}.{}", o.name())));
            }
            for (i, nested) in m.nested_type.iter().enumerate() {
                // `map<K, V>` fields generate an entry message with no source of its own.
                if nested.options.as_ref().is_some_and(|o| o.map_entry()) {
                    continue;
                }
                let mut p = prefix.clone();
                p.extend([3, i as i32]);
                message(file, p, nested, out);
            }
            for (i, e) in m.enum_type.iter().enumerate() {
                let mut p = prefix.clone();
                p.extend([4, i as i32]);
                out.push((file.into(), p.clone(), format!("{name}.{}", e.name())));
                for (j, v) in e.value.iter().enumerate() {
                    let mut pv = p.clone();
                    pv.extend([2, j as i32]);
                    out.push((file.into(), pv, v.name().to_string()));
                }
            }
        }

        let mut out = Vec::new();
        for file in &set.file {
            let fname = file.name();
            for (i, m) in file.message_type.iter().enumerate() {
                message(fname, vec![4, i as i32], m, &mut out);
            }
            for (i, e) in file.enum_type.iter().enumerate() {
                out.push((fname.into(), vec![5, i as i32], e.name().to_string()));
                for (j, v) in e.value.iter().enumerate() {
                    out.push((
                        fname.into(),
                        vec![5, i as i32, 2, j as i32],
                        v.name().to_string(),
                    ));
                }
            }
            for (i, s) in file.service.iter().enumerate() {
                out.push((fname.into(), vec![6, i as i32], s.name().to_string()));
                for (j, m) in s.method.iter().enumerate() {
                    out.push((
                        fname.into(),
                        vec![6, i as i32, 2, j as i32],
                        format!("{}.{}", s.name(), m.name()),
                    ));
                }
            }
        }
        out
    }

    #[test]
    fn every_element_of_the_contract_is_documented() {
        let set = descriptor_set();
        let comments: HashMap<(String, Vec<i32>), String> = set
            .file
            .iter()
            .flat_map(|file| {
                let info = file.source_code_info.clone().unwrap_or_default();
                info.location.into_iter().map(move |loc| {
                    (
                        (file.name().to_string(), loc.path),
                        loc.leading_comments.unwrap_or_default(),
                    )
                })
            })
            .collect();
        let undocumented: Vec<String> = documented_paths(&set)
            .into_iter()
            .filter(|(file, path, _)| {
                comments
                    .get(&(file.clone(), path.clone()))
                    .is_none_or(|c| c.trim().is_empty())
            })
            .map(|(file, _, name)| format!("{file}: {name}"))
            .collect();
        assert!(undocumented.is_empty(), "undocumented: {undocumented:#?}");
    }
}
