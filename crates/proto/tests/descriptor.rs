//! The exported descriptor set is what gRPC reflection serves: it must decode and name
//! every service of the contracts.

use agentloop_proto::FILE_DESCRIPTOR_SET;
use prost::Message;
use prost_types::FileDescriptorSet;

const SERVICES: [&str; 6] = [
    "agentloop.v1.OrchestratorService",
    "agentloop.v1.DecisionService",
    "agentloop.v1.PolicyService",
    "agentloop.v1.ToolGatewayService",
    "agentloop.v1.ToolExecutorService",
    "agentloop.v1.EffectLedgerService",
];

fn decode() -> Result<FileDescriptorSet, prost::DecodeError> {
    FileDescriptorSet::decode(FILE_DESCRIPTOR_SET)
}

#[test]
fn descriptor_set_names_all_six_services() {
    let set = decode().expect("descriptor set decodes");
    let mut found: Vec<String> = set
        .file
        .iter()
        .filter(|file| file.package() == "agentloop.v1")
        .flat_map(|file| {
            file.service
                .iter()
                .map(move |service| format!("{}.{}", file.package(), service.name()))
        })
        .collect();
    found.sort();
    let mut expected: Vec<String> = SERVICES.iter().map(|s| (*s).to_owned()).collect();
    expected.sort();
    assert_eq!(found, expected);
}

#[test]
fn descriptor_set_is_self_contained_and_carries_comments() {
    let set = decode().expect("descriptor set decodes");
    let names: Vec<&str> = set.file.iter().map(|file| file.name()).collect();
    // Imports are included, so reflection clients can resolve Timestamp and Duration.
    assert!(
        names.contains(&"google/protobuf/timestamp.proto"),
        "{names:?}"
    );
    assert!(
        names.contains(&"google/protobuf/duration.proto"),
        "{names:?}"
    );
    // Source info (the proto comments) is kept for reflection clients to show.
    let common = set
        .file
        .iter()
        .find(|file| file.name() == "agentloop/v1/common.proto")
        .expect("common.proto is in the set");
    let info = common.source_code_info.as_ref().expect("source info kept");
    assert!(
        info.location
            .iter()
            .any(|loc| loc.leading_comments().contains("Why an invocation stopped"))
    );
}
