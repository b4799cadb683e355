//! The example files under `deploy/` stay valid.
#![allow(clippy::unwrap_used, clippy::panic)]

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

/// The Kubernetes manifests, the local cluster script and the services read the same
/// configuration: each Deployment's `--config` file and every `AGENTLOOP_*` variable a
/// manifest or the script sets load into the configuration type of the binary they are
/// given to (which refuses unknown keys), every path a file names lies on a volume its
/// Deployment mounts, and the script starts the manifests' binaries with their files.
/// A key renamed in the code, a manifest or the script fails here.
#[test]
fn the_manifests_the_local_cluster_and_the_services_read_the_same_keys() {
    use agentloop_server::config::load_from;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let k8s = root.join("deploy/k8s");
    let read = |path: &std::path::Path| std::fs::read_to_string(path).unwrap();

    // The Deployments of the base: binary, configuration file, mounted directories.
    let mut deployments = Vec::new();
    for entry in std::fs::read_dir(k8s.join("base")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = read(&path);
        let after = |marker: &str| -> Vec<String> {
            text.lines()
                .filter_map(|line| line.split_once(marker))
                .map(|(_, rest)| {
                    rest.trim_end_matches([']', '}', ' '])
                        .split([',', ' '])
                        .next()
                        .unwrap()
                        .to_owned()
                })
                .collect()
        };
        let Some(binary) = after("command: [/usr/local/bin/").into_iter().next() else {
            continue;
        };
        let config = after("args: [--config, /etc/agentloop/config/");
        let mounts = after("mountPath: ");
        deployments.push((binary, config[0].clone(), mounts));
    }
    let mut wired: Vec<(String, String)> = deployments
        .iter()
        .map(|(binary, config, _)| (binary.clone(), config.clone()))
        .collect();
    wired.sort();
    assert_eq!(
        wired.iter().map(|(b, _)| b.as_str()).collect::<Vec<_>>(),
        BINARIES
    );

    // The script starts the same binaries with the same files.
    let script = read(&root.join("deploy/local/cluster"));
    let mut started: Vec<(String, String)> = script
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.trim().trim_matches('"').split(' ').collect();
            // NAME PREFIX BINARY CONFIG PORT METRICS-PORT
            (fields.len() > 4
                && fields[1]
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c == '_')
                && fields[2].starts_with("agentloop-"))
            .then(|| (fields[2].to_owned(), format!("{}.toml", fields[3])))
        })
        .collect();
    started.sort();
    started.dedup();
    assert_eq!(
        started, wired,
        "deploy/local/cluster starts what the manifests run"
    );

    // Every variable set: the manifests' `env` (base, overlays, components), the price
    // ConfigMap's `envFrom`, and the script's, `${prefix}` standing for each service's.
    let mut variables: std::collections::BTreeMap<String, Option<String>> = Default::default();
    let mut yaml = String::new();
    let mut stack = vec![k8s.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                yaml.push_str(&read(&path));
            }
        }
    }
    for line in yaml.lines() {
        if let Some((_, rest)) = line.split_once("name: AGENTLOOP_") {
            let name = format!("AGENTLOOP_{}", rest.split([',', ' ', '}']).next().unwrap());
            let value = line
                .split_once("value: ")
                .map(|(_, v)| v.trim_end_matches(['}', ' ']).to_owned());
            variables.insert(name, value);
        }
    }
    for line in read(&k8s.join("base/config/prices.env")).lines() {
        if let Some((name, value)) = line.split_once('=') {
            variables.insert(name.to_owned(), Some(value.to_owned()));
        }
    }
    let prefixes: Vec<String> = BINARIES.into_iter().map(prefix_of).collect();
    let mut rest = script.as_str();
    while let Some(at) = rest.find("AGENTLOOP_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || "_${}".contains(*c))
            .collect();
        rest = &rest[at + name.len()..];
        let name = name.trim_end_matches('_');
        match name.split_once("${prefix}_") {
            // A placeholder in a comment: `AGENTLOOP_<SERVICE>_LISTEN`.
            None if name == "AGENTLOOP" => {}
            // A service's prefix alone, which `--env` variables are matched against.
            None if name == "AGENTLOOP_${prefix}" => {}
            Some((_, key)) => {
                for prefix in &prefixes {
                    variables.insert(format!("{prefix}{key}"), None);
                }
            }
            None if name.contains('$') => panic!("cannot read the variable {name} of the script"),
            None => {
                variables.entry(name.to_owned()).or_insert(None);
            }
        }
    }

    // Each variable belongs to one service or is the log's; none is left over.
    let mut by_prefix: std::collections::BTreeMap<&str, Vec<(String, String)>> = Default::default();
    for (name, value) in &variables {
        if name == agentloop_telemetry::config::LOG_FORMAT_ENV {
            continue;
        }
        let prefix = prefixes
            .iter()
            .filter(|p| name.starts_with(p.as_str()))
            .max_by_key(|p| p.len())
            .unwrap_or_else(|| panic!("{name} is no service's variable"));
        // A value the manifests take from a Secret, or the script computes: one of the
        // key's type.
        let value = value.clone().unwrap_or_else(|| {
            match name.rsplit_once("__").map_or(name.as_str(), |(_, k)| k) {
                n if n.ends_with("DATABASE_URL") => "postgres://agentloop@db/agentloop".into(),
                n if n.ends_with("REDIS_URL") => "redis://redis:6379".into(),
                n if n.ends_with("LISTEN") => "127.0.0.1:1".into(),
                _ => "/var/lib/agentloop/x".into(),
            }
        });
        by_prefix
            .entry(prefix.as_str())
            .or_default()
            .push((name.clone(), value));
    }

    for (binary, config, mounts) in &deployments {
        let file = k8s.join("base/config").join(config);
        let prefix = prefix_of(binary);
        let env = by_prefix.get(prefix.as_str()).cloned().unwrap_or_default();
        // The binary's own configuration type, which refuses unknown keys.
        fn load<C>(
            file: &std::path::Path,
            env: Vec<(String, String)>,
            prefix: &str,
        ) -> Result<(), String>
        where
            C: serde::de::DeserializeOwned + serde::Serialize + Default,
        {
            let no_flags = std::collections::BTreeMap::<String, String>::new();
            load_from::<C>(Some(file), env, prefix, &no_flags)
                .map(drop)
                .map_err(|e| e.to_string())
        }
        let loaded = match binary.as_str() {
            "agentloop-orchestrator" => {
                load::<agentloop_orchestrator::OrchestratorConfig>(&file, env, &prefix)
            }
            "agentloop-decision" => load::<agentloop_decision::DecisionConfig>(&file, env, &prefix),
            "agentloop-policy" => load::<agentloop_policy::PolicyConfig>(&file, env, &prefix),
            "agentloop-tools" => load::<agentloop_tools::ToolsServiceConfig>(&file, env, &prefix),
            "agentloop-ledger" => load::<agentloop_ledger::LedgerConfig>(&file, env, &prefix),
            "agentloop-demo-executor" => {
                load::<agentloop_demo_executor::DemoConfig>(&file, env, &prefix)
            }
            other => panic!("no configuration type for {other}"),
        };
        loaded.unwrap_or_else(|e| panic!("{binary} with {config} and its variables: {e}"));

        // Every file the configuration names is on a volume of its Deployment.
        for word in read(&file).split(['"', '\'']) {
            if word.starts_with('/') && !word.contains(' ') {
                assert!(
                    mounts
                        .iter()
                        .any(|m| word.starts_with(&format!("{m}/")) || word == m),
                    "{config} names {word}, which no volume of {binary} holds ({mounts:?})"
                );
            }
        }
    }
    // The registry the ConfigMap carries loads (`deploy/k8s/check` keeps it and the
    // policies in step with the examples).
    agentloop_tools::ToolsConfig::load(&k8s.join("base/config/tools.toml")).unwrap();
}

/// The service binaries, as `agentloop_server::Service` names them.
const BINARIES: [&str; 6] = [
    "agentloop-decision",
    "agentloop-demo-executor",
    "agentloop-ledger",
    "agentloop-orchestrator",
    "agentloop-policy",
    "agentloop-tools",
];

/// The variable prefix of `binary`'s configuration.
fn prefix_of(binary: &str) -> String {
    let name = BINARIES
        .into_iter()
        .find(|b| *b == binary)
        .unwrap_or_else(|| panic!("{binary} is no service binary"));
    agentloop_server::Service::new(name).env_prefix()
}
