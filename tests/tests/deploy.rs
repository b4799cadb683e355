//! The example files under `deploy/` stay valid.
#![allow(clippy::unwrap_used)]

#[test]
fn the_example_tool_registry_loads() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/tools.example.toml");
    let config = agentloop_tools::ToolsConfig::load(&path).unwrap();
    let names: Vec<String> = config.descriptors().into_iter().map(|d| d.name).collect();
    assert_eq!(names, ["lookup", "transfer"]);
}
