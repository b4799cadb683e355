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

/// The metric names in `text`: every `agentloop_[a-z_]+`, a histogram's `_bucket`,
/// `_count` and `_sum` series named by the histogram.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("agentloop_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        let name = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(&name)
            .to_owned();
        names.insert(name);
    }
    names
}

/// Every `.rs` file under `dir`, read.
fn sources(dir: &std::path::Path, into: &mut String) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push_str(&std::fs::read_to_string(&path).unwrap());
        }
    }
}

/// The Grafana dashboard is built on the documented metrics, all of them and no other,
/// and every documented metric is one the code registers: a metric renamed in the code
/// or the docs fails here.
#[test]
fn the_dashboard_charts_every_documented_metric_and_the_code_registers_them() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/grafana/agentloop.json")).unwrap(),
    )
    .unwrap();
    let mut queried = String::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            queried.push_str(target["expr"].as_str().unwrap());
            queried.push('\n');
        }
    }
    let charted = metric_names(&queried);
    let docs = std::fs::read_to_string(root.join("docs/observability.md")).unwrap();
    let table: String = docs
        .lines()
        .filter(|line| line.starts_with("| `agentloop_"))
        .map(|line| line.split('|').nth(1).unwrap_or_default())
        .collect();
    let documented = metric_names(&table);
    assert!(documented.len() >= 18, "{documented:?}");
    assert_eq!(
        charted, documented,
        "the dashboard against docs/observability.md"
    );

    let mut code = String::new();
    for dir in ["crates", "services"] {
        sources(&root.join(dir), &mut code);
    }
    for metric in &documented {
        let registered = metric
            .strip_prefix("agentloop_")
            .unwrap()
            .trim_end_matches("_total");
        assert!(
            code.contains(&format!("\"{registered}\"")),
            "{metric} is registered as \"{registered}\" somewhere in the code"
        );
    }
}
